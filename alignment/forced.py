"""Word alignments from cross-attention, by any layer, heads and reading.

A model is fed a given target teacher-forced (forced decoding) and every cross-attention map is
kept: ``(L, H, T + 1, S)`` per sentence, ``L`` decoder layers of ``H`` heads (the RNN: one layer,
one head but for ``multihead``), one row per decoder input (row 0 reads ``<s>``, row ``j + 1``
reads target piece ``j``), one column per source piece (EOS last). A ``Method``
(``alignment/method.py``) turns those maps into one ``(T, S)`` map, one row per target piece
``j`` (0-based):

- the **layer**: one (1-based) or the mean of all;
- the **heads**: some (1-based) or the mean of all;
- the **reading**: ``predict`` takes row ``j``, the step that predicts piece ``j`` (its input is the
  piece before); ``read`` row ``j + 1``, the step whose input is piece ``j``. A decoder attends to
  the source to choose its next word, so the predicting step may look where that word comes from;
  in a Transformer the reading step's attention has the word itself in its query (Kobayashi et al.
  2020 found middle layers at the reading step to align best). The RNN's attention query is the
  state before the step's input is read (Bahdanau's data flow), so its ``read`` row has not seen
  piece ``j`` yet: it is the row that predicts piece ``j + 1``.

A Transformer with learned positions reads at most ``max_positions`` inputs: for a target of that
many pieces the last piece's ``read`` row is its ``predict`` row (the only one there is).

Pieces are pooled to words (``alignment/words.py``: ``word_attention``) and each target word
is linked to its most-attended source word (``hard_alignment``).

Shapes: ``L`` layers, ``H`` heads, ``T`` target pieces, ``S`` source pieces (EOS included),
``B`` sentences.
"""

from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor, nn

from alignment.method import Method
from alignment.scores import Links
from alignment.words import hard_alignment, word_attention
from common.progress_bar import progress_bar
from data.batching import pad, source_mask
from data.specials import BOS_ID, EOS_ID, PAD_ID
from models.seq2seq import Attention


def method_map(maps: Tensor, method: Method) -> Tensor:
    """One sentence's ``(L, H, T + 1, S)`` maps -> the method's ``(T, S)`` map."""
    chosen = maps if method.layer is None else maps[method.layer - 1 : method.layer]  # (L', H, T + 1, S)
    if method.heads is not None:
        chosen = chosen[:, [h - 1 for h in method.heads]]  # (L', H', T + 1, S)
    rows = chosen.mean(dim=(0, 1))  # (T + 1, S)
    return rows[:-1] if method.reading == "predict" else rows[1:]  # (T, S)


@torch.no_grad()
def forced_attention(
    model: nn.Module, src_ids: Sequence[List[int]], tgt_ids: Sequence[List[int]]
) -> Attention:
    """The attention of ``model`` (put in eval mode) reading each source ``src_ids`` (EOS last) while
    fed ``<s>`` and its target pieces ``tgt_ids`` teacher-forced: ``forward(..., need_weights=True)``'s
    dict (``models/seq2seq.py``), padded ``(B, H, T + 1, S)`` maps. A model with ``max_positions``
    reads at most that many inputs."""
    device = next(model.parameters()).device
    limit = getattr(model, "max_positions", None) or max(len(ids) + 1 for ids in tgt_ids)
    src = pad(list(src_ids), PAD_ID).to(device)  # (B, S)
    tgt_in = pad([[BOS_ID, *ids][:limit] for ids in tgt_ids], PAD_ID).to(device)  # (B, T + 1)
    model.eval()
    _, attention = model(src, source_mask(src), tgt_in, need_weights=True)
    return attention


def cross_maps(model: nn.Module, src_ids: Sequence[List[int]], tgt_ids: Sequence[List[int]]) -> List[Tensor]:
    """Each sentence's cross-attention ``(L, H, T + 1, S)`` with its target fed teacher-forced
    (``forced_attention``): row ``j`` predicts target piece ``j``, the last row ``</s>``."""
    attention = forced_attention(model, src_ids, tgt_ids)
    maps = torch.stack([w.float() for w in attention["cross"]], dim=1)  # (B, L, H, T' + 1, S)
    found = []
    for b, (src, tgt) in enumerate(zip(src_ids, tgt_ids)):
        rows = maps[b, :, :, : len(tgt) + 1, : len(src)]  # (L, H, T + 1, S), or T rows at max_positions
        if rows.size(2) == len(tgt):  # no row read the last piece: its predict row stands in
            rows = torch.cat([rows, rows[:, :, -1:]], dim=2)  # (L, H, T + 1, S)
        found.append(rows.cpu())
    return found


def batched_cross_maps(
    model: nn.Module, src_ids: Sequence[List[int]], tgt_ids: Sequence[List[int]], batch_size: int = 32
) -> List[Tensor]:
    """``cross_maps`` of many sentences, ``batch_size`` of similar length at a time (little padding),
    returned in their order (the progress on standard error)."""
    order = sorted(range(len(src_ids)), key=lambda k: (len(tgt_ids[k]), len(src_ids[k])))
    maps: List[Tensor] = [None] * len(src_ids)  # type: ignore[list-item]
    with progress_bar(len(order), "attention: forced decoding", "pairs") as bar:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            for k, found in zip(
                chunk, cross_maps(model, [src_ids[k] for k in chunk], [tgt_ids[k] for k in chunk])
            ):
                maps[k] = found
            bar.update(len(chunk))
    return maps


def word_links(
    rows: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str]
) -> Tuple[Tensor, List[Tuple[int, int]]]:
    """One sentence's ``(T, S)`` source attention (``method_map``) -> its ``(W_tgt, W_src)`` word
    attention and its ``(i, j)`` links (source word ``i``, target word ``j``, 0-based)."""
    words = word_attention(rows, src_pieces, tgt_pieces)  # (W_tgt, W_src)
    return words, hard_alignment(words)


def src_with_eos(ids: Sequence[List[int]]) -> List[List[int]]:
    """Source ids as the encoder takes them, EOS last."""
    return [list(row) + [EOS_ID] for row in ids]


def model_links(
    maps: List[Tensor], methods: Sequence[Method], src_pieces: List[List[str]], tgt_pieces: List[List[str]]
) -> Dict[Method, List[Links]]:
    """Every method's links of every pair (the progress on standard error: one step a method)."""
    links = {}
    with progress_bar(len(methods), "word links", "methods") as bar:
        for method in methods:
            pairs = zip(maps, src_pieces, tgt_pieces)
            links[method] = [frozenset(word_links(method_map(m, method), s, t)[1]) for m, s, t in pairs]
            bar.update(1)
    return links
