"""Corpus BLEU and chrF with sacrebleu, on detokenized text against the raw references."""

from typing import Dict, List, Sequence

from sacrebleu.metrics import BLEU, CHRF


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Dict[str, float]:
    """``{"bleu": ..., "chrf": ...}`` of one hypothesis per reference (one reference stream)."""
    if len(hypotheses) != len(references):
        # sacrebleu zips the two silently: a length mismatch would give a meaningless score.
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    refs: List[List[str]] = [list(references)]
    return {
        "bleu": BLEU().corpus_score(list(hypotheses), refs).score,
        "chrf": CHRF().corpus_score(list(hypotheses), refs).score,
    }


def signatures() -> Dict[str, str]:
    """sacrebleu's signatures of the two metrics as ``corpus_scores`` computes them (one reference)."""
    bleu, chrf = BLEU(), CHRF()
    bleu.corpus_score(["a"], [["a"]])  # the signature needs the number of references: score once
    chrf.corpus_score(["a"], [["a"]])
    return {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature())}
