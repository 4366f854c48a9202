"""Weight averages (training/averaging.py, scripts/average_checkpoints.py): the exponential moving
average kept while training, the mean of checkpoints, and how runs use them."""

import json

import pytest
import torch
from torch import nn

from common.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from inference.translator import Translator
from training.averaging import (
    ExponentialAverage,
    average_checkpoints,
    ema_decay_at,
    last_checkpoints,
    mean_state,
)
from training.resume import check_resumable

from helpers import load_script, synthetic_run

average_script = load_script("average_checkpoints")


def test_mean_state_is_the_element_wise_mean_and_keeps_integer_tensors():
    states = [{"w": torch.full((2, 3), float(k)), "n": torch.tensor(7)} for k in (1, 2, 6)]
    mean = mean_state(states)
    assert torch.equal(mean["w"], torch.full((2, 3), 3.0))
    assert mean["n"].item() == 7 and mean["n"].dtype == torch.int64
    states[1]["n"] = torch.tensor(8)
    with pytest.raises(ValueError, match="n is not floating point and differs"):
        mean_state(states)


def test_the_ema_decay_is_lower_early_so_the_initial_weights_fade():
    assert ema_decay_at(0.999, 0) == pytest.approx(0.1)
    assert ema_decay_at(0.999, 90) == pytest.approx(0.91)
    assert ema_decay_at(0.999, 10**6) == 0.999


