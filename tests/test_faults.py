"""Faults in real runs (train.py subprocesses, tiny models, the Multi30k slice): signals, exact resume."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parent.parent
TINY_RNN = ["model=rnn", "model.embed_dim=32", "model.hidden_size=32", "model.attention_size=32"]


def command(run_dir: Path, slice_dir: Path, cache: Path, *extra: str):
    return [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", f"data.root={slice_dir}",
            f"data.cache_dir={cache}", "data.vocab_size=500", *TINY_RNN, "trainer.batch_tokens=1000",
            "trainer.log_every=1", "trainer.eval_every=20", "trainer.max_steps=40", "trainer.max_epochs=null",
            "trainer.attention_samples=0", "trainer.beam_size=1", "trainer.num_threads=1", *extra]


def losses(run_dir: Path):
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars("train/loss")}


def test_a_run_stopped_by_sigterm_and_resumed_is_the_uninterrupted_run(multi30k_slice, tmp_path):
    cache = tmp_path / "cache"
    whole = subprocess.run(command(tmp_path / "whole", multi30k_slice, cache), capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]
    split = tmp_path / "split"
    process = subprocess.Popen(command(split, multi30k_slice, cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:  # stop in the middle of the first epoch, between evaluations
        if " step 13/" in line:
            process.send_signal(signal.SIGTERM)
            break
    rest = process.communicate(timeout=600)[0]
    assert process.returncode == 75, rest[-2000:]
    assert "resume with: python train.py trainer.resume=auto" in rest
    resumed = subprocess.run(command(split, multi30k_slice, cache, "trainer.resume=auto"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert losses(split) == losses(tmp_path / "whole") and len(losses(split)) == 40
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)["model"]
    b = torch.load(split / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise: same ops, same order, same thread count on CPU
