import logging
import subprocess
import sys

import pytest

from data.corpus import folder_splits
from data.errors import DataError
from data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, build_tokenizer, normalize

from helpers import ROOT, read_all


@pytest.fixture(scope="module")
def corpus(multi30k_dir):
    return read_all(folder_splits(multi30k_dir, "de", "en"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("spm-cache")


@pytest.fixture(scope="module")
def tokenizer(corpus, cache):
    return build_tokenizer(corpus["train"][:4000], 2000, True, "unigram", str(cache))


def test_special_ids_are_fixed(tokenizer):
    for piece, expected in {"<pad>": PAD_ID, "<unk>": UNK_ID, "<s>": BOS_ID, "</s>": EOS_ID}.items():
        assert tokenizer.src.piece_to_id(piece) == expected
    ids = tokenizer.encode_src(["Ein Hund rennt."])[0]
    assert BOS_ID not in ids and EOS_ID not in ids and PAD_ID not in ids


def test_validation_split_round_trips_up_to_normalization(tokenizer, corpus):
    sources = [src for src, _ in corpus["val"]]
    targets = [tgt for _, tgt in corpus["val"]]
    assert tokenizer.decode_src(tokenizer.encode_src(sources)) == [normalize(s) for s in sources]
    assert tokenizer.decode_tgt(tokenizer.encode_tgt(targets)) == [normalize(t) for t in targets]
    # Multi30k is clean text: normalization changes only stray spaces, case and punctuation stay.
    assert sum(normalize(t) != t for t in targets) <= 5


def test_unseen_characters_survive_through_byte_fallback(tokenizer):
    text = "Ein Drache 🐉 im Café Ø."
    ids = tokenizer.encode_src([text])[0]
    assert UNK_ID not in ids
    assert tokenizer.decode_src([ids]) == [text]


def test_special_ids_decode_to_nothing(tokenizer):
    ids = tokenizer.encode_tgt(["A dog runs."])[0]
    assert tokenizer.decode_tgt([[BOS_ID] + ids + [EOS_ID, PAD_ID, PAD_ID]]) == ["A dog runs."]


def test_second_build_with_same_data_reuses_the_cached_model(corpus, cache, tokenizer, caplog):
    (model_file,) = [
        path for path in cache.glob("spm/*/joint.model") if path.read_bytes() == tokenizer.src_model
    ]
    mtime = model_file.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="data.tokenizer"):
        again = build_tokenizer(corpus["train"][:4000], 2000, True, "unigram", str(cache))
    assert "using the cached" in caplog.text and "trained" not in caplog.text
    assert model_file.stat().st_mtime_ns == mtime
    assert again.src_model == tokenizer.src_model


def test_other_data_or_options_train_a_new_model(corpus, cache, tokenizer):
    before = len(list(cache.glob("spm/*/joint.model")))
    build_tokenizer(corpus["train"][:3999], 2000, True, "unigram", str(cache))
    build_tokenizer(corpus["train"][:4000], 1500, True, "unigram", str(cache))
    assert len(list(cache.glob("spm/*/joint.model"))) == before + 2


def test_separate_vocabularies(corpus, tmp_path):
    tok = build_tokenizer(corpus["train"][:2000], 800, False, "bpe", str(tmp_path))
    assert not tok.joint and tok.src_vocab_size == tok.tgt_vocab_size == 800
    assert tok.src_model != tok.tgt_model
    assert tok.decode_tgt(tok.encode_tgt(["Two dogs play."])) == ["Two dogs play."]


def test_state_dict_rebuilds_the_same_tokenizer(tokenizer):
    again = Tokenizer.from_state_dict(tokenizer.state_dict())
    text = ["Eine Frau mit rotem Hut."]
    assert again.encode_src(text) == tokenizer.encode_src(text) and again.joint


def test_vocabulary_too_large_for_the_data_is_a_clear_error(tmp_path):
    pairs = [("ein Hund", "a dog"), ("zwei Katzen", "two cats")] * 10
    with pytest.raises(
        DataError, match=r"data.vocab_size=5000 does not fit .*too high.*lower data.vocab_size$"
    ):
        build_tokenizer(pairs, 5000, True, "unigram", str(tmp_path))
    with pytest.raises(DataError, match=r"data.vocab_size=100 does not fit .*raise data.vocab_size$"):
        build_tokenizer(pairs, 100, True, "unigram", str(tmp_path))


def test_the_training_sample_is_exact_and_the_same_in_every_process():
    from data.tokenizer import sample_sentences

    lines = [f"sentence {i}" for i in range(1000)]
    assert list(sample_sentences(iter(lines), 1000, 1000)) == lines  # no more than the limit: all, in order
    sample = list(sample_sentences(iter(lines), 1000, 300))
    assert len(sample) == len(set(sample)) == 300 and sample == sorted(sample, key=lines.index)
    code = (
        "from data.tokenizer import sample_sentences; "
        "print(list(sample_sentences((f'sentence {i}' for i in range(1000)), 1000, 300)))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert other.stdout.strip() == str(sample)  # another process draws the same sentences
