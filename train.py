"""Train a model: ``python train.py [OVERRIDES]`` (Hydra; see conf/ and README).

A thin wrapper: composes the config, prepares the run in Hydra's output folder (every refusal
happens there), records the config in ``.hydra/`` and trains. Hydra's own ``.hydra/`` writing is
off (``hydra.output_subdir: null``) because it comes before any check: a refused run must leave
the folder of an earlier run as it was.
"""

import atexit
import logging
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from common.checkpoint import CheckpointError
from common.device import pick_device
from common.files import AtomicFile
from data.errors import DataError
from training import distributed
from training.config import register_configs
from training.run import prepare, run
from training.run_folder import RunFolderError
from training.stopping import INTERRUPTED, Interrupted
from training.trainer import TrainingError

CONF_DIR = str(Path(__file__).resolve().parent / "conf")
register_configs()
log = logging.getLogger("train")


def record_config(out_dir: Path, cfg: DictConfig) -> None:
    """Write ``.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` as Hydra would."""
    hydra_cfg = HydraConfig.get()
    folder = out_dir / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    for name, node in [
        ("config.yaml", cfg),
        ("hydra.yaml", OmegaConf.create({"hydra": hydra_cfg})),
        ("overrides.yaml", hydra_cfg.overrides.task),
    ]:
        with AtomicFile(folder / name) as out:
            out.write(OmegaConf.to_yaml(node))


def log_to_file(level: int, message: str) -> None:
    """Record ``message`` in ``train.log`` alone: the terminal gets it once, on stderr."""
    record = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def agree_on_run_dir(cfg: DictConfig, out_dir: Path) -> Path:
    """Under torchrun, join the process group and take rank 0's run folder (each process's Hydra
    made its own; only rank 0's is used)."""
    distributed.export_job_ranks()
    world = distributed.world_from_env()
    if not world.distributed:
        return out_dir
    if not world.main:  # quiet: warnings and errors only, and never into rank 0's train.log
        root = logging.getLogger()
        root.setLevel(logging.WARNING)
        for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
            root.removeHandler(handler)
    device = pick_device(cfg.device, world.local_rank, world.local_world_size)
    distributed.init(world, device)
    return Path(distributed.broadcast(str(out_dir), device))


def quiet_other_ranks() -> None:
    """Ranks other than 0 of a torchrun job write nothing: no log file, no .hydra, and a
    throw-away Hydra folder (removed at exit) instead of a second run folder."""
    if distributed.world_from_env().main:
        return
    scratch = tempfile.mkdtemp(prefix="nmt-rank-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    sys.argv += ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled", f"hydra.run.dir={scratch}"]


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    hydra_cfg = HydraConfig.get()
    try:
        out_dir = agree_on_run_dir(cfg, Path(hydra_cfg.runtime.output_dir))
        trainer = prepare(cfg, out_dir)
        if trainer.setup.world.main:
            record_config(out_dir, cfg)
        results = run(trainer)
        distributed.close()
    except KeyboardInterrupt:  # Ctrl-C while the data loads: no training state exists yet
        print("interrupted: SIGINT before training started; nothing was saved", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
    except Interrupted as stop:
        log_to_file(logging.WARNING, str(stop))
        if distributed.world_from_env().main:  # the other ranks of a torchrun job stopped with it, quietly
            print(f"interrupted: {stop}", file=sys.stderr)
        sys.exit(INTERRUPTED)  # not 1: a stop to resume from, not a failure (ends a sweep too)
    except (DataError, CheckpointError, TrainingError, RunFolderError, ConfigKeyError, ValueError) as error:
        log_to_file(logging.ERROR, f"error: {error}")
        if hydra_cfg.mode == RunMode.MULTIRUN:
            raise  # Hydra records the failed job and goes on with the sweep (exit code 1 at the end)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    return results["valid"]["bleu"] if results else None


if __name__ == "__main__":
    quiet_other_ranks()
    main()
