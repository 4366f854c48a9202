"""Learning-rate schedules as pure functions of the optimizer step (1-based).

Two kinds:
- open-ended (``inverse_sqrt``, ``exponential``, ``constant``): the rate depends on the step only;
- fitted to the run (``linear``, ``cosine``): the rate decays from the peak to ``min_lr`` exactly at
  the run's last step (``horizon``), so the run ends with the small steps that settle the weights
  whatever its length. A run shorter than four warm-ups gets a warm-up of a quarter of its steps.

``Schedule`` is a run's schedule, its horizon included: the trainer asks it for each step's rate.
"""

import math
from dataclasses import dataclass
from typing import Any, Optional

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


@dataclass(frozen=True)
class Schedule:
    """The learning rate of a run: its kind, peak, warm-up, floor and, for a fitted schedule, its
    horizon (the step where the decay reaches ``min_lr``), fixed when the run starts."""

    kind: str
    peak: float
    warmup_steps: int
    min_lr: float
    decay_rate: float = 0.5
    decay_steps: int = 1000
    horizon: Optional[int] = None

    @classmethod
    def of_run(cls, tc: Any, run_steps: Optional[int]) -> "Schedule":
        """The schedule of ``trainer.*`` (``tc``) for a run of ``run_steps`` optimizer steps (None:
        no step or epoch limit). A fitted schedule ends at ``trainer.schedule_steps``, else there."""
        horizon = tc.schedule_steps if tc.schedule_steps is not None else run_steps
        return cls(tc.schedule, tc.lr, tc.warmup_steps, tc.min_lr, tc.decay_rate, tc.decay_steps, horizon)

    def lr(self, step: int) -> float:
        """The rate of optimizer step ``step`` (1-based): ``lr_at``."""
        return lr_at(
            step,
            self.kind,
            self.peak,
            self.warmup_steps,
            self.decay_rate,
            self.decay_steps,
            self.min_lr,
            self.horizon,
        )

    def describe(self) -> str:
        """The log line of the schedule: its peak, warm-up and, when fitted, its end."""
        if self.kind in FITTED:
            warmup = fitted_warmup(self.warmup_steps, self.horizon)
            return (
                f"schedule: {self.kind}, {warmup} warm-up steps to {self.peak:g}, then down to "
                f"{self.min_lr:g} at step {self.horizon}"
            )
        return f"schedule: {self.kind}, {self.warmup_steps} warm-up steps to {self.peak:g}"
