"""The attention heatmaps of an evaluation, drawn in a process of their own while training goes on.

Drawing is matplotlib's work on the CPU, about half a second an image: an evaluation of the default
Transformer draws 32 (``trainer.attention_samples`` sentences, eight maps each), which took longer
than its greedy decoding of the validation split on 2 CPU cores and most of an evaluation on a
GPU. So ``Drawing`` hands each evaluation's maps to one worker process and the images come back as
finished TensorBoard summaries (PNG inside), which ``training/board.py`` writes at their
evaluation's step as they arrive; closing the board waits for the last. The worker is forked, as
the data's workers are (``data/loading.py``): it draws with matplotlib and numpy and never touches
torch, CUDA or NCCL; it ignores SIGINT (a Ctrl-C reaches the whole process group; the trainer
decides what it means) and ends with the board. Images are an aid, not a result: a drawing that
fails (or a worker that dies) is a warning in ``train.log``, and the next evaluation starts a new
worker; training goes on.
"""

import logging
import multiprocessing
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

log = logging.getLogger(__name__)


class Picture(NamedTuple):
    """One heatmap to draw: its tag, ``(query, key)`` weights and what ``attention_figure`` writes on it."""

    tag: str
    weights: np.ndarray
    x_tokens: Sequence[str]
    y_tokens: Sequence[str]
    title: str
    x_label: str
    y_label: str


def ignore_sigint() -> None:
    """In the worker: Ctrl-C is the trainer's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


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

    def submit(self, pictures: Sequence[Picture], step: int) -> None:
        if self.pool is None:
            context = multiprocessing.get_context("fork")
            self.pool = ProcessPoolExecutor(1, mp_context=context, initializer=ignore_sigint)
        self.pending.append((step, self.pool.submit(draw, list(pictures))))

    def finished(self, wait: bool = False) -> List[Tuple[int, List[bytes]]]:
        """The summaries of the drawings done (``wait``: of every one), oldest first, each once; a
        drawing that failed is a warning, and its worker is replaced at the next ``submit``."""
        done = []
        while self.pending and (wait or self.pending[0][1].done()):
            step, future = self.pending.pop(0)
            try:
                done.append((step, future.result()))
            except Exception as error:  # the worker raised, or died (BrokenProcessPool)
                log.warning(
                    "the attention images of step %d were not drawn: %s", step, error or type(error).__name__
                )
                self.close()
        return done

    def close(self) -> None:
        """End the worker once the drawings under way are done (or failed)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=False)
            self.pool = None
