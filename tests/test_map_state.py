"""models/seq2seq.py ``map_state``: a function applied to every tensor of a nested decoder state."""

import torch

from models.search import SOURCE_KEYS, map_state


def test_every_tensor_of_nested_dicts_lists_and_tuples_is_mapped_and_the_containers_kept():
    h, c, k, v = torch.arange(6.0).view(3, 2), torch.ones(3, 2), torch.zeros(3, 1, 2), torch.full((3, 4), 2.0)
    state = {"hidden": (h, c), "layers": [{"k": k, "v": v}, None], "length": 7, "name": "rnn"}
    mapped = map_state(state, lambda x: x * 10)
    assert isinstance(mapped["hidden"], tuple) and isinstance(mapped["layers"], list)
    assert torch.equal(mapped["hidden"][0], h * 10) and torch.equal(mapped["hidden"][1], c * 10)
    assert torch.equal(mapped["layers"][0]["k"], k * 10) and torch.equal(mapped["layers"][0]["v"], v * 10)
    assert mapped["layers"][1] is None and mapped["length"] == 7 and mapped["name"] == "rnn"


def test_the_input_state_is_left_as_it_was():
    h = torch.arange(4.0)
    state = {"layers": [h], "pair": (h, h)}
    map_state(state, lambda x: x + 1)
    assert state["layers"][0] is h and torch.equal(h, torch.arange(4.0))
    assert state["pair"][0] is h and state["pair"][1] is h


def test_a_bare_tensor_and_other_leaves():
    assert torch.equal(map_state(torch.tensor([1, 2]), lambda x: -x), torch.tensor([-1, -2]))
    assert map_state(None, lambda x: -x) is None
    assert map_state(3, lambda x: -x) == 3


def test_values_under_skipped_keys_stay_the_same_objects_at_any_depth():
    memory, mask, step = torch.randn(2, 5, 4), torch.ones(2, 5, dtype=torch.bool), torch.randn(2, 4)
    state = {"cross_v": memory, "layers": [{"cross_k": memory, "self_k": step}], "src_mask": mask, "h": step}
    rows = torch.tensor([1, 1, 0])
    mapped = map_state(state, lambda x: x.index_select(0, rows), skip=SOURCE_KEYS)
    assert (
        mapped["cross_v"] is memory
        and mapped["src_mask"] is mask
        and mapped["layers"][0]["cross_k"] is memory
    )
    assert torch.equal(mapped["h"], step[[1, 1, 0]]) and torch.equal(
        mapped["layers"][0]["self_k"], step[[1, 1, 0]]
    )
    everything = map_state(state, lambda x: x.index_select(0, rows))  # no skip: the source entries too
    assert torch.equal(everything["cross_v"], memory[[1, 1, 0]]) and everything["src_mask"].shape == (3, 5)


def test_skip_names_dict_keys_only():
    t = torch.ones(2)
    mapped = map_state(
        {"outer": {"memory": [t]}, "memory_like": t}, lambda x: x * 0, skip=frozenset({"memory"})
    )
    assert mapped["outer"]["memory"][0] is t
    assert torch.equal(mapped["memory_like"], torch.zeros(2))
