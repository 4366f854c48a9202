"""scripts/compare.py on real finished runs: a Hydra sweep of both families and two seeds, trained
for a few steps in the test (``train.py -m``, as users run it); and its errors."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
COMPARE = [sys.executable, str(ROOT / "scripts" / "compare.py")]


def run(command, **kwargs):
    return subprocess.run(command, cwd=kwargs.pop("cwd", ROOT), capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def sweep(multi30k_slice, tmp_path_factory):
    """``train.py -m model=rnn,transformer seed=1,2``: four tiny finished runs in one multirun folder."""
    scratch = tmp_path_factory.mktemp("sweep")
    folder = scratch / "multirun"
    done = run([
        sys.executable, str(ROOT / "train.py"), "-m", "model=rnn,transformer", "seed=1,2",
        f"data.root={multi30k_slice}", f"data.cache_dir={scratch / 'cache'}", "data.vocab_size=500",
        "trainer.max_steps=3", "trainer.eval_every=2", "trainer.batch_tokens=1500", "trainer.warmup_steps=2",
        "trainer.beam_size=2", "trainer.attention_samples=0", f"hydra.sweep.dir={folder}",
    ], cwd=scratch)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, done.stdout + done.stderr


JOBS = [("0", "model=rnn", "seed=1"), ("1", "model=rnn", "seed=2"), ("2", "model=transformer", "seed=1"), ("3", "model=transformer", "seed=2")]


def job_of(name: str):
    """``(job number, model override, seed override)`` of a sweep folder ``<n>_<overrides, comma-separated>``."""
    number, overrides = name.split("_", 1)
    settings = overrides.split(",")
    return number, next(s for s in settings if s.startswith("model=")), next(s for s in settings if s.startswith("seed="))


def significance_rows(markdown: str):
    """``(run, BLEU p, chrF p)`` of the rows of the first significance table."""
    section = markdown.split("## Significance on test_2016_flickr", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    return [(cells[0].strip("| `"), cells[3], cells[6].rstrip(" |")) for cells in rows]


def test_sweep_trains_each_family_and_seed_in_its_own_folder_with_one_shared_vocabulary(sweep):
    folder, log = sweep
    runs = sorted(p.parent for p in folder.glob("*/results.json"))
    assert [job_of(p.name) for p in runs] == JOBS
    assert log.count("trained unigram SentencePiece") == 1 and log.count("using the cached SentencePiece") == 3
    tokenizers = [torch.load(p / "checkpoints" / "best.pt", weights_only=True)["tokenizer"] for p in runs]
    assert all(t == tokenizers[0] for t in tokenizers)
    refs = {(p / "test_2016_flickr.ref").read_text(encoding="utf-8") for p in runs}
    assert len(refs) == 1 and len(refs.pop().splitlines()) == 30


def test_compare_reports_every_run_with_p_values_seed_groups_and_a_figure(sweep):
    folder, _ = sweep
    done = run(COMPARE + [str(folder), "--bootstrap", "200"])
    assert done.returncode == 0, done.stderr
    markdown = (folder / "comparison.md").read_text(encoding="utf-8")
    assert done.stdout == markdown
    table = markdown.split("## Runs", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == 4
    assert [row.split(" | ")[1] for row in rows] == ["rnn", "rnn", "transformer", "transformer"]
    for folder_run in folder.glob("*/results.json"):
        results = json.loads(folder_run.read_text())
        assert f"{results['params']:,}" in table and f"{results['test']['test_2016_flickr']['bleu']:.2f}" in table
    assert "sacrebleu signatures: BLEU `nrefs:1|" in markdown
    significance = significance_rows(markdown)
    assert [job_of(name) for name, _, _ in significance] == JOBS
    assert significance[0][1:] == ("(baseline)", "(baseline)")
    for _, bleu_p, chrf_p in significance[1:]:
        assert 0.0 <= float(bleu_p) <= 1.0 and 0.0 <= float(chrf_p) <= 1.0
    seeds = markdown.split("## Seeds", 1)[1]
    groups = [line.split(" | ") for line in seeds.splitlines() if line.startswith("| rnn") or line.startswith("| transformer")]
    assert [(g[0], g[1]) for g in groups] == [("| rnn", "2"), ("| transformer", "2")]
    assert all("±" in cell for g in groups for cell in g[2:])
    png = (folder / "comparison.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def write_run(folder: Path, model: str, hyps, refs, bleu: float) -> Path:
    """A run folder as train.py leaves it, reduced to what compare.py reads (no .hydra, no events)."""
    folder.mkdir(parents=True)
    results = {"model": model, "params": 10, "steps": 1, "epochs": 1.0, "train_seconds": 60.0,
               "train_tokens_per_second": 100.0, "valid": {"bleu": bleu}, "test": {"test_2016_flickr": {"bleu": bleu, "chrf": bleu}}}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "test_2016_flickr.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (folder / "test_2016_flickr.ref").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    return folder


def test_paired_bootstrap_separates_a_clearly_better_system_and_not_an_equal_one(multi30k_slice, tmp_path):
    refs = (multi30k_slice / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    weak = [" ".join(r.split()[::2]) for r in refs]  # every other word dropped
    base = write_run(tmp_path / "weak", "rnn", weak, refs, 30.0)
    better = write_run(tmp_path / "better", "transformer", refs, refs, 100.0)
    same = write_run(tmp_path / "same", "rnn", weak, refs, 30.0)
    done = run(COMPARE + [str(base), str(better), str(same), "--out", str(tmp_path), "--no-plot"])
    assert done.returncode == 0, done.stderr
    (_, _, _), (_, better_bleu, better_chrf), (_, same_bleu, same_chrf) = significance_rows(done.stdout)
    assert float(better_bleu) < 0.01 and float(better_chrf) < 0.01
    assert float(same_bleu) == 1.0 and float(same_chrf) == 1.0
    assert not (tmp_path / "comparison.png").exists()


def test_runs_on_other_references_are_reported_but_not_paired(multi30k_slice, tmp_path):
    refs = (multi30k_slice / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    other = (multi30k_slice / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    write_run(tmp_path / "runs" / "de-en", "rnn", refs, refs, 100.0)
    write_run(tmp_path / "runs" / "en-de", "rnn", other, other, 100.0)
    done = run(COMPARE + [str(tmp_path / "runs"), "--no-plot"])
    assert done.returncode == 0, done.stderr
    assert "No paired test: en-de was scored against other references than de-en" in done.stdout
    assert (tmp_path / "runs" / "comparison.md").is_file()


def test_a_folder_without_a_finished_run_is_an_error(sweep, tmp_path):
    folder, _ = sweep
    first = sorted(folder.glob("0_*"))[0]
    shutil.copytree(first / ".hydra", tmp_path / "multirun" / first.name / ".hydra")  # started, never finished
    (tmp_path / "empty").mkdir()
    cases = {
        tmp_path / "multirun": "holds no finished run: no results.json below it (1 run folder(s) without results.json",
        tmp_path / "empty": "holds no finished run",
        tmp_path / "missing": "does not exist",
    }
    for path, message in cases.items():
        done = run(COMPARE + [str(path)])
        assert done.returncode == 1
        assert done.stderr.startswith("error: ") and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert done.stdout == "" and not (path / "comparison.md").exists()


def test_a_damaged_results_file_names_the_file(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "results.json").write_text('{"model": "rnn"')
    done = run(COMPARE + [str(folder)])
    assert done.returncode == 1 and re.match(r"error: .*results\.json: not a readable results file", done.stderr)
