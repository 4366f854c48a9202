"""Word alignments from cross-attention, by any layer, heads and reading.

A model is fed a given target teacher-forced (forced decoding) and every cross-attention map is
kept: ``(L, H, T + 1, S)`` per sentence, ``L`` decoder layers of ``H`` heads (the RNN: one layer,
one head but for ``multihead``), one row per decoder input (``<s>`` then the ``T`` target pieces),
one column per source piece (EOS last). A ``Method`` turns those maps into one ``(T, S)`` map:

- the **layer**: one (1-based) or the mean of all;
- the **heads**: some (1-based) or the mean of all;
- the **reading**: which decoder step stands for target piece ``t``. ``predict`` takes the row of
  the step that predicts it (input ``y_{t-1}``, row ``t``); ``read`` the row of the step after,
  whose input is ``y_t`` (row ``t + 1``). A decoder attends to the source to choose the next word,
  so the predicting step may look where the next word comes from; the reading step has the word
  itself in its input (Kobayashi et al. 2020 found middle layers at the reading step to align best).

Pieces are pooled to words (``inference/alignment.py``: ``word_attention``) and each target word
is linked to its most-attended source word (``hard_alignment``).

Shapes: ``L`` layers, ``H`` heads, ``T`` target pieces, ``S`` source pieces (EOS included),
``B`` sentences.
"""

from typing import List, Sequence, Tuple

import torch
from torch import Tensor, nn

from data.batching import pad, source_mask
from data.specials import BOS_ID, EOS_ID, PAD_ID
from inference.align_method import Method
from inference.alignment import hard_alignment, word_attention


def method_map(maps: Tensor, method: Method) -> Tensor:
    """One sentence's ``(L, H, T + 1, S)`` maps -> the method's ``(T, S)`` map."""
    chosen = maps if method.layer is None else maps[method.layer - 1 : method.layer]  # (L', H, T + 1, S)
    if method.heads is not None:
        chosen = chosen[:, [h - 1 for h in method.heads]]  # (L', H', T + 1, S)
    rows = chosen.mean(dim=(0, 1))  # (T + 1, S)
    return rows[:-1] if method.reading == "predict" else rows[1:]  # (T, S)


@torch.no_grad()
def cross_maps(model: nn.Module, src_ids: Sequence[List[int]], tgt_ids: Sequence[List[int]]) -> List[Tensor]:
    """Each sentence's cross-attention ``(L, H, T + 1, S)`` with its target fed teacher-forced.

    ``src_ids`` end with EOS; ``tgt_ids`` are the target pieces (no BOS, no EOS): the decoder reads
    ``<s> y_1 .. y_T`` and its ``T + 1`` rows predict ``y_1 .. y_T, </s>``."""
    device = next(model.parameters()).device
    src = pad(list(src_ids), PAD_ID).to(device)  # (B, S)
    tgt_in = pad([[BOS_ID, *ids] for ids in tgt_ids], PAD_ID).to(device)  # (B, T + 1)
    model.eval()
    _, attention = model(src, source_mask(src), tgt_in, need_weights=True)
    maps = torch.stack([w.float() for w in attention["cross"]], dim=1)  # (B, L, H, T + 1, S)
    return [maps[b, :, :, : len(t) + 1, : len(s)].cpu() for b, (s, t) in enumerate(zip(src_ids, tgt_ids))]


def batched_cross_maps(
    model: nn.Module, src_ids: Sequence[List[int]], tgt_ids: Sequence[List[int]], batch_size: int = 32
) -> List[Tensor]:
    """``cross_maps`` of many sentences, ``batch_size`` of similar length at a time (little padding),
    returned in their order."""
    order = sorted(range(len(src_ids)), key=lambda k: (len(tgt_ids[k]), len(src_ids[k])))
    maps: List[Tensor] = [None] * len(src_ids)  # type: ignore[list-item]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        for k, found in zip(
            chunk, cross_maps(model, [src_ids[k] for k in chunk], [tgt_ids[k] for k in chunk])
        ):
            maps[k] = found
    return maps


def word_links(
    maps: Tensor, method: Method, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> Tuple[Tensor, List[Tuple[int, int]]]:
    """The method's ``(W_tgt, W_src)`` word attention of one sentence and its ``(i, j)`` links
    (source word ``i``, target word ``j``, 0-based)."""
    words = word_attention(method_map(maps, method), src_pieces, tgt_pieces)  # (W_tgt, W_src)
    return words, hard_alignment(words)


def src_with_eos(ids: Sequence[List[int]]) -> List[List[int]]:
    """Source ids as the encoder takes them, EOS last."""
    return [list(row) + [EOS_ID] for row in ids]
