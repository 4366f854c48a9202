"""Continuing a run from a checkpoint: only with the model, the vocabulary and the settings that
decide the batches it was trained with (anything else could not give the run it continues); each
rank's random generators, saved in every checkpoint and restored as they were, and what cannot be
restored exactly said once."""

import logging
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from common.checkpoint import CheckpointError, link_checkpoint
from common.settings import NOT_SETTINGS, flatten
from data.config import DataConfig
from models.config import config_from_dict
from models.search import map_state
from training.distributed import World

log = logging.getLogger(__name__)

BATCH_ORDER_KEYS = ("seed", "trainer.batch_tokens", "trainer.accumulate")  # besides data.*


def config_changes(saved: Dict[str, Any], now: Dict[str, Any], prefix: str = "model.") -> str:
    """The keys whose values differ, as ``model.d_model (checkpoint 256, now 512)``; empty when none."""
    keys = sorted(set(saved) | set(now))
    return ", ".join(
        f"{prefix}{k} (checkpoint {saved.get(k)!r}, now {now.get(k)!r})"
        for k in keys
        if saved.get(k) != now.get(k)
    )


def batch_order_settings(config: Dict[str, Any]) -> Dict[str, Any]:
    """The flattened settings that decide each epoch's batches: the data, the batching and the seed."""
    flat = flatten(config)
    return {
        k: v
        for k, v in flat.items()
        if (k.startswith("data.") and k not in NOT_SETTINGS) or k in BATCH_ORDER_KEYS
    }


def saved_batch_settings(config: Dict[str, Any], now: Dict[str, Any]) -> Dict[str, Any]:
    """``batch_order_settings`` of a checkpoint's config; a data key it is older than (one ``now``
    has and it lacks) holds that key's default, as the run that wrote it did."""
    saved = batch_order_settings(config)
    defaults = {f"data.{key}": value for key, value in asdict(DataConfig()).items()}
    return {**{k: defaults[k] for k in now.keys() - saved.keys() if k in defaults}, **saved}


def check_resumable(
    payload: Dict[str, Any],
    path: Path,
    model_config: Dict[str, Any],
    config: Dict[str, Any],
    tokenizer: Dict[str, Any],
) -> None:
    """Refuse (``CheckpointError``, naming the keys) a checkpoint trained with another model config,
    other batch-deciding settings or another vocabulary than this run's; or one of weights alone."""
    if "optimizer" not in payload or "rng" not in payload:
        raise CheckpointError(
            f"checkpoint {path} holds weights only (an average, ema.pt or average.pt): it translates but does not "
            "resume; resume from last.pt"
        )
    # both with every key (a checkpoint older than a model key holds that key's default)
    saved, now = (asdict(config_from_dict(values)) for values in (payload["model_config"], model_config))
    changed = config_changes(saved, now)
    if changed:
        raise CheckpointError(
            f"checkpoint {path} was trained with another model config: {changed}; resume with the same model.* settings"
        )
    now = batch_order_settings(config)
    changed = config_changes(saved_batch_settings(payload.get("config", {}), now), now, prefix="")
    if changed:
        raise CheckpointError(
            f"checkpoint {path} was trained with other settings that decide the batches: {changed}; an exact resume "
            "needs the same ones (to change them, start a new run)"
        )
    if payload["tokenizer"] != tokenizer:
        raise CheckpointError(
            f"checkpoint {path} was trained with another vocabulary: check the data.* settings"
        )


def adopt_best(source: Path, ckpt_dir: Path) -> None:
    """A run continued from another run's checkpoint takes that run's ``best.pt`` too (the best
    weights so far belong to this run as well)."""
    best = source.parent / "best.pt"
    if source.parent.resolve() != ckpt_dir.resolve() and best.is_file():
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        link_checkpoint(best, ckpt_dir / "best.pt")  # replaced whole: a best.pt here may be last.pt's file


def remove_stale_temporaries(ckpt_dir: Path) -> None:
    """Remove the temporary files of saves cut short by SIGKILL or a crash (never renamed into place)."""
    for stale in ckpt_dir.glob(".*.pt.*.tmp"):
        log.info("removing %s, the temporary file of a save that did not finish", stale)
        stale.unlink()


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


def cudnn_rnn_dropout(model: nn.Module) -> bool:
    """Whether ``model`` has a torch RNN with dropout between its layers: on CUDA, cuDNN draws those
    masks from a state of its own that no checkpoint can hold."""
    return any(isinstance(m, nn.RNNBase) and m.dropout > 0 for m in model.modules())


def restore_rngs(payload: Dict[str, Any], world: World, device: torch.device, model: nn.Module) -> None:
    """This rank's generators from ``payload``; what cannot be restored exactly is logged once."""
    rngs = payload.get("rng_ranks") or [payload["rng"]]
    lost: List[str] = []
    if world.distributed and len(rngs) != world.world_size:
        lost.append(
            f"the checkpoint holds the generators of {len(rngs)} rank(s), this run has {world.world_size}: "
            "each rank takes rank 0's, so dropout masks differ from the interrupted run's"
        )
    lost += set_rng_states(rngs[world.rank] if len(rngs) == world.world_size else rngs[0], device)
    if device.type == "cuda" and cudnn_rnn_dropout(model):
        lost.append("cuDNN keeps the RNN's dropout state out of reach: its masks after resume are new ones")
    for what in lost if world.main else []:
        log.warning("resume on %s is not exact: %s", device, what)
