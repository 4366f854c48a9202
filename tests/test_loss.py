"""Label-smoothed cross-entropy (training/step.py) against PyTorch's cross_entropy."""

import pytest
import torch
import torch.nn.functional as F

from data.specials import PAD_ID
from training.step import label_smoothed_nll

V = 30


pytestmark = pytest.mark.usefixtures("seed")  # torch seeded before each test (conftest.py)


def example():
    """Logits ``(3, 5, V)`` and a target with 5 + 3 + 1 real tokens."""
    logits = torch.randn(3, 5, V)
    target = torch.randint(1, V, (3, 5))
    target[1, 3:] = PAD_ID
    target[2, 1:] = PAD_ID
    return logits, target


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_padded_positions_do_not_count(smoothing):
    logits, target = example()
    changed = logits.clone()
    changed[target == PAD_ID] = torch.randn(int((target == PAD_ID).sum()), V) * 100
    loss, nll, count = label_smoothed_nll(logits, target, PAD_ID, smoothing)
    loss2, nll2, count2 = label_smoothed_nll(changed, target, PAD_ID, smoothing)
    assert torch.equal(loss, loss2) and torch.equal(nll, nll2) and count == count2


def test_no_smoothing_is_cross_entropy():
    logits, target = example()
    loss, nll, _ = label_smoothed_nll(logits, target, PAD_ID, 0.0)
    expected = F.cross_entropy(logits.view(-1, V), target.view(-1), ignore_index=PAD_ID, reduction="sum")
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(nll, expected)


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_smoothing_is_pytorch_label_smoothing(smoothing):
    logits, target = example()
    loss, nll, _ = label_smoothed_nll(logits, target, PAD_ID, smoothing)
    flat_logits, flat_target = logits.view(-1, V), target.view(-1)
    expected = F.cross_entropy(
        flat_logits, flat_target, ignore_index=PAD_ID, reduction="sum", label_smoothing=smoothing
    )
    torch.testing.assert_close(loss, expected)
    # The NLL stays the unsmoothed one (for perplexity).
    torch.testing.assert_close(
        nll, F.cross_entropy(flat_logits, flat_target, ignore_index=PAD_ID, reduction="sum")
    )


def test_token_count():
    logits, target = example()
    assert label_smoothed_nll(logits, target, PAD_ID, 0.1)[2] == 9


def test_nll_carries_no_gradient_and_loss_does():
    logits, target = example()
    logits.requires_grad_(True)
    loss, nll, _ = label_smoothed_nll(logits, target, PAD_ID, 0.1)
    assert not nll.requires_grad
    loss.backward()
    assert (logits.grad[target == PAD_ID] == 0).all()
    assert (logits.grad[target != PAD_ID] != 0).any(dim=-1).all()


def test_half_precision_logits_are_computed_in_float32():
    logits, target = example()
    loss, _, _ = label_smoothed_nll(logits.bfloat16(), target, PAD_ID, 0.1)
    assert loss.dtype == torch.float32
    expected = label_smoothed_nll(logits.bfloat16().float(), target, PAD_ID, 0.1)[0]
    torch.testing.assert_close(loss, expected)
