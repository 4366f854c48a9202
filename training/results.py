"""The end of a run: the test weights are chosen (of ``best.pt``, ``ema.pt`` and ``average.pt``, the
best on validation), they decode every test split with beam search into ``<split>.hyp``
(references beside them in ``<split>.ref``), and the scores, the validation history and the
sacrebleu signatures go into ``results.json``, TensorBoard's HParams and one summary line."""

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from common.checkpoint import load_checkpoint, save_checkpoint
from common.files import AtomicFile, write_lines
from common.progress_bar import progress_bar
from inference.decoding import translate_split
from training.averaging import average_checkpoints, last_checkpoints
from training.board import Board
from training.progress import Progress
from training.run_folder import resume_command
from training.setup import Setup
from training.stopping import Interrupted, StopRequest
from training.validation import corpus_scores, signatures

log = logging.getLogger(__name__)


def decode_test_split(setup: Setup, split: str) -> Dict[str, float]:
    """Beam-decode one test split into ``<split>.hyp`` (its references into ``<split>.ref``, for
    significance tests by scripts/compare.py); its BLEU and chrF."""
    tick, data, out_dir, beam = time.perf_counter(), setup.data, setup.out_dir, setup.tc.beam_size
    with progress_bar(len(data.datasets[split]), f"test {split}: beam {beam}", "sentences") as bar:
        hyps = translate_split(
            setup.model,
            data.datasets[split],
            data.tokenizer,
            setup.eval_batch_tokens,
            setup.device,
            beam,
            setup.tc.length_penalty,
            setup.autocast,
            bar.update,
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


def results_of(p: Progress, setup: Setup, epochs: float, test: Dict[str, Dict[str, float]]) -> Dict[str, Any]:
    """The contents of ``results.json``: the run, its best validation scores, its test scores."""
    best: Dict[str, Optional[float]] = max(p.history, key=lambda h: h["bleu"]) if p.history else {}
    return {
        "model": setup.model_cfg.name,
        "params": setup.params,
        "steps": p.step,
        "epochs": round(epochs, 3),
        "train_seconds": round(p.train_seconds, 1),
        "train_tokens_per_second": round(p.tgt_tokens / max(p.step_seconds, 1e-9), 1),
        "device": str(setup.device),
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


def choose_test_weights(
    setup: Setup, p: Progress, ema: bool, validate_weights: Callable[[Dict[str, Any]], Dict[str, float]]
) -> Dict[str, Any]:
    """Load into the model the weights the test splits are decoded with: of ``best.pt``, ``ema.pt``
    (``ema``: trainer.ema_decay is on) and the mean of the last ``trainer.average_last`` checkpoints
    (saved as ``average.pt``, scored by ``validate_weights``), the one with the best validation BLEU
    (the first on a tie). Returns which, and the validation BLEU of each."""
    bleu, ckpt_dir = {}, setup.out_dir / "checkpoints"
    if (ckpt_dir / "best.pt").is_file():
        bleu["best.pt"] = p.best_bleu
    if ema and (ckpt_dir / "ema.pt").is_file() and p.history and "ema_bleu" in p.history[-1]:
        bleu["ema.pt"] = p.history[-1]["ema_bleu"]
    kept = last_checkpoints(ckpt_dir, setup.tc.average_last or 0)  # none when average_last is off
    if len(kept) > 1:
        averaged = average_checkpoints(kept)
        save_checkpoint(averaged, ckpt_dir / "average.pt")
        bleu["average.pt"] = validate_weights(averaged["model"])["bleu"]
        log.info(
            "average.pt: mean of %s, valid BLEU %.2f", ", ".join(k.name for k in kept), bleu["average.pt"]
        )
    if not bleu:  # stopped before any evaluation: the weights as they are
        return {"used": None, "valid_bleu": {}}
    used = max(bleu, key=lambda name: bleu[name])
    setup.model.load_state_dict(load_checkpoint(ckpt_dir / used)["model"])
    if len(bleu) > 1:
        log.info("test weights: %s (valid BLEU %s)", used, ", ".join(f"{k} {v:.2f}" for k, v in bleu.items()))
    return {"used": used, "valid_bleu": bleu}


def decode_tests(setup: Setup, stop: StopRequest, step: int) -> Dict[str, Dict[str, float]]:
    """Beam-decode and score every test split into the run folder; a stop signal (``stop``) between
    two splits ends the run there, finished and saved at ``step``."""
    results, out_dir = {}, setup.out_dir
    for split in setup.data.test_splits:
        if stop.signum is not None:  # training is over and saved: nothing to add
            raise Interrupted(
                f"{stop.name}: stopped before decoding test split {split}; training is finished "
                f"({out_dir / 'checkpoints' / 'last.pt'}, step {step}); decode the test splits with: "
                + resume_command(out_dir),
                stop.signum,
            )
        results[split] = decode_test_split(setup, split)
    return results


def finish(out_dir: Path, results: Dict[str, Any], board: Board, config: Dict[str, Any]) -> None:
    """Write ``results.json``, the HParams entry (``config`` and the scores) and the summary line."""
    write_results(out_dir, results)
    board.hparams(config, hparam_metrics(results))
    log.info("summary: %s", summary_line(results))
