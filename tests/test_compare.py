"""scripts/compare.py on small run folders written by the test in train.py's format (tests/helpers.py:
results.json, .hydra/, <split>.hyp/.ref with real Multi30k sentences, real TensorBoard events), and
one real ``train.py -m`` sweep (slow) that holds that format to what train.py writes."""

import io
import itertools
import json
import math
import statistics
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from comparison.curves import bleu_curve, mean_curve, run_curves, value_at
from comparison.figure import figure
from comparison.formats import format_mean_std, format_p
from comparison.runs import read_run
from comparison.significance import paired_bootstrap, verdict
from comparison.statistics import (
    SPLITS,
    exact_permutations,
    permutation_test,
    smallest_permutation_p,
    welch_t_test,
)
from training.validation import signatures

from helpers import ROOT, SPLIT, drop_words, load_script, sweep_job, write_curve, write_run

compare_script = load_script("compare")

N_SENTENCES = 40


def compare(*args):
    """``compare.py ARGS`` in this process: ``(exit code, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = compare_script.main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def table(markdown: str, section: str):
    """The cells of the rows of the table under ``## <section>``."""
    text = markdown.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [
        [c.strip() for c in line.strip("|").split(" | ")]
        for line in text.splitlines()
        if line.startswith("| ")
        and not line.startswith("| ---")
        and not line.startswith("| run ")
        and not line.startswith("| configuration ")
    ]


@pytest.fixture(scope="module")
def refs(multi30k_dir):
    from data.corpus import read_lines, split_files

    return read_lines(split_files(multi30k_dir)[SPLIT]["en"])[:N_SENTENCES]


# job: (sweep overrides, words dropped from every Nth position, validation curve)
JOBS = [
    (["model=rnn", "seed=1"], 2, [(2, 30.0, 12.0), (4, 60.0, 20.0)]),
    (["model=rnn", "seed=2"], 3, [(2, 33.0, 15.0), (4, 66.0, 22.0)]),
    (["model=transformer", "seed=1"], 5, [(2, 24.0, 25.0), (4, 48.0, 30.0)]),
    (["model=transformer", "seed=2"], 7, [(2, 27.0, 28.0), (4, 54.0, 34.0)]),
]


@pytest.fixture(scope="module")
def sweep(refs, tmp_path_factory):
    """A finished ``train.py -m model=rnn,transformer seed=1,2 data.root=...`` multirun folder."""
    folder = tmp_path_factory.mktemp("multirun") / "2026-01-01" / "12-00-00"
    for number, (overrides, every, curve) in enumerate(JOBS):
        write_run(
            sweep_job(folder, number, overrides),
            drop_words(refs, every),
            refs,
            [*overrides, "data.root=/data/multi30k"],
            curve,
        )
    return folder


@pytest.fixture(scope="module")
def report(sweep):
    """``compare.py SWEEP --bootstrap 200``, once."""
    code, out, err = compare(sweep, "--bootstrap", 200)
    assert code == 0, err
    return out, err


def test_the_runs_table_has_every_run_in_job_order_with_its_results(sweep, report):
    out, err = report
    assert (sweep / "comparison.md").read_text(encoding="utf-8") == out
    assert err.strip().splitlines()[-1] == f"wrote {sweep / 'comparison.md'}, {sweep / 'comparison.png'}"
    rows = table(out, "Runs")
    assert [row[0] for row in rows] == [f"`{sweep_job(sweep, n, job[0]).name}`" for n, job in enumerate(JOBS)]
    models_and_seeds = [(model[6:], seed[5:]) for (model, seed), _, _ in JOBS]  # model=rnn, seed=1: rnn, 1
    assert [(row[1], row[2]) for row in rows] == models_and_seeds
    for row, (_, _, curve) in zip(rows, JOBS):
        results = json.loads((sweep / row[0].strip("`") / "results.json").read_text())
        scores = results["test"][SPLIT]
        assert row[3:] == [
            "123,456",
            "4",
            "1",
            f"{curve[-1][1] / 60:.1f} min",
            "1,500",
            f"{max(b for _, _, b in curve):.2f}",
            "`best.pt`",
            f"{scores['bleu']:.2f}",
            f"{scores['chrf']:.2f}",
        ]
    bleus = [float(row[10]) for row in rows]
    assert bleus == sorted(bleus) and bleus[0] < bleus[-1]  # fewer words dropped, higher BLEU
    sig = signatures()
    assert f"sacrebleu signatures: BLEU `{sig['bleu']}`, chrF `{sig['chrf']}`" in out
    assert "not comparable" not in out


def test_each_run_is_tested_against_the_first_on_the_same_sentences(sweep, report):
    out, _ = report
    first = sweep_job(sweep, 0, JOBS[0][0]).name
    assert f"Paired bootstrap resampling (200 resamples of the test set) of each run against `{first}`" in out
    rows = table(out, f"Significance on {SPLIT}")
    runs = table(out, "Runs")
    assert [row[0] for row in rows] == [row[0] for row in runs]
    # the scores of the .hyp files, as in results.json
    assert [row[1] for row in rows] == [row[10] for row in runs]
    assert [row[4] for row in rows] == [row[11] for row in runs]
    assert rows[0][3] == rows[0][6] == "(baseline)"
    for row in rows:
        mean, ci = row[2].split(" ± ")
        assert abs(float(mean) - float(row[1])) < float(ci) < 10
    p_values = [float(row[i]) for row in rows[1:] for i in (3, 6)]
    assert all(0 <= p <= 1 for p in p_values)
    assert float(rows[3][3]) < 0.05  # a quarter of the words back is a clear difference on 40 sentences
    assert "sacrebleu: BLEU `nrefs:1|bs:200|seed:12345|" in out


def test_runs_that_differ_only_by_seed_form_a_group_with_mean_and_spread(report):
    out, _ = report
    assert "Runs whose configs differ only by `seed`" in out
    rows = table(out, "Seeds")
    assert [row[:3] for row in rows] == [["rnn", "2", "21.00 ± 1.41"], ["transformer", "2", "32.00 ± 2.83"]]
    assert rows[0][5:] == ["1.1 ± 0.1 min", "1,500 ± 0"]  # 60 and 66 seconds
    runs = table(out, "Runs")
    test_bleu = [float(row[10]) for row in runs[:2]]
    mean, std = rows[0][3].split(" ± ")
    assert float(mean) == pytest.approx(sum(test_bleu) / 2, abs=0.006)
    assert float(std) == pytest.approx(abs(test_bleu[0] - test_bleu[1]) / math.sqrt(2), abs=0.006)


def test_groups_are_named_by_the_model_and_the_settings_that_differ(refs, tmp_path):
    common = ["trainer.max_steps=7", "data.root=/somewhere"]
    for number, extra in enumerate(
        [
            ["trainer.lr=0.002", "seed=1"],
            ["trainer.lr=0.002", "seed=2"],
            ["trainer.lr=0.001", "seed=1"],
            ["model=transformer_base", "seed=1"],
        ]
    ):
        model = [] if "model=transformer_base" in extra else ["model=rnn"]
        write_run(
            sweep_job(tmp_path / "runs", number, model + extra),
            refs,
            refs,
            model + extra + common,
            curve=None,
        )
    code, out, err = compare(tmp_path / "runs", "--no-plot")
    assert code == 0, err
    groups = [row[:2] for row in table(out, "Seeds")]
    assert groups == [["rnn trainer.lr=0.002", "2"], ["rnn trainer.lr=0.001", "1"], ["transformer_base", "1"]]
    assert [row[1] for row in table(out, "Runs")] == [
        "rnn",
        "rnn",
        "rnn",
        "transformer",
    ]  # the family, from results.json


def test_one_seed_per_configuration_gets_a_note_instead_of_a_table(refs, tmp_path):
    write_run(tmp_path / "runs" / "a", refs, refs, ["model=rnn"], curve=None)
    write_run(tmp_path / "runs" / "b", refs, refs, ["model=transformer"], curve=None)
    write_run(
        tmp_path / "runs" / "c", refs, refs, ["model=rnn"], curve=None, hydra=False
    )  # a group of its own
    code, out, _ = compare(tmp_path / "runs", "--no-plot")
    assert code == 0
    assert "One seed per configuration." in out and table(out, "Seeds") == []
    assert [row[2] for row in table(out, "Runs")] == ["1", "1", "-"]  # no config: no seed known


def test_paired_bootstrap_separates_a_clearly_better_system_and_not_an_equal_one(refs, tmp_path):
    weak = drop_words(refs, 2)
    base = write_run(tmp_path / "weak", weak, refs, hydra=False)
    better = write_run(tmp_path / "better", refs, refs, hydra=False)
    same = write_run(tmp_path / "same", weak, refs, hydra=False)
    (tmp_path / "out").mkdir()
    code, out, err = compare(base, better, same, "--out", tmp_path / "out", "--no-plot")
    assert code == 0, err
    _, (_, better_bleu, _, better_p, *_), (_, _, _, same_p, _, _, same_chrf_p) = table(
        out, f"Significance on {SPLIT}"
    )
    assert float(better_bleu) == 100.0 and float(better_p) < 0.01
    assert float(same_p) == 1.0 and float(same_chrf_p) == 1.0  # no observed difference: no evidence of one
    assert (tmp_path / "out" / "comparison.md").read_text(encoding="utf-8") == out
    assert not (tmp_path / "out" / "comparison.png").exists()
    assert err.strip().splitlines()[-1] == f"wrote {tmp_path / 'out' / 'comparison.md'}"


