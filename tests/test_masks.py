import pytest
import torch

from models.attention import (
    causal_mask,
    combine_masks,
    key_mask,
    padding_mask_from_ids,
    padding_mask_from_lengths,
)


def test_padding_mask_from_lengths_marks_real_positions():
    mask = padding_mask_from_lengths(torch.tensor([3, 1, 4]))
    assert mask.dtype == torch.bool and mask.shape == (3, 4)
    assert mask.sum(dim=1).tolist() == [3, 1, 4]
    for row, length in zip(mask, [3, 1, 4]):
        assert row[:length].all() and not row[length:].any()


def test_padding_mask_from_lengths_pads_to_max_len_and_rejects_short_max_len():
    assert padding_mask_from_lengths(torch.tensor([2, 0]), max_len=5).shape == (2, 5)
    assert not padding_mask_from_lengths(torch.tensor([2, 0]), max_len=5)[1].any()
    with pytest.raises(ValueError, match="max_len=2"):
        padding_mask_from_lengths(torch.tensor([3]), max_len=2)


def test_padding_mask_from_ids_hides_pad_tokens():
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 0]])
    mask = padding_mask_from_ids(ids, pad_id=0)
    assert torch.equal(mask, ids != 0)


def test_padding_masks_from_lengths_and_ids_agree():
    lengths = torch.tensor([4, 2, 1])
    ids = torch.where(padding_mask_from_lengths(lengths), torch.tensor(9), torch.tensor(1))
    assert torch.equal(padding_mask_from_ids(ids, pad_id=1), padding_mask_from_lengths(lengths))


def test_key_mask_shapes_broadcast_over_queries_and_heads():
    padding = padding_mask_from_lengths(torch.tensor([2, 3]))  # (B, S)
    assert key_mask(padding).shape == (2, 1, 1, 3)
    scores = torch.zeros(2, 4, 5, 3)  # (B, H, T, S)
    assert torch.equal(key_mask(padding).expand_as(scores)[1, 2, 3], padding[1])


def test_causal_mask_is_lower_triangle():
    mask = causal_mask(5)
    assert mask.shape == (5, 5)
    for t in range(5):
        for s in range(5):
            assert bool(mask[t, s]) == (s <= t)


def test_causal_mask_with_cached_keys_is_aligned_bottom_right():
    # Two new queries after three cached steps are positions 3 and 4 of a 5-step sequence.
    assert torch.equal(causal_mask(2, 5), causal_mask(5)[3:])
    assert causal_mask(1, 7).all()  # a single newest query sees every earlier step
    with pytest.raises(ValueError):
        causal_mask(3, 2)


def test_combine_masks_intersects_with_broadcasting():
    causal = causal_mask(3)  # (T, T)
    padding = key_mask(padding_mask_from_lengths(torch.tensor([3, 2])))  # (B, 1, 1, T)
    combined = combine_masks(causal, None, padding)
    assert combined.shape == (2, 1, 3, 3)
    assert torch.equal(combined[0, 0], causal)
    assert not combined[1, 0, :, 2].any()  # the padded key is hidden from every query
    assert torch.equal(combined[1, 0, :, :2], causal[:, :2])


def test_combine_masks_of_nothing_is_none_and_rejects_float_masks():
    assert combine_masks(None, None) is None
    with pytest.raises(TypeError, match="boolean"):
        combine_masks(torch.ones(2, 2))
