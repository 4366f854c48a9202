"""Attention: one recipe, three scores in five classes, one interface.

Every attention here follows one recipe. A query ``q`` is scored against every key ``k_i`` with a
score function ``a(q, k_i)``; a softmax over the keys turns the scores into weights; the output is
the weighted sum of the values::

    weights_i = softmax_i(a(q, k_i))        output = sum_i weights_i * v_i

The functions differ only in ``a`` and in how many heads run it. Each class documents its own
score, parameters and cost in time and memory; in order:

- ``AdditiveAttention``: the additive score of Bahdanau et al. (2015), one head;
- ``GeneralAttention``: Luong et al.'s (2015) bilinear score, one head;
- ``ScaledDotAttention``: the scaled dot product of Vaswani et al. (2017), one head;
- ``MultiHeadAttention``: ``H`` heads of the scaled dot product, mixed by ``W_O``;
- ``MultiHeadAdditiveAttention``: ``H`` heads of the additive score, mixed by ``W_O``.

The single-head ones return a weighted sum of the values as they are (the RNN's encoder states:
Bahdanau's data flow); the multi-head ones project the values into ``H`` heads and mix the heads
with ``W_O`` (Vaswani et al. 2017, section 3.2.2).

Every class has the same interface, so a decoder or layer does not change with the choice:

- ``project_kv(key, value)``: what does not depend on the query, per-head keys ``(B, H, S, d_k)``
  (or ``d_a``) and values ``(B, H, S, d_v)``; a decoder computes it once per sentence and caches it;
- ``attend(query, k, v, mask, need_weights, causal)``: output ``(B, T, D_out)`` and weights
  ``(B, H, T, S)`` (None when not asked for, where the fused kernel can skip them);
- ``forward(query, key, value, ...)`` is exactly ``attend(query, *project_kv(key, value), ...)``.

Shapes follow ``models/__init__.py``: ``T`` queries, ``S`` keys; ``D_query``, ``D_key`` the sizes of
a single-head attention's inputs (in the RNN ``D`` and ``2D``).

Masks are boolean, ``True`` = may attend (the convention of ``F.scaled_dot_product_attention``;
``nn.MultiheadAttention`` uses the opposite one), built by the functions after the classes, broadcastable to
``(B, H, T, S)``: ``(T, S)`` causal, ``(B, 1, 1, S)`` padding, ``(B, 1, T, S)`` both combined. A
masked key gets exactly zero weight. A query whose keys are *all* masked (a padded query row, or an
empty source) gets zero weights and a zero output instead of ``softmax([-inf, ..., -inf]) = NaN``,
with finite gradients. ``causal=True`` asks for the lower triangle of ``causal_mask`` without
a mask tensor, so that the fused path can pass ``is_causal`` to the kernel (CUDA's flash-attention
kernel takes no ``attn_mask``); it is defined only for as many queries as keys (a full pass, no
cache). These guards come after the classes, each written once: ``attention_mask`` decides the
mask of every attention, ``open_empty_rows`` guards the empty rows of both paths.

Weights are returned, never stored on the module, and are the softmax output *before* attention
dropout (dropout is a training-time perturbation; the returned rows sum to 1).
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


# ----- the score functions -----
def additive_scores(q: Tensor, k: Tensor, w_v: Tensor) -> Tensor:
    """``w_v^T tanh(q + k)`` for every (query, key) pair of already projected ``q = W_q q``, ``k = W_k k``.

    Shapes: q ``(B, H, T, d_a)``, k ``(B, H, S, d_a)``, w_v ``(H, d_a)``. Returns ``(B, H, T, S)``.
    The ``tanh`` layer is the ``(B, H, T, S, d_a)`` tensor that additive attention materialises.
    """
    hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, H, T, S, d_a)
    if w_v.size(0) == 1:  # one head: a plain linear map of the hidden units (nn.Linear's kernel)
        return F.linear(hidden, w_v).squeeze(-1)  # (B, 1, T, S)
    return torch.einsum("bhtsa,ha->bhts", hidden, w_v)  # (B, H, T, S)


def dot_scores(q: Tensor, k: Tensor, scale: float = 1.0) -> Tensor:
    """``scale * q^T k`` for every (query, key) pair: q ``(B, H, T, d_k)``, k ``(B, H, S, d_k)`` ->
    ``(B, H, T, S)``. Scaling ``q`` (``T d_k`` products) is cheaper than scaling the scores."""
    if scale != 1.0:
        q = q * scale  # (B, H, T, d_k)
    return torch.matmul(q, k.transpose(-2, -1))  # (B, H, T, S)


def scaled_dot_product_explicit(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, dropout_p: float = 0.0
) -> Tuple[Tensor, Tensor]:
    """``softmax(Q K^T / sqrt(d_k)) V`` written out, returning the weights too.

    Shapes: q ``(..., T, d_k)``, k ``(..., S, d_k)``, v ``(..., S, d_v)``, mask broadcastable to
    ``(..., T, S)``. Returns output ``(..., T, d_v)`` and weights ``(..., T, S)`` (before dropout).
    """
    scores = dot_scores(q, k, 1.0 / math.sqrt(q.size(-1)))  # (..., T, S)
    return weighted_values(scores, v, mask, dropout_p)


def weighted_values(
    scores: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float
) -> Tuple[Tensor, Tensor]:
    """The recipe after the score: masked softmax over the keys, dropout, the weighted sum of the
    values. ``scores`` ``(..., T, S)`` (overwritten at masked keys), ``v`` ``(..., S, d_v)`` ->
    output ``(..., T, d_v)`` and weights ``(..., T, S)`` (before dropout)."""
    weights = masked_softmax_(scores, mask)  # (..., T, S)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights  # (..., T, S)
    return torch.matmul(dropped, v), weights  # (..., T, d_v), (..., T, S)


# ----- the interface every function shares -----
class AttentionFunction(nn.Module):
    """What a decoder or layer sees of any attention function: ``project_kv`` (what does not depend
    on the query, computed once and cached), ``attend`` (a subclass's) and ``forward``, which is
    exactly ``attend(query, *project_kv(key, value), ...)``.

    ``head_mask`` ``(H,)``, None by default, scales each head's output before the heads are mixed
    (the gate ``xi_h`` of Michel et al. 2019): 0 masks a head, to measure how much it matters
    (``inference/heads.py``). It is set on a module for a measurement, never saved."""

    head_mask: Optional[Tensor] = None

    def gate(self, heads: Tensor) -> Tensor:
        """Every head's output ``(B, H, T, d)`` scaled by ``head_mask`` (as it is when there is none)."""
        if self.head_mask is None:
            return heads
        return heads * self.head_mask.to(heads.dtype).view(1, -1, 1, 1)  # (B, H, T, d)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` ``(B, T, D_query)`` over ``key``/``value`` ``(B, S, D_key)`` (the query
        itself for self-attention); ``need_weights``: return the weights (for multi-head attention
        the explicit path instead of the fused kernel, with the same output)."""
        return self.attend(query, *self.project_kv(key, value), mask, need_weights, causal)


# ----- single-head attention over values as they are (the RNN's choices) -----
class SingleHeadAttention(AttentionFunction):
    """The part of the three single-head functions that does not depend on the score: one head, the
    values attended as they are (the context is a weighted sum of the encoder states), the key
    projection done once per sentence. A subclass sets ``project_query``, ``project_keys`` and
    ``score``."""

    n_heads = 1

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.dropout_p = dropout

    def project_kv(self, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
        """``(B, S, D_key)`` keys and ``(B, S, D_value)`` values -> ``(B, 1, S, .)`` projected keys and
        the values as they are, ``(B, 1, S, D_value)``."""
        return self.project_keys(key).unsqueeze(1), value.unsqueeze(1)  # (B, 1, S, .), (B, 1, S, D_value)

    def attend(
        self,
        query: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` ``(B, T, D_query)`` to ``project_kv``'s ``k``, ``v``: context
        ``(B, T, D_value)`` and weights ``(B, 1, T, S)`` (None unless ``need_weights``)."""
        mask, _ = attention_mask(mask, query.size(1), k.size(2), causal, query.device)
        q = self.project_query(query).unsqueeze(1)  # (B, 1, T, .)
        dropout_p = self.dropout_p if self.training else 0.0
        context, weights = weighted_values(
            self.score(q, k), v, mask, dropout_p
        )  # (B, 1, T, D_value), (B, 1, T, S)
        context = self.gate(context).squeeze(1)  # (B, T, D_value)
        return context, weights if need_weights else None  # (B, T, D_value), (B, 1, T, S)


