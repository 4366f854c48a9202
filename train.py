"""Train a model: ``python train.py [OVERRIDES]`` (Hydra; see conf/ and README).

A thin wrapper: composes the config, then calls ``training.trainer.train(cfg, out_dir)`` with
Hydra's output folder as the run folder.
"""
import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from data.errors import DataError
from training.checkpoint import CheckpointError
from training.config import register_configs
from training.signals import INTERRUPTED, Interrupted
from training.trainer import TrainingError, train

CONF_DIR = str(Path(__file__).resolve().parent / "conf")
register_configs()
log = logging.getLogger("train")


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    try:
        results = train(cfg, Path(hydra_cfg.runtime.output_dir))
    except Interrupted as stop:
        log.warning("%s", stop)
        print(f"interrupted: {stop}", file=sys.stderr)
        sys.exit(INTERRUPTED)  # not 1: a stop to resume from, not a failure (ends a sweep too)
    except (DataError, CheckpointError, TrainingError, ValueError) as error:
        log.error("error: %s", error)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            raise  # Hydra records the failed job and goes on with the sweep (exit code 1 at the end)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    return results["valid"]["bleu"]


if __name__ == "__main__":
    main()