def test_pairs_need_the_same_references_and_both_files(refs, multi30k_dir, tmp_path):
    from data.corpus import read_lines, split_files

    german = read_lines(split_files(multi30k_dir)[SPLIT]["de"])[:N_SENTENCES]
    write_run(tmp_path / "runs" / "de-en", refs, refs, curve=None)
    write_run(tmp_path / "runs" / "en-de", german, german, curve=None)
    code, out, _ = compare(tmp_path / "runs", "--no-plot")
    assert code == 0
    other = "other references than de-en (another data set or direction)."
    assert f"No paired test: en-de was scored against {other}" in out
    (tmp_path / "runs" / "en-de" / f"{SPLIT}.hyp").unlink()
    code, out, _ = compare(tmp_path / "runs", "--no-plot")
    assert f"No paired test: en-de has no {SPLIT}.hyp and {SPLIT}.ref." in out
    code, out, _ = compare(tmp_path / "runs" / "de-en", "--out", tmp_path, "--no-plot")
    assert code == 0 and "No paired test: one run: nothing to compare." in out


def test_a_hypothesis_file_shorter_than_its_references_is_an_error(refs, tmp_path):
    run = write_run(tmp_path / "a", refs, refs, curve=None)
    write_run(tmp_path / "b", refs, refs, curve=None)
    (run / f"{SPLIT}.hyp").write_text("".join(r + "\n" for r in refs[:-1]), encoding="utf-8")
    code, out, err = compare(run, tmp_path / "b", "--out", tmp_path, "--no-plot")
    assert code == 1 and out == ""
    assert (
        err == f"error: {run / f'{SPLIT}.hyp'}: {N_SENTENCES - 1} lines for {N_SENTENCES} references in "
        f"{run / f'{SPLIT}.ref'}: the run folder is damaged\n"
    )


def test_every_test_split_of_any_run_is_a_column_and_missing_scores_are_dashes(refs, tmp_path):
    # a: stopped before its first evaluation, so no weights were chosen for its tests
    no_choice = {"used": None, "valid_bleu": {}}
    write_run(tmp_path / "a", refs, refs, curve=None, valid={"bleu": None}, test_weights=no_choice)
    write_run(tmp_path / "b", refs, refs, curve=None, split="test_2017_flickr")
    code, out, _ = compare(tmp_path / "a", tmp_path / "b", "--out", tmp_path, "--no-plot")
    assert code == 0
    head = out.split("## Runs\n\n", 1)[1].splitlines()[0]
    columns = [
        f"{split} {metric}"
        for split in ("test_2016_flickr", "test_2017_flickr")
        for metric in ("BLEU", "chrF")
    ]
    assert head.endswith(" | ".join(["valid BLEU", "test weights", *columns]) + " |")
    (a_valid, a_weights, *a_tests), (_, b_weights, *b_tests) = [row[8:] for row in table(out, "Runs")]
    assert (
        a_valid == "-"
        and (a_weights, b_weights) == ("-", "`best.pt`")
        and a_tests == ["100.00", "100.00", "-", "-"]
        and b_tests == ["-", "-", "100.00", "100.00"]
    )
    assert "## Significance on test_2016_flickr" in out and "## Significance on test_2017_flickr" in out


def test_runs_scored_with_other_sacrebleu_settings_are_flagged(refs, tmp_path):
    write_run(tmp_path / "a", refs, refs, curve=None, hydra=False)
    write_run(
        tmp_path / "b",
        refs,
        refs,
        curve=None,
        hydra=False,
        sacrebleu={"bleu": "nrefs:1|tok:intl", "chrf": "x"},
    )
    code, out, _ = compare(tmp_path / "a", tmp_path / "b", "--out", tmp_path, "--no-plot")
    assert code == 0
    assert "sacrebleu signatures: BLEU `nrefs:1|tok:intl`, chrF `x`" in out
    assert (
        "**The runs were scored with different sacrebleu settings: their scores are not comparable.**" in out
    )


def test_the_figure_plots_validation_bleu_from_the_tensorboard_events(report, sweep):
    png = (sweep / "comparison.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    run = read_run(sweep_job(sweep, 1, JOBS[1][0]), "rnn seed 2")
    assert bleu_curve(run) == ([2, 4], [33.0 / 60, 66.0 / 60], [15.0, 22.0])


def test_a_resumed_run_keeps_the_last_value_logged_at_a_step(refs, tmp_path):
    run = write_run(tmp_path / "run", refs, refs, curve=[(2, 30.0, 10.0), (4, 60.0, 20.0)])
    write_curve(run / "tb", [(4, 62.0, 21.0), (6, 90.0, 25.0)])  # the resumed life evaluates step 4 again
    curve = bleu_curve(read_run(run, "run"))
    assert curve == ([2, 4, 6], [0.5, 62.0 / 60, 1.5], [10.0, 21.0, 25.0])


def test_runs_from_before_the_train_seconds_tag_use_wall_time_and_runs_without_events_are_named(
    refs, tmp_path
):
    old = write_run(tmp_path / "old", refs, refs, curve=None)
    write_curve(old / "tb", [(2, 0.0, 10.0), (4, 0.0, 20.0)], seconds=False)
    steps, minutes, bleu = bleu_curve(read_run(old, "old"))
    assert steps == [2, 4] and bleu == [10.0, 20.0] and minutes[0] == 0.0 and 0.0 <= minutes[1] < 1.0
    write_run(tmp_path / "none", refs, refs, curve=None)
    code, _, err = compare(old, tmp_path / "none", "--out", tmp_path)
    assert code == 0
    assert "warning: no validation curve in the TensorBoard events of none\n" in err
    assert (tmp_path / "comparison.png").read_bytes()[:4] == b"\x89PNG"


def test_the_report_goes_to_the_folder_of_runs_or_the_current_folder(refs, tmp_path, monkeypatch):
    a = write_run(tmp_path / "runs" / "a", refs, refs, curve=None)
    b = write_run(tmp_path / "runs" / "b", refs, refs, curve=None)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for args in [(a,), (a, b)]:  # one run, or several PATHs: the current folder
        assert compare(*args, "--no-plot")[0] == 0
        assert (here / "comparison.md").is_file() and not (tmp_path / "runs" / "comparison.md").exists()
        (here / "comparison.md").unlink()
    assert compare(tmp_path / "runs", "--no-plot")[0] == 0  # one folder of runs: that folder
    assert (tmp_path / "runs" / "comparison.md").is_file() and not (here / "comparison.md").exists()
    code, out, err = compare(a, "--out", tmp_path / "missing")
    assert (code, out, err) == (1, "", f"error: --out {tmp_path / 'missing'}: no such folder\n")


def test_runs_are_named_by_their_path_and_sweeps_with_the_same_job_names_by_the_sweep_too(refs, tmp_path):
    for sweep in ("sweep1", "sweep2"):
        for number in (0, 1):
            write_run(sweep_job(tmp_path / sweep, number, [f"seed={number + 1}"]), refs, refs, curve=None)
    code, out, _ = compare(
        tmp_path / "sweep1",
        tmp_path / "sweep2",
        tmp_path / "sweep1" / "0_seed=1",
        "--out",
        tmp_path,
        "--no-plot",
    )
    assert code == 0
    names = [row[0] for row in table(out, "Runs")]  # the run given twice is there once
    assert names == ["`sweep1/0_seed=1`", "`sweep1/1_seed=2`", "`sweep2/0_seed=1`", "`sweep2/1_seed=2`"]


def test_jobs_sort_by_their_number(refs, tmp_path):
    for number in (10, 9, 2):
        write_run(
            sweep_job(tmp_path / "runs", number, [f"seed={number}"]), refs, refs, curve=None, hydra=False
        )
    code, out, _ = compare(tmp_path / "runs", "--no-plot")
    assert [row[0] for row in table(out, "Runs")] == ["`2_seed=2`", "`9_seed=9`", "`10_seed=10`"]


def test_unfinished_runs_beside_finished_ones_are_left_out_with_a_warning(refs, tmp_path):
    runs = tmp_path / "runs"
    write_run(runs / "0_done", refs, refs, curve=None)
    (runs / "1_training" / ".hydra").mkdir(parents=True)
    (runs / "1_training" / ".hydra" / "config.yaml").write_text("seed: 1\n")
    code, out, err = compare(runs, "--no-plot")
    assert code == 0
    assert [row[0] for row in table(out, "Runs")] == ["`0_done`"]
    why = "still training, interrupted or failed"
    warning = f"warning: {runs / '1_training'} has no results.json ({why}): left out\n"
    assert err.startswith(warning)


def test_paths_without_a_finished_run_are_one_line_errors(tmp_path):
    started = tmp_path / "multirun" / "0_seed=1" / ".hydra"
    started.mkdir(parents=True)
    (started / "config.yaml").write_text("seed: 1\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a run\n")
    none = "holds no finished run: no results.json below it"
    when = "a run writes it when training and testing are done"
    cases = {
        tmp_path / "multirun": f"{tmp_path / 'multirun'} {none} (1 run folder(s) without results.json: still "
        f"training, interrupted or failed); {when}",
        tmp_path / "empty": f"{tmp_path / 'empty'} {none}; {when}",
        tmp_path / "missing": f"{tmp_path / 'missing'} does not exist",
        tmp_path / "notes.txt": f"{tmp_path / 'notes.txt'} is not a run folder or a folder of runs",
    }
    for path, message in cases.items():
        code, out, err = compare(path)
        assert (code, out) == (1, "")
        assert err.splitlines()[-1] == f"error: {message}" and err.count("error:") == 1
        assert not (path / "comparison.md").exists()


def test_damaged_results_files_are_named(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "results.json").write_text('{"model": "rnn"')
    code, _, err = compare(folder)
    assert code == 1 and err.startswith(f"error: {folder / 'results.json'}: not a readable results file (")
    (folder / "results.json").write_text('{"model": "rnn", "params": 3, "test": {}}')
    code, _, err = compare(folder)
    assert code == 1
    assert err == (
        f"error: {folder / 'results.json'}: missing steps, epochs, train_seconds, train_tokens_per_second, "
        "valid: not a results.json written by train.py\n"
    )


def test_bad_options_are_refused_by_the_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare.py"), str(tmp_path), "--bootstrap", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "error: --bootstrap must be at least 1"
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compare.py"), str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        f"error: {tmp_path / 'missing'} does not exist\n",
    )


