"""The checkpoints a run keeps and the averages of weights: ``step_<step>.pt`` beside ``last.pt`` for
the last evaluations (``trainer.keep_last``, ``trainer.average_last``), an exponential moving
average kept while training (``trainer.ema_decay``) and the plain mean of saved checkpoints
(``scripts/average_checkpoints.py``, ``trainer.average_last``).

Both smooth out the noise of the last updates; the averaged weights are an ordinary model state,
saved as an ordinary checkpoint that ``translate.py`` and ``scripts/compare.py`` take.
"""

import re
from pathlib import Path
from typing import Any, Dict, List, Sequence

import torch
from torch import Tensor, nn

from common.checkpoint import CheckpointError, link_checkpoint, load_checkpoint

STEP_CHECKPOINT = re.compile(r"step_(\d+)\.pt$")


def step_checkpoints(folder: Path) -> List[Path]:
    """The ``step_<step>.pt`` checkpoints of a run's checkpoint folder, oldest (lowest step) first."""
    found = [(m, path) for path in Path(folder).glob("step_*.pt") if (m := STEP_CHECKPOINT.search(path.name))]
    return [path for m, path in sorted(found, key=lambda item: int(item[0].group(1)))]


def keep_recent(folder: Path, step: int, keep: int) -> None:
    """Keep ``last.pt`` as ``step_<step>.pt`` too (``link_checkpoint``: no second write), and only
    the ``keep`` newest of those."""
    link_checkpoint(folder / "last.pt", folder / f"step_{step:07d}.pt")
    for old in step_checkpoints(folder)[:-keep]:
        old.unlink()


def ema_decay_at(decay: float, step: int) -> float:
    """The decay of update ``step``: ``decay``, lower early on, ``(1 + step) / (10 + step)``, so
    that the initial weights do not linger in the average of a short run."""
    return min(decay, (1.0 + step) / (10.0 + step))


class ExponentialAverage:
    """``ema = d * ema + (1 - d) * weights`` after every update, in float32, for the floating-point
    parameters and buffers of a model (others are copied as they are)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay  # in (0, 1): training/config.py checks trainer.ema_decay
        own = model.state_dict()  # views of the model's tensors: updated in place by every step
        self.state = {
            k: v.detach().clone().float() if v.is_floating_point() else v.detach().clone()
            for k, v in own.items()
        }
        # (average, weights) pairs, found once: the update on every step does no lookups
        self.floats = [(self.state[k], v) for k, v in own.items() if v.is_floating_point()]
        self.others = [(self.state[k], v) for k, v in own.items() if not v.is_floating_point()]

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold the model's weights after update ``step`` into the average."""
        weight = 1.0 - ema_decay_at(self.decay, step)
        for average, value in self.others:
            average.copy_(value)
        torch._foreach_lerp_([a for a, _ in self.floats], [v.float() for _, v in self.floats], weight)

    def state_dict(self) -> Dict[str, Tensor]:
        return self.state

    def load_state_dict(self, state: Dict[str, Tensor]) -> None:
        for name, value in state.items():
            self.state[name].copy_(value)


def mean_state(states: Sequence[Dict[str, Tensor]]) -> Dict[str, Tensor]:
    """The element-wise mean of model states (accumulated in float64, returned in each tensor's own
    dtype); tensors that are not floating point must be equal in every state and are kept."""
    if not states:
        raise ValueError("no model states to average")
    first = states[0]
    out = {}
    for name, value in first.items():
        if not value.is_floating_point():
            if any(not torch.equal(state[name], value) for state in states[1:]):
                raise ValueError(f"{name} is not floating point and differs between the checkpoints")
            out[name] = value.clone()
            continue
        total = torch.zeros_like(value, dtype=torch.float64)
        for state in states:
            total += state[name].to(torch.float64)
        out[name] = (total / len(states)).to(value.dtype)
    return out


def average_checkpoints(paths: Sequence[Path]) -> Dict[str, Any]:
    """An ordinary checkpoint whose weights are the mean of the checkpoints at ``paths``, which must
    hold the same model and vocabulary; the rest (config, progress) is the last one's. The optimizer
    and random states are left out: an average is for translating, not for resuming."""
    payloads = [load_checkpoint(Path(p)) for p in paths]
    if not payloads:
        raise ValueError("no checkpoints to average")
    last = payloads[-1]
    for path, payload in zip(paths, payloads):
        if "tokenizer" not in payload:
            raise CheckpointError(f"{path} holds no tokenizer (not a checkpoint of this project)")
        if payload["model_config"] != last["model_config"]:
            raise CheckpointError(f"{path} holds another model ({payload['model_config']}) than {paths[-1]}")
        if payload["tokenizer"] != last["tokenizer"]:
            raise CheckpointError(f"{path} has another vocabulary than {paths[-1]}")
        if payload["model"].keys() != last["model"].keys():
            raise CheckpointError(f"{path} holds other weights than {paths[-1]}")
    averaged = {
        k: v for k, v in last.items() if k not in ("model", "optimizer", "rng", "rng_ranks", "ema", "format")
    }
    averaged["model"] = mean_state([payload["model"] for payload in payloads])
    averaged["averaged_from"] = [str(p) for p in paths]
    return averaged


def last_checkpoints(ckpt_dir: Path, n: int) -> List[Path]:
    """The ``n`` newest ``step_<step>.pt`` of a run's checkpoint folder (kept by ``trainer.keep_last``),
    oldest first; fewer when fewer are there, none for ``n`` < 1."""
    return step_checkpoints(ckpt_dir)[-n:] if n > 0 else []