class AdditiveAttention(SingleHeadAttention):
    """Additive (Bahdanau et al. 2015, appendix A.1.2): ``a(q, k) = w_v^T tanh(W_q q + W_k k)``.

    Parameters: ``W_q`` (``D_query x d_a``), ``W_k`` (``D_key x d_a``), ``w_v`` (``d_a``), no biases;
    ``d_a`` is the attention's hidden size (``model.attention_size``). Query and key sizes may
    differ. Cost: ``T S d_a`` tanh units, held for the backward pass: a ``(B, T, S, d_a)`` tensor.
    """

    def __init__(self, query_size: int, key_size: int, d_a: int, dropout: float = 0.0):
        super().__init__(dropout)
        self.query_proj = nn.Linear(query_size, d_a, bias=False)  # W_q
        self.key_proj = nn.Linear(key_size, d_a, bias=False)  # W_k
        self.score_proj = nn.Linear(d_a, 1, bias=False)  # w_v

    def project_query(self, query: Tensor) -> Tensor:
        return self.query_proj(query)  # (B, T, d_a)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, d_a)

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        return additive_scores(q, k, self.score_proj.weight)  # (B, 1, T, S)


class GeneralAttention(SingleHeadAttention):
    """General, or bilinear (Luong et al. 2015, section 3.1): ``a(q, k) = q^T W k``.

    Parameters: ``W`` (``D_query x D_key``), no bias; ``W k`` is computed once per sentence, so a
    score is one dot product of size ``D_query``. Cost: ``T S D_query``; scores ``(B, T, S)``.
    """

    def __init__(self, query_size: int, key_size: int, dropout: float = 0.0):
        super().__init__(dropout)
        self.key_proj = nn.Linear(key_size, query_size, bias=False)  # W

    def project_query(self, query: Tensor) -> Tensor:
        return query  # (B, T, D_query)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, D_query) W k

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        return dot_scores(q, k)  # (B, 1, T, S)