# ----- significance across seeds, equal budgets, the figure -----
def t_density_p(t, df, intervals=4000):
    """The two-sided p of Student's t by Simpson's rule on its density (a check independent of
    scipy): 1 - 2 * integral of the density from 0 to |t|."""
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    h = abs(t) / intervals
    ys = [scale * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(intervals + 1)]
    area = h / 3 * (ys[0] + ys[-1] + 4 * sum(ys[1:-1:2]) + 2 * sum(ys[2:-1:2]))
    return 1 - 2 * area


def test_welch_t_test_and_the_exact_permutation_test():
    t, df, p = welch_t_test([1, 2, 3], [4, 5, 6])
    assert t == pytest.approx(3 / math.sqrt(2 / 3)) and df == pytest.approx(4)
    assert p == pytest.approx(0.021311641, abs=1e-8)
    # unequal sizes and spreads: the Welch-Satterthwaite degrees of freedom
    t, df, p = welch_t_test([1, 2, 3, 4], [2, 4, 6, 8, 10])
    va, vb = (5 / 3) / 4, 10 / 5
    assert t == pytest.approx(3.5 / math.sqrt(va + vb))
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 3 + vb**2 / 4))
    assert p == pytest.approx(t_density_p(t, df), abs=1e-9)
    assert all(math.isnan(v) for v in welch_t_test([1, 1, 1], [2, 2, 2]))  # no spread
    assert all(math.isnan(v) for v in welch_t_test([1], [2, 3]))
    # 3 + 3 seeds fully apart: only the observed split and its mirror are as far apart, 2 of 20
    assert permutation_test([20.1, 20.5, 20.3], [21.0, 21.4, 22.0]) == (0.1, 20)
    assert permutation_test([22.0, 21.0, 21.4], [20.1, 20.5, 20.3]) == (0.1, 20)
    assert smallest_permutation_p(3, 3) == 0.1
    # pooled 1, 2, 3, 5 in 2 + 2: |differences| 2.5, 1.5, 0.5, 0.5, 1.5, 2.5
    assert permutation_test([1, 2], [3, 5]) == (pytest.approx(2 / 6), 6)
    assert permutation_test([1, 3], [2, 5]) == (pytest.approx(4 / 6), 6)
    assert permutation_test([1, 2, 3], [1, 2, 3]) == (1.0, 20)
    # 10 + 10 seeds: 184,756 splits, too many to go through: a sample of them, the observed one counted in
    assert not exact_permutations(10, 10) and exact_permutations(9, 9)
    # (the observed split or its mirror is drawn about once in 100,000: p is its smallest or near it)
    p, splits = permutation_test(list(range(10)), list(range(20, 30)))
    assert splits == SPLITS and smallest_permutation_p(10, 10) == 1 / (SPLITS + 1) <= p < 10 / SPLITS
    assert permutation_test(list(range(10)), list(range(10)))[0] == 1.0


def test_the_permutation_test_counts_splits_equal_but_for_float_error_as_ties():
    # scores with two decimals: splits whose differences are equal in decimals but not in floats
    a, b = [49.78, 49.68, 49.58], [49.78, 49.28, 49.58]
    cents = [round(100 * x) for x in a + b]  # exact in integers: |difference of sums| of each split
    observed = abs(sum(cents[3:]) - sum(cents[:3]))
    splits = [[cents[i] for i in chosen] for chosen in itertools.combinations(range(6), 3)]
    as_far = sum(abs(sum(cents) - 2 * sum(first)) >= observed for first in splits)
    assert as_far == 14 and permutation_test(a, b) == (pytest.approx(as_far / 20), 20)


def test_the_value_at_a_budget_is_interpolated_between_evaluations_and_never_extrapolated():
    points = ([2.0, 4.0, 4.0, 7.0], [12.0, 20.0, 21.0, 27.0])  # evaluated twice at 4: the last counts
    at = value_at
    assert [at(points, x) for x in (1.99, 2.0, 3.0, 4.0, 5.5, 7.0, 7.01)] == [
        None,
        12.0,
        16.0,
        21.0,
        24.0,
        27.0,
        None,
    ]
    assert at(([], []), 1.0) is None


# rnn seeds 1, 2, 3 and transformer seeds 3 and 1 (in that job order): (overrides, words dropped from
# every Nth position, curve (step, training seconds, valid BLEU), steps per epoch)
SEED_JOBS = [
    (["model=rnn", "seed=1"], 2, [(2, 120.0, 12.0), (4, 240.0, 20.0)], 2),
    (["model=rnn", "seed=2"], 3, [(2, 90.0, 14.0), (4, 180.0, 18.0), (6, 300.0, 21.0)], 3),
    (["model=rnn", "seed=3"], 4, [(2, 150.0, 10.0), (4, 300.0, 16.0)], 2),
    (["model=transformer", "seed=3"], 6, [(2, 60.0, 10.0), (4, 120.0, 12.0), (6, 420.0, 17.0)], 2),
    (["model=transformer", "seed=1"], 8, [(2, 180.0, 22.0)], 2),
]


