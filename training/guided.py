"""Guided alignment (Garg et al. 2019; Marian's ``--guided-alignment``, fairseq's ``transformer_align``):
one cross-attention learns reference word alignments beside the translation.

At the step that predicts target piece ``t`` the supervised attention (``model.alignment_layer``,
the mean of its first ``model.alignment_heads`` heads) gives a distribution ``a_t`` over the source
pieces; the reference gives ``p_t``, the piece's links spread evenly over the source pieces they
name (``alignment/reference.py``). The loss is their cross-entropy, summed over the pieces that have
links (a piece without any adds nothing)::

    L_align = - sum_t sum_s p_t(s) log a_t(s)

and the step minimises ``L_translation + trainer.guided_alignment * L_align``, both divided by the
step's target tokens (as fairseq's ``--alignment-lambda`` weighs its sum).
"""

from typing import Tuple

from torch import Tensor

FLOOR = 1e-9  # a weight this small still gives a finite log: a source piece the attention gives nothing


def guided_alignment_loss(heads: Tensor, links: Tensor) -> Tuple[Tensor, Tensor]:
    """``heads`` ``(B, H_a, T, S)``: the supervised heads' weights; ``links`` ``(B, T, S)``: each target
    piece's reference distribution over the source pieces (a row of zeros: no links). Returns the summed
    cross-entropy and the number of target pieces with links, scalars on the weights' device."""
    attention = heads.float().mean(dim=1)  # (B, T, S) the heads' mean
    links = links.to(attention.dtype)  # (B, T, S)
    loss = -(links * attention.clamp_min(FLOOR).log()).sum()  # () over every linked piece
    linked = (links.sum(dim=-1) > 0).sum()  # () target pieces with a link
    return loss, linked
