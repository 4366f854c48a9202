"""A run in its folder: ``train(cfg, out_dir)`` is ``run(prepare(cfg, out_dir))``.

``prepare`` checks and locks the run folder, builds the ``Trainer`` (``training/trainer.py``) and
restores ``trainer.resume``: every refusal happens there, before anything is written. ``run``
trains with SIGINT / SIGTERM handled (``training/stopping.py``), then ends the run: it chooses the
test weights, decodes the test splits with them and writes ``results.json``
(``training/results.py``), each step a function of what it is given.
"""

import logging
from pathlib import Path
from typing import Any, Dict, Optional

from omegaconf import DictConfig, OmegaConf

from training import distributed
from training.results import choose_test_weights, decode_tests, finish, results_of
from training.run_folder import check_run_folder, claim_run_folder, unlock_run_folder
from training.stopping import StopRequest
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
    the other ranks: None). SIGINT / SIGTERM stop it cleanly from here on (``training/stopping.py``)."""
    try:
        with StopRequest() as stop:
            reason = trainer.fit(stop=stop)
            log.info("training stopped: %s", reason)
            if not trainer.setup.world.main:
                return None
            used = choose_test_weights(
                trainer.setup, trainer.progress, trainer.ema is not None, trainer.validate_weights
            )
            test = decode_tests(trainer.setup, stop, trainer.progress.step)
        results = results_of(trainer.progress, trainer.setup, trainer.epochs_done(), test)
        results["test_weights"] = used
        results["decode_dtype"] = trainer.setup.precision  # translate.py's --dtype auto decodes the same way
        finish(
            trainer.setup.out_dir, results, trainer.board, OmegaConf.to_container(trainer.cfg, resolve=True)
        )
        return results
    finally:
        trainer.close()


def train(cfg: DictConfig, out_dir: Path) -> Dict[str, Any]:
    """Train the model ``cfg`` describes in the run folder ``out_dir``: ``run(prepare(...))``."""
    return run(prepare(cfg, out_dir))
