"""Attention: additive (Bahdanau), scaled dot-product and multi-head.

Every attention here follows one recipe. A query ``q`` is scored against every key ``k_i`` with a
score function ``a(q, k_i)``; a softmax over the keys turns the scores into weights; the output is
the weighted sum of the values::

    weights_i = softmax_i(a(q, k_i))        output = sum_i weights_i * v_i

The two families differ only in ``a``:

- additive (Bahdanau et al. 2015, appendix A.1.2): ``a(q, k) = w_v^T tanh(W_q q + W_k k)``, a small
  feed-forward net with hidden size ``d_a``; query and key sizes may differ. The RNN decoder uses it.
- scaled dot-product (Vaswani et al. 2017, section 3.2.1): ``a(q, k) = q . k / sqrt(d_k)``, for all
  queries at once ``softmax(Q K^T / sqrt(d_k)) V``. Multi-head attention (section 3.2.2) runs it in
  ``H`` subspaces of size ``d_k = D / H`` and mixes the heads with ``W_O``. The Transformer uses it.

Shapes follow ``models/__init__.py``: ``T`` queries, ``S`` keys; ``D_query``, ``D_key``, ``D_value``
are the sizes of additive attention's inputs.

Masks are boolean, ``True`` = may attend (see ``models/masks.py``). A masked key gets exactly zero
weight. A query whose keys are *all* masked (a padded query row, or an empty source) gets zero
weights and a zero output instead of ``softmax([-inf, ..., -inf]) = NaN``, with finite gradients.
``causal=True`` asks for the lower triangle of ``masks.causal_mask`` without a mask tensor, so that
the fused path can pass ``is_causal`` to the kernel (CUDA's flash-attention kernel takes no
``attn_mask``); it is defined only for as many queries as keys (a full pass, no cache).

Weights are returned, never stored on the module, and are the softmax output *before* attention
dropout (dropout is a training-time perturbation; the returned rows sum to 1).
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.masks import causal_mask, combine_masks


def rows_with_keys(mask: Tensor) -> Tensor:
    """``(..., T, S)`` mask -> ``(..., T, 1)``: True where the query may attend to some key."""
    return mask.any(dim=-1, keepdim=True)  # (..., T, 1)


def masked_softmax_(scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Softmax of ``scores`` ``(..., T, S)`` over the key axis, with masked keys at exactly 0.

    The trailing underscore says that masked entries of ``scores`` are overwritten in place with
    ``-inf``: pass a score tensor you own, such as a fresh matmul output (not a leaf you need
    later). The fill runs outside autograd: the softmax output is exactly 0 at those entries, so
    the softmax backward already gives them zero gradient, and recording the fill would only add a
    pass over the largest tensor of attention to the backward pass.

    ``mask`` is boolean and broadcastable to ``scores``. A fully masked row is left unmasked for
    the softmax (a row of ``-inf`` would give NaN in the forward and the backward pass) and its
    weights are then set to 0, so its gradient is finite and zero.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)  # (..., T, S)
    has_key = rows_with_keys(mask)  # (..., T, 1)
    visible = mask | ~has_key  # (..., T, S) every row now sees at least one key
    with torch.no_grad():
        scores.masked_fill_(~visible, float("-inf"))  # (..., T, S)
    weights = torch.softmax(scores, dim=-1)  # (..., T, S)
    # Only pay for a pass over the weights when some row is empty (a host sync on GPUs; this is
    # the path for inspecting weights, the fused path below never syncs).
    if not bool(has_key.all()):
        weights = weights * has_key  # (..., T, S) empty rows -> 0
    return weights


def check_causal(n_queries: int, n_keys: int) -> None:
    """Refuse ``causal=True`` unless there are as many queries as keys.

    ``F.scaled_dot_product_attention(is_causal=True)`` aligns the triangle to the top left, which
    is right only when query ``t`` is key ``t``: a full pass with an empty cache. With ``t`` cached
    keys the queries are the last positions (``masks.causal_mask(T, t + T)``, bottom right).
    """
    if n_queries != n_keys:
        raise ValueError(
            f"causal=True needs as many queries as keys (a full pass, no cache), got {n_queries} "
            f"queries and {n_keys} keys; pass mask=masks.causal_mask({n_queries}, {n_keys}) instead"
        )


def with_causal(mask: Optional[Tensor], n_queries: int, n_keys: int, device: torch.device) -> Tensor:
    """``mask`` (or None) intersected with the ``(T, T)`` causal mask, after ``check_causal``."""
    check_causal(n_queries, n_keys)
    return combine_masks(causal_mask(n_queries, device=device), mask)  # (T, T) or (..., T, T)


def scaled_dot_product_explicit(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, dropout_p: float = 0.0
) -> Tuple[Tensor, Tensor]:
    """``softmax(Q K^T / sqrt(d_k)) V`` written out, returning the weights too.

    Shapes: q ``(..., T, d_k)``, k ``(..., S, d_k)``, v ``(..., S, d_v)``, mask broadcastable to
    ``(..., T, S)``. Returns output ``(..., T, d_v)`` and weights ``(..., T, S)`` (before dropout).
    """
    q = q * (1.0 / math.sqrt(q.size(-1)))  # (..., T, d_k) scaling q is cheaper than the scores
    scores = torch.matmul(q, k.transpose(-2, -1))  # (..., T, S)
    weights = masked_softmax_(scores, mask)  # (..., T, S)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights  # (..., T, S)
    return torch.matmul(dropped, v), weights  # (..., T, d_v), (..., T, S)


def scaled_dot_product_fused(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    causal: bool = False,
) -> Tensor:
    """The same attention through PyTorch's fused kernel (no weights; fast, little memory).

    ``F.scaled_dot_product_attention`` shares our mask convention (bool, True = attend). Its
    result for a fully masked row depends on the backend (0 on CPU in torch 2.13, NaN on others),
    so such rows are unmasked before the call and zeroed after it, exactly as the explicit path.

    ``causal`` (with no mask: ``scaled_dot_product_attention`` folds it into a given one) goes to
    the kernel as ``is_causal=True`` and no ``attn_mask``, the one form that CUDA's flash-attention
    kernel accepts; every causal row sees at least its own key, so nothing needs zeroing.
    """
    if causal:
        check_causal(q.size(-2), k.size(-2))
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # (..., T, d_v)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)  # (..., T, d_v)
    has_key = rows_with_keys(mask)  # (..., T, 1)
    visible = mask | ~has_key  # (..., T, S)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p)  # (..., T, d_v)
    return out * has_key  # (..., T, d_v)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    causal: bool = False,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Scaled dot-product attention: the fused kernel, or the explicit path when weights are needed.

    ``causal`` hides later keys as ``masks.causal_mask(T)`` would (on top of ``mask``); it needs
    ``T == S`` and raises ValueError otherwise. Returns output ``(..., T, d_v)`` and weights
    ``(..., T, S)`` or ``None``.
    """
    if causal and (need_weights or mask is not None):  # a mask tensor either way: the triangle joins it
        mask, causal = with_causal(mask, q.size(-2), k.size(-2), q.device), False  # (T, T) or (..., T, T)
    if need_weights:
        return scaled_dot_product_explicit(q, k, v, mask, dropout_p)
    return scaled_dot_product_fused(q, k, v, mask, dropout_p, causal), None


