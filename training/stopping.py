"""When training stops: the limits (``max_steps``, ``max_epochs``, ``max_minutes``), early stopping
(``patience``) and stop signals, agreed by every rank at the same step so that no rank waits for a
collective the others never reach.

Stopping on SIGINT / SIGTERM without losing the run: the first signal asks the training loop to
stop after the step in progress; it saves ``checkpoints/last.pt`` (with the position inside the
epoch) and the run exits with ``INTERRUPTED`` (75, EX_TEMPFAIL: try again later), not 1 (an
error), so schedulers and scripts can tell a stop to resume from a crash. A second signal exits at
once with ``128 + signal``; checkpoints are written to a temporary file and renamed, so the previous
``last.pt`` is intact. A signal that the process inherited as ignored (SIGINT under
``nohup ... &``) stays ignored."""

import logging
import os
import signal
import threading
from types import FrameType
from typing import Dict, Optional, Tuple

import torch

from training import distributed
from training.config import TrainerConfig
from training.progress import Progress

log = logging.getLogger(__name__)


INTERRUPTED = 75
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """Training stopped on a signal after saving ``last.pt``; the message says how to resume."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class StopRequest:
    """Installs the handlers while the ``with`` block runs (main thread only; elsewhere a no-op)."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: Dict[int, object] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.signum is not None:
            log.error(
                "second %s: exiting at once (checkpoints/last.pt is the one saved before)",
                signal.Signals(signum).name,
            )
            logging.shutdown()
            os._exit(128 + signum)
        self.signum = signum
        log.warning(
            "%s: stopping after the current step and saving checkpoints/last.pt (send it again to exit at once)",
            signal.Signals(signum).name,
        )

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                if signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # ignored by whoever started us (nohup, a background job): it stays ignored, as in Python
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


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
