"""Data-parallel training under torchrun: two CPU ranks (gloo), a tiny model, the Multi30k slice."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, every_core, scalars, tiny_run

STEPS = 6

pytestmark = pytest.mark.slow  # torchrun jobs of two ranks


def overrides(run_dir: Path, slice_dir: Path, cache: Path, *extra: str):
    return tiny_run(
        run_dir,
        slice_dir,
        cache,
        "model.dropout=0.0",
        "trainer.schedule=constant",
        "trainer.warmup_steps=0",
        "trainer.lr=0.01",
        "trainer.log_every=1",
        f"trainer.max_steps={STEPS}",
        *extra,
    )


def torchrun(n: int, *args: str):
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        str(ROOT / "train.py"),
        *args,
    ]


def test_two_ranks_train_like_one_process_with_the_same_global_batch_and_write_one_run(
    multi30k_slice, tmp_path
):
    """2 ranks x 500 tokens against 1 process accumulating 2 x 500 tokens: the same pairs in every
    step (rank r takes batches r, r + 2, ...; accumulation takes 2k, 2k + 1), the same token
    normalisation, so the losses agree up to the order of float additions (the all-reduce sums the
    ranks' gradients where accumulation adds them in turn): relative 1e-4 after 6 Adam steps. With
    guided alignment, whose loss adds every rank's linked pieces (a collective of its own), so that
    the training loss and the alignment loss are both checked."""
    extra = ["data.alignments=fast_align", "trainer.guided_alignment=0.5"]
    cache = tmp_path / "cache"
    single = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            *overrides(
                tmp_path / "single",
                multi30k_slice,
                cache,
                "trainer.batch_tokens=500",
                "trainer.accumulate=2",
                *extra,
            ),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    run = tmp_path / "ddp"
    done = subprocess.run(
        torchrun(2, *overrides(run, multi30k_slice, cache, "trainer.batch_tokens=500", *extra)),
        preexec_fn=every_core,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    one = scalars(tmp_path / "single" / "tb", "train/loss")
    two = scalars(run / "tb", "train/loss")
    assert [s for s, _ in two] == [s for s, _ in one] == list(range(1, STEPS + 1))
    assert [v for _, v in two] == pytest.approx([v for _, v in one], rel=1e-4)
    # guided alignment's loss, every rank's linked pieces together
    aligned = [v for _, v in scalars(run / "tb", "train/alignment_loss")]
    assert aligned == pytest.approx(
        [v for _, v in scalars(tmp_path / "single" / "tb", "train/alignment_loss")], rel=1e-4
    )
    assert (
        one[-1][1] < one[0][1] - 0.05
    )  # the steps moved the weights: the comparison is not of six initial losses
    # One run: one results.json, the events of one process (the hparams summary is a second file
    # of that same writer, as in every run), one log; no folder from the other rank.
    events = [p.name for p in (run / "tb").rglob("events.out.tfevents.*")]
    assert (run / "results.json").is_file() and len({name.split(".")[-2] for name in events}) == 1, events
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "ddp", "single"]
    assert (run / "train.log").read_text().count("summary:") == 1
    assert "world of 2 ranks" in (run / "train.log").read_text()


def worker_pids(parent: int):
    """The torchrun workers below ``parent`` with their RANK (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            status = (entry / "status").read_text()
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == parent:
            for item in environ:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry.name)
    return found


@pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="needs /proc to find the worker processes"
)
def test_both_ranks_map_one_token_store_and_a_killed_rank_makes_the_job_fail_instead_of_hanging(
    multi30k_slice, tmp_path
):
    """Rank 0 builds the token store (the cache starts empty), rank 1 maps the same files; then
    rank 1 is killed."""
    run = tmp_path / "ddp"
    job = subprocess.Popen(
        torchrun(
            2,
            *overrides(
                run,
                multi30k_slice,
                tmp_path / "cache",
                "trainer.batch_tokens=500",
                "trainer.max_steps=100000",
            ),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        preexec_fn=every_core,
    )
    seen = []
    for line in job.stdout:
        seen.append(line)
        if " step 3/" in line:
            break
    workers = worker_pids(job.pid)
    assert sorted(workers) == [0, 1], "".join(seen)[-2000:]
    stores = list((tmp_path / "cache" / "store").iterdir())
    assert len(stores) == 1, stores  # one store, no temporary folder of a second build
    ids = str((stores[0] / "train.src.ids").resolve())
    for rank, pid in workers.items():
        assert ids in Path(f"/proc/{pid}/maps").read_text(), f"rank {rank} does not map {ids}"
    os.kill(workers[1], signal.SIGKILL)
    tick = time.monotonic()
    rest = job.communicate(timeout=180)[0]
    assert job.returncode != 0, rest[-2000:]
    assert time.monotonic() - tick < 180
    assert not (run / "results.json").exists()


def test_two_ranks_build_the_token_store_once_and_both_map_it(multi30k_slice, tmp_path):
    """scripts/data_stats.py under torchrun logs on every rank: rank 0 builds, rank 1 uses."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(ROOT / "scripts" / "data_stats.py"),
            f"data.root={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.vocab_size=500",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        preexec_fn=every_core,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-2000:]
    assert log.count("data: building the token store") == 1, log[-2000:]
    assert log.count("data: using the token store") == 1, log[-2000:]
    assert "rank 0:" in log and "rank 1:" in log, log[-2000:]  # both ranks' memory lines
    assert len(list((tmp_path / "cache" / "store").iterdir())) == 1


def test_a_two_task_submitit_job_trains_as_two_ranks(multi30k_slice, tmp_path):
    """The SLURM path without SLURM: Hydra's submitit launcher, local executor, 2 tasks in one
    job; train.py maps the tasks onto torchrun's variables and trains with DDP (optional plugin)."""
    pytest.importorskip(
        "hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher is not installed (optional)"
    )
    sweep = tmp_path / "sweep"
    args = [
        a
        for a in overrides(
            tmp_path / "unused", multi30k_slice, tmp_path / "cache", "trainer.batch_tokens=500"
        )
        if not a.startswith("hydra.run.dir=")
    ]
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "-m",
            "hydra/launcher=submitit_local",
            "hydra.launcher.tasks_per_node=2",
            f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=job",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (run,) = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    log_text = (run / "train.log").read_text()
    assert "data parallel: world of 2 ranks" in log_text and log_text.count("summary:") == 1
    assert (run / "results.json").is_file()


def test_each_rank_resumes_its_own_dropout_masks(multi30k_slice, tmp_path):
    """With dropout, each rank draws its own masks: a run continued from the checkpoint of another
    run's first evaluation continues both ranks' generators, so its losses are those of the
    uninterrupted run (a resume that gave every rank rank 0's generators would give rank 1 other
    masks). The checkpoint kept at step 3 (``trainer.keep_last``) is ``last.pt`` as it was then."""
    cache = tmp_path / "cache"

    def run(folder: Path, *extra: str) -> subprocess.CompletedProcess:
        args = [
            a
            for a in overrides(folder, multi30k_slice, cache, "trainer.batch_tokens=500")
            if "dropout" not in a
        ]
        args += ["model.dropout=0.3", "trainer.eval_every=3", *extra]
        command = torchrun(2, *args)
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=300, cwd=tmp_path, preexec_fn=every_core
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return done

    run(tmp_path / "straight", "trainer.keep_last=2")
    first_evaluation = tmp_path / "straight" / "checkpoints" / "step_0000003.pt"
    resumed = run(tmp_path / "resumed", f"trainer.resume={first_evaluation}")
    assert f"resumed from {first_evaluation} at step 3" in (tmp_path / "resumed" / "train.log").read_text()
    assert "is not exact" not in resumed.stdout + resumed.stderr
    straight = scalars(tmp_path / "straight" / "tb", "train/loss")
    assert [s for s, _ in straight] == list(range(1, STEPS + 1))
    # bitwise: one machine, one thread a rank
    assert scalars(tmp_path / "resumed" / "tb", "train/loss") == straight[3:]


def test_the_world_and_the_rank_come_from_torchruns_variables_alone(monkeypatch, tmp_path):
    from omegaconf import OmegaConf

    from training.distributed import World, world_from_env
    from training.run_folder import RunFolderCheck, unlock_run_folder

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert world_from_env() == World() and world_from_env().main
    for name, value in dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2").items():
        monkeypatch.setenv(name, value)
    assert world_from_env() == World(3, 4, 1, 2) and not world_from_env().main
    folder = tmp_path / "run"
    config = OmegaConf.create({"hydra": {"run": {"dir": str(folder)}}, "trainer": {"resume": None}})
    RunFolderCheck().on_run_start(config)  # rank 3: rank 0 claims the run folder, not this one
    assert not folder.exists()
    monkeypatch.setenv("RANK", "0")
    RunFolderCheck().on_run_start(config)
    assert folder.is_dir()
    unlock_run_folder(folder)
