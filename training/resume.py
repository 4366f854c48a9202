"""Continuing a run from a checkpoint: only with the model, the vocabulary and the settings that
decide the batches it was trained with (anything else could not give the run it continues)."""

import logging
import shutil
from pathlib import Path
from typing import Any, Dict

from common.checkpoint import CheckpointError
from common.settings import NOT_SETTINGS, flatten
from data.batching import BATCH_ORDER

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
    changed = config_changes(payload["model_config"], model_config)
    if changed:
        raise CheckpointError(
            f"checkpoint {path} was trained with another model config: {changed}; resume with the same model.* settings"
        )
    changed = config_changes(
        batch_order_settings(payload.get("config", {})), batch_order_settings(config), prefix=""
    )
    if changed:
        raise CheckpointError(
            f"checkpoint {path} was trained with other settings that decide the batches: {changed}; an exact resume "
            "needs the same ones (to change them, start a new run)"
        )
    if payload["tokenizer"] != tokenizer:
        raise CheckpointError(
            f"checkpoint {path} was trained with another vocabulary: check the data.* settings"
        )


def warn_batch_order(payload: Dict[str, Any], path: Path) -> None:
    """A checkpoint saved by a version that ordered batches otherwise (``batch_order`` 1: before
    the token store of issue 18) resumes, but its epochs take this version's order: say so."""
    saved = payload.get("batch_order", 1)
    if saved != BATCH_ORDER:
        log.warning(
            "checkpoint %s was saved with batch order %d, this version has %d: the run continues, but its "
            "epochs' batches are not those the interrupted run would have had",
            path,
            saved,
            BATCH_ORDER,
        )


def adopt_best(source: Path, ckpt_dir: Path) -> None:
    """A run continued from another run's checkpoint takes that run's ``best.pt`` too (the best
    weights so far belong to this run as well)."""
    best = source.parent / "best.pt"
    if source.parent.resolve() != ckpt_dir.resolve() and best.is_file():
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(best, ckpt_dir / "best.pt")


def remove_stale_temporaries(ckpt_dir: Path) -> None:
    """Remove the temporary files of saves cut short by SIGKILL or a crash (never renamed into place)."""
    for stale in ckpt_dir.glob(".*.pt.*.tmp"):
        log.info("removing %s, the temporary file of a save that did not finish", stale)
        stale.unlink()
