"""Corpus BLEU and chrF (training/validation.py) with sacrebleu."""

import pytest

from training.validation import corpus_scores, signatures

REFS = ["The cat sat on the mat.", "A man is riding a bike down the street.", "Two dogs play in the snow."]


def test_identical_hypotheses_score_100():
    scores = corpus_scores(REFS, REFS)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)


def test_unrelated_hypotheses_score_0():
    scores = corpus_scores(["QQQ JJJ"] * 3, REFS)
    assert scores["bleu"] == pytest.approx(0.0)
    assert scores["chrf"] == pytest.approx(0.0)


def test_known_pair_by_hand():
    """n-gram matches 5/6, 3/5, 1/4, 0/3 (sacrebleu's exp smoothing: 1/(2*3)); no brevity penalty."""
    scores = corpus_scores(["the cat is on the mat"], ["the cat sat on the mat"])
    assert scores["bleu"] == pytest.approx(100 * (5 / 6 * 3 / 5 * 1 / 4 * 1 / 6) ** 0.25, abs=1e-6)
    assert 0 < scores["chrf"] < 100


def test_scores_detokenized_text_with_its_own_tokenizer():
    """A detached full stop (tokenized text) is the same to BLEU's 13a tokenizer; case is not ignored."""
    assert corpus_scores(["The cat sat on the mat ."], ["The cat sat on the mat."])["bleu"] == pytest.approx(
        100.0
    )
    assert corpus_scores(["the cat sat on the mat."], ["The cat sat on the mat."])["bleu"] < 100.0


def test_hypotheses_are_matched_to_references_in_order():
    assert corpus_scores(REFS[::-1], REFS)["bleu"] < 50.0


@pytest.mark.parametrize("hyps", [REFS[:2], REFS + ["one more"], []])
def test_different_lengths_raise(hyps):
    with pytest.raises(ValueError, match="hypotheses for"):
        corpus_scores(hyps, REFS)


def test_signatures():
    result = signatures()
    assert set(result) == {"bleu", "chrf"}
    for signature in result.values():
        assert "nrefs:1" in signature
        assert "version:" in signature
    assert "tok:13a" in result["bleu"]
