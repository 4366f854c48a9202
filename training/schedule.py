"""Learning-rate schedules as pure functions of the optimizer step (1-based).

Two kinds:
- open-ended (``inverse_sqrt``, ``exponential``, ``constant``): the rate depends on the step only;
- fitted to the run (``linear``, ``cosine``): the rate decays from the peak to ``min_lr`` exactly at
  the run's last step (``horizon``), so the run ends with the small steps that settle the weights
  whatever its length. A run shorter than four warm-ups gets a warm-up of a quarter of its steps.
"""

import math
from typing import Optional

OPEN_ENDED = ("inverse_sqrt", "exponential", "constant")
FITTED = ("linear", "cosine")
SCHEDULES = OPEN_ENDED + FITTED
MAX_WARMUP_SHARE = 0.25  # of a fitted schedule's horizon


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warm-up from ``1 / warmup_steps`` to 1 over the first ``warmup_steps`` steps."""
    return min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0


def fitted_warmup(warmup_steps: int, horizon: int) -> int:
    """The warm-up of a fitted schedule: ``warmup_steps``, or a quarter of a shorter run."""
    return min(warmup_steps, int(horizon * MAX_WARMUP_SHARE))


def decayed(progress: float, schedule: str) -> float:
    """The share of the way from ``min_lr`` to the peak left at ``progress`` (0 to 1) of the decay."""
    progress = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine (Loshchilov & Hutter 2017), no restarts


def lr_at(
    step: int,
    schedule: str,
    lr: float,
    warmup_steps: int,
    decay_rate: float = 0.5,
    decay_steps: int = 1000,
    min_lr: float = 0.0,
    horizon: Optional[int] = None,
) -> float:
    """Learning rate of optimizer step ``step`` (the first update is step 1).

    - ``inverse_sqrt`` (Vaswani et al. 2017, section 5.3, with ``lr`` as the peak): linear warm-up,
      then ``lr * sqrt(warmup_steps / step)``.
    - ``exponential``: warm-up, then ``lr * decay_rate ** ((step - warmup_steps) / decay_steps)``.
    - ``constant``: warm-up, then ``lr``.
    - ``linear`` / ``cosine``: warm-up (at most a quarter of ``horizon``), then a linear or
      half-cosine decay that reaches ``min_lr`` at step ``horizon`` and stays there.

    After the warm-up the rate never goes below ``min_lr``.
    """
    step = max(step, 1)
    if schedule not in SCHEDULES:
        raise ValueError(f"trainer.schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule in FITTED:
        if horizon is None or horizon < 1:
            raise ValueError(f"the {schedule} schedule needs the run's length in steps, got {horizon}")
        warmup_steps = fitted_warmup(warmup_steps, horizon)
    if step <= warmup_steps:
        return lr * warmup_factor(step, warmup_steps)
    if schedule in FITTED:
        progress = (step - warmup_steps) / max(horizon - warmup_steps, 1)
        return min_lr + (lr - min_lr) * decayed(progress, schedule)
    if schedule == "inverse_sqrt":
        rate = lr * math.sqrt(warmup_steps / step) if warmup_steps > 0 else lr / math.sqrt(step)
    elif schedule == "exponential":
        rate = lr * decay_rate ** ((step - warmup_steps) / decay_steps)
    else:
        rate = lr
    return max(rate, min_lr)
