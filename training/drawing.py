"""The attention heatmaps of an evaluation, drawn in a process of their own while training goes on.

Drawing is matplotlib's work on the CPU, about half a second an image: an evaluation of the default
Transformer draws 32 (``trainer.attention_samples`` sentences, eight maps each), which took longer
than its greedy decoding of the validation split on 2 CPU cores and most of an evaluation on a
GPU. So ``Drawing`` hands each evaluation's maps to one worker process and the images come back as
finished TensorBoard summaries (PNG inside), which ``training/board.py`` writes at their
evaluation's step as they arrive; closing the board waits for the last. The worker is forked, as
the data's workers are (``data/loading.py``): it draws with matplotlib and numpy and never touches
torch, CUDA or NCCL. It lets go of what it inherited that is not its own: the run folder's lock
(else a trainer that died would leave its folder locked), the trainer's signal handlers (SIGINT is
ignored: a Ctrl-C reaches the whole process group and the trainer decides what it means; SIGTERM
ends it), and it dies with the trainer (Linux's parent-death signal). Images are an aid, not a
result: a drawing that fails, takes longer than ``DRAW_SECONDS`` or whose worker dies is a warning
in ``train.log``, the next evaluation starts a new worker, and training goes on.
"""

import ctypes
import logging
import multiprocessing
import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as Late
from concurrent.futures.process import BrokenProcessPool
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

log = logging.getLogger(__name__)

DRAW_SECONDS = 300  # the longest an evaluation's images may take to come back when waited for
MAX_PENDING = 3  # evaluations whose images may be under way at once; a fourth waits for the oldest
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


class Picture(NamedTuple):
    """One heatmap to draw: its tag, ``(query, key)`` weights and what ``attention_figure`` writes on it."""

    tag: str
    weights: np.ndarray
    x_tokens: Sequence[str]
    y_tokens: Sequence[str]
    title: str
    x_label: str
    y_label: str


def worker_start(parent: int) -> None:
    """In the worker, first: give up the trainer's run-folder locks and signal handlers, and die
    with the trainer (``parent``: its pid)."""
    from training.run_folder import forget_locks

    forget_locks()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the worker ends when the board closes
        pass
    if os.getppid() != parent:  # the trainer died before the prctl
        os._exit(0)


def draw(pictures: Sequence[Picture]) -> List[bytes]:
    """Each picture as a serialized TensorBoard image summary (in the worker process)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    from inference.figures import attention_figure, png_of

    summaries = []
    for p in pictures:
        png, height, width = png_of(
            attention_figure(p.weights, p.x_tokens, p.y_tokens, p.title, p.x_label, p.y_label)
        )
        image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=png)  # RGBA
        summaries.append(Summary(value=[Summary.Value(tag=p.tag, image=image)]).SerializeToString())
    return summaries


class Drawing:
    """One worker process that draws ``Picture`` lists in order: ``submit`` returns at once,
    ``finished`` gives the summaries ready so far (``wait``: all of them) with their steps."""

    def __init__(self) -> None:
        self.pool: Optional[ProcessPoolExecutor] = None  # started by the first submit
        self.pending: List[Tuple[int, Future]] = []

    def submit(self, pictures: Sequence[Picture], step: int) -> List[Tuple[int, List[bytes]]]:
        """Hand ``pictures`` (of the evaluation at ``step``) to the worker; returns the drawings that
        had to be waited for first (``MAX_PENDING``), as ``finished`` does."""
        waited = self.finished(wait=True, oldest=len(self.pending) - MAX_PENDING + 1)
        for attempt in (1, 2):  # a worker that died while idle: a new one
            try:
                if self.pool is None:
                    context = multiprocessing.get_context("fork")
                    self.pool = ProcessPoolExecutor(1, context, worker_start, (os.getpid(),))
                self.pending.append((step, self.pool.submit(draw, list(pictures))))
                return waited
            except (BrokenProcessPool, OSError, RuntimeError) as error:
                self.stop()
                if attempt == 2:
                    log.warning("the attention images of step %d were not drawn: %s", step, error)
        return waited

    def finished(self, wait: bool = False, oldest: Optional[int] = None) -> List[Tuple[int, List[bytes]]]:
        """The summaries of the drawings done (``wait``: of every one, or of the ``oldest`` ones), oldest
        first, each once. A drawing that failed, or did not come back within ``DRAW_SECONDS`` when
        waited for, is a warning; its worker is replaced at the next ``submit``."""
        done: List[Tuple[int, List[bytes]]] = []
        count = len(self.pending) if oldest is None else max(0, oldest)
        while self.pending and ((wait and count > 0) or self.pending[0][1].done()):
            step, future = self.pending.pop(0)
            count -= 1
            try:
                done.append((step, future.result(timeout=DRAW_SECONDS)))
            except Late:
                log.warning("the attention images of step %d took over %d s: not drawn", step, DRAW_SECONDS)
                self.stop(kill=True)
            except Exception as error:  # the worker raised, or died (BrokenProcessPool)
                log.warning(
                    "the attention images of step %d were not drawn: %s", step, error or type(error).__name__
                )
                self.stop()
        return done

    def stop(self, kill: bool = False) -> None:
        """End the worker (``kill``: at once, its drawings under way dropped) and start none until
        the next ``submit``."""
        if self.pool is None:
            return
        if kill:
            for process in list(getattr(self.pool, "_processes", {}).values()):
                process.kill()
            self.pending.clear()
        self.pool.shutdown(wait=not kill, cancel_futures=kill)
        self.pool = None

    def close(self) -> None:
        """End the worker once the drawings under way are done (``finished(wait=True)`` first)."""
        self.stop()
