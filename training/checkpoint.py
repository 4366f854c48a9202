"""Checkpoints: plain dicts of tensors and plain data, written atomically.

A checkpoint loads with ``torch.load(path, weights_only=True)`` and holds everything
``translate.py`` needs (``model``, ``model_config``, ``tokenizer``) plus the training state for
resuming (optimizer, step, epoch, RNG states, the resolved config).
"""
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Dict

import torch

from models.seq2seq import map_state

FORMAT = 1


class CheckpointError(Exception):
    """A checkpoint that is missing, unreadable or not one of ours; the message says which."""


def save_checkpoint(payload: Dict[str, Any], path: Path) -> None:
    """Write ``payload`` to ``path`` through a temporary file and a rename, so that a crash or a
    full disk never leaves a half-written checkpoint in place of a good one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            torch.save(dict(payload, format=FORMAT), out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes the file private; give it normal permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def load_checkpoint(path: Path, map_location: Any = "cpu") -> Dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint`` (weights-only unpickling: no code runs)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises several types for truncated or foreign files
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}: {str(error).splitlines()[0]})") from None
    if not isinstance(payload, dict) or "model" not in payload or "model_config" not in payload:
        raise CheckpointError(f"{path} is not a checkpoint of this project (no model or model_config)")
    if payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {payload.get('format')!r}, this version reads {FORMAT}")
    return payload


def to_cpu(tree: Any) -> Any:
    """A copy of a nest of dicts / lists / tuples with every tensor on the CPU (loadable anywhere)."""
    return map_state(tree, lambda tensor: tensor.detach().cpu())


def rng_states() -> Dict[str, Any]:
    states = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Dict[str, Any]) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
