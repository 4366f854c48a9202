"""Faults in real runs (tiny models, the Multi30k slice): signals and kills of train.py subprocesses,
exact resume; non-finite steps and the checkpoints kept, trained in this process."""

import fcntl
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT, compose, scalars, tiny_run

pytestmark = pytest.mark.slow  # real train.py runs in subprocesses, stopped, killed and resumed


def command(run_dir: Path, slice_dir: Path, cache: Path, *extra: str):
    return [
        sys.executable,
        str(ROOT / "train.py"),
        *tiny_run(
            run_dir,
            slice_dir,
            cache,
            "trainer.batch_tokens=1000",
            "trainer.log_every=1",
            "trainer.eval_every=12",
            "trainer.max_steps=24",
            *extra,
        ),
    ]


def train_here(run_dir: Path, slice_dir: Path, cache: Path, *extra: str):
    """The run of ``command`` trained in this process (``training.run.train``, as ``train.py`` calls
    it): for what a run's outputs show, where a process of its own adds nothing."""
    from training.run import train

    overrides = [o for o in command(run_dir, slice_dir, cache, *extra)[2:] if not o.startswith("hydra.")]
    return train(compose(overrides), run_dir)


BLOW_UP = [
    "trainer.lr=3e38",
    "trainer.betas=[0.0,0.999]",
    "trainer.schedule=constant",
    "trainer.warmup_steps=0",
    "trainer.clip_grad_norm=null",
]


def losses(run_dir: Path):
    return dict(scalars(run_dir / "tb", "train/loss"))