class ScaledDotAttention(SingleHeadAttention):
    """Scaled dot product, one head (Vaswani et al. 2017, section 3.2.1, over projected inputs):
    ``a(q, k) = (W_q q)^T (W_k k) / sqrt(d_k)``.

    Parameters: ``W_q`` (``D_query x d_k``), ``W_k`` (``D_key x d_k``), no biases; ``d_k`` is
    ``model.attention_size``, as additive attention's ``d_a``: the two differ only in the score.
    Cost: ``T S d_k`` multiply-adds; scores ``(B, T, S)``.
    """

    def __init__(self, query_size: int, key_size: int, d_k: int, dropout: float = 0.0):
        super().__init__(dropout)
        self.query_proj = nn.Linear(query_size, d_k, bias=False)  # W_q
        self.key_proj = nn.Linear(key_size, d_k, bias=False)  # W_k
        self.scale = 1.0 / math.sqrt(d_k)

    def project_query(self, query: Tensor) -> Tensor:
        return self.query_proj(query)  # (B, T, d_k)

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, d_k)

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        return dot_scores(q, k, self.scale)  # (B, 1, T, S)


# ----- multi-head attention (the Transformer's choices; the RNN's multihead) -----
class MultiHeadAttention(AttentionFunction):
    """Multi-head scaled dot-product attention (Vaswani et al. 2017, section 3.2.2).

    ``MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O`` with
    ``head_i = softmax(Q W_Q^i (K W_K^i)^T / sqrt(d_k)) V W_V^i`` and ``d_k = d_model / H``.
    Parameters: ``W_Q``, ``W_K``, ``W_V`` (each input size x ``d_model``) and ``W_O`` (``d_model x
    out_size``), with biases: ``4 d_model^2 + 4 d_model`` when every size is ``d_model``. Cost:
    ``T S d_model`` multiply-adds for the scores and as many for the weighted sum; the fused kernel
    holds no ``(H, T, S)`` tensor (the explicit path, for the weights, does).

    The per-head projections are stored together as one linear layer each (``q_proj``, ``k_proj``,
    ``v_proj``) and split into heads by a reshape; ``out_proj`` is ``W_O``. The query and key sizes
    and the output size default to ``d_model`` (the Transformer); the RNN's ``multihead`` attention
    sets them to its decoder state ``D`` and encoder states ``2D``.

    Self-attention passes one sequence as query, key and value; cross-attention passes the decoder
    states as query and the encoder output as key and value. A decoder may cache ``project_kv``'s
    keys and values, extend them with new steps (``torch.cat`` on dim 2) and pass them to ``attend``.
    """

    fused_kernel = True  # PyTorch's fused attention computes this score

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        query_size: Optional[int] = None,
        key_size: Optional[int] = None,
        out_size: Optional[int] = None,
    ):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.dropout_p = dropout
        self.q_proj = nn.Linear(query_size or d_model, d_model)  # W_Q, every head's
        self.k_proj = nn.Linear(key_size or d_model, d_model)  # W_K
        self.v_proj = nn.Linear(key_size or d_model, d_model)  # W_V
        self.out_proj = nn.Linear(d_model, out_size or d_model)  # W_O
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Xavier-uniform weights and zero biases, as nn.MultiheadAttention initialises them.
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, T, H d_k)`` -> ``(B, H, T, d_k)``."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        """``(B, H, T, d_k)`` -> ``(B, T, H d_k)``."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.n_heads * self.d_k)  # (B, T, H d_k)

    def project_kv(self, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
        """``(B, S, D_key)`` key and value -> per-head keys and values, each ``(B, H, S, d_k)``."""
        return self.split_heads(self.k_proj(key)), self.split_heads(self.v_proj(value))  # (B, H, S, d_k) x 2

    def heads(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], need_weights: bool, causal: bool
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Every head's attention: ``(B, H, T, d_k)`` outputs and ``(B, H, T, S)`` weights or None;
        ``mask`` and ``causal`` as ``attend`` decided them (``attention_mask``)."""
        dropout_p = self.dropout_p if self.training else 0.0
        return scaled_dot_product(q, k, v, mask, dropout_p, need_weights, causal)

    def attend(
        self,
        query: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Attend from ``query`` ``(B, T, D_query)`` to projected ``k``, ``v`` ``(B, H, S, d_k)``.

        ``causal`` hides later keys (``attention_mask``); it needs ``T == S``, so it is for a full
        pass, not for queries after cached keys. Returns output ``(B, T, D_out)`` and weights
        ``(B, H, T, S)`` (None unless ``need_weights``).
        """
        fused = self.fused_kernel and not need_weights  # the kernel takes the triangle as a flag
        mask, causal = attention_mask(mask, query.size(1), k.size(2), causal, query.device, fused)
        q = self.split_heads(self.q_proj(query))  # (B, H, T, d_k)
        heads, weights = self.heads(
            q, k, v, mask, need_weights, causal
        )  # (B, H, T, d_k), (B, H, T, S) or None
        out = self.out_proj(self.merge_heads(self.gate(heads)))  # (B, T, D_out)
        return zero_empty_rows(out, mask), weights  # (B, T, D_out), (B, H, T, S) or None


class MultiHeadAdditiveAttention(MultiHeadAttention):
    """Multi-head additive attention: ``MultiHeadAttention`` with each head's score
    ``a(q, k) = w_v^i^T tanh(q W_Q^i + b_Q^i + k W_K^i + b_K^i)`` in place of the scaled dot
    product (the projections keep their biases ``b``, as in ``MultiHeadAttention``).

    Parameters: those of ``MultiHeadAttention`` and one ``w_v`` of ``d_k`` per head (``score_proj``,
    ``(H, d_k)``). Cost: ``T S d_model`` tanh units, held for the backward pass (a ``(B, H, T, S,
    d_k)`` tensor: ``d_k`` times the memory of the dot product's weights), and no fused kernel.
    """

    fused_kernel = False

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        query_size: Optional[int] = None,
        key_size: Optional[int] = None,
        out_size: Optional[int] = None,
    ):
        super().__init__(d_model, n_heads, dropout, query_size, key_size, out_size)
        self.score_proj = nn.Parameter(torch.empty(n_heads, self.d_k))  # w_v of every head
        nn.init.xavier_uniform_(self.score_proj)

    def heads(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], need_weights: bool, causal: bool
    ) -> Tuple[Tensor, Optional[Tensor]]:
        dropout_p = self.dropout_p if self.training else 0.0  # causal came as a mask: no fused kernel
        out, weights = weighted_values(additive_scores(q, k, self.score_proj), v, mask, dropout_p)
        return out, weights if need_weights else None  # (B, H, T, d_k), (B, H, T, S) or None


