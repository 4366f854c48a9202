"""When training stops: the limits (``max_steps``, ``max_epochs``, ``max_minutes``), early stopping
(``patience``) and stop signals, agreed by every rank at the same step so that no rank waits for a
collective the others never reach."""

from typing import Optional, Tuple

import torch

from training import distributed
from training.config import TrainerConfig
from training.progress import Progress
from training.signals import StopRequest


def stop_reason(
    tc: TrainerConfig, p: Progress, minutes: float, max_steps: Optional[int] = None
) -> Optional[str]:
    """Why training must stop now, or None; ``max_steps`` is a limit of the caller besides ``tc``'s."""
    if max_steps is not None and p.step >= max_steps:
        return f"{max_steps} steps reached (fit(max_steps))"
    if tc.max_steps is not None and p.step >= tc.max_steps:
        return f"trainer.max_steps={tc.max_steps} reached"
    if tc.max_epochs is not None and p.epoch >= tc.max_epochs:
        return f"trainer.max_epochs={tc.max_epochs} reached"
    if tc.max_minutes is not None and minutes >= tc.max_minutes:
        return f"trainer.max_minutes={tc.max_minutes} reached"
    if tc.patience is not None and p.evals_without_improvement >= tc.patience:
        return f"no better validation BLEU in {tc.patience} evaluations (trainer.patience)"
    return None


def total_steps(tc: TrainerConfig, batches_per_epoch: int, max_steps: Optional[int] = None) -> Optional[int]:
    """Steps of the whole run as far as the limits tell (for the ETA); None without a step or epoch limit."""
    limits = [n for n in (max_steps, tc.max_steps) if n is not None]
    if tc.max_epochs is not None:
        limits.append(-(-batches_per_epoch // tc.accumulate) * tc.max_epochs)
    return min(limits) if limits else None


def agree(
    stop: Optional[StopRequest], reason: Optional[str], device: torch.device
) -> Tuple[Optional[int], Optional[str]]:
    """After a step, on every rank at once: the stop signal any rank received (or None) and the reason
    to stop that rank 0 sees (it alone holds the scores; others pass None). One small all-reduce per
    step (none in a single process); the reason's text is broadcast only on the step that stops."""
    received = stop.signum if stop is not None else None
    signum, stopping = distributed.agree_to_stop(received, reason is not None, device)
    if signum is not None and stop is not None:
        stop.signum = signum  # a rank that received nothing itself stops on the others' signal
    return signum, distributed.broadcast(reason, device) if stopping else None
