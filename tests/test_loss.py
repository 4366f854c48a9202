"""Label-smoothed cross-entropy (training/step.py) against PyTorch's cross_entropy."""

import pytest
import torch
import torch.nn.functional as F

from data.specials import PAD_ID
from training.step import label_smoothed_nll, projected_smoothed_nll

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


def reference_loss(logits, target, smoothing):
    """The smoothed loss written with autograd's own operators (log-softmax, gather, mean)."""
    log_probs = torch.log_softmax(logits, dim=-1)
    keep = target != PAD_ID
    nll = torch.where(keep, -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1), 0.0)
    uniform = torch.where(keep, -log_probs.mean(dim=-1), 0.0)
    return ((1.0 - smoothing) * nll + smoothing * uniform).sum()


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_the_gradient_is_autograds_through_the_log_softmax(smoothing):
    """``SmoothedNLL``'s own backward (softmax less the target distribution, zero at padding) gives
    the gradient autograd computes through the plain operators, scaled by the upstream gradient."""
    logits, target = example()
    logits = logits.double().requires_grad_()
    ours, theirs = logits.detach().clone().requires_grad_(), logits
    (3.0 * label_smoothed_nll(ours, target, PAD_ID, smoothing)[0]).backward()
    (3.0 * reference_loss(theirs, target, smoothing)).backward()
    torch.testing.assert_close(ours.grad, theirs.grad)
    assert (ours.grad[target == PAD_ID] == 0).all()
    check = logits.detach()[:2, :3].clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: label_smoothed_nll(x, target[:2, :3], PAD_ID, smoothing)[0], check
    )


def test_bf16_logits_get_a_bf16_gradient_of_the_float32_loss():
    logits, target = example()
    low = logits.bfloat16().requires_grad_()
    label_smoothed_nll(low, target, PAD_ID, 0.1)[0].backward()
    wide = logits.bfloat16().float().requires_grad_()
    reference_loss(wide, target, 0.1).backward()
    assert low.grad.dtype == torch.bfloat16
    torch.testing.assert_close(low.grad.float(), wide.grad, atol=1e-2, rtol=1e-2)


def projection_example(dtype=torch.float64):
    """States ``(3, 5, E)`` and an output weight ``(V, E)`` with ``example()``'s target."""
    _, target = example()
    states = torch.randn(3, 5, 8, dtype=dtype)
    weight = torch.randn(V, 8, dtype=dtype) * 0.5
    return states, weight, target


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("block_rows", [1, 4, 15, 100])  # 15 positions: uneven blocks, one, one larger
def test_the_projected_loss_is_the_loss_of_the_output_layers_logits(smoothing, block_rows):
    """``projected_smoothed_nll`` (the output layer's product and the loss, a block of positions at a
    time) gives the three numbers and the gradients of ``label_smoothed_nll`` over the whole logits."""
    states, weight, target = projection_example()
    ours = [states.clone().requires_grad_(), weight.clone().requires_grad_()]
    theirs = [states.clone().requires_grad_(), weight.clone().requires_grad_()]
    loss, nll, count = projected_smoothed_nll(*ours, target, PAD_ID, smoothing, block_elements=block_rows * V)
    loss2, nll2, count2 = label_smoothed_nll(theirs[0] @ theirs[1].t(), target, PAD_ID, smoothing)
    torch.testing.assert_close((loss, nll), (loss2, nll2))
    assert count == count2 == 9 and not nll.requires_grad
    (3.0 * loss).backward()
    (3.0 * loss2).backward()
    torch.testing.assert_close(ours[0].grad, theirs[0].grad)
    torch.testing.assert_close(ours[1].grad, theirs[1].grad)
    assert (ours[0].grad[target == PAD_ID] == 0).all()
    check = [states[:2, :3].clone().requires_grad_(), weight.clone().requires_grad_()]
    assert torch.autograd.gradcheck(
        lambda s, w: projected_smoothed_nll(s, w, target[:2, :3], PAD_ID, smoothing, block_elements=2 * V)[0],
        check,
    )


@pytest.mark.parametrize("states_type", [torch.float32, torch.bfloat16])
def test_under_bf16_autocast_the_products_run_in_bf16_the_loss_in_float32(states_type):
    """Under autocast (where a CPU or GPU trains in bf16) the products run in bf16, as autocast's
    output layer would, the loss in float32; each gradient comes in its tensor's precision (the
    weight's summed over the blocks in float32). The states come in float32 or bf16 (autocast
    leaves a layer norm's output in float32 on CUDA)."""
    states, weight, target = projection_example(torch.float32)
    ours = [states.to(states_type).requires_grad_(), weight.clone().requires_grad_()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = projected_smoothed_nll(*ours, target, PAD_ID, 0.1, block_elements=4 * V)
    loss.backward()
    theirs = [states.to(states_type).requires_grad_(), weight.clone().requires_grad_()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = theirs[0] @ theirs[1].t()  # (B, T, V) autocast's output layer, in bf16
    loss2, _, _ = label_smoothed_nll(logits, target, PAD_ID, 0.1)
    loss2.backward()
    assert (
        loss.dtype == torch.float32
        and ours[0].grad.dtype == states_type
        and ours[1].grad.dtype == torch.float32
    )
    torch.testing.assert_close(loss, loss2)  # the same bf16 logits: float32 agreement
    torch.testing.assert_close(ours[0].grad, theirs[0].grad)
    torch.testing.assert_close(ours[1].grad, theirs[1].grad, atol=1e-2, rtol=1e-2)  # summed at each block


def test_the_projected_loss_makes_only_the_gradients_its_inputs_need():
    states, weight, target = projection_example()
    w = weight.clone().requires_grad_()
    loss, _, _ = projected_smoothed_nll(states, w, target, PAD_ID, 0.1, block_elements=4 * V)  # states fixed
    loss.backward()
    w2 = weight.clone().requires_grad_()
    label_smoothed_nll(states @ w2.t(), target, PAD_ID, 0.1)[0].backward()
    torch.testing.assert_close(w.grad, w2.grad)
    with torch.no_grad():  # validation's way: the numbers alone
        assert projected_smoothed_nll(states, w, target, PAD_ID, 0.1)[0] == pytest.approx(loss.item())
