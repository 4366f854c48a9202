"""Stopping a run on SIGINT / SIGTERM without losing it.

The first signal asks the training loop to stop after the step in progress: it saves
``checkpoints/last.pt`` (with the position inside the epoch) and the run exits with
``INTERRUPTED`` (75, EX_TEMPFAIL: try again later), not 1 (an error), so schedulers and scripts
can tell a stop to resume from a crash. A second signal exits at once with ``128 + signal``;
checkpoints are written to a temporary file and renamed, so the previous ``last.pt`` is intact.
A signal that the process inherited as ignored (SIGINT under ``nohup ... &``) stays ignored.
"""

import logging
import os
import signal
import threading
from types import FrameType
from typing import Dict, Optional

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