# ----- the guards: masks, empty rows, the fused path -----
# Masks are small pure functions (the convention in the module's docstring): padding ``(B, S)``,
# lifted by ``key_mask`` to ``(B, 1, 1, S)`` for every query and head; causal ``(T, S)``, the
# future hidden; ``combine_masks`` intersects them (a key is visible only if every mask allows it).
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


def key_mask(padding_mask: Tensor) -> Tensor:
    """Lift a ``(B, S)`` padding mask so that it hides the same keys from every query: ``(B, 1, 1, S)``,
    which broadcasts to the scores ``(B, H, T, S)`` of every function here (``H = 1`` for one head)."""
    return padding_mask[:, None, None, :]  # (B, 1, 1, S)


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


def rows_with_keys(mask: Tensor) -> Tensor:
    """``(..., T, S)`` mask -> ``(..., T, 1)``: True where the query may attend to some key."""
    return mask.any(dim=-1, keepdim=True)  # (..., T, 1)


def open_empty_rows(mask: Tensor) -> Tuple[Tensor, Tensor]:
    """The empty-row guard, for every path: ``mask`` ``(..., T, S)`` with each fully masked row
    opened (a softmax over a row of ``-inf`` gives NaN, forward and backward), and which rows have
    a key, ``(..., T, 1)``. Attention is computed over ``visible`` and then multiplied by
    ``has_key``: 0 on an opened row, 1 elsewhere (asking whether any row is empty would make the
    host wait for a GPU at every step of a search)."""
    has_key = rows_with_keys(mask)  # (..., T, 1)
    return mask | ~has_key, has_key  # (..., T, S), (..., T, 1)


