"""R-Drop (training/rdrop.py): the symmetric KL of two dropout passes, by hand, and in a step."""

import math
from contextlib import nullcontext

import pytest
import torch

from data.batching import collate
from data.specials import PAD_ID
from models.build import build_model
from models.config import RNNConfig, TransformerConfig
from training.config import TrainerConfig
from training.distributed import World
from training.rdrop import symmetric_kl, twice
from training.step import accumulate_gradients

V = 12


def test_the_symmetric_kl_is_the_hand_computed_one():
    torch.manual_seed(0)
    logits = torch.randn(4, 3, V)  # two passes of B=2 pairs, T=3
    target = torch.tensor([[5, 6, 2], [7, 2, PAD_ID]] * 2)  # the second pair's last position is padding
    expected = 0.0
    for b in range(2):
        for t in range(3):
            if target[b, t] == PAD_ID:
                continue
            p = torch.softmax(logits[b, t], -1).tolist()
            q = torch.softmax(logits[b + 2, t], -1).tolist()
            kl_pq = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
            kl_qp = sum(qi * math.log(qi / pi) for pi, qi in zip(p, q))
            expected += (kl_pq + kl_qp) / 2
    assert symmetric_kl(logits, target, PAD_ID).item() == pytest.approx(expected, rel=1e-5)
    assert symmetric_kl(torch.cat([logits[:2], logits[:2]]), target, PAD_ID).item() == 0.0  # same passes


def test_twice_stacks_every_field_of_a_batch_on_itself():
    batch = collate([(0, [4, 5, 6], [7, 8]), (1, [9], [10, 11, 4])])
    doubled = twice(batch)
    for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths", "indices"):
        assert torch.equal(getattr(doubled, name), torch.cat([getattr(batch, name)] * 2)), name
    assert doubled.links is None and doubled.n_tgt_tokens == 2 * batch.n_tgt_tokens


FAMILIES = {
    "transformer": lambda dropout, tie: TransformerConfig(
        d_model=16, n_heads=2, ff_size=32, encoder_layers=1, decoder_layers=1, dropout=dropout, tie_output=tie
    ),
    "rnn": lambda dropout, tie: RNNConfig(
        embed_dim=12, hidden_size=16, attention_size=8, dropout=dropout, tie_output=tie
    ),
}


def step(family: str, dropout: float, alpha: float, tie: bool = True):
    """The summed loss and the gradients of one accumulation over a tiny batch (weights and dropout
    masks from seed 0)."""
    torch.manual_seed(0)
    model = build_model(FAMILIES[family](dropout, tie), V, V).train()
    batch = collate([(0, [4, 5, 6, 7], [8, 9, 10]), (1, [11, 4], [5, 6, 7, 8, 9])])
    tc = TrainerConfig(rdrop_alpha=alpha, label_smoothing=0.1, guided_alignment=0.0)  # batches without links
    weight = model.output_layer.proj.weight
    loss, _, _ = accumulate_gradients(model, weight, [batch], tc, World(), torch.device("cpu"), nullcontext)
    return loss, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_without_dropout_the_two_passes_agree_and_r_drop_changes_nothing(family, tie):
    """Also the training loss against the whole logits: without R-Drop the step projects the
    states a block at a time (training/step.py), with it the model's logits are whole."""
    loss, grads = step(family, dropout=0.0, alpha=0.0, tie=tie)
    loss2, grads2 = step(family, dropout=0.0, alpha=5.0, tie=tie)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-6)  # the mean of two equal passes
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(grads, grads2))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_with_dropout_the_kl_pulls_the_passes_together(family):
    """With dropout, the two passes differ: alpha > 0 adds the KL's gradient to the same passes'
    (the same seed draws the same masks, so only the KL term differs)."""
    loss, grads = step(family, dropout=0.3, alpha=1e-9)  # R-Drop's two passes, the KL all but off
    loss2, grads2 = step(family, dropout=0.3, alpha=5.0)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-6)  # the reported loss: the passes' mean
    assert not all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(grads, grads2))
