"""scripts/tune_decoding.py: the grid of beam sizes and length penalties, scored by sacrebleu."""

import re

import pytest

from data.corpus import read_lines

from helpers import SPLIT, load_script

tune = load_script("tune_decoding")


def test_the_grid_has_greedy_search_once_and_every_beam_with_every_alpha():
    grid = tune.settings([5, 1, 4, 5], [1.0, 0.6])
    assert grid == [
        {"beam": 1, "alpha": None},
        {"beam": 4, "alpha": 0.6},
        {"beam": 4, "alpha": 1.0},
        {"beam": 5, "alpha": 0.6},
        {"beam": 5, "alpha": 1.0},
    ]


def test_ties_go_to_the_smaller_beam_then_the_alpha_nearer_one():
    rows = [
        {"beam": 5, "alpha": 0.6, "bleu": 30.001},
        {"beam": 4, "alpha": 1.2, "bleu": 30.0},
        {"beam": 4, "alpha": 1.0, "bleu": 29.999},
        {"beam": 8, "alpha": 1.0, "bleu": 29.0},
    ]
    assert tune.best_row(rows) == rows[2]
    rows.append({"beam": 8, "alpha": 1.0, "bleu": 31.0})
    assert tune.best_row(rows) == rows[-1]
    zero = [{"beam": 4, "alpha": 0.0, "bleu": 30.0}, {"beam": 4, "alpha": 1.4, "bleu": 30.0}]
    assert tune.best_row(zero) == zero[1]  # alpha 0 is a setting of its own, 1.0 away from 1


def test_a_trained_model_is_scored_at_every_setting(
    trained_synthetic_models, synthetic_corpus, tmp_path, capsys
):
    checkpoint = trained_synthetic_models["transformer"].checkpoint
    src, ref = (tmp_path / "src", tmp_path / "ref")
    for side, path in (
        ("de", src),
        ("en", ref),
    ):  # held-out reversals, which the model has learnt: BLEU far above 0
        path.write_text("\n".join(read_lines(synthetic_corpus / f"{SPLIT}.{side}.gz")[:40]) + "\n")
    args = ["--checkpoint", str(checkpoint), "--src", str(src), "--ref", str(ref), "--beams", "1", "3"]
    assert tune.main([*args, "--alphas", "0.6", "1.0", "--threads", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if re.match(r"\s+\d+\s", line)]
    assert [(r[0], r[1]) for r in rows] == [("1", "-"), ("3", "0.6"), ("3", "1")]
    bleu = [float(r[2]) for r in rows]
    assert min(bleu) > 50
    best = tune.best_row(
        [
            {"beam": int(r[0]), "alpha": None if r[1] == "-" else float(r[1]), "bleu": float(r[2])}
            for r in rows
        ]
    )
    alpha = "" if best["alpha"] is None else f" --alpha {best['alpha']:g}"
    assert out[-1].startswith(f"best: --beam {best['beam']}{alpha} (BLEU {best['bleu']:.2f}")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--src", "{src}", "--ref", "{short}"], "has 40 lines, {short} 39: they must be aligned"),
        (["--src", "{missing}", "--ref", "{short}"], "{missing}: file not found"),
    ],
)
def test_bad_inputs_are_one_error_line(trained_synthetic_models, tmp_path, capsys, args, message):
    checkpoint = trained_synthetic_models["transformer"].checkpoint
    paths = {"src": tmp_path / "src", "short": tmp_path / "short", "missing": tmp_path / "missing"}
    paths["src"].write_text("ein Hund .\n" * 40)
    paths["short"].write_text("a dog .\n" * 39)
    argv = ["--checkpoint", str(checkpoint), *(a.format(**paths) for a in args)]
    assert tune.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message.format(**paths) in err and err.count("\n") == 1
