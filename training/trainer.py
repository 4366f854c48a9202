"""The training loop: ``train(cfg, out_dir) -> results``.

data -> model -> optimizer; per step: label-smoothed loss, backward, clip, ``lr_at(step)``; per
evaluation: validation loss, greedy BLEU/chrF, attention images, checkpoints, early stopping; at
the end: the best checkpoint decodes every test split with beam search into ``results.json``.
"""
import json
import logging
import math
import os
import random
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from data.batching import Batch, TokenBucketSampler, collate
from data.config import check_keys, data_config
from data.corpus import TRAIN, VALID
from data.pipeline import PreparedData, batch_stats, format_stats, prepare_data
from data.specials import PAD_ID
from models.build import build_model, count_parameters
from training.board import Board, NullBoard, flat_params
from training.checkpoint import CheckpointError, load_checkpoint, rng_states, save_checkpoint, set_rng_states, to_cpu
from training.config import TrainerConfig, model_config
from training import distributed
from training.device import pick_device
from training.distributed import world_from_env
from models.search import Hypothesis
from training.files import AtomicFile
from training.evaluate import decode_ids, detokenize, output_attention, src_mask_of, translate_split, validation_loss
from training.loss import label_smoothed_nll
from training.metrics import corpus_scores, signatures
from training.schedule import lr_at
from training.run_folder import check_run_folder, resume_path
from training.signals import Interrupted, StopRequest

log = logging.getLogger(__name__)


class TrainingError(Exception):
    """A run that cannot go on (or must not start); the message says why and what to do."""


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


def set_threads(tc: TrainerConfig, device: torch.device) -> None:
    """CPU threads: ``trainer.num_threads``, else the cores this process may use, shared by the
    ranks on this machine (``LOCAL_WORLD_SIZE`` under torchrun)."""
    if device.type == "cpu":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(tc.num_threads or max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))


def check_trainer_config(tc: TrainerConfig) -> None:
    """Range checks the schema's types cannot express; one line naming the key."""
    at_least_one = {"batch_tokens": tc.batch_tokens, "accumulate": tc.accumulate, "log_every": tc.log_every,
                    "beam_size": tc.beam_size, "eval_every": tc.eval_every, "patience": tc.patience,
                    "keep_last": tc.keep_last, "max_bad_steps": tc.max_bad_steps,
                    "max_epochs": tc.max_epochs, "max_steps": tc.max_steps, "num_threads": tc.num_threads}
    for key, value in at_least_one.items():
        if value is not None and value < 1:
            raise ValueError(f"trainer.{key} must be at least 1, got {value}")
    if tc.max_minutes is not None and tc.max_minutes <= 0:
        raise ValueError(f"trainer.max_minutes must be positive, got {tc.max_minutes}")
    if not 0.0 <= tc.label_smoothing < 1.0:
        raise ValueError(f"trainer.label_smoothing must be in [0, 1), got {tc.label_smoothing}")
    if tc.attention_samples < 0:
        raise ValueError(f"trainer.attention_samples must be 0 or more, got {tc.attention_samples}")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model: nn.Module, tc: TrainerConfig) -> torch.optim.Optimizer:
    kinds = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if tc.optimizer not in kinds:
        raise ValueError(f"trainer.optimizer must be adam or adamw, got {tc.optimizer!r}")
    return kinds[tc.optimizer](model.parameters(), lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay)


def autocast_for(device: torch.device, tc: TrainerConfig):
    if device.type == "cuda" and tc.amp:
        return partial(torch.autocast, device_type="cuda", dtype=torch.bfloat16)
    return nullcontext


