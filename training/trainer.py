"""The training loop: a ``Trainer`` holds a run's setup (``training/setup.py``: the data, model,
optimizer, device and precision) and its progress, and ``Trainer.fit`` trains them.

Read ``train_epoch`` first: each step takes its batches, the rate of the schedule
(``training/schedule.py``), accumulates, clips and updates (``training/step.py``), logs, evaluates
when due (``training/validation.py``, then ``last.pt`` / ``best.pt``) and asks whether to stop
(``training/stopping.py``). What a reader may skip is kept at the end of the class and in its own
modules: resuming (``training/resume.py``), stop signals (``training/stopping.py``), the run
folder's lock (``training/run_folder.py``) and the agreement of the ranks under DDP
(``training/distributed.py``). A whole run in its folder is ``training/run.py``.
"""

import logging
import time
from contextlib import closing
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np
from omegaconf import DictConfig, OmegaConf

from common.checkpoint import CheckpointError, link_checkpoint, load_checkpoint, save_checkpoint
from data.batching import Batch, TokenBucketSampler, collate
from data.corpus import TRAIN, VALID
from data.loading import collated
from data.pipeline import batch_stats, format_stats
from data.sampling import Resegmenter
from training import distributed
from training.averaging import ExponentialAverage, keep_recent
from training.board import Board, NullBoard
from training.config import checked_config
from training.progress import LogWindow, Progress, StepStats, describe_setup, log_window
from training.resume import (
    adopt_best,
    check_resumable,
    remove_stale_temporaries,
    restore_rngs,
    rng_states,
    to_cpu,
)
from training.run_folder import resume_command, resume_path, unlock_run_folder
from training.schedule import Schedule
from training.setup import make_setup
from training.step import count_skipped, optimizer_step
from training.stopping import Interrupted, StopRequest, agree, stop_reason, total_steps
from training.validation import EvalSeconds, draw_samples, log_scores, record, validate, watch_entropy

log = logging.getLogger(__name__)


class TrainingError(Exception):
    """A run that cannot go on (or must not start); the message says why and what to do."""


