"""Learning-rate schedules as pure functions of the optimizer step (1-based)."""

import math

SCHEDULES = ("inverse_sqrt", "exponential", "constant")


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warm-up from ``1 / warmup_steps`` to 1 over the first ``warmup_steps`` steps."""
    return min(1.0, step / warmup_steps) if warmup_steps > 0 else 1.0


def lr_at(
    step: int,
    schedule: str,
    lr: float,
    warmup_steps: int,
    decay_rate: float = 0.5,
    decay_steps: int = 1000,
    min_lr: float = 0.0,
) -> float:
    """Learning rate of optimizer step ``step`` (the first update is step 1).

    - ``inverse_sqrt`` (Vaswani et al. 2017, section 5.3, with ``lr`` as the peak): linear warm-up,
      then ``lr * sqrt(warmup_steps / step)``.
    - ``exponential``: warm-up, then ``lr * decay_rate ** ((step - warmup_steps) / decay_steps)``.
    - ``constant``: warm-up, then ``lr``.

    After the warm-up the rate never goes below ``min_lr``.
    """
    step = max(step, 1)
    if schedule not in SCHEDULES:
        raise ValueError(f"trainer.schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if step <= warmup_steps:
        return lr * warmup_factor(step, warmup_steps)
    if schedule == "inverse_sqrt":
        rate = lr * math.sqrt(warmup_steps / step) if warmup_steps > 0 else lr / math.sqrt(step)
    elif schedule == "exponential":
        rate = lr * decay_rate ** ((step - warmup_steps) / decay_steps)
    else:
        rate = lr
    return max(rate, min_lr)