class Trainer:
    def __init__(self, cfg: DictConfig, out_dir: Path):
        self.cfg, self.out_dir = cfg, out_dir
        check_keys(cfg.trainer, TrainerConfig, "trainer")
        self.tc: TrainerConfig = OmegaConf.to_object(cfg.trainer)
        check_trainer_config(self.tc)
        self.world = world_from_env()
        self.device = pick_device(cfg.device, self.world.local_rank)
        set_threads(self.tc, self.device)
        distributed.init(self.world, self.device)
        seed_everything(cfg.seed)  # the same initial weights on every rank (DDP checks that they agree)
        with distributed.main_first(self.world):  # rank 0 trains and caches the tokenizer; the others then read it
            self.data: PreparedData = prepare_data(data_config(cfg.data))
        self.model_cfg = model_config(cfg.model)
        tok = self.data.tokenizer
        if not tok.joint and self.model_cfg.share_embeddings:
            log.info("separate vocabularies (data.joint_vocab=false): source and target embeddings are not shared")
            self.model_cfg.share_embeddings = False
        self.model = build_model(self.model_cfg, tok.src_vocab_size, tok.tgt_vocab_size, PAD_ID).to(self.device)
        self.params = count_parameters(self.model)
        self.optimizer = make_optimizer(self.model, self.tc)
        self.autocast = autocast_for(self.device, self.tc)
        # DDP shares the parameters of self.model (saved, evaluated) and all-reduces their gradients.
        self.ddp = distributed.wrap(self.model, self.world, self.device)
        self.step_fn = torch.compile(self.ddp) if self.tc.compile else self.ddp
        if self.world.distributed:
            torch.manual_seed(cfg.seed * 1000 + self.world.rank)  # each rank its own dropout masks
        train = self.data.datasets[TRAIN]
        self.sampler = TokenBucketSampler(train.src_lengths(), train.tgt_lengths(), self.tc.batch_tokens, seed=cfg.seed,
                                          rank=self.world.rank, world_size=self.world.world_size)
        self.progress = Progress()
        self.ckpt_dir = out_dir / "checkpoints"
        self.board: Optional[Board] = None
        self.stop: Optional[StopRequest] = None  # set while fit() runs: a signal asks to stop
        self.resumed = False  # whether maybe_resume restored a checkpoint

    # ----- checkpoints -----
    def checkpoint(self) -> Dict[str, Any]:
        return {
            "model": to_cpu(self.model.state_dict()),
            "model_config": asdict(self.model_cfg),
            "tokenizer": self.data.tokenizer.state_dict(),
            "optimizer": to_cpu(self.optimizer.state_dict()),
            "progress": asdict(self.progress),
            "rng": rng_states(),
            "config": OmegaConf.to_container(self.cfg, resolve=True),
        }

    def maybe_resume(self) -> bool:
        """Restore the state of ``trainer.resume``; whether there was one."""
        path = resume_path(self.out_dir, self.tc.resume)
        if path is None:
            return False
        payload = load_checkpoint(path)
        changed = config_changes(payload["model_config"], asdict(self.model_cfg))
        if changed:
            raise CheckpointError(
                f"checkpoint {path} was trained with another model config: {changed}; resume with the same model.* settings"
            )
        changed = config_changes(batch_order_settings(payload.get("config", {})),
                                 batch_order_settings(OmegaConf.to_container(self.cfg, resolve=True)), prefix="")
        if changed:
            raise CheckpointError(
                f"checkpoint {path} was trained with other settings that decide the batches: {changed}; an exact resume "
                "needs the same ones (to change them, start a new run)"
            )
        if payload["tokenizer"] != self.data.tokenizer.state_dict():
            raise CheckpointError(f"checkpoint {path} was trained with another vocabulary: check the data.* settings")
        self.model.load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.progress = Progress(**payload["progress"])
        set_rng_states(payload["rng"])
        best = path.parent / "best.pt"
        if self.world.main and path.parent.resolve() != self.ckpt_dir.resolve() and best.is_file():
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(best, self.ckpt_dir / "best.pt")  # the best weights so far belong to this run too
        if self.world.main:
            for stale in self.ckpt_dir.glob(".*.pt.*.tmp"):  # a save cut short by SIGKILL or a crash: never renamed into place
                log.info("removing %s, the temporary file of a save that did not finish", stale)
                stale.unlink()
        self.progress.bad_in_a_row = 0  # a resumed run (say with a lower lr) gets trainer.max_bad_steps afresh
        log.info("resumed from %s at step %d (epoch %d, batch %d)", path, self.progress.step, self.progress.epoch + 1, self.progress.batches_done)
        return True

    # ----- training -----
    def train_step(self, batches: List[Batch]) -> Dict[str, float]:
        """One optimizer step over ``batches`` (gradient accumulation); loss normalised per target token."""
        self.model.train()
        # Normalised by the target tokens of the whole step, every rank's batches together: DDP
        # averages the ranks' gradients, hence the factor world_size.
        n_tokens = int(distributed.total(sum(b.n_tgt_tokens for b in batches), self.device))
        total = 0.0
        for k, batch in enumerate(batches):
            batch = batch.to(self.device)
            with distributed.no_sync(self.ddp, last=k == len(batches) - 1):  # one all-reduce per step
                with self.autocast():
                    logits, _ = self.step_fn(batch.src, src_mask_of(batch), batch.tgt_in)  # (B, T, V)
                loss, _, _ = label_smoothed_nll(logits, batch.tgt_out, PAD_ID, self.tc.label_smoothing)
                (loss / n_tokens * self.world.world_size).backward()
            total += float(loss.detach())
        total = distributed.total(total, self.device)  # every rank sees the same loss: the same skip decisions
        clip = self.tc.clip_grad_norm if self.tc.clip_grad_norm is not None else float("inf")
        grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        if not (math.isfinite(total) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)  # no update: weights, optimizer state and step stay as they were
            return {"loss": total / n_tokens, "lr": float("nan"), "grad_norm": grad_norm, "tokens": n_tokens, "skipped": True}
        self.progress.step += 1
        lr = lr_at(self.progress.step, self.tc.schedule, self.tc.lr, self.tc.warmup_steps, self.tc.decay_rate, self.tc.decay_steps, self.tc.min_lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": total / n_tokens, "lr": lr, "grad_norm": grad_norm, "tokens": n_tokens, "skipped": False}

    def skip_bad_step(self, stats: Dict[str, float], where: str, start: float) -> None:
        """Count a skipped update; too many in a row stop the run, with last.pt from before them."""
        p = self.progress
        p.skipped_steps += 1
        p.bad_in_a_row += 1
        log.warning("non-finite %s on %s: update skipped (%d in a row, %d in all)",
                    "loss" if not math.isfinite(stats["loss"]) else "gradient", where, p.bad_in_a_row, p.skipped_steps)
        self.board.scalars({"train/skipped_steps": p.skipped_steps}, p.step)
        if p.bad_in_a_row >= self.tc.max_bad_steps:
            self.save_last(start)
            raise TrainingError(
                f"{p.bad_in_a_row} steps in a row with a non-finite loss or gradient (trainer.max_bad_steps), the last on "
                f"{where}; {self.ckpt_dir / 'last.pt'} holds the weights of step {p.step}, before them: lower trainer.lr "
                "or check the data, then resume with trainer.resume=auto"
            )

    def save_last(self, start: float) -> Path:
        """Save the state as it is now (mid-epoch too) as ``last.pt`` (rank 0 writes it)."""
        self.progress.train_seconds = time.perf_counter() - start
        path = self.ckpt_dir / "last.pt"
        if self.world.main:
            save_checkpoint(self.checkpoint(), path)
        return path

    def should_stop(self, start: float) -> Optional[str]:
        tc, p = self.tc, self.progress
        if tc.max_steps is not None and p.step >= tc.max_steps:
            return f"trainer.max_steps={tc.max_steps} reached"
        if tc.max_epochs is not None and p.epoch >= tc.max_epochs:
            return f"trainer.max_epochs={tc.max_epochs} reached"
        if tc.max_minutes is not None and (time.perf_counter() - start) / 60 >= tc.max_minutes:
            return f"trainer.max_minutes={tc.max_minutes} reached"
        if tc.patience is not None and p.evals_without_improvement >= tc.patience:
            return f"no better validation BLEU in {tc.patience} evaluations (trainer.patience)"
        return None

    def total_steps(self) -> Optional[int]:
        """Steps of the whole run as far as the limits tell (for the ETA)."""
        per_epoch = math.ceil(len(self.sampler) / self.tc.accumulate)
        limits = [self.tc.max_steps] if self.tc.max_steps is not None else []
        if self.tc.max_epochs is not None:
            limits.append(per_epoch * self.tc.max_epochs)
        return min(limits) if limits else None

    def log_line(self, stats: Dict[str, float], window: Dict[str, float]) -> None:
        p = self.progress
        tokens_per_second = window["tokens"] / max(window["seconds"], 1e-9)
        total = self.total_steps()
        eta = ""
        if total is not None and p.step_seconds > 0:
            seconds = (total - p.step) * p.step_seconds / max(p.step, 1)
            eta = f" | ETA {time.strftime('%H:%M:%S', time.gmtime(max(seconds, 0)))} (+evals)"
        log.info(
            "epoch %d step %d%s | loss %.3f | lr %.2e | grad %.2f | %.0f tgt tok/s%s",
            p.epoch + 1, p.step, f"/{total}" if total else "", window["loss"] / max(window["count"], 1),
            stats["lr"], stats["grad_norm"], tokens_per_second, eta,
        )
        self.board.scalars({
            "train/loss": window["loss"] / max(window["count"], 1), "train/lr": stats["lr"],
            "train/grad_norm": stats["grad_norm"], "train/tokens_per_second": tokens_per_second,
        }, p.step)

    def train_epoch(self, start: float) -> Optional[str]:
        """Train on the rest of the current epoch; returns why training must stop, or None."""
        p, tc = self.progress, self.tc
        self.sampler.set_epoch(p.epoch)
        batches = list(self.sampler)
        if p.batches_done == len(batches):  # saved at the very end of an epoch: the next one starts
            p.epoch, p.batches_done = p.epoch + 1, 0
            return None
        if p.batches_done > len(batches):
            raise CheckpointError(
                f"the resumed run had done {p.batches_done} batches of epoch {p.epoch + 1}, which now has {len(batches)}: "
                "resume with the same data.*, trainer.batch_tokens and seed"
            )
        train = self.data.datasets[TRAIN]
        window = {"loss": 0.0, "count": 0, "tokens": 0, "seconds": 0.0}
        while p.batches_done < len(batches):
            group = batches[p.batches_done : p.batches_done + tc.accumulate]
            where = f"epoch {p.epoch + 1} batch {p.batches_done + 1}" + (f"-{p.batches_done + len(group)}" if len(group) > 1 else "")
            tick = time.perf_counter()
            stats = self.train_step([collate([train[i] for i in indices]) for indices in group])
            seconds = time.perf_counter() - tick
            p.batches_done += len(group)
            if p.batches_done >= len(batches):
                p.epoch, p.batches_done = p.epoch + 1, 0
            if stats["skipped"]:
                self.skip_bad_step(stats, where, start)  # the step counter stays: no evaluation is due
            else:
                p.bad_in_a_row = 0
                p.step_seconds += seconds
                p.tgt_tokens += stats["tokens"]
                window = {"loss": window["loss"] + stats["loss"], "count": window["count"] + 1,
                          "tokens": window["tokens"] + stats["tokens"], "seconds": window["seconds"] + seconds}
                if p.step % tc.log_every == 0:
                    self.log_line(stats, window)
                    window = {"loss": 0.0, "count": 0, "tokens": 0, "seconds": 0.0}
            if tc.eval_every is not None and p.step % tc.eval_every == 0 and not stats["skipped"]:
                self.evaluate(start)
            elif tc.eval_every is None and p.batches_done == 0:
                self.evaluate(start)
            reason = self.agreed_stop(start)
            if reason:
                return reason
            if p.batches_done == 0:
                return None  # the epoch is over: the next one has its own batch order
        return None

    def agreed_stop(self, start: float) -> Optional[str]:
        """After a step, on every rank at once: a stop signal that any rank received saves last.pt and
        raises ``Interrupted``; otherwise the reason to stop that rank 0 sees (it alone holds the
        scores), or None. One small all-reduce per step (none in a single process); the reason's
        text is broadcast only on the step that stops."""
        reason = self.should_stop(start) if self.world.main else None
        signum, stopping = distributed.agree_to_stop(self.received_signal(), reason is not None, self.device)
        if signum is not None:
            self.interrupt(signum, start)
        return distributed.broadcast(reason, self.device) if stopping else None

    def check_signal(self, start: float) -> None:
        """A stop signal that any rank received saves last.pt and raises ``Interrupted``."""
        signum, _ = distributed.agree_to_stop(self.received_signal(), False, self.device)
        if signum is not None:
            self.interrupt(signum, start)

    def received_signal(self) -> Optional[int]:
        return self.stop.signum if self.stop is not None else None

    def interrupt(self, signum: int, start: float) -> None:
        """Save last.pt where training stands and stop with the command that resumes it."""
        self.stop.signum = signum  # a rank that received nothing itself stops on the others' signal
        p = self.progress
        path = self.save_last(start)
        self.board.flush()
        raise Interrupted(
            f"{self.stop.name}: stopped at step {p.step} (epoch {p.epoch + 1}, batch {p.batches_done}), saved {path}; "
            f"resume with: python train.py trainer.resume=auto hydra.run.dir={self.out_dir} (and the same overrides)",
            signum,
        )

    # ----- evaluation -----
    def evaluate(self, start: float) -> None:
        """Validation loss, greedy BLEU and chrF, images, checkpoints: on rank 0 only (the other
        ranks wait at the next collective; the decision to stop reaches them by broadcast)."""
        if not self.world.main:
            return
        p, tc = self.progress, self.tc
        tick = time.perf_counter()
        valid = self.data.datasets[VALID]
        batch_tokens = tc.eval_batch_tokens or tc.batch_tokens
        scores = validation_loss(self.model, valid, batch_tokens, self.device, self.autocast)
        found = decode_ids(self.model, valid, batch_tokens, self.device, 1, autocast=self.autocast)
        hyps = detokenize(self.data.tokenizer, found)
        scores.update(corpus_scores(hyps, self.data.references[VALID]))
        seconds = time.perf_counter() - start  # training time so far, evaluations included (the x axis of comparisons)
        self.board.scalars({f"valid/{k}": v for k, v in scores.items()} | {"valid/train_seconds": seconds}, p.step)
        self.draw_samples(found, hyps)
        improved = scores["bleu"] > p.best_bleu
        if improved:
            p.best_bleu, p.evals_without_improvement = scores["bleu"], 0
        else:
            p.evals_without_improvement += 1
        p.history.append(dict(scores, step=p.step, epoch=self.epochs_done()))
        p.train_seconds = time.perf_counter() - start
        self.board.flush()
        payload = self.checkpoint()
        save_checkpoint(payload, self.ckpt_dir / "last.pt")
        if improved:
            save_checkpoint(payload, self.ckpt_dir / "best.pt")
        if tc.keep_last:
            keep_recent(self.ckpt_dir, p.step, tc.keep_last)
        log.info(
            "valid step %d: loss %.3f ppl %.2f BLEU %.2f chrF %.2f%s (%.0f s)",
            p.step, scores["loss"], scores["ppl"], scores["bleu"], scores["chrf"],
            " *best*" if improved else f" (best {p.best_bleu:.2f}, {p.evals_without_improvement} without improvement)",
            time.perf_counter() - tick,
        )

    def draw_samples(self, found: List[Hypothesis], hyps: List[str]) -> None:
        """Attention images and sample text of the first ``attention_samples`` validation sentences.

        The model's own greedy output ids are fed back teacher-forced, so each image row is the
        attention with which it produced that output token (EOS last when it emitted one).
        """
        n = min(self.tc.attention_samples, len(hyps))
        if n == 0:
            return
        valid, tok = self.data.datasets[VALID], self.data.tokenizer
        attention, src_ids, out_ids = output_attention(self.model, valid, found[:n], self.device)
        src_tokens = [tok.src_pieces(ids) for ids in src_ids]
        tgt_tokens = [tok.tgt_pieces(ids) for ids in out_ids]
        self.board.attention(attention, src_tokens, tgt_tokens, self.progress.step)
        self.board.samples(self.data.sources[VALID][:n], self.data.references[VALID][:n], hyps[:n], self.progress.step)

    def epochs_done(self) -> float:
        return self.progress.epoch + self.progress.batches_done / max(len(self.sampler), 1)

    # ----- the whole run -----
    def fit(self) -> str:
        stats = dict(self.data.stats, batches=batch_stats(self.sampler))
        log.info("%s", format_stats(stats))
        log.info("model: %s, %s parameters, device %s, %d threads", self.model_cfg.name, f"{self.params:,}", self.device, torch.get_num_threads())
        if self.world.distributed:
            log.info("data parallel: world of %d ranks (%s), each with batches of %d tokens: %d tokens per step",
                     self.world.world_size, "NCCL" if self.device.type == "cuda" else "gloo", self.tc.batch_tokens,
                     self.tc.batch_tokens * self.tc.accumulate * self.world.world_size)
        start = time.perf_counter() - self.progress.train_seconds
        reason = self.agreed_stop(start)
        while reason is None:
            reason = self.train_epoch(start)
            self.progress.train_seconds = time.perf_counter() - start
        self.progress.train_seconds = time.perf_counter() - start
        if not self.progress.history or self.progress.history[-1]["step"] != self.progress.step:
            self.evaluate(start)  # stopped between evaluations: score (and save) the last weights too
            self.progress.train_seconds = time.perf_counter() - start
        self.check_signal(start)  # a signal during that last evaluation
        return reason  # the last evaluation, at this step, wrote last.pt

    def test(self) -> Dict[str, Dict[str, float]]:
        """Load the best checkpoint; beam-decode every test split into ``<split>.hyp``; score them
        (rank 0; the other ranks have nothing to do)."""
        if not self.world.main:
            return {}
        best = self.ckpt_dir / "best.pt"
        if best.is_file():
            self.model.load_state_dict(load_checkpoint(best)["model"])
        batch_tokens = self.tc.eval_batch_tokens or self.tc.batch_tokens
        results = {}
        for split in self.data.test_splits:
            if self.stop is not None and self.stop.signum is not None:  # training is over and saved: nothing to add to last.pt
                raise Interrupted(
                    f"{self.stop.name}: stopped before decoding test split {split}; training is finished ({self.ckpt_dir / 'last.pt'}, "
                    f"step {self.progress.step}); decode the test splits with: python train.py trainer.resume=auto "
                    f"hydra.run.dir={self.out_dir} (and the same overrides)", self.stop.signum)
            tick = time.perf_counter()
            hyps = translate_split(self.model, self.data.datasets[split], self.data.tokenizer, batch_tokens, self.device,
                                   self.tc.beam_size, self.tc.length_penalty, self.autocast)
            (self.out_dir / f"{split}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            refs = self.data.references[split]  # beside the hypotheses, for significance tests (scripts/compare.py)
            (self.out_dir / f"{split}.ref").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
            results[split] = corpus_scores(hyps, self.data.references[split])
            log.info("test %s (beam %d): BLEU %.2f chrF %.2f (%.0f s)", split, self.tc.beam_size,
                     results[split]["bleu"], results[split]["chrf"], time.perf_counter() - tick)
        return results

    def results(self, test: Dict[str, Dict[str, float]]) -> Dict[str, Any]:
        p = self.progress
        best = max(p.history, key=lambda h: h["bleu"]) if p.history else {}
        return {
            "model": self.model_cfg.name,
            "params": self.params,
            "steps": p.step,
            "epochs": round(self.epochs_done(), 3),
            "train_seconds": round(p.train_seconds, 1),
            "train_tokens_per_second": round(p.tgt_tokens / max(p.step_seconds, 1e-9), 1),
            "device": str(self.device),
            "valid": {k: best.get(k) for k in ("loss", "ppl", "bleu", "chrf")} | {"step": best.get("step")},
            "test": test,
            "sacrebleu": signatures(),
            "valid_history": p.history,
        }


def prepare(cfg: DictConfig, out_dir: Path) -> Trainer:
    """Check the run folder, load the data, build the model and restore ``trainer.resume``: every
    refusal happens here, before anything is written into ``out_dir``."""
    out_dir = Path(out_dir)
    check_run_folder(out_dir, cfg.trainer.get("resume"))
    trainer = Trainer(cfg, out_dir)
    trainer.resumed = trainer.maybe_resume()
    return trainer


def run(trainer: Trainer) -> Optional[Dict[str, Any]]:
    """Train a prepared run, decode the test splits with the best weights and write checkpoints,
    TensorBoard events, hypotheses and ``results.json`` into its folder; return the results.
    SIGINT / SIGTERM stop it cleanly from here on (``training/signals.py``)."""
    # A resumed run appends to its TensorBoard run; events its previous life logged after the checkpoint are dropped.
    if trainer.world.main:
        trainer.board = Board(trainer.out_dir / "tb", purge_step=trainer.progress.step + 1 if trainer.resumed else None)
    else:
        trainer.board = NullBoard()  # the other ranks of a data-parallel run write nothing
    try:
        with StopRequest() as trainer.stop:
            reason = trainer.fit()
            log.info("training stopped: %s", reason)
            test = trainer.test()
        if not trainer.world.main:
            return None
        results = trainer.results(test)
        with AtomicFile(trainer.out_dir / "results.json") as out:
            out.write(json.dumps(results, indent=2) + "\n")
        metrics = {"hparam/valid_bleu": results["valid"]["bleu"] or 0.0}
        metrics.update({f"hparam/{split}_bleu": s["bleu"] for split, s in test.items()})
        metrics.update({f"hparam/{split}_chrf": s["chrf"] for split, s in test.items()})
        trainer.board.hparams(flat_params(OmegaConf.to_container(trainer.cfg, resolve=True)), metrics)
        log.info("summary: %s", summary_line(results))
        return results
    finally:
        trainer.stop = None
        trainer.board.close()


def train(cfg: DictConfig, out_dir: Path) -> Dict[str, Any]:
    """Train the model ``cfg`` describes in the run folder ``out_dir``: ``run(prepare(...))``."""
    return run(prepare(cfg, out_dir))


def config_changes(saved: Dict[str, Any], now: Dict[str, Any], prefix: str = "model.") -> str:
    """The keys whose values differ, as ``model.d_model (checkpoint 256, now 512)``; empty when none."""
    keys = sorted(set(saved) | set(now))
    return ", ".join(f"{prefix}{k} (checkpoint {saved.get(k)!r}, now {now.get(k)!r})" for k in keys if saved.get(k) != now.get(k))


NOT_BATCH_ORDER = ("data.root", "data.cache_dir")  # where the data lies, not what it is


def batch_order_settings(config: Dict[str, Any]) -> Dict[str, Any]:
    """The flattened settings that decide each epoch's batches: the data, the batching and the seed."""
    flat = flat_params(config)
    return {k: v for k, v in flat.items()
            if (k.startswith("data.") and k not in NOT_BATCH_ORDER) or k in ("seed", "trainer.batch_tokens", "trainer.accumulate")}


def keep_recent(folder: Path, step: int, keep: int) -> None:
    """Keep ``last.pt`` as ``step_<step>.pt`` too (a hard link: no second write), and only the ``keep`` newest of those."""
    kept = folder / f"step_{step:07d}.pt"
    kept.unlink(missing_ok=True)
    try:
        os.link(folder / "last.pt", kept)
    except OSError:  # no hard links on this file system: a copy, atomic like every checkpoint write
        with open(folder / "last.pt", "rb") as source, AtomicFile(kept, "wb") as out:
            shutil.copyfileobj(source, out)
    for old in sorted(folder.glob("step_*.pt"))[:-keep]:
        old.unlink()


def summary_line(results: Dict[str, Any]) -> str:
    tests = ", ".join(f"{split} BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f}" for split, s in results["test"].items())
    return (
        f"{results['model']} ({results['params']:,} params): {results['steps']} steps, {results['epochs']} epochs, "
        f"{results['train_seconds']:.0f} s, {results['train_tokens_per_second']:.0f} tgt tok/s; "
        f"best valid BLEU {results['valid']['bleu']:.2f}; {tests}"
    )
