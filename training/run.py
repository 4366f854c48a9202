"""A run in its folder: ``train(cfg, out_dir)`` is ``run(prepare(cfg, out_dir))``.

``prepare`` checks and locks the run folder, builds the ``Trainer`` (``training/trainer.py``) and
restores ``trainer.resume``: every refusal happens there, before anything is written. ``run``
trains with SIGINT / SIGTERM handled (``training/signals.py``), then ends the run: it chooses the
test weights, decodes the test splits with them and writes ``results.json``
(``training/finish.py``), each step a function of what it is given.
"""

import logging
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Optional

from omegaconf import DictConfig, OmegaConf
from torch import nn

from common.checkpoint import load_checkpoint, save_checkpoint
from data.pipeline import PreparedData
from training import distributed
from training.averaging import average_checkpoints, last_checkpoints
from training.board import Board
from training.finish import decode_test_split, hparam_metrics, results_of, summary_line, write_results
from training.progress import Progress
from training.run_folder import check_run_folder, claim_run_folder, unlock_run_folder
from training.signals import Interrupted, StopRequest
from training.trainer import Trainer

log = logging.getLogger(__name__)


def prepare(cfg: DictConfig, out_dir: Path) -> Trainer:
    """Check and lock the run folder, load the data, build the model and restore ``trainer.resume``:
    every refusal happens here, before anything is written into ``out_dir``."""
    out_dir = Path(out_dir)
    try:
        if distributed.world_from_env().main:
            claim_run_folder(out_dir, cfg.trainer.get("resume"))
        else:  # rank 0 holds the folder; the others check what it holds
            check_run_folder(out_dir, cfg.trainer.get("resume"))
        trainer = Trainer(cfg, out_dir)
        trainer.resume()
    except BaseException:
        unlock_run_folder(out_dir)
        raise
    return trainer


def run(trainer: Trainer) -> Optional[Dict[str, Any]]:
    """Train a prepared run, decode the test splits with the best weights and write checkpoints,
    TensorBoard events, hypotheses and ``results.json`` into its folder; return the results (rank 0;
    the other ranks: None). SIGINT / SIGTERM stop it cleanly from here on (``training/signals.py``)."""
    try:
        with StopRequest() as stop:
            reason = trainer.fit(stop=stop)
            log.info("training stopped: %s", reason)
            if not trainer.world.main:
                return None
            used = choose_test_weights(
                trainer.model,
                trainer.ckpt_dir,
                trainer.progress,
                trainer.ema is not None,
                trainer.tc.average_last,
                trainer.validate_weights,
            )
            tc = trainer.tc
            test = decode_tests(
                trainer.model,
                trainer.data,
                trainer.out_dir,
                trainer.eval_batch_tokens,
                tc.beam_size,
                tc.length_penalty,
                trainer.device,
                trainer.autocast,
                stop,
                trainer.progress.step,
            )
        results = results_of(
            trainer.progress,
            trainer.model_cfg.name,
            trainer.params,
            trainer.epochs_done(),
            trainer.device,
            test,
        )
        results["test_weights"] = used
        results["decode_dtype"] = trainer.precision  # translate.py's --dtype auto decodes the same way
        finish(trainer.out_dir, results, trainer.board, OmegaConf.to_container(trainer.cfg, resolve=True))
        return results
    finally:
        trainer.close()


def train(cfg: DictConfig, out_dir: Path) -> Dict[str, Any]:
    """Train the model ``cfg`` describes in the run folder ``out_dir``: ``run(prepare(...))``."""
    return run(prepare(cfg, out_dir))


def choose_test_weights(
    model: nn.Module,
    ckpt_dir: Path,
    p: Progress,
    ema: bool,
    average_last: Optional[int],
    validate_weights: Callable[[Dict[str, Any]], Dict[str, float]],
) -> Dict[str, Any]:
    """Load into ``model`` the weights the test splits are decoded with: of ``best.pt``, ``ema.pt``
    (``ema``: trainer.ema_decay is on) and the mean of the last ``average_last`` checkpoints (saved
    as ``average.pt``, scored by ``validate_weights``), the one with the best validation BLEU (the
    first on a tie). Returns which, and the validation BLEU of each."""
    bleu = {}
    if (ckpt_dir / "best.pt").is_file():
        bleu["best.pt"] = p.best_bleu
    if ema and (ckpt_dir / "ema.pt").is_file() and p.history and "ema_bleu" in p.history[-1]:
        bleu["ema.pt"] = p.history[-1]["ema_bleu"]
    kept = last_checkpoints(ckpt_dir, average_last or 0)  # none when average_last is off
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
    model.load_state_dict(load_checkpoint(ckpt_dir / used)["model"])
    if len(bleu) > 1:
        log.info("test weights: %s (valid BLEU %s)", used, ", ".join(f"{k} {v:.2f}" for k, v in bleu.items()))
    return {"used": used, "valid_bleu": bleu}


def decode_tests(
    model: nn.Module,
    data: PreparedData,
    out_dir: Path,
    batch_tokens: int,
    beam: int,
    alpha: float,
    device: Any,
    autocast: Callable[[], ContextManager],
    stop: StopRequest,
    step: int,
) -> Dict[str, Dict[str, float]]:
    """Beam-decode and score every test split of ``data`` with ``model`` into ``out_dir``; a stop
    signal (``stop``) between two splits ends the run there, finished and saved at ``step``."""
    results = {}
    for split in data.test_splits:
        if stop.signum is not None:  # training is over and saved: nothing to add
            raise Interrupted(
                f"{stop.name}: stopped before decoding test split {split}; training is finished "
                f"({out_dir / 'checkpoints' / 'last.pt'}, step {step}); decode the test splits with: "
                f"python train.py trainer.resume=auto hydra.run.dir={out_dir} (and the same overrides)",
                stop.signum,
            )
        results[split] = decode_test_split(
            model, data, split, out_dir, batch_tokens, beam, alpha, device, autocast
        )
    return results


def finish(out_dir: Path, results: Dict[str, Any], board: Board, config: Dict[str, Any]) -> None:
    """Write ``results.json``, the HParams entry (``config`` and the scores) and the summary line."""
    write_results(out_dir, results)
    board.hparams(config, hparam_metrics(results))
    log.info("summary: %s", summary_line(results))
