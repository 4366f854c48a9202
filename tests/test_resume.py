"""What a resumed run must share with its checkpoint (training/resume.py)."""

from pathlib import Path

import pytest

from common.checkpoint import CheckpointError
from training.resume import batch_order_settings, check_resumable, config_changes

CONFIG = {
    "seed": 1,
    "device": "auto",
    "data": {"root": "/a", "cache_dir": ".cache", "vocab_size": 8000, "src": "de"},
    "trainer": {"batch_tokens": 4096, "accumulate": 1, "lr": 1e-3, "resume": None},
}
MODEL = {"name": "rnn", "hidden_size": 256}


def test_config_changes_names_each_key_that_differs():
    assert config_changes({"a": 1, "b": 2}, {"a": 1, "b": 2}) == ""
    assert config_changes({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == (
        "model.b (checkpoint 2, now 3), model.c (checkpoint None, now 4)"
    )
    assert config_changes({"seed": 1}, {"seed": 2}, prefix="") == "seed (checkpoint 1, now 2)"


def test_batch_order_settings_are_the_data_the_batching_and_the_seed_but_not_paths():
    assert batch_order_settings(CONFIG) == {
        "seed": 1,
        "data.vocab_size": 8000,
        "data.src": "de",
        "trainer.batch_tokens": 4096,
        "trainer.accumulate": 1,
    }


def payload(**changes):
    state = {"optimizer": {}, "rng": {}}  # a checkpoint that resumes holds them (weights alone do not)
    return {"model_config": dict(MODEL), "config": CONFIG, "tokenizer": {"src": b"spm"}, **state, **changes}


def test_a_checkpoint_of_the_same_run_is_resumable_whatever_the_paths_and_the_rate():
    moved = {
        **CONFIG,
        "data": {**CONFIG["data"], "root": "/b", "cache_dir": "/c"},
        "trainer": {**CONFIG["trainer"], "lr": 5e-4, "resume": "auto"},
    }
    check_resumable(payload(), Path("last.pt"), MODEL, moved, {"src": b"spm"})


@pytest.mark.parametrize(
    "model,config,tokenizer,message",
    [
        (
            {**MODEL, "hidden_size": 512},
            CONFIG,
            {"src": b"spm"},
            "another model config: model.hidden_size (checkpoint 256, now 512)",
        ),
        (
            MODEL,
            {**CONFIG, "seed": 2},
            {"src": b"spm"},
            "settings that decide the batches: seed (checkpoint 1, now 2)",
        ),
        (MODEL, CONFIG, {"src": b"other"}, "another vocabulary"),
    ],
)
def test_anything_else_is_refused_naming_what_differs(model, config, tokenizer, message):
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_resumable(payload(), Path("last.pt"), model, config, tokenizer)


def test_a_checkpoint_older_than_a_data_key_resumes_as_that_keys_default():
    """``data.pad_multiple`` came after some checkpoints: theirs hold no such key, and they were
    batched as its default (1) does; a run that sets another value is refused, naming it."""
    now = {**CONFIG, "data": {**CONFIG["data"], "pad_multiple": 1}}
    check_resumable(payload(), Path("last.pt"), MODEL, now, {"src": b"spm"})
    rounded = {**CONFIG, "data": {**CONFIG["data"], "pad_multiple": 8}}
    with pytest.raises(CheckpointError, match=r"data.pad_multiple \(checkpoint 1, now 8\)"):
        check_resumable(payload(), Path("last.pt"), MODEL, rounded, {"src": b"spm"})
