"""A catalogue of bad inputs to ``train.py`` (real subprocesses, a tiny model, the Multi30k slice).

Each case asserts the message, the non-zero exit and that the earlier run in the folder is
untouched: every file byte for byte, except ``train.log``, which may only have lines appended
(Hydra opens it before ``train.py`` runs; the refusal is logged there too).

Config values, data and checkpoints that ``prepare`` refuses are checked in this process
(``prepare`` on a copy of the run); the command line's exit code and one ``error:`` line are
checked with the refusals that come before ``prepare`` (the run folder's checks, in the Hydra
callback) and one of ``prepare``'s. Keys and types that Hydra refuses while composing are in
test_config.py.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
import torch
from omegaconf.errors import ConfigKeyError

from common.checkpoint import CheckpointError
from data.errors import DataError
from training.run import prepare

from helpers import ROOT, tiny_run

TINY_STEPS = ["trainer.batch_tokens=1000", "trainer.max_steps=6", "trainer.eval_every=3"]


def train(run_dir: Path, data_root: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    args = tiny_run(run_dir, data_root, cache, *TINY_STEPS, *extra)
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, timeout=300
    )


def snapshot(folder: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(multi30k_slice, tmp_path_factory):
    """One finished tiny run (6 steps), made once; each case works on a copy."""
    base = tmp_path_factory.mktemp("finished")
    done = train(base / "run", multi30k_slice, base / "cache")
    assert done.returncode == 0, done.stderr[-2000:]
    return base / "run", base / "cache"


def bad_data(slice_dir: Path, target: Path, kind: str) -> Path:
    """A copy of the slice with one fault."""
    shutil.copytree(slice_dir, target)
    if kind == "short_target":
        lines = (target / "train.en").read_text(encoding="utf-8").splitlines(keepends=True)
        (target / "train.en").write_text("".join(lines[:-1]), encoding="utf-8")
    elif kind == "empty_train":
        for lang in ("de", "en", "fr"):
            (target / f"train.{lang}").write_text("", encoding="utf-8")
    return target


# (case, overrides, expected text); {run}: a copy of the finished run, {fresh}: a folder that does
# not exist, {slice}: the data slice, {short} / {empty}: slices with a fault, {nothing}: no folder.
# Config and data faults are tried while continuing the finished run (trainer.resume=auto), the
# case where a mistake could cost the most: its checkpoints and results must survive.
CASES = [
    (
        "unknown key added with +",
        ["trainer.resume=auto", "+trainer.frobnicate=1"],
        "error: unknown config key trainer.frobnicate",
    ),
    (
        "resume=auto with nothing to resume",
        ["hydra.run.dir={fresh}", "trainer.resume=auto"],
        "error: trainer.resume=auto: nothing to resume",
    ),
    (
        "new run in a finished run's folder",
        [],
        "already holds a finished run (results.json); a new run there would overwrite it",
    ),
    (
        "another run's checkpoint into a finished run's folder",
        ["trainer.resume={earlier}/checkpoints/last.pt"],
        "already holds a finished run",
    ),
    (
        "run folder not writable",
        ["hydra.run.dir={run}/results.json/run"],
        "error: cannot write into hydra.run.dir={run}/results.json/run (Not a directory)",
    ),
]


@pytest.mark.parametrize("case, overrides, expected", CASES, ids=[case[0] for case in CASES])
def test_bad_input_is_refused_and_the_earlier_run_survives(
    case, overrides, expected, finished_run, multi30k_slice, tmp_path
):
    earlier, cache = finished_run
    run = tmp_path / "run"
    shutil.copytree(earlier, run)
    before = snapshot(run)
    names = {
        "run": run,
        "earlier": earlier,
        "fresh": tmp_path / "fresh",
        "slice": multi30k_slice,
        "nothing": tmp_path / "nothing",
    }
    if "{short}" in " ".join(overrides):
        names["short"] = bad_data(multi30k_slice, tmp_path / "short", "short_target")
    if "{empty}" in " ".join(overrides):
        names["empty"] = bad_data(multi30k_slice, tmp_path / "empty", "empty_train")
    done = train(run, multi30k_slice, cache, *[o.format(**names) for o in overrides])
    assert done.returncode == 1, done.stderr[-2000:]
    assert expected.format(**names) in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    if expected.startswith("error:"):  # ours: one line (the others are Hydra's own, naming full_key)
        assert len(done.stderr.splitlines()) == 1, done.stderr
    after = snapshot(run)
    log_before, log_after = before.pop("train.log"), after.pop("train.log")
    assert after == before and log_after.startswith(log_before)
    assert not (tmp_path / "fresh").exists()


# (case, overrides, error, expected text): refused by prepare() while continuing the finished run
# (trainer.resume=auto); {nothing}: no folder, {short} / {empty}: slices with a fault.
PREPARE_CASES = [
    ("unknown data key", ["+data.srcc=de"], ConfigKeyError, "unknown config key data.srcc"),
    ("unknown model key", ["+model.frobnicate=1"], ConfigKeyError, "unknown config key model.frobnicate"),
    ("out of range", ["trainer.keep_last=0"], ValueError, "trainer.keep_last must be at least 1, got 0"),
    ("negative learning rate", ["trainer.lr=-1"], ValueError, "trainer.lr must be positive, got -1.0"),
    ("model size zero", ["model.hidden_size=0"], ValueError, "model.hidden_size must be at least 1, got 0"),
    (
        "model checked before the data",  # a model typo surfaces at once, not after the data is prepared
        ["model.dropout=1.5", "data.root={nothing}"],
        ValueError,
        "model.dropout must be in [0, 1), got 1.5",
    ),
    ("data folder missing", ["data.root={nothing}"], DataError, "data folder {nothing} does not exist"),
    (
        "mismatched line counts",
        ["data.root={short}"],
        DataError,
        "has 400 lines but {short}/train.en has 399",
    ),
    ("empty training split", ["data.root={empty}"], DataError, "the training split of"),
    (
        "vocabulary too large",
        ["data.vocab_size=100000"],
        DataError,
        "data.vocab_size=100000 does not fit this training data",
    ),
    (
        "resume with a changed model config",
        ["model.hidden_size=32", "model.dropout=0.1"],
        CheckpointError,
        "model.dropout (checkpoint 0.2, now 0.1), model.hidden_size (checkpoint 64, now 32)",
    ),
    (
        "resume with other batches",
        ["trainer.batch_tokens=1200", "seed=2"],
        CheckpointError,
        "other settings that decide the batches: seed (checkpoint 1, now 2), "
        "trainer.batch_tokens (checkpoint 1000, now 1200)",
    ),
]


@pytest.mark.parametrize("case, overrides, error, expected", PREPARE_CASES, ids=[c[0] for c in PREPARE_CASES])
def test_bad_config_or_data_is_refused_before_the_earlier_run_is_touched(
    case, overrides, error, expected, finished_run, multi30k_slice, compose_config, tmp_path
):
    earlier, cache = finished_run
    run = tmp_path / "run"
    shutil.copytree(earlier, run)
    before = snapshot(run)
    names = {"nothing": tmp_path / "nothing"}
    if "{short}" in " ".join(overrides):
        names["short"] = bad_data(multi30k_slice, tmp_path / "short", "short_target")
    if "{empty}" in " ".join(overrides):
        names["empty"] = bad_data(multi30k_slice, tmp_path / "empty", "empty_train")
    args = [o for o in tiny_run(run, multi30k_slice, cache, *TINY_STEPS) if not o.startswith("hydra.")]
    cfg = compose_config([*args, "trainer.resume=auto", *[o.format(**names) for o in overrides]])
    expected = expected.format(**names)
    threads = torch.get_num_threads()  # prepare sets this process's threads before it reads the data config
    try:
        with pytest.raises(error, match=re.escape(expected)):
            prepare(cfg, run)
    finally:
        torch.set_num_threads(threads)
    assert snapshot(run) == before


def test_a_checkpoint_carrying_code_is_refused_by_train_and_nothing_runs(
    multi30k_slice, finished_run, tmp_path
):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    payload = torch.load(finished_run[0] / "checkpoints" / "last.pt", weights_only=True)
    torch.save(dict(payload, optimizer=Payload()), evil)
    done = train(tmp_path / "run", multi30k_slice, finished_run[1], f"trainer.resume={evil}")
    assert done.returncode == 1
    assert (
        f"error: checkpoint {evil} cannot be read: it holds pickled code or objects (posix.system)"
        in done.stderr
    ), done.stderr[-2000:]
    assert not marker.exists()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_an_unwritable_run_folder_is_refused(multi30k_slice, finished_run, read_only_folder):
    done = train(read_only_folder / "run", multi30k_slice, finished_run[1])
    assert done.returncode == 1
    assert (
        f"error: cannot write into hydra.run.dir={read_only_folder / 'run'} (Permission denied)"
        in done.stderr
    )


def test_a_finished_run_continues_with_resume_auto(finished_run, multi30k_slice, tmp_path):
    """The documented way on from a finished run: trainer.resume=auto with a later limit."""
    earlier, cache = finished_run
    run = tmp_path / "run"
    shutil.copytree(earlier, run)
    done = train(run, multi30k_slice, cache, "trainer.resume=auto", "trainer.max_steps=9")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run / "results.json").read_text())["steps"] == 9
    assert "trainer.max_steps=9" in (run / ".hydra" / "overrides.yaml").read_text()
