"""Checkpoint files: plain dicts of tensors and plain data, written atomically and read without
running code.

A checkpoint loads with ``torch.load(path, weights_only=True)`` and holds everything
``translate.py`` needs (``model``, ``model_config``, ``tokenizer``) plus the training state for
resuming (optimizer, step, epoch, RNG states, the resolved config). Training writes them
(``training/trainer.py``); translation reads them (``inference/translator.py``).
"""

import io
import pickle
import re
from pathlib import Path
from typing import IO, Any, Dict

import torch

from common.files import AtomicFile, same_file

FORMAT = 1


class CheckpointError(Exception):
    """A checkpoint that is missing, unreadable or not one of ours; the message says which."""


class _Writes(io.RawIOBase):
    """A binary stream that keeps the first ``OSError`` of its writes (``error``): torch.save
    reports a failed write (a full disk) as a ``RuntimeError`` of its own that does not say why."""

    def __init__(self, stream: IO[bytes]):
        self.stream, self.error = stream, None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        try:
            return self.stream.write(data)
        except OSError as error:
            self.error = self.error or error
            raise


def save_checkpoint(payload: Dict[str, Any], path: Path) -> None:
    """Write ``payload`` to ``path`` through a temporary file, fsync and a rename, so that a crash or
    a full disk never leaves a half-written checkpoint in place of a good one. A write that fails
    (a full disk, a lost mount) raises ``CheckpointError`` naming the file and the reason."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writes = None
    try:
        with AtomicFile(path, "wb") as out:
            writes = _Writes(out)
            torch.save(dict(payload, format=FORMAT), writes)
    except (OSError, RuntimeError) as error:
        cause = writes.error if writes is not None and writes.error is not None else error
        if not isinstance(cause, OSError):
            raise  # not a failed write: a bug, with its traceback
        raise write_failure(path, cause) from None


def write_failure(path: Path, cause: OSError) -> CheckpointError:
    """The error of a checkpoint write to ``path`` that failed with ``cause``: the file, the reason,
    and whether the checkpoint it was to replace is there."""
    before = f"the previous {path.name} is intact" if path.is_file() else f"no {path.name} was written"
    return CheckpointError(f"cannot write checkpoint {path}: {cause.strerror or cause}; {before}")


def link_checkpoint(source: Path, target: Path) -> None:
    """``target`` becomes the checkpoint ``source`` (``common.files.same_file``: a hard link, its
    bytes not written twice), whole or not at all; a failure raises ``CheckpointError`` as
    ``save_checkpoint``'s do."""
    try:
        same_file(source, target)
    except OSError as error:
        raise write_failure(target, error) from None


def load_checkpoint(path: Path, map_location: Any = "cpu") -> Dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint`` (weights-only unpickling: no code runs)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"checkpoint {path} cannot be read: {_load_failure(error)}") from None
    if not isinstance(payload, dict) or "model" not in payload or "model_config" not in payload:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no model or model_config)")
    if payload.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {payload.get('format')!r}, this version reads {FORMAT}"
        )
    return payload


def _load_failure(error: Exception) -> str:
    """What went wrong in ``torch.load``, in one line (torch's messages run over several)."""
    message = str(error)
    if "GLOBAL" in message:  # weights-only unpickling met a class or function: nothing was run
        found = re.search(r"GLOBAL (\S+)", message)
        what = found.group(1) if found else "a Python object"
        return f"it holds pickled code or objects ({what}), not only tensors and plain data; refused, nothing was run"
    if isinstance(error, pickle.UnpicklingError) or "Weights only load failed" in message:
        return "not a file written by torch.save"
    if isinstance(error, PermissionError):
        return "permission denied"
    if isinstance(error, (EOFError, OSError)) or "zip archive" in message or "central directory" in message:
        return "the file is truncated or corrupt"
    lines = [line for line in message.splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