def test_the_ema_update_is_a_lerp_towards_the_new_weights():
    model = nn.Linear(3, 2)
    ema = ExponentialAverage(model, decay=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(step=100)  # decay 0.5 at step 100
    for name, value in ema.state_dict().items():
        assert torch.allclose(value, before[name] + 0.5)
    assert all(torch.equal(model.state_dict()[k], before[k] + 1.0) for k in before)  # the model is left alone


@pytest.fixture(scope="module")
def averaged_run(synthetic_corpus, tmp_path_factory):
    """A tiny RNN run on the synthetic task that keeps its last three evaluations' checkpoints and
    an EMA; and the same run without averages (trained in-process)."""
    from training.run import train

    from helpers import compose

    base = tmp_path_factory.mktemp("averaged")
    runs = {}
    for name, extra in {
        "on": ["trainer.ema_decay=0.9", "trainer.average_last=3"],
        "off": ["trainer.keep_last=3"],  # kept checkpoints alone are not averaged
    }.items():
        overrides = synthetic_run(
            base / name,
            synthetic_corpus,
            base / "cache",
            "trainer.max_steps=24",
            "trainer.eval_every=6",
            "trainer.batch_tokens=1000",
            *extra,
        )
        run_dir = base / name
        cfg = compose([o for o in overrides if not o.startswith("hydra.")])
        train(cfg, run_dir)
        runs[name] = run_dir
    return runs


def test_average_last_averages_the_kept_checkpoints_and_the_test_uses_the_best_on_validation(averaged_run):
    run = averaged_run["on"]
    kept = last_checkpoints(run / "checkpoints", 3)
    assert [p.name for p in kept] == ["step_0000012.pt", "step_0000018.pt", "step_0000024.pt"]
    average = load_checkpoint(run / "checkpoints" / "average.pt")
    states = [load_checkpoint(p)["model"] for p in kept]
    for name, value in average["model"].items():
        assert torch.allclose(value, sum(s[name] for s in states) / 3, atol=1e-7), name
    assert "optimizer" not in average  # an average translates, it does not resume
    results = json.loads((run / "results.json").read_text())
    weights = results["test_weights"]
    assert set(weights["valid_bleu"]) == {"best.pt", "ema.pt", "average.pt"}
    assert weights["used"] == max(weights["valid_bleu"], key=weights["valid_bleu"].get)
    assert all("ema_bleu" in entry for entry in results["valid_history"])


def test_ema_off_changes_nothing_and_on_changes_only_its_own_files(averaged_run):
    on, off = (load_checkpoint(averaged_run[k] / "checkpoints" / "last.pt") for k in ("on", "off"))
    assert all(torch.equal(on["model"][k], off["model"][k]) for k in off["model"])  # training is the same
    assert "ema" in on and "ema" not in off
    assert not (averaged_run["off"] / "checkpoints" / "ema.pt").exists()
    assert not (averaged_run["off"] / "checkpoints" / "average.pt").exists()
    assert len(last_checkpoints(averaged_run["off"] / "checkpoints", 5)) == 3
    ema = load_checkpoint(averaged_run["on"] / "checkpoints" / "ema.pt")
    assert all(torch.equal(ema["model"][k], on["ema"][k]) for k in on["ema"])
    assert any(not torch.equal(ema["model"][k], on["model"][k]) for k in on["model"])
    results = json.loads((averaged_run["off"] / "results.json").read_text())
    assert results["test_weights"] == {"used": "best.pt", "valid_bleu": {"best.pt": results["valid"]["bleu"]}}


def test_the_script_averages_a_run_folder_last_n_into_a_checkpoint_that_translates(
    averaged_run, tmp_path, capsys
):
    run = averaged_run["on"]
    out = tmp_path / "avg.pt"
    assert average_script.main(["--out", str(out), "--run", str(run), "--last", "2"]) == 0
    kept = last_checkpoints(run / "checkpoints", 2)
    expected = average_checkpoints(kept)["model"]
    assert all(torch.equal(load_checkpoint(out)["model"][k], v) for k, v in expected.items())
    assert Translator.from_checkpoint(out, "cpu").translate(["Ein Hund läuft."], beam=2)[0].text is not None
    # explicit paths give the same average
    again = tmp_path / "again.pt"
    assert average_script.main(["--out", str(again), *map(str, kept)]) == 0
    assert all(torch.equal(load_checkpoint(again)["model"][k], v) for k, v in expected.items())


def test_the_script_refuses_an_existing_out_too_few_checkpoints_and_foreign_files(
    averaged_run, tmp_path, capsys
):
    run = averaged_run["on"]
    out = tmp_path / "avg.pt"
    out.write_bytes(b"precious")
    assert average_script.main(["--out", str(out), "--run", str(run), "--last", "2"]) == 1
    assert "exists: remove it or choose another --out" in capsys.readouterr().err
    assert out.read_bytes() == b"precious"
    assert average_script.main(["--out", str(tmp_path / "a.pt"), "--run", str(run), "--last", "5"]) == 1
    assert "holds 3 step_*.pt checkpoints, not 5: train with trainer.keep_last=5" in capsys.readouterr().err
    foreign = tmp_path / "foreign.pt"
    foreign.write_text("not a checkpoint")
    kept = last_checkpoints(run / "checkpoints", 1)[0]
    assert average_script.main(["--out", str(tmp_path / "b.pt"), str(kept), str(foreign)]) == 1
    assert f"error: checkpoint {foreign} cannot be read" in capsys.readouterr().err
    assert not (tmp_path / "b.pt").exists()


def test_checkpoints_of_other_models_are_not_averaged(averaged_run, tmp_path):
    kept = last_checkpoints(averaged_run["on"] / "checkpoints", 1)[0]
    other = load_checkpoint(kept)
    other["model_config"] = dict(other["model_config"], hidden_size=2 * other["model_config"]["hidden_size"])
    save_checkpoint(other, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="holds another model"):
        average_checkpoints([tmp_path / "other.pt", kept])


@pytest.mark.parametrize("name", ["average.pt", "ema.pt"])
def test_a_checkpoint_of_weights_alone_is_refused_for_resume_naming_last_pt(averaged_run, name):
    path = averaged_run["on"] / "checkpoints" / name
    with pytest.raises(CheckpointError, match="holds weights only .* does not resume; resume from last.pt"):
        check_resumable(load_checkpoint(path), path, {}, {}, {})


def test_last_checkpoints_go_by_step_and_none_for_zero(tmp_path):
    for step in (9, 10, 100):
        (tmp_path / f"step_{step:07d}.pt").write_bytes(b"")
    (tmp_path / "step_x.pt").write_bytes(b"")
    assert [p.name for p in last_checkpoints(tmp_path, 2)] == ["step_0000010.pt", "step_0000100.pt"]
    assert last_checkpoints(tmp_path, 0) == []
