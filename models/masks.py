"""Attention masks as small pure functions.

One convention everywhere in the project: a mask is a boolean tensor and ``True`` means
"this query may attend to this key" (the convention of
``torch.nn.functional.scaled_dot_product_attention``; note that ``nn.MultiheadAttention`` uses the
opposite one). Masks are built in their smallest broadcastable shape and broadcast against the
scores, ``(B, T, S)`` for additive attention and ``(B, H, T, S)`` for multi-head attention:

- padding mask ``(B, S)``: hides ``<pad>`` keys; ``key_mask`` lifts it to ``(B, 1, S)`` or
  ``(B, 1, 1, S)`` so that it applies to every query (and every head);
- causal mask ``(T, S)``: hides future positions in decoder self-attention;
- ``combine_masks`` intersects any of them (a position is visible only if every mask allows it).
"""

from typing import Optional

import torch
from torch import Tensor


def padding_mask_from_lengths(lengths: Tensor, max_len: Optional[int] = None) -> Tensor:
    """``(B,)`` sequence lengths -> ``(B, S)`` mask, True at positions ``< length``.

    ``S`` is ``max_len`` when given (it must be at least the longest length), else the longest length.
    """
    longest = int(lengths.max()) if lengths.numel() else 0
    size = longest if max_len is None else max_len
    if size < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest sequence ({longest})")
    positions = torch.arange(size, device=lengths.device)  # (S,)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)  # (B, S)


def padding_mask_from_ids(ids: Tensor, pad_id: int) -> Tensor:
    """``(B, S)`` token ids -> ``(B, S)`` mask, True where the token is not ``pad_id``."""
    return ids != pad_id  # (B, S)


def key_mask(padding_mask: Tensor, n_heads_dim: bool = True) -> Tensor:
    """Lift a ``(B, S)`` padding mask so that it hides the same keys from every query.

    Returns ``(B, 1, 1, S)`` (broadcasts to multi-head scores ``(B, H, T, S)``) or, with
    ``n_heads_dim=False``, ``(B, 1, S)`` (broadcasts to single-head scores ``(B, T, S)``).
    """
    mask = padding_mask.unsqueeze(1)  # (B, 1, S)
    return mask.unsqueeze(1) if n_heads_dim else mask  # (B, 1, 1, S) or (B, 1, S)


def causal_mask(
    n_queries: int, n_keys: Optional[int] = None, device: Optional[torch.device] = None
) -> Tensor:
    """``(T, S)`` mask that lets query ``t`` see keys ``0 .. t + (S - T)`` and nothing later.

    With ``S == T`` (the default) this is the lower triangle used in decoder self-attention. With
    ``S > T`` it is aligned to the bottom right: the ``T`` queries are the *last* ``T`` positions of
    the sequence, as in step-wise decoding where the keys include ``S - T`` cached earlier steps.
    (``F.scaled_dot_product_attention(is_causal=True)`` aligns to the top left instead, which would
    let a single cached query see only key 0.)
    """
    n_keys = n_queries if n_keys is None else n_keys
    if n_keys < n_queries:
        raise ValueError(f"causal mask needs at least as many keys ({n_keys}) as queries ({n_queries})")
    ones = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)  # (T, S)
    return torch.tril(ones, diagonal=n_keys - n_queries)  # (T, S)


def combine_masks(*masks: Optional[Tensor]) -> Optional[Tensor]:
    """Intersect broadcastable boolean masks; ``None`` entries (no mask) are skipped.

    Example: ``combine_masks(causal_mask(T), key_mask(tgt_padding))`` gives ``(B, 1, T, T)``.
    Returns ``None`` when every entry is ``None``.
    """
    result: Optional[Tensor] = None
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype != torch.bool:
            raise TypeError(f"masks must be boolean (True = may attend), got {mask.dtype}")
        result = mask if result is None else result & mask  # broadcast shape of both
    return result