class Trainer:
    """A run's setup and progress, and the loop that trains them (``fit``)."""

    def __init__(self, cfg: DictConfig, out_dir: Path):
        self.cfg = cfg
        data_cfg, model_cfg, tc = checked_config(cfg)  # every value, before the data
        self.setup = s = make_setup(cfg, data_cfg, model_cfg, tc, out_dir)
        train, world, seed = s.data.datasets[TRAIN], s.world, cfg.seed
        lengths = train.src_lengths(), train.tgt_lengths()
        self.sampler = TokenBucketSampler(
            *lengths, tc.batch_tokens, True, seed, world.rank, world.world_size, data_cfg.pad_multiple
        )
        # the moving average lives on rank 0, which alone evaluates and saves
        use_ema = tc.ema_decay is not None and world.main
        self.ema = ExponentialAverage(s.model, tc.ema_decay) if use_ema else None
        self.schedule = Schedule.of_run(tc, total_steps(tc, len(self.sampler)))
        self.resegmenter = None  # data.sampling_alpha: a new segmentation of the training pairs every epoch
        if data_cfg.sampling_alpha is not None:
            alpha, text = data_cfg.sampling_alpha, s.data.train_text
            self.resegmenter = Resegmenter(s.data.tokenizer, text, train, alpha, seed, data_cfg.max_len)
        self.progress = Progress()
        self.ckpt_dir = s.out_dir / "checkpoints"
        self.board: Optional[Board] = None  # opened by fit(), closed by close()
        self.stop: Optional[StopRequest] = None  # the signals fit() was given to heed
        self.resumed = False  # whether resume() restored a checkpoint
        self.window = LogWindow()  # the steps since the last log line
        self.collapsed: Set[Tuple[int, int]] = set()  # cross-attention (layer, head)s said to have collapsed
        self.max_steps: Optional[int] = None  # the limit of the fit() in progress
        self.started = time.perf_counter()  # the clock of the loop; fit() sets it back by the time resumed

    def seconds(self) -> float:
        """Training time so far, evaluations included, earlier lives of a resumed run too."""
        return time.perf_counter() - self.started

    def epochs_done(self) -> float:
        return self.progress.epochs_done(len(self.sampler))

    # ----- the loop -----
    def fit(
        self, max_steps: Optional[int] = None, evaluate_last: bool = True, stop: Optional[StopRequest] = None
    ) -> str:
        """Train until a limit of ``trainer.*``, early stopping or ``max_steps`` (a limit of this call);
        the last weights are then evaluated and saved (unless ``evaluate_last`` is false: benchmarks).
        ``stop``: the stop signals to heed (``training/run.py``). Returns why training stopped. Call
        ``close()`` when done with the trainer."""
        self.open_board()
        self.max_steps, self.stop = max_steps, stop
        self.log_start()
        self.started = time.perf_counter() - self.progress.train_seconds
        try:
            reason = self.agreed_stop()
            while reason is None:
                reason = self.train_epoch()
            # rank 0 (which alone keeps the evaluations) decides for all: evaluate() is a collective
            if evaluate_last and distributed.broadcast(not self.progress.evaluated_now(), self.setup.device):
                self.evaluate()  # stopped between evaluations: score (and save) the last weights too
            self.agreed_stop(signal_only=True)  # a signal during that last evaluation
        finally:
            self.progress.train_seconds = self.seconds()
            self.log_steps()  # the last steps of a run (or of a stop) are always logged
        return reason

    def train_epoch(self) -> Optional[str]:
        """Train on the rest of the current epoch; returns why training must stop, or None."""
        p, tc = self.progress, self.setup.tc
        batches = self.epoch_batches()
        epoch = p.epoch
        stream = collated(batches[p.batches_done :], lambda b: self.collate(b, epoch), tc.loader_workers)
        with closing(stream):  # ends the loader's workers when the epoch stops early
            while p.batches_done < len(batches):
                group = batches[p.batches_done : p.batches_done + tc.accumulate]  # gradient accumulation
                where, tick = p.position(len(group)), time.perf_counter()  # "epoch 3 batch 117"
                stats = self.train_step([next(stream) for _ in group])  # rate, accumulate, clip, update
                seconds = time.perf_counter() - tick
                p.advance(len(group), len(batches))
                if stats.skipped:
                    self.skip_bad_step(stats, where)  # the step counter stays: no evaluation is due
                else:
                    self.log_step(stats, seconds)
                if self.evaluation_due(stats):
                    self.evaluate()
                reason = self.agreed_stop()
                # a stop, or the epoch is over: the next one has its own order
                if reason or p.batches_done == 0:
                    return reason
        return None

    def train_step(self, batches: List[Batch]) -> StepStats:
        """One optimizer step over ``batches`` at the schedule's rate; counted unless skipped."""
        lr = self.schedule.lr(self.progress.step + 1)
        stats = optimizer_step(self.setup, batches, lr)
        if not stats.skipped:
            self.progress.step += 1
            if self.ema is not None:
                self.ema.update(self.progress.step)
        return stats

    def log_step(self, stats: StepStats, seconds: float) -> None:
        """Count an update's time and tokens; log the steps every ``trainer.log_every``."""
        self.progress.count_step(seconds, stats.tokens)
        self.window.add(stats, seconds)
        if self.progress.step % self.setup.tc.log_every == 0:
            self.log_steps()

    def skip_bad_step(self, stats: StepStats, where: str) -> None:
        """Count a skipped update; too many in a row stop the run, with last.pt from before them."""
        too_many = count_skipped(
            self.progress, stats, where, self.setup.tc.max_bad_steps, self.ckpt_dir / "last.pt"
        )
        self.board.scalars({"train/skipped_steps": self.progress.skipped_steps}, self.progress.step)
        if too_many:
            self.save_last()
            raise TrainingError(too_many)

    def evaluation_due(self, stats: StepStats) -> bool:
        """Every ``trainer.eval_every`` steps (a skipped step adds none), else at the end of every epoch."""
        if self.setup.tc.eval_every is None:
            return self.progress.batches_done == 0
        return not stats.skipped and self.progress.step % self.setup.tc.eval_every == 0

    def epoch_batches(self) -> List[np.ndarray]:
        """The batches (arrays of pair indices) of the current epoch, resumed at ``batches_done``."""
        p = self.progress
        self.sampler.set_epoch(p.epoch)
        batches = list(self.sampler)
        if p.batches_done == len(batches):  # saved at the very end of an epoch: the next one starts
            p.epoch, p.batches_done = p.epoch + 1, 0
            return []
        if p.batches_done > len(batches):
            raise CheckpointError(
                f"the resumed run had done {p.batches_done} batches of epoch {p.epoch + 1}, which now has "
                f"{len(batches)}: resume with the same data.*, trainer.batch_tokens and seed"
            )
        return batches

    def collate(self, indices: np.ndarray, epoch: int) -> Batch:
        """The training pairs ``indices`` as a ``Batch``, in the segmentation of ``epoch``, padded as
        the sampler counted them (``data.pad_multiple``)."""
        multiple = self.sampler.multiple
        if self.resegmenter is not None:  # data.sampling_alpha: this epoch's segmentation
            return collate([self.resegmenter.example(i, epoch) for i in indices], multiple)
        return self.setup.data.datasets[TRAIN].batch(indices, multiple)

    # ----- evaluation and checkpoints -----
    def evaluate(self) -> None:
        """Validation scores, images, checkpoints: on rank 0 only (the other ranks wait at the next
        collective; the decision to stop reaches them by broadcast)."""
        if not self.setup.world.main:
            self.rank_rngs()  # for rank 0's checkpoint, once it has validated
            return
        p, ticks = self.progress, [time.perf_counter()]
        scores, found, hyps = validate(self.setup)
        if self.ema is not None:  # the average is scored beside the weights; they decide best.pt
            scores |= {f"ema_{k}": v for k, v in self.validate_weights(self.ema.state_dict()).items()}
        ticks.append(time.perf_counter())
        # the x axis of comparisons: training time so far, evaluations included
        self.board.scalars(
            {f"valid/{k}": v for k, v in scores.items()} | {"valid/train_seconds": self.seconds()}, p.step
        )
        watch_entropy(
            self.board,
            self.setup.model,
            self.setup.data.datasets[VALID],
            self.setup.eval_batch_tokens,
            p.step,
            self.collapsed,
        )
        draw_samples(
            self.board,
            self.setup.model,
            self.setup.data,
            found,
            hyps,
            self.setup.tc.attention_samples,
            p.step,
        )
        ticks.append(time.perf_counter())
        improved = record(p, scores, self.epochs_done())
        p.train_seconds = self.seconds()
        self.board.flush()
        payload = self.checkpoint(self.rank_rngs())  # the generators as they are after validating
        self.save(payload, "last.pt")
        if improved:  # the same bytes, written once: best.pt is last.pt's file
            self.save_as("last.pt", "best.pt")
        if self.ema is not None:
            self.save(self.weights_checkpoint(self.ema.state_dict()), "ema.pt")
        keep = max(self.setup.tc.keep_last or 0, self.setup.tc.average_last or 0)
        if keep:
            keep_recent(self.ckpt_dir, p.step, keep)
        ticks.append(time.perf_counter())
        log_scores(p, scores, improved, EvalSeconds(*(b - a for a, b in zip(ticks, ticks[1:]))))

    def validate_weights(self, state: Dict[str, Any]) -> Dict[str, float]:
        """Validation scores of the weights ``state`` (the model's own come back after)."""
        own = {k: v.detach().clone() for k, v in self.setup.model.state_dict().items()}
        self.setup.model.load_state_dict(state)
        try:
            return validate(self.setup)[0]
        finally:
            self.setup.model.load_state_dict(own)

    def checkpoint(self, rngs: List[Dict[str, Any]]) -> Dict[str, Any]:
        """The state that resumes the run; ``rngs``: every rank's generators (``rank_rngs``)."""
        payload = self.weights_checkpoint(self.setup.model.state_dict())
        payload |= {"optimizer": to_cpu(self.setup.optimizer.state_dict()), "rng": rngs[0]}
        if len(rngs) > 1:  # each rank resumes its own dropout masks
            payload["rng_ranks"] = rngs
        if self.ema is not None:
            payload["ema"] = to_cpu(self.ema.state_dict())
        return payload

    def weights_checkpoint(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """A checkpoint of the weights ``state`` that translates but does not resume (no optimizer)."""
        return {
            "model": to_cpu(state),
            "model_config": asdict(self.setup.model_cfg),
            "tokenizer": self.setup.data.tokenizer.state_dict(),
            "progress": asdict(self.progress),
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "precision": self.setup.precision,  # of the validation scores: translate.py --dtype auto takes it
        }

    def save_last(self) -> Path:
        """Save the state as it is now (mid-epoch too) as ``last.pt`` (rank 0 writes it)."""
        self.progress.train_seconds = self.seconds()
        path = self.ckpt_dir / "last.pt"
        rngs = self.rank_rngs()  # every rank calls save_last at the same step
        if self.setup.world.main:
            self.save(self.checkpoint(rngs), path.name)
        return path

    def save(self, payload: Dict[str, Any], name: str) -> None:
        """Write ``checkpoints/<name>``; a write that fails (a full disk) stops the run in one line
        that says what to do (the checkpoint it was to replace is intact)."""
        self.saving(lambda: save_checkpoint(payload, self.ckpt_dir / name))

    def save_as(self, source: str, name: str) -> None:
        """``checkpoints/<name>`` made the checkpoint ``checkpoints/<source>`` (a hard link), as ``save``."""
        self.saving(lambda: link_checkpoint(self.ckpt_dir / source, self.ckpt_dir / name))

    def saving(self, write: Callable[[], None]) -> None:
        """Run a checkpoint ``write``; its ``CheckpointError`` stops the run in one line that says what to do."""
        try:
            write()
        except CheckpointError as error:
            then = (
                f"continue with: {resume_command(self.setup.out_dir)}"
                if (self.ckpt_dir / "last.pt").is_file()
                else "start the run again"
            )
            raise TrainingError(f"{error}; free space (or fix the folder), then {then}") from None

    # ----- run machinery a reader may skip: resume, signals and ranks, the board -----
    def resume(self) -> bool:
        """Restore the state of ``trainer.resume``; whether there was one."""
        path = resume_path(self.setup.out_dir, self.setup.tc.resume)
        if path is None:
            return False
        payload = load_checkpoint(path)
        config = OmegaConf.to_container(self.cfg, resolve=True)
        check_resumable(
            payload, path, asdict(self.setup.model_cfg), config, self.setup.data.tokenizer.state_dict()
        )
        trained_in = payload.get("precision", self.setup.precision)
        if trained_in != self.setup.precision:  # trainer.amp=auto on another machine
            log.warning(
                "%s was trained in %s; this run goes on in %s (%s)",
                path,
                trained_in,
                self.setup.precision,
                self.setup.precision_reason,
            )
        self.setup.model.load_state_dict(payload["model"])
        self.setup.optimizer.load_state_dict(payload["optimizer"])
        self.progress = Progress(**payload["progress"])
        restore_rngs(payload, self.setup.world, self.setup.device, self.setup.model)
        if self.ema is not None and "ema" in payload:
            self.ema.load_state_dict(payload["ema"])
        elif self.ema is not None:
            log.info("%s holds no weight average: trainer.ema_decay starts one from its weights", path)
            self.ema = ExponentialAverage(self.setup.model, self.setup.tc.ema_decay)
        if self.setup.world.main:
            adopt_best(path, self.ckpt_dir)
            remove_stale_temporaries(self.ckpt_dir)
        # a resumed run (say with a lower lr) gets trainer.max_bad_steps afresh
        self.progress.bad_in_a_row = 0
        self.resumed = True
        p = self.progress
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, p.step, p.epoch + 1, p.batches_done)
        return True

    def rank_rngs(self) -> List[Dict[str, Any]]:
        """Every rank's generators, in rank order (a collective: every rank calls it at once)."""
        return distributed.gather(rng_states(), self.setup.device)

    def agreed_stop(self, signal_only: bool = False) -> Optional[str]:
        """After a step, on every rank at once: a stop signal saves last.pt and raises ``Interrupted``;
        otherwise the reason to stop that rank 0 sees (None: go on)."""
        reason = None
        if self.setup.world.main and not signal_only:
            reason = stop_reason(self.setup.tc, self.progress, self.seconds() / 60, self.max_steps)
        signum, reason = agree(self.stop, reason, self.setup.device)
        if signum is not None:
            self.interrupt()
        return reason

    def interrupt(self) -> None:
        """Save last.pt where training stands and stop with the command that resumes it."""
        p = self.progress
        path = self.save_last()
        self.log_steps()
        self.board.flush()
        raise Interrupted(
            f"{self.stop.name}: stopped at step {p.step} (epoch {p.epoch + 1}, batch {p.batches_done}), saved "
            f"{path}; resume with: {resume_command(self.setup.out_dir)}",
            self.stop.signum,
        )

    def open_board(self) -> None:
        """The run's TensorBoard writer (rank 0; the other ranks write nothing). A resumed run appends
        to its TensorBoard run; events its previous life logged after the checkpoint are dropped."""
        if self.board is not None:
            return
        if not self.setup.world.main:
            self.board = NullBoard()
            return
        self.board = Board(
            self.setup.out_dir / "tb", purge_step=self.progress.step + 1 if self.resumed else None
        )

    def close(self) -> None:
        """Close the board and release the run folder."""
        if self.board is not None:
            self.board.close()
            self.board = None
        unlock_run_folder(self.setup.out_dir)

    def log_start(self) -> None:
        log.info("%s", format_stats(dict(self.setup.data.stats, batches=batch_stats(self.sampler))))
        s = self.setup
        log.info("%s", describe_setup(s.model_cfg.name, s.params, s.device, s.precision, s.world, s.tc))
        log.info("precision: %s", s.precision_reason)
        log.info("%s", self.schedule.describe())

    def log_steps(self) -> None:
        """Log the steps since the last log line (a line and the ``train/*`` scalars), if any."""
        if self.window.count:
            total = total_steps(self.setup.tc, len(self.sampler), self.max_steps)
            self.board.scalars(log_window(self.progress, self.window, total), self.progress.step)
            self.window = LogWindow()
