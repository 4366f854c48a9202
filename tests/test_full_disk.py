"""A disk that fills while a checkpoint is written (common/checkpoint.py, training/trainer.py):
one line naming the file and the reason, the previous checkpoint intact, and a resume that
continues once there is room again.

The disk is a real one: a small tmpfs, filled to a few kilobytes (mounting needs root, as in CI;
elsewhere these tests skip and say why)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

from helpers import ROOT, tiny_run

STEPS = ["trainer.batch_tokens=1000", "trainer.eval_every=3"]


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs mounted at ``tmp_path/disk``, unmounted afterwards."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system (tmpfs) needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave: int) -> Path:
    """A file that fills ``folder``'s file system up to about ``leave`` free bytes."""
    filler = folder / "filler"
    with open(filler, "wb") as out:
        out.write(b"\0" * max(shutil.disk_usage(folder).free - leave, 0))
    return filler


def payload(values: int):
    return {"model": {"w": torch.arange(values, dtype=torch.float32)}, "model_config": {"name": "rnn"}}


def test_a_full_disk_names_the_checkpoint_and_keeps_the_previous_one(small_disk):
    path = small_disk / "checkpoints" / "last.pt"
    save_checkpoint(payload(100), path)
    before = path.read_bytes()
    fill(small_disk, leave=16 * 1024)
    with pytest.raises(CheckpointError) as raised:
        save_checkpoint(payload(1_000_000), path)
    assert str(raised.value) == (
        f"cannot write checkpoint {path}: No space left on device; the previous last.pt is intact"
    )
    assert path.read_bytes() == before
    assert load_checkpoint(path)["model"]["w"].numel() == 100
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary file left behind


def train(run: Path, data: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    args = tiny_run(run, data, cache, *STEPS, *extra)
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, timeout=300
    )


def test_training_on_a_full_disk_stops_in_one_line_and_resumes(small_disk, multi30k_slice, tmp_path):
    run, cache = small_disk / "run", tmp_path / "cache"
    done = train(run, multi30k_slice, cache, "trainer.max_steps=6")
    assert done.returncode == 0, done.stderr[-2000:]
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    filler = fill(small_disk, leave=64 * 1024)  # room for the logs, not for a checkpoint

    done = train(run, multi30k_slice, cache, "trainer.resume=auto", "trainer.max_steps=9")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"error: cannot write checkpoint {last}: No space left on device; the previous last.pt is intact; "
        "free space (or fix the folder), then continue with: python train.py trainer.resume=auto "
        f"hydra.run.dir={run} (and the same overrides)"
    ]
    assert last.read_bytes() == before
    assert load_checkpoint(last)["progress"]["step"] == 6

    filler.unlink()
    done = train(run, multi30k_slice, cache, "trainer.resume=auto", "trainer.max_steps=9")
    assert done.returncode == 0, done.stderr[-2000:]
    assert load_checkpoint(last)["progress"]["step"] == 9
