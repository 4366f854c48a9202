"""Checkpoints (common/checkpoint.py; training/resume.py, training/averaging.py): weights-only round
trip, atomic writes, clear errors, RNG states."""

import pickle
import random
from pathlib import Path

import pytest
import torch

from common.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from common.files import AtomicFile
from models.config import RNNConfig
from models.rnn import RNNModel
from training.averaging import keep_recent
from training.resume import cuda_states_to_restore, rng_states, set_rng_states


def payload(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = RNNModel(RNNConfig(embed_dim=8, hidden_size=8, attention_size=8), 20, 20)
    return {
        "model": model.state_dict(),
        "model_config": {"name": "rnn", "embed_dim": 8, "hidden_size": 8, "attention_size": 8},
        "tokenizer": b"\x00sentencepiece model bytes\xff",
        "step": 12,
        "rng": rng_states(),
    }


def assert_same_state(loaded: dict, saved: dict) -> None:
    assert loaded["model"].keys() == saved["model"].keys()
    for name, tensor in saved["model"].items():
        assert torch.equal(loaded["model"][name], tensor), name


def test_round_trip_loads_weights_only(tmp_path):
    saved = payload()
    path = tmp_path / "checkpoints" / "last.pt"  # the folder is created
    save_checkpoint(saved, path)
    raw = torch.load(path, weights_only=True)
    assert_same_state(raw, saved)
    loaded = load_checkpoint(path)
    assert_same_state(loaded, saved)
    assert loaded["tokenizer"] == saved["tokenizer"]
    assert loaded["model_config"] == saved["model_config"] and loaded["step"] == 12
    assert loaded["rng"]["python"] == saved["rng"]["python"]
    assert torch.equal(loaded["rng"]["torch"], saved["rng"]["torch"])


def test_loaded_state_dict_rebuilds_the_model(tmp_path):
    save_checkpoint(payload(), tmp_path / "a.pt")
    model = RNNModel(RNNConfig(embed_dim=8, hidden_size=8, attention_size=8), 20, 20)
    model.load_state_dict(load_checkpoint(tmp_path / "a.pt")["model"])


def test_missing_file_raises(tmp_path):
    path = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match="does not exist") as error:
        load_checkpoint(path)
    assert str(path) in str(error.value)


def test_truncated_file_raises_with_its_path(tmp_path):
    path = tmp_path / "best.pt"
    save_checkpoint(payload(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert str(path) in str(error.value)


def test_foreign_file_raises(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(path)


@pytest.mark.parametrize("missing", ["model", "model_config"])
def test_dict_without_model_raises(tmp_path, missing):
    path = tmp_path / "x.pt"
    content = payload()
    del content[missing]
    torch.save(dict(content, format=1), path)
    with pytest.raises(CheckpointError, match="not a checkpoint of this project"):
        load_checkpoint(path)


def test_other_format_raises(tmp_path):
    path = tmp_path / "old.pt"
    torch.save(dict(payload(), format=0), path)
    with pytest.raises(CheckpointError, match="format"):
        load_checkpoint(path)


def test_failed_save_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    good = payload(seed=0)
    save_checkpoint(good, path)
    before = path.read_bytes()
    real_save = torch.save

    def save_then_fail(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # some bytes reach the temporary file
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", save_then_fail)
    with pytest.raises(CheckpointError, match=f"cannot write checkpoint {path}: No space left on device"):
        save_checkpoint(payload(seed=1), path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]
    assert_same_state(load_checkpoint(path), good)


def test_unpicklable_payload_leaves_no_temporary_file(tmp_path):
    with pytest.raises((AttributeError, pickle.PicklingError)):  # torch.save of a lambda
        save_checkpoint({"model": {}, "model_config": {}, "hook": lambda: None}, tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


def test_non_tensor_code_objects_are_refused_on_load(tmp_path):
    """Weights-only loading: a pickled class instance is not executed but refused."""
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "model_config": {}, "format": 1, "path": Path("x")}, path)
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(path)


def test_rng_states_restore_the_same_draws():
    random.seed(3)
    torch.manual_seed(3)
    states = rng_states()
    first = (random.random(), torch.rand(4), torch.randint(0, 100, (3,)))
    random.random(), torch.rand(10)  # move on
    set_rng_states(states)
    again = (random.random(), torch.rand(4), torch.randint(0, 100, (3,)))
    assert first[0] == again[0]
    assert torch.equal(first[1], again[1]) and torch.equal(first[2], again[2])


def test_rng_states_survive_a_checkpoint(tmp_path):
    states = rng_states()
    expected = (random.random(), torch.rand(3))
    save_checkpoint({"model": {}, "model_config": {}, "rng": states}, tmp_path / "c.pt")
    set_rng_states(load_checkpoint(tmp_path / "c.pt")["rng"])
    assert random.random() == expected[0]
    assert torch.equal(torch.rand(3), expected[1])


def test_cuda_generators_restore_onto_fewer_or_more_gpus():
    saved = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]  # a state per GPU of the saver
    kept, lost = cuda_states_to_restore(saved, visible=4, used=2)
    assert [int(s[0]) for s in kept] == [0, 1, 2, 3] and lost == ""
    # one GPU here (set_rng_state_all would fail): GPU 0's state, all that a process on it draws from
    kept, lost = cuda_states_to_restore(saved, visible=1, used=0)
    assert [int(s[0]) for s in kept] == [0] and lost == ""
    kept, lost = cuda_states_to_restore(saved[:1], visible=4, used=3)  # saved where one GPU was seen
    assert [int(s[0]) for s in kept] == [0] and lost == (
        "the checkpoint holds the generators of 1 GPU(s), none for GPU 3: it starts a new one"
    )
    assert cuda_states_to_restore([], visible=1, used=0) == (
        [],
        "the checkpoint holds the generators of 0 GPU(s), none for GPU 0: it starts a new one",
    )
    assert cuda_states_to_restore(saved, visible=0, used=None) == ([], "")  # resumed on the CPU


def test_a_checkpoint_saved_on_a_gpu_resumes_on_the_cpu(tmp_path):
    states = rng_states()
    states["cuda"] = [torch.zeros(16, dtype=torch.uint8)]  # as a CUDA machine saves them
    expected = torch.rand(3)
    save_checkpoint({"model": {}, "model_config": {}, "rng": states}, tmp_path / "c.pt")
    lost = set_rng_states(load_checkpoint(tmp_path / "c.pt")["rng"], torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected) and lost == []


def test_keep_recent_keeps_the_newest_as_hard_links_of_last(tmp_path):
    for step in (3, 6, 9):
        with AtomicFile(
            tmp_path / "last.pt", "wb"
        ) as out:  # a new file renamed over it, as save_checkpoint does
            out.write(f"weights of step {step}".encode())
        keep_recent(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*.pt")) == ["step_0000006.pt", "step_0000009.pt"]
    assert (
        tmp_path / "step_0000006.pt"
    ).read_bytes() == b"weights of step 6"  # the old inode, not the new last.pt
    assert (tmp_path / "step_0000009.pt").samefile(tmp_path / "last.pt")
    keep_recent(tmp_path, 9, keep=2)  # the same step again (a resumed run): replaced, not an error
    assert (tmp_path / "step_0000009.pt").samefile(tmp_path / "last.pt")
