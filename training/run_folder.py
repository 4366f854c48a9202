"""The run folder's guards: a run never silently writes over another one, and an unusable folder
is refused before anything is written.

``check_run_folder`` and the folder's lock (one process trains into a folder at a time) run twice:
from the Hydra callback ``RunFolderCheck`` (``conf/config.yaml``, ``hydra.callbacks``), before
Hydra creates the folder, opens ``train.log`` or does anything else there; and from
``training.run.prepare`` (in-process callers and each job of a sweep).
"""

import fcntl
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from training.distributed import world_from_env


class RunFolderError(Exception):
    """A run folder that must not or cannot take this run; the message says what to do."""


def check_run_folder(out_dir: Path, resume: Optional[str]) -> None:
    """A folder that holds a finished run (``results.json``) or an interrupted one
    (``checkpoints/last.pt``) refuses a new run: ``trainer.resume=auto`` (or a path to one of its
    own checkpoints) continues it. ``trainer.resume=auto`` needs a ``last.pt`` to continue."""
    last = out_dir / "checkpoints" / "last.pt"
    if resume == "auto":
        if not last.is_file():
            raise RunFolderError(
                f"trainer.resume=auto: nothing to resume, {last} does not exist; point hydra.run.dir at the "
                "run folder to continue, or leave trainer.resume out to start a new run"
            )
        return
    if (out_dir / "results.json").is_file():
        held = "a finished run (results.json)"
    elif last.is_file():
        held = f"an unfinished run ({last})"
    else:
        return
    if resume is not None and Path(resume).resolve().parent == last.parent.resolve():
        return  # continuing from one of this run's own checkpoints
    raise RunFolderError(
        f"{out_dir} already holds {held}; a new run there would overwrite it: choose another hydra.run.dir, "
        "or continue this one with trainer.resume=auto (for example with a larger trainer.max_epochs)"
    )


def resume_command(out_dir: Path) -> str:
    """The command that continues the run in ``out_dir`` from its ``last.pt``."""
    return f"python train.py trainer.resume=auto hydra.run.dir={out_dir} (and the same overrides)"


def resume_path(out_dir: Path, resume: Optional[str]) -> Optional[Path]:
    """The checkpoint ``trainer.resume`` names: none, this run folder's ``last.pt``, or a path."""
    if resume is None:
        return None
    return out_dir / "checkpoints" / "last.pt" if resume == "auto" else Path(resume)


def check_writable(folder: Path, key: str) -> None:
    """Create ``folder`` if needed and write (and remove) a file in it; ``key`` names the setting."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise RunFolderError(
            f"cannot write into {key}={folder} ({error.strerror}): choose a writable folder"
        ) from None


_LOCKS: Dict[Path, int] = {}  # run folder -> the open descriptor that holds its lock in this process


def forget_locks() -> None:
    """In a child forked from a trainer: close its copies of the run folders' lock descriptors. The
    locks stay with the trainer, which holds its own; a child that outlived it would hold them."""
    for descriptor in _LOCKS.values():
        os.close(descriptor)
    _LOCKS.clear()


def lock_run_folder(out_dir: Path) -> None:
    """Hold an exclusive ``flock`` on the run folder (created if needed) until ``unlock_run_folder``
    or the end of this process: a second process that trains into the same folder is refused.
    Taking it again in the process that holds it does nothing. Nothing is written into the folder."""
    folder = Path(out_dir).resolve()
    if folder in _LOCKS:
        return
    folder.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        raise RunFolderError(
            f"another process is training in {out_dir} (it holds the folder's lock): wait for it to end, "
            "or choose another hydra.run.dir"
        ) from None
    _LOCKS[folder] = handle


def unlock_run_folder(out_dir: Path) -> None:
    handle = _LOCKS.pop(Path(out_dir).resolve(), None)
    if handle is not None:
        os.close(handle)  # closing the descriptor releases the lock


def claim_run_folder(out_dir: Path, resume: Optional[str]) -> None:
    """Check that ``out_dir`` may take this run (``check_run_folder``), create it and lock it. A
    folder that exists is locked first, so a run still going on there is named as such; a refused
    run leaves no new folder behind."""
    if out_dir.is_dir():
        lock_run_folder(out_dir)
    check_run_folder(out_dir, resume)
    check_writable(out_dir, "hydra.run.dir")
    lock_run_folder(out_dir)


class RunFolderCheck(Callback):
    """Hydra callback: refuse a run (one ``error:`` line, exit 1) before Hydra touches its folder."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not world_from_env().main:  # torchrun: rank 0 checks the run folder, the others use its
            return
        folder = Path(str(config.hydra.run.dir))
        self._refuse_on_error(lambda: claim_run_folder(folder, config.trainer.get("resume")))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._refuse_on_error(lambda: check_writable(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir"))

    @staticmethod
    def _refuse_on_error(check) -> None:
        try:
            check()
        except RunFolderError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(1)
