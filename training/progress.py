"""Where training stands (``Progress``, saved in every checkpoint) and the log line of its steps."""

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from training.config import TrainerConfig, cuda_graphs
from training.distributed import World

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0  # the epoch in progress (0-based)
    batches_done: int = 0  # batches of that epoch already trained on
    best_bleu: float = -1.0
    evals_without_improvement: int = 0
    train_seconds: float = 0.0  # wall time of the loop so far, evaluations included
    step_seconds: float = 0.0  # time inside optimizer steps only
    tgt_tokens: int = 0  # real target tokens trained on
    skipped_steps: int = 0  # updates skipped for a non-finite loss or gradient
    bad_in_a_row: int = 0  # of those, how many just now, in a row
    history: List[Dict[str, float]] = field(default_factory=list)  # one entry per evaluation

    def epochs_done(self, batches_per_epoch: int) -> float:
        return self.epoch + self.batches_done / max(batches_per_epoch, 1)

    def position(self, n_batches: int = 1) -> str:
        """The next ``n_batches`` batches, as ``epoch 3 batch 117`` (``batch 117-118`` for two)."""
        first = self.batches_done + 1
        last = f"-{self.batches_done + n_batches}" if n_batches > 1 else ""
        return f"epoch {self.epoch + 1} batch {first}{last}"

    def advance(self, n_batches: int, batches_per_epoch: int) -> None:
        """``n_batches`` more batches of the epoch trained on; at its end, the next epoch begins."""
        self.batches_done += n_batches
        if self.batches_done >= batches_per_epoch:
            self.epoch, self.batches_done = self.epoch + 1, 0

    def count_step(self, seconds: float, tokens: int) -> None:
        """An update was made: its time and target tokens; the run of skipped steps is over."""
        self.bad_in_a_row, self.step_seconds, self.tgt_tokens = (
            0,
            self.step_seconds + seconds,
            self.tgt_tokens + tokens,
        )

    def evaluated_now(self) -> bool:
        """Whether the last evaluation scored the weights of this step."""
        return bool(self.history) and self.history[-1]["step"] == self.step


@dataclass
class StepStats:
    """One optimizer step: loss per target token, rate, gradient norm, tokens, whether it was skipped,
    and guided alignment's loss per linked target piece (NaN when off)."""

    loss: float
    lr: float
    grad_norm: float
    tokens: int
    skipped: bool
    alignment: float = float("nan")


@dataclass
class LogWindow:
    """The steps since the last log line: their mean loss and their target tokens per second."""

    loss: float = 0.0
    count: int = 0
    tokens: int = 0
    seconds: float = 0.0
    last: Optional[StepStats] = None
    alignment: float = 0.0  # guided alignment's loss, summed over the steps that had linked pieces
    aligned: int = 0  # those steps

    def add(self, stats: StepStats, seconds: float) -> None:
        self.loss, self.count, self.last = self.loss + stats.loss, self.count + 1, stats
        self.tokens, self.seconds = self.tokens + stats.tokens, self.seconds + seconds
        if math.isfinite(stats.alignment):
            self.alignment, self.aligned = self.alignment + stats.alignment, self.aligned + 1

    def scalars(self) -> Dict[str, float]:
        """The ``train/*`` scalars of the window (one point at its last step); ``train/alignment_loss``
        with guided alignment."""
        scalars = {
            "train/loss": self.loss / max(self.count, 1),
            "train/lr": self.last.lr,
            "train/grad_norm": self.last.grad_norm,
            "train/tokens_per_second": self.tokens / max(self.seconds, 1e-9),
        }
        if self.aligned:
            scalars["train/alignment_loss"] = self.alignment / self.aligned
        return scalars


def eta(p: Progress, total_steps: Optional[int]) -> str:
    """`` | ETA hh:mm:ss (+evals)`` from the mean step time so far; empty without a step limit."""
    if total_steps is None or p.step_seconds <= 0:
        return ""
    seconds = (total_steps - p.step) * p.step_seconds / max(p.step, 1)
    return f" | ETA {time.strftime('%H:%M:%S', time.gmtime(max(seconds, 0)))} (+evals)"


def log_window(p: Progress, window: LogWindow, total_steps: Optional[int]) -> Dict[str, float]:
    """Log the line of the steps in ``window``; return its scalars for TensorBoard."""
    scalars = window.scalars()
    guided = f" | align {scalars['train/alignment_loss']:.3f}" if "train/alignment_loss" in scalars else ""
    log.info(
        "epoch %d step %d%s | loss %.3f%s | lr %.2e | grad %.2f | %.0f tgt tok/s%s",
        p.epoch + 1,
        p.step,
        f"/{total_steps}" if total_steps else "",
        scalars["train/loss"],
        guided,
        scalars["train/lr"],
        scalars["train/grad_norm"],
        scalars["train/tokens_per_second"],
        eta(p, total_steps),
    )
    return scalars


def describe_setup(
    model: str, params: int, device: torch.device, precision: str, world: World, tc: TrainerConfig
) -> str:
    """The log line of what trains where: model, parameters, device, precision, threads, compilation
    (and the DDP world)."""
    line = f"model: {model}, {params:,} parameters, device {device} ({precision}), {torch.get_num_threads()} threads"
    if tc.compile:
        graphs = ", CUDA graphs" if cuda_graphs(tc, device.type) else ""
        line += f", compiled (mode {tc.compile_mode}{graphs})"
    if world.distributed:
        backend = "NCCL" if device.type == "cuda" else "gloo"
        line += (
            f"; data parallel: world of {world.world_size} ranks ({backend}), each with batches of "
            f"{tc.batch_tokens} tokens: {tc.batch_tokens * tc.accumulate * world.world_size} tokens per step"
        )
    return line