@pytest.mark.parametrize(
    "extra",
    [
        # a schedule fitted to the run, an EMA (saved in the checkpoint) and sampled segmentations
        ["trainer.schedule=cosine", "trainer.ema_decay=0.9", "data.sampling_alpha=0.3"],
        # guided alignment on fast_align's links of the slice (computed by the first run, cached)
        ["data.alignments=fast_align", "trainer.guided_alignment=0.5"],
    ],
    ids=["cosine-ema-sampling", "guided"],
)
def test_a_run_stopped_by_sigterm_and_resumed_is_the_uninterrupted_run(multi30k_slice, tmp_path, extra):
    """Runs with state a resume must restore beside the plain run's weights, optimizer and
    generators (sampling and guided alignment exclude each other): the losses, the weights and the
    EMA bit for bit."""
    cache = tmp_path / "cache"
    whole = subprocess.run(
        command(tmp_path / "whole", multi30k_slice, cache, *extra),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert whole.returncode == 0, whole.stderr[-2000:]
    split = tmp_path / "split"
    process = subprocess.Popen(
        command(split, multi30k_slice, cache, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in process.stdout:  # stop in the middle of the first epoch, between evaluations
        if " step 7/" in line:
            process.send_signal(signal.SIGTERM)
            break
    rest = process.communicate(timeout=600)[0]
    assert process.returncode == 75, rest[-2000:]
    assert "resume with: python train.py trainer.resume=auto" in rest
    resumed = subprocess.run(
        command(split, multi30k_slice, cache, *extra, "trainer.resume=auto"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert losses(split) == losses(tmp_path / "whole") and len(losses(split)) == 24
    if "trainer.guided_alignment=0.5" in extra:  # its loss in TensorBoard, the same; the links from the cache
        aligned = scalars(split / "tb", "train/alignment_loss")
        assert aligned == scalars(tmp_path / "whole" / "tb", "train/alignment_loss") and len(aligned) == 24
        assert "guided alignment: the links of fast_align from" in resumed.stderr + resumed.stdout
    a = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)
    b = torch.load(split / "checkpoints" / "last.pt", weights_only=True)
    # bitwise: same ops, same order, same thread count on CPU
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a.keys() == b.keys() and all(torch.equal(a["ema"][k], b["ema"][k]) for k in a.get("ema", {}))


def default_sigint() -> None:
    """In the child: SIGINT at its default, even when the tests run with it ignored (a background job)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_inherited_as_ignored_stays_ignored(multi30k_slice, tmp_path):
    """Started with SIGINT ignored (``nohup ... &``), training is not stopped by it, as Python itself
    leaves such a signal ignored; SIGTERM still stops it."""
    run = tmp_path / "run"
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    process = subprocess.Popen(
        command(run, multi30k_slice, tmp_path / "cache", "trainer.max_steps=10"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ignore,
    )
    wait_for(process, " step 3/")
    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=300)[0]
    assert process.returncode == 0, rest[-2000:]
    assert "SIGINT" not in rest and (run / "results.json").is_file()


def test_a_second_process_training_into_a_run_folder_is_refused(multi30k_slice, tmp_path):
    """The folder's lock is held (here by the test, as a running train.py holds it): a second
    train.py there is refused with one line before it writes anything, its train.log included."""
    run = tmp_path / "run"
    run.mkdir()
    holder = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = subprocess.run(
            command(run, multi30k_slice, tmp_path / "cache"), capture_output=True, text=True, timeout=300
        )
    finally:
        os.close(holder)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: another process is training in {run} (it holds the folder's lock): wait for it to end, "
        "or choose another hydra.run.dir"
    ]
    assert list(run.iterdir()) == []


def wait_for(process: subprocess.Popen, text: str) -> str:
    """Read the process's output up to the first line holding ``text``; all of it so far."""
    seen = []
    for line in process.stdout:
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"never saw {text!r}:\n" + "".join(seen)[-2000:])


def test_a_second_signal_exits_at_once_and_the_previous_last_pt_survives(multi30k_slice, tmp_path):
    """The run is frozen (SIGSTOP) in the middle of training, sent SIGINT and SIGTERM (two
    different signals stay pending; two SIGINTs would merge into one) and let go (SIGCONT). The
    first handler to run asks to stop after the step, the second exits at once with 128 + its
    signal. Which runs first is not fixed: Python runs pending handlers in signal-number order, but
    the process's other threads (torch's) may take SIGTERM first and SIGINT later (seen under load).
    The last.pt in place when the run was frozen is the one left."""
    run = tmp_path / "run"
    process = subprocess.Popen(
        command(run, multi30k_slice, tmp_path / "cache", "trainer.eval_every=3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,
    )
    wait_for(process, "valid step 3:")
    wait_for(process, " step 5/")
    process.send_signal(signal.SIGSTOP)
    saved = (run / "checkpoints" / "last.pt").read_bytes()
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGTERM)
    process.send_signal(signal.SIGCONT)
    rest = process.communicate(timeout=300)[0]
    first, second = (
        (signal.SIGINT, signal.SIGTERM)
        if process.returncode == 128 + signal.SIGTERM
        else (signal.SIGTERM, signal.SIGINT)
    )
    assert process.returncode == 128 + second, rest[-2000:]
    assert f"{first.name}: stopping after the current step" in rest, rest[-2000:]
    assert f"second {second.name}: exiting at once" in rest, rest[-2000:]
    assert (run / "checkpoints" / "last.pt").read_bytes() == saved
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["progress"]["step"] >= 3


WRITER = """
import sys, torch
from pathlib import Path
from common.checkpoint import save_checkpoint, load_checkpoint
path = Path(sys.argv[1])
step = load_checkpoint(path)["step"] + 1 if path.exists() else 0
while True:  # 16 MB checkpoints, as fast as the disk takes them
    save_checkpoint({"model": {"w": torch.full((4_000_000,), float(step))}, "model_config": {}, "step": step}, path)
    print(step, flush=True)
    step += 1
"""


def test_sigkill_during_saves_never_leaves_a_broken_checkpoint(tmp_path):
    """The real save_checkpoint, killed with SIGKILL at 6 points in its save loop: each time the
    checkpoint in place loads whole, holds the last step reported saved (or the one being saved
    when the rename had happened), and the writer goes on from it."""
    from common.checkpoint import load_checkpoint

    path = tmp_path / "last.pt"
    for attempt in range(6):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        reported = int(writer.stdout.readline())
        time.sleep(0.029 * attempt)  # spread the kills over the save's phases
        writer.kill()
        writer.wait(timeout=60)
        payload = load_checkpoint(path)
        assert payload["step"] >= reported
        assert torch.equal(payload["model"]["w"], torch.full((4_000_000,), float(payload["step"])))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "last.pt"]
    assert all(name.startswith(".last.pt.") and name.endswith(".tmp") for name in leftovers)


def test_a_run_killed_with_sigkill_resumes_from_its_last_checkpoint(multi30k_slice, tmp_path):
    run = tmp_path / "run"
    process = subprocess.Popen(
        command(run, multi30k_slice, tmp_path / "cache", "trainer.eval_every=4", "trainer.max_steps=6"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for(process, "valid step 4:")
    wait_for(process, " step 5/")
    process.kill()
    process.wait(timeout=60)
    stale = (
        run / "checkpoints" / ".last.pt.k1ll3d.tmp"
    )  # what a kill inside a save leaves (the loop above rarely hits one)
    stale.write_bytes(b"half a checkpoint")
    resumed = subprocess.run(
        command(
            run,
            multi30k_slice,
            tmp_path / "cache",
            "trainer.eval_every=4",
            "trainer.max_steps=6",
            "trainer.resume=auto",
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert re.search(r"resumed from \S+last\.pt at step 4 ", resumed.stdout + resumed.stderr)
    assert (run / "results.json").is_file()
    assert not stale.exists()  # a killed save's temporary file is cleared on resume


def test_non_finite_steps_are_skipped_and_too_many_in_a_row_stop_the_run(multi30k_slice, tmp_path, caplog):
    """A real blow-up: lr=3e38 with Adam's beta1=0 (its first step moves every weight by the full
    lr) and no clipping. Step 1 throws the weights to ~3e38, so the next forward overflows and every
    later loss is non-finite; the updates are skipped, and the third in a row stops the run with
    last.pt at step 1. (A merely huge lr is not enough: tanh saturates and the loss stays finite.)
    In this process: ``train.py`` prints a ``TrainingError`` as one ``error:`` line and exits 1
    (test_bad_inputs.py)."""
    from training.trainer import TrainingError

    run = tmp_path / "run"
    with caplog.at_level(logging.INFO), pytest.raises(TrainingError) as stopped:
        train_here(run, multi30k_slice, tmp_path / "cache", *BLOW_UP, "trainer.max_bad_steps=3")
    log_text = caplog.text
    for n in (1, 2, 3):
        assert f"on epoch 1 batch {n + 1}: update skipped ({n} in a row, {n} in all)" in log_text
    assert str(stopped.value).startswith(
        "3 steps in a row with a non-finite loss or gradient (trainer.max_bad_steps), the last on epoch 1 batch 4"
    )
    payload = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert payload["progress"]["step"] == 1 and payload["progress"]["skipped_steps"] == 3
    assert all(torch.isfinite(t).all() for t in payload["model"].values())
    assert [value for _, value in scalars(run / "tb", "train/skipped_steps")] == [1, 2, 3]
    assert not (run / "results.json").exists()

    # The same fault stopping the run on the last batch of an epoch: the resumed run starts the
    # next epoch (it used to find no batch left and loop for ever), and stops there again.
    per_epoch = int(re.search(r"train batches: (\d+) per epoch", log_text).group(1))
    edge = tmp_path / "edge"
    with pytest.raises(TrainingError, match=f"the last on epoch 1 batch {per_epoch};"):
        train_here(
            edge, multi30k_slice, tmp_path / "cache", *BLOW_UP, f"trainer.max_bad_steps={per_epoch - 1}"
        )
    progress = torch.load(edge / "checkpoints" / "last.pt", weights_only=True)["progress"]
    assert (progress["epoch"], progress["batches_done"], progress["step"]) == (1, 0, 1)
    with pytest.raises(TrainingError, match="the last on epoch 2 batch 2;"):
        train_here(
            edge,
            multi30k_slice,
            tmp_path / "cache",
            *BLOW_UP,
            "trainer.max_bad_steps=2",
            "trainer.resume=auto",
        )


def test_keep_last_keeps_the_newest_evaluations_checkpoints(multi30k_slice, tmp_path):
    run = tmp_path / "run"
    train_here(
        run,
        multi30k_slice,
        tmp_path / "cache",
        "trainer.eval_every=3",
        "trainer.max_steps=12",
        "trainer.keep_last=2",
    )
    kept = sorted(p.name for p in (run / "checkpoints").glob("step_*.pt"))
    assert kept == ["step_0000009.pt", "step_0000012.pt"]
    assert torch.load(run / "checkpoints" / "step_0000009.pt", weights_only=True)["progress"]["step"] == 9
    assert (run / "checkpoints" / "step_0000012.pt").read_bytes() == (
        run / "checkpoints" / "last.pt"
    ).read_bytes()