@pytest.fixture(scope="module")
def seeds_sweep(refs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("seeds") / "multirun"
    for number, (overrides, every, curve, steps_per_epoch) in enumerate(SEED_JOBS):
        job = sweep_job(folder, number, overrides)
        write_run(job, drop_words(refs, every), refs, overrides, curve, steps_per_epoch=steps_per_epoch)
    return folder


@pytest.fixture(scope="module")
def seeds_report(seeds_sweep):
    code, out, err = compare(seeds_sweep, "--bootstrap", 200, "--minutes-step", 1)
    assert code == 0, err
    return out


def section(markdown: str, title: str) -> str:
    return markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def rows(text: str):
    """The cells of every table row in ``text`` (headers and rules left out)."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [
        [c.strip() for c in line.strip("|").split(" | ")] for line in lines if not line.startswith("| ---")
    ]


def test_seed_groups_are_compared_seed_pair_by_seed_pair_and_across_seeds(seeds_sweep, seeds_report):
    out = seeds_report
    text = section(out, f"Significance across seeds on {SPLIT}")
    assert "with 3 + 3 seeds 0.1, 2 of the 20 splits, so it cannot show a difference at 0.05" in text
    assert "The verdict is Welch's at p < 0.05" in text
    name = [f"`{sweep_job(seeds_sweep, n, job[0]).name}`" for n, job in enumerate(SEED_JOBS)]
    assert "### transformer against rnn" in text
    # the common seeds 1 and 3, each rnn run beside the transformer run of its seed
    assert (
        f"Runs with the same seed: seed 1: {name[0]} and {name[4]}; seed 3: {name[2]} and {name[3]}." in text
    )
    results = [json.loads((seeds_sweep / n.strip("`") / "results.json").read_text()) for n in name]
    score = [r["test"][SPLIT] for r in results]
    bleu_block = text.split("**BLEU**", 1)[1].split("**chrF**", 1)[0]
    header, *pairs = rows(bleu_block)
    assert header == ["seed", "rnn", "transformer", "difference", "bootstrap p", "higher"]
    assert [row[:4] for row in pairs] == [
        [
            seed,
            f"{score[a]['bleu']:.2f}",
            f"{score[b]['bleu']:.2f}",
            f"{score[b]['bleu'] - score[a]['bleu']:+.2f}",
        ]
        for seed, a, b in (("1", 0, 4), ("3", 2, 3))
    ]
    assert all(row[5] == "transformer" for row in pairs)  # fewer words dropped in both pairs
    # the p-value of each pair is the paired bootstrap of those two runs alone
    runs = [read_run(seeds_sweep / n.strip("`"), n) for n in name]
    for row, (a, b) in zip(pairs, ((0, 4), (2, 3))):
        scores, _ = paired_bootstrap([runs[a], runs[b]], SPLIT, 200)
        assert row[4] == f"{scores['BLEU'][1].p_value:.4f}"
    assert float(pairs[0][4]) < 0.05  # half the words back
    # across seeds: every seed of each group, not only the paired ones
    rnn, transformer = [s["bleu"] for s in score[:3]], [s["bleu"] for s in score[3:]]
    t, df, p = welch_t_test(rnn, transformer)
    perm, splits = permutation_test(rnn, transformer)
    assert splits == 10
    assert f"Welch's t-test: t = {t:.2f}, df = {df:.1f}, p = {format_p(p)}." in bleu_block
    assert f"Permutation test: p = {perm:.3f} over all 10 splits of the 5 scores into 3 + 2" in bleu_block
    diff = sum(transformer) / 2 - sum(rnn) / 3
    welch, permutation = format_p(p), format_p(perm)
    sentence = (
        f"{diff:+.2f} BLEU (mean over 3 and 2 seeds); Welch p = {welch}, permutation p = {permutation}: "
    )
    assert f"transformer - rnn: {sentence}" in bleu_block
    assert "transformer higher in every seed pair (bootstrap p < 0.05 in " in bleu_block
    chrf_block = text.split("**chrF**", 1)[1]
    assert "transformer - rnn: " in chrf_block and " chrF (mean over 3 and 2 seeds)" in chrf_block


def test_the_verdict_says_what_the_tests_show():
    labels = ("rnn", "transformer")
    a, b = [20.0, 21.0, 22.0], [21.0, 22.5, 23.0]
    no = verdict(labels, "BLEU", a, b, 0.31, 0.4, [(1.0, 0.2), (1.5, 0.01), (1.0, 0.03)])
    assert no == (
        "transformer - rnn: +1.17 BLEU (mean over 3 seeds); Welch p = 0.310, permutation p = 0.400: no "
        "difference shown with 3 seeds; transformer higher in every seed pair (bootstrap p < 0.05 in 2 of 3)."
    )
    # the permutation test is a check, not the verdict
    check = verdict(labels, "BLEU", a, b, 0.2, 0.01, [])
    assert check.endswith("permutation p = 0.010: no difference shown with 3 seeds.")
    yes = verdict(labels, "chrF", b, a, 0.004, 0.1, [(-1.0, 0.01), (0.5, 0.04)])
    assert yes == (
        "transformer - rnn: -1.17 chrF (mean over 3 seeds); Welch p = 0.004, permutation p = 0.100: rnn's "
        "mean is higher across seeds (Welch p < 0.05); rnn higher in 1 of 2 seed pairs (bootstrap p < 0.05 "
        "in 1 of 2), transformer significantly higher in 1."
    )


def test_groups_of_one_seed_are_left_out_of_the_comparison_across_seeds(refs, report, tmp_path):
    out, _ = report  # rnn and transformer, 2 seeds each: compared
    assert f"## Significance across seeds on {SPLIT}" in out and "BLEU (mean over 2 seeds)" in out
    for number, overrides in enumerate(
        [["model=rnn", "seed=1"], ["model=rnn", "seed=2"], ["model=transformer"]]
    ):
        write_run(sweep_job(tmp_path / "one", number, overrides), refs, refs, overrides, curve=None)
    code, out, _ = compare(tmp_path / "one", "--no-plot")
    assert code == 0 and "## Seeds" in out and "Significance across seeds" not in out
    for number, overrides in [(3, ["model=transformer", "seed=2"]), (4, ["model=transformer_base"])]:
        write_run(sweep_job(tmp_path / "one", number, overrides), refs, refs, overrides, curve=None)
    code, out, _ = compare(tmp_path / "one", "--no-plot")
    text = section(out, f"Significance across seeds on {SPLIT}")
    assert code == 0 and "Left out (one seed): `transformer_base`." in text
    assert "### transformer against rnn" in text and text.count("### ") == 1


def test_validation_bleu_at_equal_training_time_is_interpolated_per_seed(seeds_report):
    text = section(seeds_report, "Validation BLEU at equal training time")
    header, rnn, transformer = rows(text)
    assert header == ["configuration", "seeds"] + [
        f"{m} min" for m in range(1, 8)
    ]  # to the longest run's 7 min

    def cell(values, runs):
        mean, std = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None
        text = f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"
        return text if len(values) == runs else f"{text} ({len(values)}/{runs})"

    # rnn: seed 1 at (2, 12) (4, 20); seed 2 at (1.5, 14) (3, 18) (5, 21); seed 3 at (2.5, 10) (5, 16)
    assert rnn == [
        "rnn",
        "3",
        "–",  # before every seed's first evaluation
        cell([12, 14 + 4 * 0.5 / 1.5], 3),  # seed 3 first evaluates at 2.5 min
        cell([16, 18, 10 + 6 * 0.5 / 2.5], 3),
        cell([20, 18 + 3 * 1 / 2, 10 + 6 * 1.5 / 2.5], 3),
        cell([21, 16], 3),  # seed 1 stopped at 4 min
        "–",
        "–",
    ]
    assert rnn[3] == "13.67 ± 2.36 (2/3)" and rnn[6] == "18.50 ± 3.54 (2/3)"
    # transformer: seed 3 at (1, 10) (2, 12) (7, 17); seed 1 at (3, 22) only
    assert transformer == [
        "transformer",
        "2",
        "10.00 (1/2)",
        "12.00 (1/2)",
        cell([13, 22], 2),
        "14.00 (1/2)",
        "15.00 (1/2)",
        "16.00 (1/2)",
        "17.00 (1/2)",
    ]
    # where every seed of both has a value, 3 min only: 15.07 < 17.50 (2 min: rnn's 13.67 is 2 of 3
    # seeds against 1 of 2; 4 min: 17.70 against 1 of 2)
    assert "Higher mean validation BLEU, at the budgets every seed reached: transformer at 3 min." in text
    # 3 min: transformer 13 and 22 against rnn 16, 18 and 11.2: Welch's p is far above 0.05
    assert welch_t_test([16, 18, 10 + 6 * 0.5 / 2.5], [13, 22])[2] > 0.5
    assert "Shown by Welch's t-test over the seeds (the leader against the next, p < 0.05): none." in text


def test_validation_bleu_at_equal_epochs_takes_each_evaluations_epoch(seeds_report):
    text = section(seeds_report, "Validation BLEU at equal epochs")
    header, rnn, transformer = rows(text)
    assert header == ["configuration", "seeds", "epoch 1", "epoch 2", "epoch 3"]
    # rnn seed 2 has 3 steps an epoch: epochs 2/3, 4/3, 2 at BLEU 14, 18, 21; the others 2: epochs 1, 2
    assert rnn == ["rnn", "3", "12.67 ± 3.06", "19.00 ± 2.65", "–"]
    assert (
        rnn[2]
        == f"{statistics.fmean([12, 14 + 4 * (1 / 3) / (2 / 3), 10]):.2f} ± {statistics.stdev([12, 16, 10]):.2f}"
    )
    assert transformer == ["transformer", "2", "16.00 ± 8.49", "12.00 (1/2)", "17.00 (1/2)"]
    assert "Higher mean validation BLEU, at the budgets every seed reached: transformer at epoch 1." in text
    assert "Shown by Welch's t-test over the seeds (the leader against the next, p < 0.05): none." in text


def test_a_lead_at_a_budget_is_shown_where_welchs_test_tells_the_seeds_apart(refs, tmp_path):
    # both transformer seeds far above both rnn seeds at 1 and 2 min; at 3 min the rnn leads by
    # less than its seeds' spread; the transformer stops there
    curves = {
        ("rnn", 1): [(2, 60.0, 10.0), (4, 120.0, 11.0), (6, 180.0, 30.0), (8, 240.0, 32.0)],
        ("rnn", 2): [(2, 60.0, 11.0), (4, 120.0, 12.0), (6, 180.0, 20.0), (8, 240.0, 33.0)],
        ("transformer", 1): [(2, 60.0, 30.0), (4, 120.0, 31.0), (6, 180.0, 24.0)],
        ("transformer", 2): [(2, 60.0, 31.0), (4, 120.0, 32.5), (6, 180.0, 23.0)],
        # one seed, far above the others: in the table, but it has no spread to lead by
        ("transformer_base", 1): [(2, 60.0, 50.0), (4, 120.0, 50.0), (6, 180.0, 50.0), (8, 240.0, 50.0)],
    }
    for number, ((model, seed), curve) in enumerate(curves.items()):
        overrides = [f"model={model}", f"seed={seed}"]
        write_run(sweep_job(tmp_path / "sweep", number, overrides), refs, refs, overrides, curve)
    code, out, _ = compare(tmp_path / "sweep", "--bootstrap", 10, "--minutes-step", 1, "--no-plot")
    assert code == 0
    text = section(out, "Validation BLEU at equal training time")
    assert rows(text)[-1] == ["transformer_base", "1", "50.00", "50.00", "50.00", "50.00"]
    assert "every seed reached: transformer at 1-2 min, rnn at 3 min." in text
    assert welch_t_test([10, 11], [30, 31])[2] < 0.01 and welch_t_test([30, 20], [24, 23])[2] > 0.5
    assert (
        "Shown by Welch's t-test over the seeds (the leader against the next, p < 0.05): transformer at 1-2 min."
        in text
    )


def test_budgets_follow_the_minutes_step_and_runs_without_curves_are_said(
    refs, tmp_path, seeds_sweep, seeds_report
):
    code, out, _ = compare(
        seeds_sweep, "--bootstrap", 10, "--minutes-step", 2.5, "--out", tmp_path, "--no-plot"
    )
    assert code == 0
    header, rnn, _ = rows(section(out, "Validation BLEU at equal training time"))
    assert header[2:] == ["2.5 min", "5 min"]  # 7.5 is past the longest run
    at_2_5 = [12 + 8 * 0.5 / 2, 14 + 4 * 1 / 1.5, 10]  # seeds 1, 2 and 3 (its first evaluation)
    assert rnn[2] == f"{statistics.fmean(at_2_5):.2f} ± {statistics.stdev(at_2_5):.2f}" == "13.56 ± 3.36"
    write_run(tmp_path / "runs" / "a", refs, refs, curve=None)
    code, out, _ = compare(tmp_path / "runs", "--no-plot")
    assert code == 0
    assert "No budget to compare: no run has a validation curve in its TensorBoard events." in section(
        out, "Validation BLEU at equal training time"
    )
    assert compare_script.parse_args([str(tmp_path), "--minutes-step", "0.5"]).minutes_step == 0.5


def test_a_minutes_step_of_zero_is_refused(tmp_path):
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as stop:
        compare_script.parse_args([str(tmp_path), "--minutes-step", "0"])
    assert stop.value.code == 2 and err.getvalue().strip().endswith("error: --minutes-step must be above 0")


def test_the_figure_has_a_panel_per_axis_with_the_mean_and_band_of_each_group(seeds_sweep, seeds_report):
    png = (seeds_sweep / "comparison.png").read_bytes()
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # the IHDR chunk
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and (width, height) == (1200, 480) and len(png) > 20_000
    runs = [read_run(sweep_job(seeds_sweep, n, job[0]), str(n)) for n, job in enumerate(SEED_JOBS)]
    curves = {run.path: run_curves(run) for run in runs}
    assert curves[runs[1].path]["epochs"] == ([2 / 3, 4 / 3, 2.0], [14.0, 18.0, 21.0])
    fig = figure([runs[:3], runs[3:]], curves)
    by_time, by_epoch = fig.axes
    assert "minutes" in by_time.get_xlabel() and by_epoch.get_xlabel() == "epochs"
    title = fig._suptitle.get_text()
    assert "band from the lowest to the highest seed where every seed has data" in title
    for ax in (by_time, by_epoch):
        means = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        assert [line.get_label() for line in means] == [
            "rnn (mean of 3 seeds)",
            "transformer (mean of 2 seeds)",
        ]
        assert len(ax.collections) == 2  # a band each
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [line.get_label() for line in means]
        assert len(ax.get_lines()) == 4  # and each group's evaluations as dots
    rnn_time, rnn_dots = by_time.get_lines()[:2]
    assert len(rnn_dots.get_xdata()) == 7 and rnn_dots.get_linestyle() == "None"
    # seed 1 spans 2-4 min, seed 2 1.5-5, seed 3 2.5-5: the mean from 2.5 (seed 3's first
    # evaluation) to 4 (seed 1's last), at every evaluation in between
    assert list(rnn_time.get_xdata()) == [2.5, 3.0, 4.0]
    s2_at_2_5 = 14 + 4 * 1 / 1.5
    expected = [(14 + s2_at_2_5 + 10) / 3, (16 + 18 + 11.2) / 3, (20 + 19.5 + 13.6) / 3]
    assert list(rnn_time.get_ydata()) == pytest.approx(expected)
    band = by_time.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(10.0) and band[:, 1].max() == pytest.approx(20.0)
    # the transformer's seeds share one minute, 3 (seed 1's only evaluation): a point, drawn as one
    transformer_time = by_time.get_lines()[2]
    assert transformer_time.get_xydata().tolist() == [[3.0, (13.0 + 22.0) / 2]]
    assert transformer_time.get_marker() == "o"
    # one x in all: that point
    assert mean_curve([([3.0], [22.0]), ([3.0], [20.0])]) == ([3.0], [21.0], [20.0], [22.0])
    # a group of one run: its curve, no band
    fig = figure([runs[:3], runs[4:]], curves)
    single = fig.axes[0].get_lines()[2]
    assert single.get_label() == "transformer (one run)" and single.get_xydata().tolist() == [[3.0, 22.0]]
    assert len(fig.axes[0].collections) == 1
    import matplotlib.pyplot as plt

    plt.close("all")


def in_memory_run(name, overrides, valid=None, test=None, attention=None):
    """A ``Run`` without a folder: its config the model of ``overrides`` with ``attention`` (None:
    no such key, a config from before it) and their ``model.*`` keys, their seed and trainer.lr
    (default 0.001, one rate for every cell; ``trainer.lr=none``: no such key); its results the validation
    BLEU ``valid`` and the test BLEU ``test`` (chrF 20 above it)."""
    from pathlib import Path

    from comparison.runs import Run

    values = dict(o.split("=", 1) for o in overrides)
    model = {"name": values["model"], **({"attention": attention} if attention else {})}
    model.update({key[len("model.") :]: value for key, value in values.items() if key.startswith("model.")})
    lr = values.get("trainer.lr", "0.001")
    config = {
        "model": model,
        "seed": int(values.get("seed", 1)),
        "trainer": {} if lr == "none" else {"lr": lr},
    }
    scores = {} if test is None else {SPLIT: {"bleu": test, "chrf": test + 20}}
    results = {"model": model["name"], "valid": {"bleu": valid}, "test": scores}
    results.update(train_seconds=600.0, train_tokens_per_second=2000.0)
    return Run(Path(name), name, results, config, list(overrides))


def test_the_mean_curve_covers_only_the_span_every_seed_has_data_for():
    # seed b stops at 2 min on a low score and c starts at 1.5: a mean over the seeds that have a
    # value would jump from (20 + 10 + 14) / 3 to (20 + 14) / 2 at 2 min, and at c's start
    a = ([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0])
    b = ([1.0, 2.0], [6.0, 10.0])
    c = ([1.5, 2.5, 3.5], [11.0, 17.0, 23.0])
    xs, means, lows, highs = mean_curve([a, b, c])
    assert xs == [1.5, 2.0]  # from c's first evaluation to b's last
    assert means == pytest.approx([(15.0 + 8.0 + 11.0) / 3, (20.0 + 10.0 + 14.0) / 3])
    assert (lows, highs) == ([8.0, 10.0], [15.0, 20.0])
    assert mean_curve([a, b]) == ([1.0, 2.0], [8.0, 15.0], [6.0, 10.0], [10.0, 20.0])
    assert mean_curve([b, ([3.0, 4.0], [30.0, 34.0])]) == ([], [], [], [])  # no span in common


def test_seeds_that_share_no_span_are_drawn_as_their_evaluations_and_said_so():
    runs = [in_memory_run(f"r{seed}", ["model=rnn", f"seed={seed}"]) for seed in (1, 2)]
    spans = [([1.0, 2.0], [10.0, 20.0]), ([3.0, 4.0], [30.0, 34.0])]
    curves = {run.path: {"minutes": points, "epochs": points} for run, points in zip(runs, spans)}
    fig = figure([runs], curves)
    (dots,) = fig.axes[0].get_lines()
    assert dots.get_label() == "rnn (2 seeds, no span they all reached)" and dots.get_linestyle() == "None"
    assert len(fig.axes[0].collections) == 0 and "band" not in fig._suptitle.get_text()
    import matplotlib.pyplot as plt

    plt.close("all")


# ----- the grid of architecture and attention -----
# (architecture, attention or None for no override: the family's default) -> the words dropped from
# every Nth position and the validation BLEU of seeds 1, 2, 3. On the test split the transformer is
# far ahead of the rnn; on validation the rnn with scaled_dot leads: what chooses is validation.
GRID = {
    ("rnn", None): ((4, 5, 4), (30.0, 31.0, 32.0)),
    ("rnn", "scaled_dot"): ((4, 5, 5), (40.0, 41.0, 42.0)),
    ("transformer", "additive"): ((9, 10, 11), (35.0, 36.0, 37.0)),
    ("transformer", None): ((12, 13, 14), (38.0, 36.0, 37.0)),
}
EXPLORATORY = [("general", 6, 20.0), ("multihead", 7, 31.0)]  # rnn, seed 1 only: every, valid BLEU


def grid_overrides(model, attention, seed):
    return [f"model={model}", *([f"model.attention={attention}"] if attention else []), f"seed={seed}"]


def write_grid(folder, refs, jobs):
    """A sweep's folder of finished runs, one per job ``(overrides, every, valid BLEU)``: the
    references with the words at every ``every``-th position dropped, validation chrF 20 above the
    BLEU, training minutes half the BLEU and target tokens/s 50 times it."""
    for number, (overrides, every, valid) in enumerate(jobs):
        write_run(
            sweep_job(folder, number, overrides),
            drop_words(refs, every),
            refs,
            [*overrides, "data.root=/data/multi30k"],
            curve=None,
            valid={"loss": 3.0, "ppl": 20.1, "bleu": valid, "chrf": valid + 20, "step": 1},
            train_seconds=valid * 30,
            train_tokens_per_second=valid * 50,
        )
    return folder


@pytest.fixture(scope="module")
def grid_sweep(refs, tmp_path_factory):
    """``+experiment=attention_grid`` as the sweep writes it, the family defaults without their
    override, and two exploratory rnn runs of one seed."""
    folder = tmp_path_factory.mktemp("grid") / "multirun"
    jobs = [
        (grid_overrides(model, attention, seed), every, valid)
        for (model, attention), (everies, valids) in GRID.items()
        for seed, every, valid in zip((1, 2, 3), everies, valids)
    ]
    jobs += [(grid_overrides("rnn", attention, 1), every, valid) for attention, every, valid in EXPLORATORY]
    return write_grid(folder, refs, jobs)


@pytest.fixture(scope="module")
def grid_report(grid_sweep):
    code, out, err = compare(grid_sweep, "--bootstrap", 10, "--no-plot")
    assert code == 0, err
    return out


def grid_scores(sweep, key):
    """``{(architecture, attention): [test score of seeds 1, 2, 3]}`` from the runs' files."""
    scores = {}
    for folder in sorted(sweep.glob("*/results.json")):
        run = read_run(folder.parent, folder.parent.name)
        cell = (run.config["model"]["name"], run.config["model"]["attention"])
        scores.setdefault(cell, []).append(run.results["test"][SPLIT][key])
    return scores


def test_the_attention_grid_experiment_sweeps_12_jobs_on_one_data_config():
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # how train.py -m splits a sweep
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from data.config import data_config
    from training.config import model_config, trainer_config

    from helpers import compose

    base = ["+experiment=attention_grid", "data.root=/data/multi30k"]
    cfg = compose(base, hydra_config=True)
    assert cfg.hydra.sweep.dir.startswith("multirun/attention_grid/")
    swept = [f"{key}={value}" for key, value in cfg.hydra.sweeper.params.items()]
    (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(swept), None)
    composed = [compose([*base, *job]) for job in jobs]
    for c in composed:  # accepted as train.py reads them, before any data
        model_config(c.model)
        trainer_config(c.trainer)
        data_config(c.data)
    cells = [(c.model.name, c.model.attention, c.seed) for c in composed]
    assert cells == list(itertools.product(("rnn", "transformer"), ("additive", "scaled_dot"), (1, 2, 3)))
    for c in composed:  # today's default sizes and schedules (the trainer follows the model), unguided
        default = compose([f"model={c.model.name}", "trainer.guided_alignment=0"])
        assert OmegaConf.to_container(c.trainer) == OmegaConf.to_container(default.trainer)
        default.model.attention = c.model.attention
        assert OmegaConf.to_container(c.model) == OmegaConf.to_container(default.model)
    assert len({OmegaConf.to_yaml(c.data) for c in composed}) == 1  # one SentencePiece model for all


def test_the_exploratory_commands_of_the_docs_narrow_the_grid_to_one_seed_of_each_variant():
    """docs/comparing.md's exploratory sweeps, split as ``train.py -m`` splits them: the
    experiment's ``hydra.sweeper.params`` first, the command line after (a key given there wins)."""
    import shlex

    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from helpers import compose

    commands = [
        shlex.split(line)[4:]  # after python train.py -m +experiment=attention_grid
        for line in (ROOT / "docs" / "comparing.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("python train.py -m +experiment=attention_grid model=")
    ]
    jobs = []
    for cli in commands:
        cfg = compose(["+experiment=attention_grid"], hydra_config=True)
        params = [f"{key}={value}" for key, value in cfg.hydra.sweeper.params.items()]
        parsed = OverridesParser.create().parse_overrides([*params, *cli])
        for job in BasicSweeper.split_arguments(parsed, None)[0]:
            c = compose(["+experiment=attention_grid", *(o for o in job if not o.startswith("hydra."))])
            jobs.append(
                (
                    c.model.name,
                    c.model.attention,
                    c.model.get("attention_heads", c.model.get("n_heads")),
                    c.seed,
                )
            )
    assert jobs == [
        ("rnn", "general", 4, 1),
        ("rnn", "multihead", 4, 1),
        ("transformer", "scaled_dot", 1, 1),
        ("transformer", "scaled_dot", 2, 1),
        ("transformer", "scaled_dot", 8, 1),
    ]


def test_a_run_without_model_attention_in_its_config_has_its_familys_default():
    from comparison.grid import attention_of
    from models.config import RNNConfig, TransformerConfig

    assert attention_of(in_memory_run("a", ["model=rnn"], attention="general")) == "general"
    old_rnn, old_transformer = (in_memory_run(m, [f"model={m}"]) for m in ("rnn", "transformer"))
    assert (attention_of(old_rnn), attention_of(old_transformer)) == ("additive", "scaled_dot")
    assert (RNNConfig.attention, TransformerConfig.attention) == ("additive", "scaled_dot")


def test_the_grid_section_has_a_cell_per_architecture_and_attention_with_2_seeds_or_more(
    grid_sweep, grid_report
):
    text = section(grid_report, "Architecture and attention")
    tables = [rows(block) for block in text.split("\n\n") if block.startswith("| ")]
    titles = [
        "valid BLEU",
        "valid chrF",
        "training minutes",
        "target tokens/s",
        f"{SPLIT} BLEU",
        f"{SPLIT} chrF",
    ]
    assert [head for head, *_ in tables] == [[title, "additive", "scaled_dot"] for title in titles]
    rnn_valid = format_mean_std(GRID[("rnn", None)][1])
    assert tables[0][1:] == [
        ["rnn", f"{rnn_valid} (3)", "41.00 ± 1.00 (3)"],
        ["transformer", "36.00 ± 1.00 (3)", "37.00 ± 1.00 (3)"],
    ]
    assert tables[1][1:] == [  # chrF: BLEU + 20 in these runs
        ["rnn", "51.00 ± 1.00 (3)", "61.00 ± 1.00 (3)"],
        ["transformer", "56.00 ± 1.00 (3)", "57.00 ± 1.00 (3)"],
    ]
    assert tables[2][1:] == [  # minutes: BLEU / 2; tokens/s: 50 x BLEU
        ["rnn", "15.5 ± 0.5 (3)", "20.5 ± 0.5 (3)"],
        ["transformer", "18.0 ± 0.5 (3)", "18.5 ± 0.5 (3)"],
    ]
    assert tables[3][1:] == [
        ["rnn", "1,550 ± 50 (3)", "2,050 ± 50 (3)"],
        ["transformer", "1,800 ± 50 (3)", "1,850 ± 50 (3)"],
    ]
    for cells, key in zip(tables[4:], ("bleu", "chrf")):
        scores = grid_scores(grid_sweep, key)
        assert cells[1:] == [
            [model, *(f"{format_mean_std(scores[(model, f)])} (3)" for f in ("additive", "scaled_dot"))]
            for model in ("rnn", "transformer")
        ]
    # chosen on validation (the rnn with scaled_dot), though the transformer's test scores are higher
    choice = "Highest mean validation BLEU: rnn with scaled_dot (41.00). Choices are made on validation only"
    assert choice in text
    # the exploratory runs of one seed: in the seeds' table without a spread, not in the grid
    seeds = {row[0]: row[1:3] for row in table(grid_report, "Seeds")}
    assert seeds["rnn model.attention=general"] == ["1", "20.00"]
    assert seeds["rnn model.attention=multihead"] == ["1", "31.00"]
    assert "general" not in text and "multihead" not in text


def test_configurations_of_one_seed_are_set_beside_the_seeds_of_their_model(
    grid_sweep, grid_report, tmp_path
):
    text = section(grid_report, "Configurations with one seed")
    header, *found = rows(text)
    assert header[:4] == ["configuration", "seed", "valid BLEU", "valid chrF"]
    assert header[-3:] == ["train time", "tgt tok/s", "valid BLEU against the seeds of its model"]
    by_name = {row[0]: row for row in found}
    assert list(by_name) == ["rnn model.attention=general", "rnn model.attention=multihead"]
    general, multihead = by_name.values()
    assert general[1:4] == ["1", "20.00", "40.00"] and general[-3:-1] == ["10.0 min", "1,000"]
    # the rnn's cells (additive 30-32, scaled_dot 40-42), never the transformer's
    assert general[-1] == "below `rnn` (30.00-32.00); below `rnn model.attention=scaled_dot` (40.00-42.00)"
    assert multihead[-1] == "within `rnn` (30.00-32.00); below `rnn model.attention=scaled_dot` (40.00-42.00)"
    # none without a configuration of 2+ seeds beside it: the seed-1 runs alone
    seed_1 = sorted(p for p in grid_sweep.iterdir() if p.name.endswith("seed=1"))
    code, out, err = compare(*seed_1, "--bootstrap", 10, "--no-plot", "--out", tmp_path)
    assert code == 0 and len(seed_1) == 6, err
    assert "## Configurations with one seed" not in out and "One seed per configuration" in out


# (the heading of the verdicts, where, the cell against which, the cell)
COMPARISONS = [
    ("The attention function within each architecture", f"in {m}", (m, "additive"), (m, "scaled_dot"))
    for m in ("rnn", "transformer")
] + [
    ("The architecture within each attention function", f"with {f} attention", ("rnn", f), ("transformer", f))
    for f in ("additive", "scaled_dot")
]


def test_the_grid_verdicts_are_the_tests_across_seeds_of_the_cells_per_seed_scores(grid_sweep, grid_report):
    text = section(grid_report, "Architecture and attention")
    bullets = {
        heading: [line for line in block.splitlines() if line.startswith("- ")]
        for heading, block in zip(text.split("**")[1::2], text.split("**")[2::2])
    }
    assert list(bullets) == [COMPARISONS[0][0], COMPARISONS[2][0]]
    shown = set()
    for metric, key in (("BLEU", "bleu"), ("chrF", "chrf")):
        scores = grid_scores(grid_sweep, key)
        for heading, where, base, other in COMPARISONS:
            factor = 0 if base[0] != other[0] else 1  # the one that differs
            a, b = scores[base], scores[other]
            welch, permutation = welch_t_test(a, b)[2], permutation_test(a, b)[0]
            diff = statistics.fmean(b) - statistics.fmean(a)
            leader = other[factor] if diff > 0 else base[factor]
            what = (
                f"{leader}'s mean is higher across seeds (Welch p < 0.05)"
                if welch < 0.05
                else "no difference shown with 3 seeds"
            )
            line = (
                f"- {metric} {where}: {other[factor]} - {base[factor]}: {diff:+.2f} {metric} (mean over 3 "
                f"seeds); Welch p = {format_p(welch)}, permutation p = {format_p(permutation)}: {what}."
            )
            assert line in bullets[heading]
            shown.add(welch < 0.05)
    assert shown == {True, False}  # the fake grid has both kinds of verdict
    assert [len(lines) for lines in bullets.values()] == [4, 4]  # 2 comparisons each, 2 metrics


def test_no_grid_section_for_runs_that_do_not_cross_architecture_and_attention(report, seeds_report):
    # rnn and transformer each with its default attention: the architecture is all that differs
    for out in (report[0], seeds_report):
        assert "Significance across seeds" in out and "Architecture and attention" not in out
    from comparison.grid import grid_section
    from comparison.runs import groups_of

    def runs(*cells):
        return [
            in_memory_run(
                f"{n}-{seed}",
                [f"model={m}", f"seed={seed}", *extra],
                valid=30.0,
                test=20.0 + seed,
                attention=f,
            )
            for n, (m, f, extra) in enumerate(cells)
            for seed in (1, 2)
        ]

    grid = [("rnn", "additive", []), ("rnn", "scaled_dot", []), ("transformer", "additive", [])]
    assert grid_section(groups_of(runs(*grid)), [SPLIT]) == []  # three cells: no 2 x 2
    full = runs(*grid, ("transformer", "scaled_dot", []))
    assert "## Architecture and attention" in grid_section(groups_of(full), [SPLIT])
    # a cell of two configurations (another dropout too): not a grid of these two factors
    crowded = groups_of(full + runs(("rnn", "additive", ["model.dropout=0.5"])))
    lines = grid_section(crowded, [SPLIT])
    assert lines[-1].startswith("No grid: rnn with additive attention is 2 configurations with 2+ seeds (")
    # one configuration a cell, the transformer's at two rates: said above the tables
    apart = groups_of(runs(*grid) + runs(("transformer", "scaled_dot", ["trainer.lr=0.002"])))
    said = "The cells of transformer were trained at different peak rates (additive 0.001, scaled_dot 0.002)."
    assert said in grid_section(apart, [SPLIT]) and said not in grid_section(groups_of(full), [SPLIT])
    # a config without a rate (a run from before the key) says nothing of rates
    unrated = groups_of(runs(*grid) + runs(("transformer", "scaled_dot", ["trainer.lr=none"])))
    assert not any("different peak rates" in line for line in grid_section(unrated, [SPLIT]))
    # ... and gives no protocols when another cell was trained at several rates
    retuned_rnn = runs(*grid, ("rnn", "additive", ["trainer.lr=0.004"]))
    both = groups_of(retuned_rnn + runs(("transformer", "scaled_dot", ["trainer.lr=none"])))
    assert grid_section(both, [SPLIT])[-1] == (
        "No grid: some cells were trained at several peak rates, but transformer with scaled_dot "
        "attention has no `trainer.lr` in its config to compare them by."
    )
    # the same with another rate instead: the grid under the protocols of learning rates, below
    retuned = groups_of(full + runs(("rnn", "additive", ["trainer.lr=0.004"])))
    assert "### The rates" in grid_section(retuned, [SPLIT])


# The grid trained at several peak rates: each family's schedule trained every cell at one rate
# (rnn 8e-3, transformer 1.5e-3), and some cells again at other rates. (architecture, attention,
# rate) -> the words dropped from every Nth position and the validation BLEU of seeds 1, 2, 3. At
# the rnn's one rate its scaled_dot loses (it collapsed); at its own best rate it wins: the verdict
# flips between the protocols. The transformer's cells share two rates: averaged over both cells
# 1.5e-3 is ahead (37.5 against 36.0), though its additive cell is best at the higher 3e-3.
TUNED = {
    ("rnn", "additive", 8e-3): ((5, 5, 6), (36.0, 37.0, 38.0)),
    ("rnn", "scaled_dot", 8e-3): ((3, 3, 3), (20.0, 21.0, 22.0)),
    ("rnn", "scaled_dot", 4e-3): ((12, 13, 14), (40.0, 41.0, 42.0)),
    ("transformer", "additive", 1.5e-3): ((7, 8, 7), (35.0, 36.0, 37.0)),
    ("transformer", "additive", 3e-3): ((9, 10, 9), (37.0, 38.0, 39.0)),
    ("transformer", "scaled_dot", 1.5e-3): ((9, 9, 10), (38.0, 39.0, 40.0)),
    ("transformer", "scaled_dot", 3e-3): ((6, 6, 7), (33.0, 34.0, 35.0)),
}
# each protocol's rate per cell
SHARED_RATES = {
    ("rnn", "additive"): 8e-3,
    ("rnn", "scaled_dot"): 8e-3,
    ("transformer", "additive"): 1.5e-3,
    ("transformer", "scaled_dot"): 1.5e-3,
}
BEST_RATES = {**SHARED_RATES, ("rnn", "scaled_dot"): 4e-3, ("transformer", "additive"): 3e-3}


@pytest.fixture(scope="module")
def tuned_sweep(refs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tuned") / "multirun"
    jobs = [
        ([*grid_overrides(model, attention, seed), f"trainer.lr={rate}"], every, valid)
        for (model, attention, rate), (everies, valids) in TUNED.items()
        for seed, every, valid in zip((1, 2, 3), everies, valids)
    ]
    return write_grid(folder, refs, jobs)


def test_a_grid_trained_at_several_rates_is_read_at_one_rate_per_architecture_and_at_each_cells_best(
    tuned_sweep,
):
    code, out, err = compare(tuned_sweep, "--bootstrap", 10, "--no-plot")
    assert code == 0, err
    text = section(out, "Architecture and attention")
    assert "No grid" not in text
    rates = rows(text.split("### The rates\n", 1)[1].split("###", 1)[0])
    assert rates == [
        ["cell", "rates trained", "one rate per architecture", "each cell at its best rate"],
        [
            "rnn with additive",
            "0.008",
            "0.008 (valid BLEU 37.00, 3 seeds)",
            "0.008 (valid BLEU 37.00, 3 seeds)",
        ],
        [
            "rnn with scaled_dot",
            "0.004, 0.008",
            "0.008 (valid BLEU 21.00, 3 seeds)",
            "0.004 (valid BLEU 41.00, 3 seeds)",
        ],
        [
            "transformer with additive",
            "0.0015, 0.003",
            "0.0015 (valid BLEU 36.00, 3 seeds)",
            "0.003 (valid BLEU 38.00, 3 seeds)",
        ],
        [
            "transformer with scaled_dot",
            "0.0015, 0.003",
            "0.0015 (valid BLEU 39.00, 3 seeds)",
            "0.0015 (valid BLEU 39.00, 3 seeds)",
        ],
    ]
    scores = {}
    for folder in sorted(tuned_sweep.glob("*/results.json")):
        run = read_run(folder.parent, folder.parent.name)
        cell = (run.config["model"]["name"], run.config["model"]["attention"], run.config["trainer"]["lr"])
        for metric, key in (("BLEU", "bleu"), ("chrF", "chrf")):
            scores.setdefault((*cell, metric), []).append(run.results["test"][SPLIT][key])

    def expected(first, second, factor, metric, rates):
        a, b = scores[(*first, rates[first], metric)], scores[(*second, rates[second], metric)]
        welch = welch_t_test(a, b)[2]
        diff = statistics.fmean(b) - statistics.fmean(a)
        what = f"{(second if diff > 0 else first)[factor]} higher" if welch < 0.05 else "no difference shown"
        p = "< 0.001" if welch < 0.001 else f"= {welch:.3f}"
        return f"{diff:+.2f}, p {p}: {what}"

    expected_rows = [
        ["comparison", "split", "metric", "one rate per architecture", "each cell at its best rate"]
    ]
    for _, where, first, second in COMPARISONS:
        factor = 0 if first[0] != second[0] else 1
        for metric in ("BLEU", "chrF"):
            found = [expected(first, second, factor, metric, rates) for rates in (SHARED_RATES, BEST_RATES)]
            expected_rows.append([f"{second[factor]} - {first[factor]} {where}", SPLIT, metric, *found])
    verdicts = rows(text.split("### The verdicts\n", 1)[1].split("###", 1)[0])
    assert verdicts == expected_rows
    # the rnn's verdict flips: scaled_dot behind at the family's rate, ahead at its own
    shared, best = verdicts[1][3:]
    assert shared.startswith("-") and shared.endswith("additive higher")
    assert best.startswith("+") and best.endswith("scaled_dot higher")
    # each protocol's grid in full below, its test split under a level-4 heading
    for title in ("One rate per architecture", "Each cell at its best rate"):
        assert f"### {title}\n" in text
    assert text.count(f"#### {SPLIT}\n") == 2


def test_the_protocols_of_rates_need_cells_that_differ_by_their_rate_only():
    from comparison.grid import grid_section
    from comparison.protocols import by_rate
    from comparison.runs import groups_of

    def runs(model, attention, rate, valid, *extra):
        overrides = [f"model={model}", f"trainer.lr={rate}", *extra]
        return [
            in_memory_run(
                f"{model}-{attention}-{rate}-{s}", [*overrides, f"seed={s}"], valid + s, 20.0 + s, attention
            )
            for s in (1, 2)
        ]

    rnn = runs("rnn", "additive", 8e-3, 30.0) + runs("rnn", "scaled_dot", 8e-3, 30.0)
    rnn += runs("rnn", "additive", 4e-3, 40.0)  # two rates in the rnn's additive cell
    transformer = runs("transformer", "additive", 1e-3, 30.0) + runs("transformer", "scaled_dot", 1e-3, 30.0)
    lines = grid_section(groups_of(rnn + transformer), [SPLIT])
    assert "### One rate per architecture" in lines and "### Each cell at its best rate" in lines
    # the transformer's cells share no rate: each cell at its best rate alone, said so
    other = runs("transformer", "additive", 1e-3, 30.0) + runs("transformer", "scaled_dot", 2e-3, 30.0)
    other += runs("transformer", "scaled_dot", 5e-4, 30.0)
    lines = grid_section(groups_of(rnn + other), [SPLIT])
    assert (
        "But the cells of transformer were trained at no rate in common: no protocol of one rate per "
        "architecture; the grid is read with each cell at its best rate only."
    ) in lines
    assert "### Each cell at its best rate" in lines and "### One rate per architecture" not in lines
    # a cell whose configurations differ by more than their rate is named, not the one that differs
    # by its rate only
    dropout = runs("transformer", "scaled_dot", 1e-3, 35.0, "model.dropout=0.5")
    lines = grid_section(groups_of(rnn + transformer + dropout), [SPLIT])
    assert lines[-1].startswith("No grid: transformer with scaled_dot attention is 2 configurations")
    # two configurations at one rate: something else differs
    assert (
        by_rate(
            [runs("rnn", "additive", 8e-3, 30.0), runs("rnn", "additive", 8e-3, 31.0, "model.dropout=0.5")]
        )
        is None
    )


@pytest.mark.slow
def test_a_real_sweep_has_the_format_these_tests_write_and_compares(multi30k_slice, refs, tmp_path):
    """``train.py -m model=tiny_rnn seed=1,2`` (two tiny runs of 2 steps): one folder per job, one shared
    vocabulary, the files of tests/helpers.py ``write_run`` with the same keys; compare.py reads it."""
    from helpers import TINY_RNN

    sweep = tmp_path / "multirun"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "-m",
            "seed=1,2",
            *TINY_RNN,
            "device=cpu",
            f"data.root={multi30k_slice}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.vocab_size=500",
            "trainer.max_epochs=null",
            "trainer.max_steps=2",
            "trainer.batch_tokens=1000",
            "trainer.attention_samples=0",
            "trainer.beam_size=1",
            "trainer.num_threads=1",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    # the first job builds the token store (SentencePiece included), the second maps it
    assert log.count("trained unigram SentencePiece") == 1 and log.count("using the token store") == 1
    jobs = sorted(p.parent for p in sweep.glob("*/results.json"))
    assert [p.name.split("_", 1)[0] for p in jobs] == ["0", "1"] and all("seed=" in p.name for p in jobs)
    written = write_run(tmp_path / "written", refs, refs, ["model=rnn", "seed=1"])
    for job in jobs:
        real = json.loads((job / "results.json").read_text())
        ours = json.loads((written / "results.json").read_text())
        assert real.keys() == ours.keys() and real["valid"].keys() == ours["valid"].keys()
        assert (
            real["test"][SPLIT].keys() == ours["test"][SPLIT].keys()
            and real["sacrebleu"] == ours["sacrebleu"]
        )
        assert real["valid_history"][0].keys() == ours["valid_history"][0].keys()
        assert {"config.yaml", "overrides.yaml"} <= {p.name for p in (job / ".hydra").iterdir()}
        assert {f"{SPLIT}.hyp", f"{SPLIT}.ref", "tb"} <= {p.name for p in job.iterdir()}
        assert len((job / f"{SPLIT}.ref").read_text(encoding="utf-8").splitlines()) == 30
    code, out, err = compare(sweep, "--bootstrap", 50)
    assert code == 0, err
    assert [(row[1], row[2]) for row in table(out, "Runs")] == [("rnn", "1"), ("rnn", "2")]
    assert [row[:2] for row in table(out, "Seeds")] == [["tiny_rnn", "2"]]
    assert "warning: no validation curve" not in err and (sweep / "comparison.png").is_file()


# --- the learning rate (+experiment=attention_lr) ---------------------------------------------------

# (attention, rate, seed, best valid BLEU, cross-attention entropy at the end)
RATE_JOBS = [
    ("additive", "2e-3", 1, 20.0, 1.9),
    ("additive", "4e-3", 1, 30.0, 1.8),
    ("additive", "8e-3", 1, 34.0, 1.7),
    ("scaled_dot", "2e-3", 1, 20.0, 1.4),
    ("scaled_dot", "4e-3", 1, 28.0, 1.1),
    ("scaled_dot", "4e-3", 2, 26.0, 1.0),
    ("scaled_dot", "8e-3", 1, 25.0, 0.002),
    ("scaled_dot", "8e-3", 2, 23.0, 0.9),
]


@pytest.fixture(scope="module")
def rates_report(refs, tmp_path_factory):
    from torch.utils.tensorboard import SummaryWriter

    folder = tmp_path_factory.mktemp("rates") / "multirun"
    for number, (attention, rate, seed, bleu, nats) in enumerate(RATE_JOBS):
        overrides = ["+experiment=attention_lr", "model=rnn", f"model.attention={attention}"]
        overrides += [f"trainer.lr={rate}", f"seed={seed}"]
        job = sweep_job(folder, number, overrides)
        write_run(job, refs, refs, overrides, curve=((2, 30.0, bleu - 5), (4, 66.0, bleu)))
        writer = SummaryWriter(log_dir=str(job / "tb"))
        writer.add_scalar("entropy/cross/layer1", 0.0, 2)  # the last evaluation's counts, not this one
        writer.add_scalar("entropy/cross/layer1", nats + 0.2, 4)  # the layer's mean: the table's
        writer.add_scalar("entropy/cross/layer1/head1", nats, 4)  # the lowest head: collapsed or not
        writer.add_scalar("entropy/cross/layer1/head2", nats + 0.4, 4)
        writer.close()
    # a run stopped before its first evaluation: no validation BLEU, no point on its curve
    overrides = [
        "+experiment=attention_lr",
        "model=rnn",
        "model.attention=additive",
        "trainer.lr=1.6e-2",
        "seed=1",
    ]
    unscored = {"loss": None, "ppl": None, "bleu": None, "chrf": None, "step": None}
    write_run(sweep_job(folder, len(RATE_JOBS), overrides), refs, refs, overrides, curve=None, valid=unscored)
    code, out, err = compare(folder, "--bootstrap", 10)
    assert code == 0, err
    return folder, out


def test_the_learning_rate_section_has_a_curve_per_attention_with_its_best_rate(rates_report):
    folder, markdown = rates_report
    section = markdown.split("## Learning rate\n", 1)[1].split("\n## ", 1)[0]
    additive, scaled_dot = section.split("`rnn +experiment=attention_lr model.attention=scaled_dot`")
    assert "`rnn +experiment=attention_lr model.attention=additive`" in additive
    rows = [line for line in scaled_dot.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows == [
        "| 0.002 | 1 | 20.00 | 20.00 | 1.600 |",
        "| **0.004** | 1, 2 | 28.00, 26.00 | 27.00 | 1.250 |",
        "| 0.008 | 1, 2 | 25.00, 23.00 | 24.00 | 0.651 (1 collapsed) |",
    ]
    assert "Best rate 0.004 (inside the range)." in scaled_dot
    assert "Best rate 0.008 (at an end of the range: try rates beyond it)." in additive
    assert "| 0.016 |" not in additive
    assert (folder / "learning_rates.png").stat().st_size > 10_000


def test_the_attention_lr_experiment_fits_each_familys_schedule_to_3_epochs():
    from helpers import compose

    for family in ("rnn", "transformer"):
        cfg = compose(["+experiment=attention_lr", f"model={family}", "trainer.lr=3e-3"], hydra_config=True)
        default = compose([f"model={family}"])
        assert cfg.trainer.max_epochs == 3 and cfg.trainer.lr == 3e-3
        assert cfg.trainer.schedule == default.trainer.schedule == "cosine"  # fitted to the 3 epochs
        assert cfg.hydra.sweep.dir.startswith("multirun/attention_lr/")
        assert dict(cfg.hydra.sweeper.params) == {"model.attention": "additive,scaled_dot", "seed": "1"}


# (overrides, rate, seed, best valid BLEU, steps trained): full runs (12 epochs: a label that sorts
# before "3 epochs", and written first) and the 3-epoch sweep of two attentions. The scaled dot
# product ranks alike at 4e-3 and 8e-3; additive ranks its best rate alike but not the pair 2e-3,
# 4e-3; a 3-epoch curve with other label smoothing is no proxy of anything.
FULL = ["+experiment=attention_grid", "trainer.max_epochs=12"]
SHORT = ["+experiment=attention_lr"]
PROXY_JOBS = [
    (FULL + ["model.attention=scaled_dot"], "4e-3", 1, 33.0, 48),
    (FULL + ["model.attention=scaled_dot"], "4e-3", 2, 31.0, 40),  # stopped early by its patience
    (FULL + ["model.attention=scaled_dot"], "8e-3", 1, 29.0, 48),
    (SHORT + ["model.attention=scaled_dot"], "2e-3", 1, 20.0, 12),
    (SHORT + ["model.attention=scaled_dot"], "4e-3", 1, 28.0, 12),
    (SHORT + ["model.attention=scaled_dot"], "4e-3", 2, 26.0, 12),
    (SHORT + ["model.attention=scaled_dot"], "8e-3", 1, 24.0, 12),
    (SHORT + ["model.attention=scaled_dot"], "8e-3", 2, 22.0, 12),
    (FULL + ["model.attention=additive"], "2e-3", 1, 36.0, 48),
    (FULL + ["model.attention=additive"], "4e-3", 1, 35.0, 48),
    (FULL + ["model.attention=additive"], "8e-3", 1, 38.0, 48),
    (SHORT + ["model.attention=additive"], "2e-3", 1, 20.0, 12),
    (SHORT + ["model.attention=additive"], "4e-3", 1, 30.0, 12),
    (SHORT + ["model.attention=additive"], "8e-3", 1, 34.0, 12),
    (SHORT + ["model.attention=additive", "trainer.label_smoothing=0.2"], "4e-3", 1, 31.0, 12),
    (SHORT + ["model.attention=additive", "trainer.label_smoothing=0.2"], "8e-3", 1, 33.0, 12),
]


def test_a_short_budget_is_checked_against_full_runs_for_the_rates_it_ranks(refs, tmp_path):
    folder = tmp_path / "multirun"
    for number, (settings, rate, seed, bleu, steps) in enumerate(PROXY_JOBS):
        overrides = ["model=rnn", *settings, f"trainer.lr={rate}", f"seed={seed}"]
        curve = ((steps // 2, 30.0, bleu - 5), (steps, 66.0, bleu))
        write_run(sweep_job(folder, number, overrides), refs, refs, overrides, curve=curve)
    code, out, err = compare(folder, "--bootstrap", 10, "--no-plot")
    assert code == 0, err
    found = section(out, "Does the short budget rank the rates as full runs do?")
    scaled_dot, additive = found.split("`rnn model.attention=additive`")
    assert scaled_dot.count("`rnn model.attention=scaled_dot`") == 1 and "label_smoothing" not in found
    assert rows(scaled_dot) == [
        ["peak lr", "valid BLEU, 3 epochs", "valid BLEU, 12 epochs"],
        ["0.004", "**27.00** (2)", "**32.00** (2)"],  # 2e-3, trained at 3 epochs only, is left out
        ["0.008", "23.00 (2)", "29.00 (1)"],
    ]
    assert (
        "3 epochs ranks 0.004 first, 12 epochs 0.004; 1 of 1 pairs of rates ordered alike: a proxy at "
        "these rates; a single seed at some rate" in scaled_dot
    )
    assert rows(additive) == [
        ["peak lr", "valid BLEU, 3 epochs", "valid BLEU, 12 epochs"],
        ["0.002", "20.00 (1)", "36.00 (1)"],
        ["0.004", "30.00 (1)", "35.00 (1)"],
        ["0.008", "**34.00** (1)", "**38.00** (1)"],
    ]
    assert (
        "3 epochs ranks 0.008 first, 12 epochs 0.008; 2 of 3 pairs of rates ordered alike: not a proxy"
        in additive
    )


def test_pairs_of_rates_are_ordered_alike_only_when_both_budgets_order_them_strictly():
    from comparison.proxy import pairs_alike

    assert pairs_alike([1.0, 2.0, 3.0], [10.0, 30.0, 20.0]) == (2, 3)
    assert pairs_alike([1.0, 1.0], [1.0, 2.0]) == (0, 1)  # a tie at the short budget decides nothing
    assert pairs_alike([3.0, 2.0, 1.0], [6.0, 5.0, 4.0]) == (3, 3)