def masked_softmax_(scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Softmax of ``scores`` ``(..., T, S)`` over the key axis, with masked keys at exactly 0 and
    fully masked rows all 0 (``open_empty_rows``), with finite, zero gradients.

    The trailing underscore says that masked entries of ``scores`` are overwritten in place with
    ``-inf``: pass a score tensor you own, such as a fresh matmul output (not a leaf you need
    later). The fill runs outside autograd: the softmax output is exactly 0 at those entries, so
    the softmax backward already gives them zero gradient, and recording the fill would only add a
    pass over the largest tensor of attention to the backward pass. ``mask`` is boolean and
    broadcastable to ``scores``.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)  # (..., T, S)
    visible, has_key = open_empty_rows(mask)  # (..., T, S), (..., T, 1)
    with torch.no_grad():
        scores.masked_fill_(~visible, float("-inf"))  # (..., T, S)
    return torch.softmax(scores, dim=-1) * has_key  # (..., T, S)


def attention_mask(
    mask: Optional[Tensor],
    n_queries: int,
    n_keys: int,
    causal: bool,
    device: torch.device,
    causal_flag: bool = False,
) -> Tuple[Optional[Tensor], bool]:
    """The mask an attention applies, decided here and nowhere else: ``mask`` (after
    ``check_mask_shape``) and, with ``causal``, the ``(T, T)`` triangle of ``causal_mask`` joined
    to it. Returns ``(mask or None, False)``, or ``(None, True)`` when ``causal_flag`` (the caller
    runs the fused kernel) and there is no mask: the triangle stays a flag, the kernel's
    ``is_causal``, the one form that CUDA's flash-attention kernel accepts.

    ``causal`` needs as many queries as keys: a full pass, with an empty cache. The fused kernel
    aligns its triangle to the top left, right only when query ``t`` is key ``t``; after ``t``
    cached keys the queries are the last positions, ``causal_mask(T, t + T)`` (bottom right).
    """
    if mask is not None:
        check_mask_shape(mask, n_queries, n_keys)
    if not causal:
        return mask, False
    if n_queries != n_keys:
        raise ValueError(
            f"causal=True needs as many queries as keys (a full pass, no cache), got {n_queries} "
            f"queries and {n_keys} keys; pass mask=causal_mask({n_queries}, {n_keys}) instead"
        )
    if causal_flag and mask is None:
        return None, True
    return combine_masks(causal_mask(n_queries, device=device), mask), False  # (T, T) or (..., T, T)


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
    so such rows are opened before the call and zeroed after it, as on the explicit path.
    ``causal`` is the flag ``attention_mask`` leaves (no mask, as many queries as keys); every
    causal row sees at least its own key, so nothing needs zeroing.
    """
    if causal:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)  # (..., T, d_v)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)  # (..., T, d_v)
    visible, has_key = open_empty_rows(mask)  # (..., T, S), (..., T, 1)
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

    ``causal`` hides later keys as ``causal_mask(T)`` would (on top of ``mask``; ``attention_mask``);
    it needs ``T == S`` and raises ValueError otherwise. Returns output ``(..., T, d_v)`` and
    weights ``(..., T, S)`` or ``None``.
    """
    mask, causal = attention_mask(mask, q.size(-2), k.size(-2), causal, q.device, not need_weights)
    return scaled_dot_product(q, k, v, mask, dropout_p, need_weights, causal)


