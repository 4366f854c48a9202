"""fast_align, the reference word aligner (alignment/fast_align.py): it recovers the known
alignment of a made-up word-for-word language, measured with alignment/scores.py."""

import random

import pytest

from alignment.fast_align import align_pairs, moses_tokenize, split_words, train_fast_align, training_lines
from alignment.scores import AlignmentError, Gold, alignment_scores, diagonal

FILLERS = ["la", "le"]  # target words with no source word: unaligned in the gold


def made_up_corpus(n_pairs: int, seed: int = 0):
    """``(src, tgt, gold)``: sentences of 3-8 source words out of 40, each translated word for word
    (``w7`` -> ``t7``), every second word pair swapped, and a filler word inserted now and then.
    The gold holds the true links as sure ones."""
    rng = random.Random(seed)
    src, tgt, gold = [], [], []
    for _ in range(n_pairs):
        words = [rng.randrange(40) for _ in range(rng.randint(3, 8))]
        order = list(range(len(words)))
        for k in range(0, len(order) - 1, 4):  # local reordering: swap positions k and k + 1
            order[k], order[k + 1] = order[k + 1], order[k]
        target, links = [], set()
        for i in order:
            if rng.random() < 0.15:
                target.append(rng.choice(FILLERS))
            links.add((i, len(target)))
            target.append(f"t{words[i]}")
        src.append([f"w{w}" for w in words])
        tgt.append(target)
        gold.append(Gold(frozenset(links), frozenset(links)))
    return src, tgt, gold


def test_fast_align_recovers_a_known_alignment(tmp_path):
    src, tgt, gold = made_up_corpus(400)
    model = train_fast_align(src, tgt, tmp_path / "fast_align")
    predicted = align_pairs(model, src, tgt)
    assert all(
        0 <= i < len(s) and 0 <= j < len(t) for links, s, t in zip(predicted, src, tgt) for i, j in links
    )
    scores = alignment_scores(predicted, gold)
    baseline = alignment_scores([diagonal(len(s), len(t)) for s, t in zip(src, tgt)], gold)
    assert scores.aer < 0.05, scores  # about 0.015 (seeds 0-2)
    assert scores.aer < baseline.aer / 2, (scores, baseline)


def test_empty_sides_get_no_links_and_stay_out_of_training(tmp_path):
    src, tgt, _ = made_up_corpus(50)
    src += [[], ["w1"], ["w1", "|||", "w2"]]
    tgt += [["t1"], [], ["t1", "t2"]]
    lines, left_out = training_lines(src, tgt)
    assert left_out == 3 and len(lines) == 50 and lines[0].count(" ||| ") == 1
    model = train_fast_align(src, tgt, tmp_path)
    assert align_pairs(model, [[], ["w1"], []], [["t1"], [], []]) == [set(), set(), set()]
    with pytest.raises(AlignmentError, match="2 source and 1 target sentences"):
        align_pairs(model, [["w1"], ["w2"]], [["t1"]])


def test_nothing_to_train_on_is_one_error(tmp_path):
    with pytest.raises(AlignmentError, match="none of the 2 pairs can train it"):
        train_fast_align([[], ["a"]], [["x"], []], tmp_path)


def test_text_is_prepared_like_the_gold_set():
    # the gold set is Moses-tokenized and cased: both sides are lowercased the same way
    assert moses_tokenize(["It's a dog, isn't it?"], "en") == [
        ["it", "'s", "a", "dog", ",", "isn", "'t", "it", "?"]
    ]
    assert moses_tokenize(["Wir glauben nicht, daß"], "de", lowercase=False) == [
        ["Wir", "glauben", "nicht", ",", "daß"]
    ]
    assert split_words(["Wir glauben  nicht ,", ""]) == [["wir", "glauben", "nicht", ","], []]
