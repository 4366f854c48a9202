"""A run in its folder: ``train(cfg, out_dir)`` is ``run(prepare(cfg, out_dir))``.

``prepare`` checks and locks the run folder, builds the ``Trainer`` (``training/trainer.py``) and
restores ``trainer.resume``: every refusal happens there, before anything is written. ``run``
trains with SIGINT / SIGTERM handled (``training/signals.py``), decodes the test splits with the
best weights and writes ``results.json`` (``training/finish.py``).
"""

import logging
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import DictConfig, OmegaConf

from common.checkpoint import load_checkpoint, save_checkpoint
from training import distributed
from training.averaging import average_checkpoints, last_checkpoints
from training.finish import decode_test_split, hparam_metrics, results_of, summary_line, write_results
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
    TensorBoard events, hypotheses and ``results.json`` into its folder; return the results.
    SIGINT / SIGTERM stop it cleanly from here on (``training/signals.py``)."""
    try:
        with StopRequest() as trainer.stop:
            reason = trainer.fit()
            log.info("training stopped: %s", reason)
            test = decode_tests(trainer)
        return finish(trainer, test)
    finally:
        trainer.stop = None
        trainer.close()


def train(cfg: DictConfig, out_dir: Path) -> Dict[str, Any]:
    """Train the model ``cfg`` describes in the run folder ``out_dir``: ``run(prepare(...))``."""
    return run(prepare(cfg, out_dir))


def choose_test_weights(trainer: Trainer) -> Dict[str, Any]:
    """Load the weights the test splits are decoded with: of ``best.pt``, ``ema.pt``
    (``trainer.ema_decay``) and the mean of the last ``trainer.average_last`` checkpoints (saved as
    ``average.pt``), the one with the best validation BLEU (the first on a tie). Returns which,
    and the validation BLEU of each."""
    p, ckpt_dir, bleu = trainer.progress, trainer.ckpt_dir, {}
    if (ckpt_dir / "best.pt").is_file():
        bleu["best.pt"] = p.best_bleu
    if (
        trainer.ema is not None
        and (ckpt_dir / "ema.pt").is_file()
        and p.history
        and "ema_bleu" in p.history[-1]
    ):
        bleu["ema.pt"] = p.history[-1]["ema_bleu"]
    kept = last_checkpoints(ckpt_dir, trainer.tc.average_last or 0)  # none when average_last is off
    if len(kept) > 1:
        averaged = average_checkpoints(kept)
        save_checkpoint(averaged, ckpt_dir / "average.pt")
        bleu["average.pt"] = trainer.validate_weights(averaged["model"])["bleu"]
        log.info(
            "average.pt: mean of %s, valid BLEU %.2f", ", ".join(k.name for k in kept), bleu["average.pt"]
        )
    if not bleu:  # stopped before any evaluation: the weights as they are
        return {"used": None, "valid_bleu": {}}
    used = max(bleu, key=lambda name: bleu[name])
    trainer.model.load_state_dict(load_checkpoint(ckpt_dir / used)["model"])
    if len(bleu) > 1:
        log.info("test weights: %s (valid BLEU %s)", used, ", ".join(f"{k} {v:.2f}" for k, v in bleu.items()))
    return {"used": used, "valid_bleu": bleu}


def decode_tests(trainer: Trainer) -> Dict[str, Dict[str, float]]:
    """Load the weights ``choose_test_weights`` picks; beam-decode and score every test split
    (rank 0; the others: {})."""
    if not trainer.world.main:
        return {}
    trainer.test_weights = choose_test_weights(trainer)
    tc, stop, results = trainer.tc, trainer.stop, {}
    for split in trainer.data.test_splits:
        if stop is not None and stop.signum is not None:  # training is over and saved: nothing to add
            raise Interrupted(
                f"{stop.name}: stopped before decoding test split {split}; training is finished "
                f"({trainer.ckpt_dir / 'last.pt'}, step {trainer.progress.step}); decode the test splits with: "
                f"python train.py trainer.resume=auto hydra.run.dir={trainer.out_dir} (and the same overrides)",
                stop.signum,
            )
        results[split] = decode_test_split(
            trainer.model,
            trainer.data,
            split,
            trainer.out_dir,
            trainer.eval_batch_tokens,
            tc.beam_size,
            tc.length_penalty,
            trainer.device,
            trainer.autocast,
        )
    return results


def finish(trainer: Trainer, test: Dict[str, Dict[str, float]]) -> Optional[Dict[str, Any]]:
    """Write ``results.json``, the HParams entry and the summary line (rank 0); the results."""
    if not trainer.world.main:
        return None
    results = results_of(
        trainer.progress, trainer.model_cfg.name, trainer.params, trainer.epochs_done(), trainer.device, test
    )
    results["test_weights"] = trainer.test_weights
    results["decode_dtype"] = trainer.precision  # translate.py's --dtype auto decodes the same way
    write_results(trainer.out_dir, results)
    trainer.board.hparams(OmegaConf.to_container(trainer.cfg, resolve=True), hparam_metrics(results))
    log.info("summary: %s", summary_line(results))
    return results
