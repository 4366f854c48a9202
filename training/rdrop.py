"""R-Drop (Liang et al. 2021): each batch goes through the model twice, with two dropout masks,
and the two output distributions of every target position are pulled towards each other by their
symmetric KL divergence, added to the loss with the weight ``trainer.rdrop_alpha``:

    L = (LS_1 + LS_2) / 2 + alpha * (KL(P_1 || P_2) + KL(P_2 || P_1)) / 4

per target token, ``LS_i`` the label-smoothed loss of pass ``i`` (``training/step.py``). This is
fairseq's ``--rdrop-alpha`` scale: its loss sums both passes and the halved KL, over twice the
tokens. The two passes run as one forward pass over the batch stacked on itself (``twice``), so
a step costs about twice as much: compare it with other settings at equal wall time."""

import torch
from torch import Tensor

from data.batching import Batch


def twice(batch: Batch) -> Batch:
    """``batch`` stacked on itself: ``2B`` rows, the second ``B`` a copy of the first (dropout draws
    its own masks for each row)."""
    fields = (getattr(batch, name) for name in batch.__dataclass_fields__)
    return Batch(*(None if t is None else torch.cat([t, t]) for t in fields))


def symmetric_kl(logits: Tensor, target: Tensor, pad_id: int) -> Tensor:
    """``(KL(P_1 || P_2) + KL(P_2 || P_1)) / 2`` summed over the target positions that are not
    padding: ``logits`` ``(2B, T, V)`` of a ``twice`` batch, ``target`` ``(2B, T)``. A scalar."""
    log_p = torch.log_softmax(logits.float(), dim=-1)  # (2B, T, V)
    first, second = log_p.chunk(2)  # (B, T, V) each
    # KL(P_1 || P_2) + KL(P_2 || P_1) = sum_v p_1 (log p_1 - log p_2) + p_2 (log p_2 - log p_1)
    #                                 = sum_v (p_1 - p_2) (log p_1 - log p_2)
    kl = ((first.exp() - second.exp()) * (first - second)).sum(dim=-1)  # (B, T)
    keep = target.chunk(2)[0] != pad_id  # (B, T)
    return torch.where(keep, kl, 0.0).sum() / 2
