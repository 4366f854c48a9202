"""The end of a run: the best weights decode every test split with beam search into
``<split>.hyp`` (references beside them in ``<split>.ref``), and the scores, the validation
history and the sacrebleu signatures go into ``results.json`` and one summary line."""

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Optional

import torch
from torch import nn

from common.files import AtomicFile, write_lines
from data.pipeline import PreparedData
from inference.decoding import translate_split
from training.metrics import corpus_scores, signatures
from training.progress import Progress

log = logging.getLogger(__name__)


def decode_test_split(
    model: nn.Module,
    data: PreparedData,
    split: str,
    out_dir: Path,
    batch_tokens: int,
    beam: int,
    alpha: float,
    device: torch.device,
    autocast: Callable[[], ContextManager],
) -> Dict[str, float]:
    """Beam-decode one test split into ``<split>.hyp`` (its references into ``<split>.ref``, for
    significance tests by scripts/compare.py); its BLEU and chrF."""
    tick = time.perf_counter()
    hyps = translate_split(
        model, data.datasets[split], data.tokenizer, batch_tokens, device, beam, alpha, autocast
    )
    write_lines(out_dir / f"{split}.hyp", hyps)
    write_lines(out_dir / f"{split}.ref", data.references[split])
    scores = corpus_scores(hyps, data.references[split])
    log.info(
        "test %s (beam %d): BLEU %.2f chrF %.2f (%.0f s)",
        split,
        beam,
        scores["bleu"],
        scores["chrf"],
        time.perf_counter() - tick,
    )
    return scores


def results_of(
    p: Progress,
    model_name: str,
    params: int,
    epochs: float,
    device: torch.device,
    test: Dict[str, Dict[str, float]],
) -> Dict[str, Any]:
    """The contents of ``results.json``: the run, its best validation scores, its test scores."""
    best: Dict[str, Optional[float]] = max(p.history, key=lambda h: h["bleu"]) if p.history else {}
    return {
        "model": model_name,
        "params": params,
        "steps": p.step,
        "epochs": round(epochs, 3),
        "train_seconds": round(p.train_seconds, 1),
        "train_tokens_per_second": round(p.tgt_tokens / max(p.step_seconds, 1e-9), 1),
        "device": str(device),
        "valid": {k: best.get(k) for k in ("loss", "ppl", "bleu", "chrf")} | {"step": best.get("step")},
        "test": test,
        "sacrebleu": signatures(),
        "valid_history": p.history,
    }


def write_results(out_dir: Path, results: Dict[str, Any]) -> None:
    with AtomicFile(out_dir / "results.json") as out:
        out.write(json.dumps(results, indent=2) + "\n")


def hparam_metrics(results: Dict[str, Any]) -> Dict[str, float]:
    """The final scores for TensorBoard's HParams view."""
    metrics = {"hparam/valid_bleu": results["valid"]["bleu"] or 0.0}
    for split, scores in results["test"].items():
        metrics.update({f"hparam/{split}_bleu": scores["bleu"], f"hparam/{split}_chrf": scores["chrf"]})
    return metrics


def summary_line(results: Dict[str, Any]) -> str:
    tests = ", ".join(
        f"{split} BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f}" for split, s in results["test"].items()
    )
    return (
        f"{results['model']} ({results['params']:,} params): {results['steps']} steps, {results['epochs']} epochs, "
        f"{results['train_seconds']:.0f} s, {results['train_tokens_per_second']:.0f} tgt tok/s; "
        f"best valid BLEU {results['valid']['bleu']:.2f}; {tests}"
    )