def scaled_dot_product(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    dropout_p: float,
    need_weights: bool,
    causal: bool,
) -> Tuple[Tensor, Optional[Tensor]]:
    """``scaled_dot_product_attention`` once ``attention_mask`` has decided ``mask`` and ``causal``
    (a layer decides them once, in ``attend``): the explicit path for the weights, else the fused
    kernel."""
    if need_weights:
        return scaled_dot_product_explicit(q, k, v, mask, dropout_p)
    return scaled_dot_product_fused(q, k, v, mask, dropout_p, causal), None


def zero_empty_rows(out: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``out`` ``(B, T, D_out)`` with zeros where a query sees no key in any head (not ``W_O``'s
    bias). Causal alone never empties a row: every query sees its own key."""
    if mask is None:
        return out
    has_key = rows_with_keys(mask)  # (T, 1) or (B|1, H|1, T|1, 1)
    return out * (has_key if has_key.dim() == 2 else has_key.any(dim=1))  # (B, T, D_out)


def check_mask_shape(mask: Tensor, n_queries: int, n_keys: int) -> None:
    """Refuse a mask that would broadcast against ``(B, H, T, S)`` in a wrong way."""
    if mask.dim() not in (2, 4) or mask.size(-2) not in (1, n_queries) or mask.size(-1) != n_keys:
        raise ValueError(
            f"attention mask must be (T, S) = ({n_queries}, {n_keys}) or 4-d broadcastable to "
            f"(B, H, {n_queries}, {n_keys}), got shape {tuple(mask.shape)}; lift a (B, S) padding mask "
            f"with key_mask"
        )
