"""models/dropout.py: dropout as nn.Dropout defines it, its mask drawn as uniform floats on a CPU."""

import pytest
import torch

from models.dropout import Dropout, dropout


def test_training_drops_a_share_p_and_scales_the_rest():
    torch.manual_seed(0)
    x = torch.ones(400, 500)
    y = dropout(x, 0.3, training=True)
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(0.7, abs=0.005)
    assert torch.equal(y[kept], torch.full_like(y[kept], 1 / 0.7))
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)  # the expectation kept


def test_evaluation_and_p_zero_change_nothing():
    x = torch.randn(3, 4)
    layer = Dropout(0.5).eval()
    assert layer(x) is x and dropout(x, 0.0, training=True) is x
    assert "p=0.5" in repr(layer)


def test_the_gradient_flows_through_the_kept_elements_only():
    torch.manual_seed(1)
    x = torch.randn(50, 60, requires_grad=True)
    y = Dropout(0.2).train()(x)
    y.sum().backward()
    assert torch.equal(x.grad, (y != 0).float() / 0.8)


def test_the_same_seed_draws_the_same_mask_and_a_bf16_input_its_share():
    x = torch.ones(300, 300)
    torch.manual_seed(2)
    a = dropout(x, 0.1, training=True)
    torch.manual_seed(2)
    assert torch.equal(a, dropout(x, 0.1, training=True))
    # the draws are float32 whatever the input: a bf16 activation keeps p, not bf16's coarse steps
    half = dropout(x.bfloat16(), 0.1, training=True)
    assert half.dtype == torch.bfloat16 and (half == 0).float().mean().item() == pytest.approx(0.1, abs=0.005)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_precision_gives_x_times_the_scale_where_kept(dtype):
    """float32 takes a mask made in place, bf16 scales in its own precision: both give exactly
    ``x * (1 / (1 - p))`` at the kept elements (the scale is not rounded to bf16 first), and the
    same mask for the same seed."""
    x = torch.randn(200, 300).to(dtype)
    torch.manual_seed(3)
    y = dropout(x, 0.1, training=True)
    torch.manual_seed(3)
    keep = torch.rand(x.shape) >= 0.1
    assert y.dtype == dtype and torch.equal(y, torch.where(keep, x * (1 / 0.9), 0).to(dtype))
