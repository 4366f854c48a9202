"""The training side of checkpoints: the random generators a resumed run restores, and the
checkpoints of the last evaluations kept beside ``last.pt`` (``trainer.keep_last``,
``trainer.average_last``). Writing and reading the files: ``common/checkpoint.py``."""

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from common.files import AtomicFile
from models.seq2seq import map_state


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
