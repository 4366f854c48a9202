"""Label-smoothed cross-entropy over target tokens, padding ignored (Szegedy et al. 2016)."""

from typing import Tuple

import torch
from torch import Tensor


def label_smoothed_nll(
    logits: Tensor, target: Tensor, pad_id: int, smoothing: float
) -> Tuple[Tensor, Tensor, Tensor]:
    """Summed losses over the non-padding positions of ``target``.

    ``logits`` ``(B, T, V)``, ``target`` ``(B, T)``. The smoothed loss is
    ``(1 - eps) * NLL + eps * mean_v(-log p_v)``: the cross-entropy against a target distribution
    that puts ``1 - eps`` on the reference token and spreads ``eps`` uniformly over the vocabulary.

    Returns (smoothed loss sum, NLL sum, number of target tokens), scalars on the logits' device
    (no host sync); the NLL gives perplexity.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = target != pad_id  # (B, T)
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    nll = nll.masked_select(keep)  # (M,)
    if smoothing > 0:
        uniform = -log_probs.mean(dim=-1).masked_select(keep)  # (M,)
        loss = (1.0 - smoothing) * nll + smoothing * uniform  # (M,)
    else:
        loss = nll
    return loss.sum(), nll.sum().detach(), keep.sum()
