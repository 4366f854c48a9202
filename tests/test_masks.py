import pytest
import torch

from data.batching import pad, source_mask
from data.specials import PAD_ID
from models.attention import causal_mask, combine_masks, key_mask
from models.transformer import target_self_mask


def test_the_source_mask_is_true_at_real_tokens_and_false_at_pad():
    """The one source mask of the project (training, evaluation, translation)."""
    ids = pad([[5, 6], [7], [8, 9, 4, 4]])
    mask = source_mask(ids)
    assert mask.dtype == torch.bool and mask.shape == (3, 4)
    assert mask.sum(dim=1).tolist() == [2, 1, 4] and torch.equal(mask, ids != PAD_ID)


def test_the_transformers_target_mask_hides_the_future_and_padding():
    tgt_in = pad([[1, 5, 6], [1, 7]])  # the second sentence padded at position 2
    mask = target_self_mask(tgt_in, PAD_ID)  # (B, 1, T, T)
    assert mask.shape == (2, 1, 3, 3)
    assert torch.equal(mask[0, 0], causal_mask(3))
    assert torch.equal(mask[1, 0], causal_mask(3) & torch.tensor([True, True, False]))


def test_key_mask_shapes_broadcast_over_queries_and_heads():
    padding = torch.tensor([[True, True, False], [True, True, True]])  # (B, S)
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
    padding = key_mask(torch.tensor([[True, True, True], [True, True, False]]))  # (B, 1, 1, T)
    combined = combine_masks(causal, None, padding)
    assert combined.shape == (2, 1, 3, 3)
    assert torch.equal(combined[0, 0], causal)
    assert not combined[1, 0, :, 2].any()  # the padded key is hidden from every query
    assert torch.equal(combined[1, 0, :, :2], causal[:, :2])


def test_combine_masks_of_nothing_is_none_and_rejects_float_masks():
    assert combine_masks(None, None) is None
    with pytest.raises(TypeError, match="boolean"):
        combine_masks(torch.ones(2, 2))
