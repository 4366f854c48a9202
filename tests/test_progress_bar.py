"""Progress of long work on standard error (common/progress_bar.py): a tqdm bar on a terminal, drawn
as the work starts; plain lines every few seconds in a log; nothing on standard output. Each long
command's bar is checked with standard error as a terminal (a stream whose ``isatty`` is true: the
bar's file), its standard output against the same command's without one."""

import contextlib
import io
import random

import pytest
from synthetic import reversal_pairs

from common.progress_bar import LineProgress, progress_bar

from helpers import load_module, load_script, translate, write_lines


class Terminal(io.StringIO):
    """What a terminal receives: a text stream that says it is one."""

    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_drawn_at_once_and_cleared_at_the_end():
    screen = Terminal()
    with progress_bar(40, "translating", "sentences", stream=screen) as bar:
        drawn = screen.getvalue()  # before any update: the bar is there from the start
        bar.update(40)
    assert "translating" in drawn and "0/40" in drawn
    assert screen.getvalue().endswith("\r") and screen.getvalue().count("\n") == 0  # cleared in place


def test_a_log_gets_a_line_every_few_seconds_and_a_short_job_none():
    log = io.StringIO()
    with progress_bar(10, "encoding", "pairs", stream=log) as bar:  # a short job: no line at all
        bar.update(10)
    assert log.getvalue() == ""
    with LineProgress(10, "encoding", "pairs", log, every=0.0) as bar:  # every update is due
        bar.update(4)
        bar.update(6)
    lines = log.getvalue().splitlines()
    shown = [line.split(", ")[0] for line in lines]
    assert shown == ["encoding: 4/10 pairs (40%)", "encoding: 10/10 pairs (100%)"]  # the end once
    assert "\r" not in log.getvalue()  # lines, not a bar redrawn in place


def test_no_progress_lines_go_where_the_output_goes_or_nowhere(tmp_path, monkeypatch):
    """``> out 2>&1``: progress lines would land among the output's lines, so there are none; a
    closed standard error (``2>&-``) gets none either, and nothing reaches standard output."""
    with open(tmp_path / "out", "w") as out:
        monkeypatch.setattr("sys.stdout", out)
        with progress_bar(3, "translating", "sentences", stream=out, every=0.0) as bar:
            bar.update(3)
        monkeypatch.setattr("sys.stderr", None)
        with progress_bar(3, "translating", "sentences", every=0.0) as bar:
            bar.update(3)
    assert (tmp_path / "out").read_text() == ""


def run_with(stderr, main, *args):
    """``main(ARGS)`` with ``stderr`` as standard error: ``(exit code, stdout)``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(stderr):
        code = main([str(a) for a in args])
    return code, out.getvalue()


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_translate_shows_a_bar_on_a_terminal_and_prints_the_same_translations(
    family, trained_synthetic_models, tmp_path, monkeypatch
):
    monkeypatch.setattr("common.progress_bar.LINE_SECONDS", 600.0)  # no line without a terminal, however slow
    lines = [source for source, _ in reversal_pairs(150, random.Random(3), set())] + [""]
    source = write_lines(tmp_path / "input.txt", lines)
    args = ["--checkpoint", trained_synthetic_models[family].checkpoint, "--input", source, "--beam", "2"]
    plain = translate(*args)
    screen = Terminal()
    code, stdout = run_with(screen, load_module("translate").main, *args)
    assert code == 0 and plain.returncode == 0
    assert stdout == plain.stdout and len(stdout.splitlines()) == len(lines)
    assert "translating" in screen.getvalue() and f"0/{len(lines)}" in screen.getvalue()
    assert "translating" not in plain.stderr  # not a terminal, and short: no progress line


def test_align_shows_each_stage_on_a_terminal_and_prints_the_same_report(trained_synthetic_models, tmp_path):
    pairs = reversal_pairs(40, random.Random(5), set())
    src = write_lines(tmp_path / "pairs.de", [s for s, _ in pairs])
    tgt = write_lines(tmp_path / "pairs.en", [t for _, t in pairs])
    checkpoint = trained_synthetic_models["transformer"].checkpoint
    align = load_script("align").main
    args = ["--checkpoint", checkpoint, "--src", src, "--tgt", tgt, "--dev", 10]
    args += ["--train-src", src, "--train-tgt", tgt]  # fast_align's links as the reference
    quiet = io.StringIO()
    code, plain = run_with(quiet, align, *args, "--out", tmp_path / "plain")
    screen = Terminal()
    code_tty, shown = run_with(screen, align, *args, "--out", tmp_path / "tty")
    assert code == code_tty == 0
    drop_time = [line for line in plain.splitlines() if "took" not in line]  # the report's timing line
    assert drop_time == [line for line in shown.splitlines() if "took" not in line]
    for stage in ("fast_align: training", "fast_align: aligning", "attention: forced decoding", "word links"):
        assert stage in screen.getvalue(), stage
    assert quiet.getvalue() == ""


def test_compare_shows_its_bootstrap_on_a_terminal():
    from comparison.significance import bootstrap_systems

    refs = [f"a man rides a horse number {i}" for i in range(30)]
    systems = [("a", refs), ("b", [r.replace("horse", "bike") for r in refs])]
    screen = Terminal()
    with contextlib.redirect_stderr(screen):
        scores, _ = bootstrap_systems(systems, refs, 50)
    assert "paired bootstrap: 2 systems, 50 resamples" in screen.getvalue()
    assert scores["BLEU"][0].score == pytest.approx(100.0)


def test_the_data_preparation_shows_its_encoding_on_a_terminal(multi30k_config, tmp_path):
    from data.pipeline import prepare_data

    screen = Terminal()
    with contextlib.redirect_stderr(screen):
        prepare_data(multi30k_config(tmp_path / "cache", train_limit=500, vocab_size=400))
    assert "encoding the training pairs" in screen.getvalue() and "0/500" in screen.getvalue()


def test_an_evaluation_shows_its_decoding_on_a_terminal(trained_synthetic_models):
    from training.validation import validate

    trainer = trained_synthetic_models["rnn"].trainer
    screen = Terminal()
    with contextlib.redirect_stderr(screen):
        scores, _, hyps = validate(trainer.setup)
    n = len(hyps)
    assert "validation: greedy decoding" in screen.getvalue() and f"0/{n}" in screen.getvalue()
    assert scores["bleu"] > 0