def check_mask_shape(mask: Tensor, n_queries: int, n_keys: int) -> None:
    """Refuse a multi-head mask that would broadcast against ``(B, H, T, S)`` in a wrong way."""
    if mask.dim() not in (2, 4) or mask.size(-2) not in (1, n_queries) or mask.size(-1) != n_keys:
        raise ValueError(
            f"multi-head mask must be (T, S) = ({n_queries}, {n_keys}) or 4-d broadcastable to "
            f"(B, H, {n_queries}, {n_keys}), got shape {tuple(mask.shape)}; lift a (B, S) padding mask "
            f"with masks.key_mask"
        )


class AdditiveAttention(nn.Module):
    """Additive (Bahdanau) attention: ``score(q, k) = w_v^T tanh(W_q q + W_k k)``, no biases.

    ``W_q: D_query -> d_a``, ``W_k: D_key -> d_a`` and ``w_v: d_a -> 1``, where ``d_a`` is ``hidden_size``.
    The key projection ``W_k k`` does not depend on the query, so a decoder computes it once per
    sentence with ``project_keys`` and passes it back in on every step (``projected_keys=``).
    """

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0):
        super().__init__()
        self.query_proj = nn.Linear(query_size, hidden_size, bias=False)  # W_q
        self.key_proj = nn.Linear(key_size, hidden_size, bias=False)  # W_k
        self.score_proj = nn.Linear(hidden_size, 1, bias=False)  # w_v
        self.dropout = nn.Dropout(dropout)

    def project_keys(self, keys: Tensor) -> Tensor:
        """``(B, S, D_key)`` keys -> ``(B, S, d_a)``: ``W_k k``, reusable for every query."""
        return self.key_proj(keys)  # (B, S, d_a)

    def forward(
        self,
        query: Tensor,
        keys: Optional[Tensor],
        values: Tensor,
        mask: Optional[Tensor] = None,
        projected_keys: Optional[Tensor] = None,
    ) -> Tuple[Tensor, Tensor]:
        """Attend from every query to the keys.

        Args:
            query: ``(B, T, D_query)``; a decoder step has ``T = 1``.
            keys: ``(B, S, D_key)``; may be None when ``projected_keys`` is given.
            values: ``(B, S, D_value)``; in an RNN decoder usually the same tensor as ``keys``.
            mask: boolean, True = may attend, broadcastable to ``(B, T, S)`` (a padding mask is
                ``(B, 1, S)``, see ``masks.key_mask``).
            projected_keys: ``(B, S, d_a)`` from ``project_keys(keys)``, to skip recomputing it.

        Returns:
            context ``(B, T, D_value)`` and weights ``(B, T, S)``.
        """
        if mask is not None and mask.dim() != 3:
            raise ValueError(
                f"additive attention mask must be 3-d, broadcastable to (B, T, S), got shape "
                f"{tuple(mask.shape)}; lift a (B, S) padding mask with masks.key_mask(m, False)"
            )
        if projected_keys is None:
            if keys is None:
                raise ValueError("AdditiveAttention needs keys or projected_keys")
            projected_keys = self.project_keys(keys)  # (B, S, d_a)
        projected_query = self.query_proj(query)  # (B, T, d_a)
        hidden = torch.tanh(projected_query.unsqueeze(2) + projected_keys.unsqueeze(1))  # (B, T, S, d_a)
        scores = self.score_proj(hidden).squeeze(-1)  # (B, T, S)
        weights = masked_softmax_(scores, mask)  # (B, T, S)
        context = torch.bmm(self.dropout(weights), values)  # (B, T, D_value)
        return context, weights  # (B, T, D_value), (B, T, S)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017, section 3.2.2).

    ``MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O`` with
    ``head_i = Attention(Q W_Q^i, K W_K^i, V W_V^i)`` and ``d_k = d_model / H``. The per-head
    projections are stored together as one ``D x D`` linear layer each (``q_proj``, ``k_proj``,
    ``v_proj``, with bias) and split into heads by a reshape; ``out_proj`` is ``W_O``.

    Self-attention passes one sequence as query, key and value; cross-attention passes the decoder
    states as query and the encoder output as key and value. For step-wise decoding the key/value
    projection is a separate public step: ``project_kv`` gives per-head keys and values that a
    caller may cache, extend with new steps (``torch.cat`` on dim 2) and pass to ``attend``;
    ``forward`` is exactly ``attend(query, *project_kv(key, value))``.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.dropout_p = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Xavier-uniform weights and zero biases, as nn.MultiheadAttention initialises them.
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, T, D)`` -> ``(B, H, T, d_k)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        """``(B, H, T, d_k)`` -> ``(B, T, D)``."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.n_heads * self.d_head)  # (B, T, D)

    def project_kv(self, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
        """``(B, S, D)`` key and value -> per-head keys and values, each ``(B, H, S, d_k)``."""
        return self.split_heads(self.k_proj(key)), self.split_heads(self.v_proj(value))  # (B, H, S, d_k) x 2

    def attend(
        self,
        query: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` ``(B, T, D)`` to projected ``k``, ``v`` ``(B, H, S, d_k)``.

        ``causal`` hides later keys without a mask tensor (see ``scaled_dot_product_fused``); it
        needs ``T == S``, so it is for a full pass, not for queries after cached keys.
        Returns output ``(B, T, D)`` and weights ``(B, H, T, S)`` (None unless ``need_weights``).
        """
        if mask is not None:
            check_mask_shape(mask, query.size(1), k.size(2))
            if causal:  # one mask, so that the zeroing below also sees rows that causality empties
                mask = with_causal(mask, query.size(1), k.size(2), query.device)  # (T, T) or (B|1, H|1, T, T)
                causal = False
        q = self.split_heads(self.q_proj(query))  # (B, H, T, d_k)
        dropout_p = self.dropout_p if self.training else 0.0
        heads, weights = scaled_dot_product_attention(
            q, k, v, mask, dropout_p, need_weights, causal
        )  # (B, H, T, d_k), (B, H, T, S) or None
        out = self.out_proj(self.merge_heads(heads))  # (B, T, D)
        if mask is not None:
            # A query with no visible key in any head returns zeros, not W_O's bias. (Causal alone
            # never empties a row: every query sees its own key.)
            has_key = rows_with_keys(mask)  # (T, 1) or (B|1, H|1, T|1, 1)
            out = out * (has_key if has_key.dim() == 2 else has_key.any(dim=1))  # (B, T, D)
        return out, weights  # (B, T, D), (B, H, T, S) or None

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Multi-head attention of ``query`` over ``key``/``value``.

        Args:
            query: ``(B, T, D)``.
            key, value: ``(B, S, D)`` (the query itself for self-attention).
            mask: boolean, True = may attend, broadcastable to ``(B, H, T, S)``: ``(T, S)`` causal,
                ``(B, 1, 1, S)`` padding, ``(B, 1, T, S)`` both combined.
            need_weights: return the attention weights (explicit path) instead of using the
                fused kernel; both paths give the same output.
            causal: hide later keys as ``masks.causal_mask(T)`` would, without a mask tensor
                (self-attention with ``T == S`` only; see ``scaled_dot_product_fused``).

        Returns:
            output ``(B, T, D)`` and weights ``(B, H, T, S)`` or None.
        """
        k, v = self.project_kv(key, value)  # (B, H, S, d_k) each
        return self.attend(query, k, v, mask, need_weights, causal)
