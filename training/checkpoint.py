"""Checkpoints: plain dicts of tensors and plain data, written atomically.

A checkpoint loads with ``torch.load(path, weights_only=True)`` and holds everything
``translate.py`` needs (``model``, ``model_config``, ``tokenizer``) plus the training state for
resuming (optimizer, step, epoch, RNG states, the resolved config).
"""

import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from common.files import AtomicFile
from data.specials import PAD_ID
from data.tokenizer import Tokenizer
from models.build import build_model
from models.config import config_from_dict
from models.seq2seq import map_state

FORMAT = 1


class CheckpointError(Exception):
    """A checkpoint that is missing, unreadable or not one of ours; the message says which."""


def save_checkpoint(payload: Dict[str, Any], path: Path) -> None:
    """Write ``payload`` to ``path`` through a temporary file, fsync and a rename, so that a crash or
    a full disk never leaves a half-written checkpoint in place of a good one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with AtomicFile(path, "wb") as out:
        torch.save(dict(payload, format=FORMAT), out)


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


def to_cpu(tree: Any) -> Any:
    """A copy of a nest of dicts / lists / tuples with every tensor on the CPU (loadable anywhere)."""
    return map_state(tree, lambda tensor: tensor.detach().cpu())


def rng_states() -> Dict[str, Any]:
    """Python's, NumPy's, torch's and (when present) CUDA's generators, as tensors and plain data
    (``cuda``: one state per visible GPU)."""
    import numpy as np

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def cuda_states_to_restore(
    saved: List[torch.Tensor], visible: int, used: Optional[int]
) -> Tuple[List[torch.Tensor], str]:
    """The CUDA generator states of ``saved`` (one per GPU of the saving process) that the
    ``visible`` GPUs of this one take, GPU ``i`` state ``i``; and, when the GPU this process
    trains on (``used``; None: the CPU) gets none, a line that says so (else empty)."""
    kept = list(saved[:visible])
    if used is None or used < len(kept):
        return kept, ""
    return (
        kept,
        f"the checkpoint holds the generators of {len(saved)} GPU(s), none for GPU {used}: it starts a new one",
    )


def set_rng_states(states: Dict[str, Any], device: Optional[torch.device] = None) -> List[str]:
    """Restore the generators of ``rng_states``; what could not be restored of those that the
    process on ``device`` draws from (empty: all of them)."""
    import numpy as np

    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        n = states["numpy"]
        np.random.set_state(
            (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
        )
    used = (device.index or 0) if device is not None and device.type == "cuda" else None
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    kept, lost = cuda_states_to_restore(states.get("cuda", []), visible, used)
    for index, state in enumerate(kept):
        torch.cuda.set_rng_state(state, index)
    return [lost] if lost else []


def weights_mismatch(expected: Dict[str, Any], given: Dict[str, Any]) -> str:
    """How the weights ``given`` differ from a model's ``expected`` state dict, in one line; empty
    when they fit. Weights of the other model family show as missing and unexpected names."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    shapes = [
        k
        for k in sorted(set(expected) & set(given))
        if not isinstance(given[k], torch.Tensor) or given[k].shape != expected[k].shape
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} weights missing, e.g. {missing[0]}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected, e.g. {unexpected[0]}")
    if shapes:
        k = shapes[0]
        got = tuple(given[k].shape) if isinstance(given[k], torch.Tensor) else type(given[k]).__name__
        parts.append(f"{len(shapes)} of another shape, e.g. {k} {got} instead of {tuple(expected[k].shape)}")
    return "; ".join(parts)


def load_model(path: Path, device: Any = "cpu") -> Tuple[nn.Module, Tokenizer, Dict[str, Any]]:
    """The model (in eval mode, on ``device``) and the tokenizer of a checkpoint, and the checkpoint.

    Everything comes from the file: model config, weights and SentencePiece models.
    """
    return model_of(load_checkpoint(path), path, device)


def model_of(
    payload: Dict[str, Any], path: Path, device: Any = "cpu"
) -> Tuple[nn.Module, Tokenizer, Dict[str, Any]]:
    """``load_model`` of a checkpoint already read from ``path`` (named in the errors)."""
    if "tokenizer" not in payload:
        raise CheckpointError(f"{path} holds no tokenizer (not a checkpoint of this project)")
    try:
        cfg = config_from_dict(dict(payload["model_config"]))
        tokenizer = Tokenizer.from_state_dict(payload["tokenizer"])
        model = build_model(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, PAD_ID)
        mismatch = weights_mismatch(model.state_dict(), payload["model"])
        if mismatch:
            raise ValueError(f"model {cfg.name}: {mismatch}")
    except (ValueError, TypeError, KeyError, RuntimeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint {path} does not match its model config ({first})") from None
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), tokenizer, payload


STEP_CHECKPOINT = re.compile(r"step_(\d+)\.pt$")


def step_checkpoints(folder: Path) -> List[Path]:
    """The ``step_<step>.pt`` checkpoints of a run's checkpoint folder, oldest (lowest step) first."""
    found = [(m, path) for path in Path(folder).glob("step_*.pt") if (m := STEP_CHECKPOINT.search(path.name))]
    return [path for m, path in sorted(found, key=lambda item: int(item[0].group(1)))]


def keep_recent(folder: Path, step: int, keep: int) -> None:
    """Keep ``last.pt`` as ``step_<step>.pt`` too (a hard link: no second write), and only the ``keep`` newest of those."""
    kept = folder / f"step_{step:07d}.pt"
    kept.unlink(missing_ok=True)
    try:
        os.link(folder / "last.pt", kept)
    except OSError:  # no hard links on this file system: a copy, atomic like every checkpoint write
        with open(folder / "last.pt", "rb") as source, AtomicFile(kept, "wb") as out:
            shutil.copyfileobj(source, out)
    for old in step_checkpoints(folder)[:-keep]:
        old.unlink()
