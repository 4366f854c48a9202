"""Attention: a query scores every key, a softmax turns the scores into weights, and the output is
the weighted sum of the values::

    weights_i = softmax_i(score(q, k_i))        output = sum_i weights_i * v_i

The functions differ only in ``score`` and in how many heads compute it. Each class's ``score``
(or, for ``MultiHeadAttention``, ``attend``) is the paper's formula, line for line:

- ``AdditiveAttention``, one head (RNN ``additive``): ``w_v^T tanh(W_q q + W_k k)``;
- ``GeneralAttention``, one head (RNN ``general``): ``q^T W k``;
- ``ScaledDotAttention``, one head (RNN ``scaled_dot``): ``(W_q q)^T (W_k k) / sqrt(d_k)``;
- ``MultiHeadAttention``, ``H`` heads mixed by ``W_O`` (RNN ``multihead``; every attention of the
  Transformer): per head ``(q W_Q^h)^T (k W_K^h) / sqrt(d_k)`` (``score="scaled_dot"``, the
  Transformer's ``scaled_dot``) or ``w_v^h^T tanh(q W_Q^h + k W_K^h)`` (``score="additive"``, the
  Transformer's ``additive``).

So ``model.attention`` names a *score*: in the RNN ``scaled_dot`` and ``additive`` are one head
over the encoder states as they are (Bahdanau et al. 2015's data flow); in the Transformer every
attention is ``H`` heads of that score with ``W_V`` and ``W_O`` (Vaswani et al. 2017, 3.2.2).

``qk_norm`` (dot-product scores; Henry et al. 2020): unit queries and keys per head, so that
``q^T k`` is a cosine, scaled by a learned ``g`` (``qk_scale``, from ``QK_NORM_SCALE``) instead of
``1/sqrt(d_k)``: a bounded score cannot saturate the softmax on one key (docs/attention.md).

Every class has one interface (``AttentionFunction``): ``project_kv`` (what does not depend on the
query, cached by decoders), ``attend`` and ``forward``. Weights are returned, never stored.

Masks are boolean, ``True`` = may attend (``F.scaled_dot_product_attention``'s convention),
broadcastable to ``(B, H, T, S)``: ``(T, S)`` causal, ``(B, 1, 1, S)`` padding (``key_mask``),
``(B, 1, T, S)`` both. A masked key gets exactly zero weight. A query whose keys are all masked
gets zero weights and a zero output instead of ``softmax([-inf, ..., -inf]) = NaN`` (the guard is
``open_empty_rows``, for both the explicit path and the fused kernel). ``causal=True`` asks for
the lower triangle without a mask tensor, so that the fused kernel gets it as ``is_causal`` (the
one form CUDA's flash-attention kernel takes); it needs as many queries as keys.

A head's output can be switched off for a measurement (the gate ``xi_h`` of Michel et al. 2019,
``alignment/heads.py``) with ``masked_heads({module: (H,) gates})``, a context: nothing is set on
the module. Shapes follow ``models/__init__.py``: ``T`` queries, ``S`` keys.
"""

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Dict, Iterator, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.dropout import dropout

QK_NORM_SCALE = math.log2(32**2 - 32)  # 9.95: g's initial value, log2(L^2 - L) at L = 32 (Henry et al.)


# ----- masks -----
def key_mask(padding_mask: Tensor) -> Tensor:
    """A ``(B, S)`` padding mask (True at real tokens) lifted to ``(B, 1, 1, S)``: the same keys
    hidden from every query and head."""
    return padding_mask[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(
    n_queries: int, n_keys: Optional[int] = None, device: Optional[torch.device] = None
) -> Tensor:
    """``(T, S)``: query ``t`` sees keys ``0 .. t + (S - T)``. With ``S == T`` the lower triangle of
    decoder self-attention; with ``S > T`` aligned to the bottom right, as when the ``T`` queries
    follow ``S - T`` cached steps (``is_causal`` of the fused kernel aligns to the top left)."""
    n_keys = n_queries if n_keys is None else n_keys
    if n_keys < n_queries:
        raise ValueError(f"causal mask needs at least as many keys ({n_keys}) as queries ({n_queries})")
    ones = torch.ones(n_queries, n_keys, dtype=torch.bool, device=device)  # (T, S)
    return torch.tril(ones, diagonal=n_keys - n_queries)  # (T, S)


def combine_masks(*masks: Optional[Tensor]) -> Optional[Tensor]:
    """The intersection of broadcastable boolean masks, None entries skipped (None if all are)."""
    result: Optional[Tensor] = None
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype != torch.bool:
            raise TypeError(f"masks must be boolean (True = may attend), got {mask.dtype}")
        result = mask if result is None else result & mask  # broadcast to the shape of both
    return result


def decide_mask(
    mask: Optional[Tensor],
    n_queries: int,
    n_keys: int,
    causal: bool,
    device: torch.device,
    as_flag: bool = False,
) -> Tuple[Optional[Tensor], bool]:
    """The mask an attention applies, decided once per call: ``mask`` (its shape checked) joined
    with the causal triangle, or ``(None, True)`` when the triangle can stay a flag (``as_flag``:
    the caller runs the fused kernel, and there is no other mask)."""
    if mask is not None and (
        mask.dim() not in (2, 4) or mask.size(-2) not in (1, n_queries) or mask.size(-1) != n_keys
    ):
        raise ValueError(
            f"attention mask must be (T, S) = ({n_queries}, {n_keys}) or 4-d broadcastable to "
            f"(B, H, {n_queries}, {n_keys}), got shape {tuple(mask.shape)}; lift a (B, S) padding mask "
            "with key_mask"
        )
    if not causal:
        return mask, False
    if n_queries != n_keys:
        raise ValueError(
            f"causal=True needs as many queries as keys (a full pass, no cache), got {n_queries} "
            f"queries and {n_keys} keys; pass mask=causal_mask({n_queries}, {n_keys}) instead"
        )
    if as_flag and mask is None:
        return None, True
    return combine_masks(causal_mask(n_queries, device=device), mask), False  # (T, T) or (..., T, T)


def open_empty_rows(mask: Tensor) -> Tuple[Tensor, Tensor]:
    """The empty-row guard: ``mask`` ``(..., T, S)`` with every fully masked row opened, and
    ``has_key`` ``(..., T, 1)``, 0 on such a row. Attention runs over the opened mask and is then
    multiplied by ``has_key`` (asking whether a row is empty would make the host wait for a GPU)."""
    has_key = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    return mask | ~has_key, has_key  # (..., T, S), (..., T, 1)


def masked_softmax(scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Softmax of ``scores`` ``(..., T, S)`` over the keys: masked keys exactly 0, fully masked rows
    all 0, with finite gradients. Masked entries of ``scores`` are overwritten with ``-inf`` in
    place and outside autograd (pass a fresh score tensor): the softmax is 0 there, so its backward
    already gives them no gradient."""
    if mask is None:
        return torch.softmax(scores, dim=-1)  # (..., T, S)
    visible, has_key = open_empty_rows(mask)  # (..., T, S), (..., T, 1)
    with torch.no_grad():
        scores.masked_fill_(~visible, float("-inf"))  # (..., T, S)
    return torch.softmax(scores, dim=-1) * has_key  # (..., T, S)


# ----- head masks, a context -----
_HEAD_MASKS: ContextVar[Optional[Dict[nn.Module, Tensor]]] = ContextVar("head_masks", default=None)


@contextmanager
def masked_heads(gates: Dict[nn.Module, Tensor]) -> Iterator[None]:
    """Within the block each attention module of ``gates`` scales its heads' outputs by its ``(H,)``
    gates (0: the head is masked) before they are mixed; outside it, nothing is masked."""
    token = _HEAD_MASKS.set({**(_HEAD_MASKS.get() or {}), **gates})
    try:
        yield
    finally:
        _HEAD_MASKS.reset(token)


# ----- the interface, and the recipe of one head -----
class AttentionFunction(nn.Module):
    """What a decoder or layer sees of any attention function. The single-head functions define
    ``project_kv`` and ``score``; ``attend`` is the rest of the recipe for them (masked softmax,
    dropout, weighted sum of the values as they are). ``MultiHeadAttention`` has its own."""

    n_heads = 1

    def __init__(self, dropout: float = 0.0, qk_norm: bool = False):
        super().__init__()
        self.dropout_p = dropout
        self.qk_norm = qk_norm
        if qk_norm:
            self.qk_scale = nn.Parameter(torch.tensor(QK_NORM_SCALE))  # g, learned

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
        itself for self-attention)."""
        return self.attend(query, *self.project_kv(key, value), mask, need_weights, causal)

    def attend(
        self,
        query: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """One head: from ``query`` ``(B, T, D_query)`` to ``project_kv``'s ``k`` ``(B, 1, S, .)`` and
        ``v`` ``(B, 1, S, D_value)``: context ``(B, T, D_value)``, weights ``(B, 1, T, S)`` or None."""
        mask, _ = decide_mask(mask, query.size(1), k.size(2), causal, query.device)
        context, weights = self.weigh(self.score(query, k), v, mask)  # (B, 1, T, D_value), (B, 1, T, S)
        context = self.gate(context).squeeze(1)  # (B, T, D_value)
        return context, weights if need_weights else None

    def weigh(self, scores: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """``scores`` ``(..., T, S)`` -> the weighted sum of ``v`` ``(..., S, d_v)`` and the weights."""
        weights = masked_softmax(scores, mask)  # (..., T, S)
        dropped = dropout(weights, self.dropout_p, self.training)  # (..., T, S)
        return torch.matmul(dropped, v), weights  # (..., T, d_v), (..., T, S)

    def gate(self, heads: Tensor) -> Tensor:
        """Every head's output ``(B, H, T, d)`` scaled by its gate under ``masked_heads``."""
        if torch.compiler.is_compiling():  # a compiled model measures nothing (a ContextVar breaks its graph)
            return heads
        gates = (_HEAD_MASKS.get() or {}).get(self)
        return heads if gates is None else heads * gates.to(heads.dtype).view(1, -1, 1, 1)

    def normalized(self, x: Tensor) -> Tensor:
        """``x`` as it is, or L2-normalised over its last axis under ``qk_norm``."""
        return F.normalize(x, dim=-1) if self.qk_norm else x


# ----- one head over the values as they are (the RNN's choices) -----
class AdditiveAttention(AttentionFunction):
    """Additive (Bahdanau et al. 2015, appendix A.1.2): ``score(q, k) = w_v^T tanh(W_q q + W_k k)``.

    Parameters: ``W_q`` (``D_query x d_a``), ``W_k`` (``D_key x d_a``), ``w_v`` (``d_a``), no biases;
    ``d_a`` is ``model.attention_size``. Cost: ``T S d_a`` tanh units, held for the backward pass:
    a ``(B, T, S, d_a)`` tensor."""

    def __init__(self, query_size: int, key_size: int, d_a: int, dropout: float = 0.0):
        super().__init__(dropout)
        self.query_proj = nn.Linear(query_size, d_a, bias=False)  # W_q
        self.key_proj = nn.Linear(key_size, d_a, bias=False)  # W_k
        self.score_proj = nn.Linear(d_a, 1, bias=False)  # w_v

    def project_kv(self, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
        return self.key_proj(key).unsqueeze(1), value.unsqueeze(1)  # (B, 1, S, d_a), (B, 1, S, D_value)

    def score(self, query: Tensor, k: Tensor) -> Tensor:
        q = self.query_proj(query).unsqueeze(1)  # (B, 1, T, d_a) W_q q
        hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, 1, T, S, d_a) tanh(W_q q + W_k k)
        return self.score_proj(hidden).squeeze(-1)  # (B, 1, T, S) w_v^T tanh(...)


class GeneralAttention(AttentionFunction):
    """General, or bilinear (Luong et al. 2015, section 3.1): ``score(q, k) = q^T W k``.

    Parameters: ``W`` (``D_query x D_key``), no bias; ``W k`` is computed once per sentence, so a
    score is one dot product of size ``D_query``. Cost: ``T S D_query``."""

    def __init__(self, query_size: int, key_size: int, dropout: float = 0.0, qk_norm: bool = False):
        super().__init__(dropout, qk_norm)
        self.key_proj = nn.Linear(key_size, query_size, bias=False)  # W

    def project_kv(self, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
        return self.normalized(self.key_proj(key)).unsqueeze(1), value.unsqueeze(1)  # (B, 1, S, D_query) W k

    def score(self, query: Tensor, k: Tensor) -> Tensor:
        q = self.normalized(query).unsqueeze(1)  # (B, 1, T, D_query)
        if self.qk_norm:
            q = q * self.qk_scale  # g q^T W k over unit vectors
        return torch.matmul(q, k.transpose(-2, -1))  # (B, 1, T, S) q^T (W k)


class ScaledDotAttention(AttentionFunction):
    """Scaled dot product, one head (Vaswani et al. 2017, 3.2.1, over projected inputs):
    ``score(q, k) = (W_q q)^T (W_k k) / sqrt(d_k)``.

    Parameters: ``W_q`` (``D_query x d_k``), ``W_k`` (``D_key x d_k``), no biases; ``d_k`` is
    ``model.attention_size``, as additive attention's ``d_a``: the two differ only in the score.
    Cost: ``T S d_k`` multiply-adds."""

    def __init__(self, query_size: int, key_size: int, d_k: int, dropout: float = 0.0, qk_norm: bool = False):
        super().__init__(dropout, qk_norm)
        self.query_proj = nn.Linear(query_size, d_k, bias=False)  # W_q
        self.key_proj = nn.Linear(key_size, d_k, bias=False)  # W_k
        self.scale = 1.0 / math.sqrt(d_k)

    def project_kv(self, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
        return self.normalized(self.key_proj(key)).unsqueeze(1), value.unsqueeze(1)  # (B, 1, S, d_k) W_k k

    def score(self, query: Tensor, k: Tensor) -> Tensor:
        q = self.normalized(self.query_proj(query)).unsqueeze(1)  # (B, 1, T, d_k) W_q q
        q = q * (self.qk_scale if self.qk_norm else self.scale)  # g, or 1 / sqrt(d_k)
        return torch.matmul(q, k.transpose(-2, -1))  # (B, 1, T, S) (W_q q)^T (W_k k) / sqrt(d_k)


# ----- H heads, mixed by W_O (the Transformer's choices; the RNN's multihead) -----
class MultiHeadAttention(AttentionFunction):
    """Multi-head attention (Vaswani et al. 2017, section 3.2.2):
    ``MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_O``, ``head_h = softmax(score_h) V W_V^h``,
    ``d_k = d_model / H``, with the score of each head

    - ``score="scaled_dot"``: ``(Q W_Q^h) (K W_K^h)^T / sqrt(d_k)``, through PyTorch's fused kernel
      unless the weights are asked for;
    - ``score="additive"``: ``w_v^h^T tanh(Q W_Q^h + K W_K^h)`` (the projections with their biases),
      explicit only.

    Parameters: ``W_Q``, ``W_K``, ``W_V`` (input size x ``d_model``), ``W_O`` (``d_model x out``),
    with biases, ``4 d_model^2 + 4 d_model`` when every size is ``d_model``; ``additive`` adds
    ``w_v`` (``H x d_k``). Cost: ``T S d_model`` multiply-adds for the scores and as many for the
    weighted sum; ``additive`` holds ``T S d_model`` tanh units (``(B, H, T, S, d_k)``) for the
    backward pass. The per-head projections are one linear layer each, split into heads by a
    reshape. Query, key and output sizes default to ``d_model`` (the Transformer); the RNN's
    ``multihead`` sets them to its decoder state ``D`` and encoder states ``2D``.

    Self-attention passes one sequence as query, key and value; cross-attention the decoder states
    as query and the encoder output as key and value. A decoder may cache ``project_kv``'s keys and
    values, extend them step by step (``torch.cat`` on dim 2) and pass them to ``attend``."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        query_size: Optional[int] = None,
        key_size: Optional[int] = None,
        out_size: Optional[int] = None,
        score: str = "scaled_dot",
        qk_norm: bool = False,
    ):
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if score not in ("scaled_dot", "additive"):
            raise ValueError(f"score must be scaled_dot or additive, got {score!r}")
        if qk_norm and score != "scaled_dot":
            raise ValueError(
                "qk_norm normalises the queries and keys of a dot product: the additive score has none"
            )
        super().__init__(dropout, qk_norm)
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(query_size or d_model, d_model)  # W_Q, every head's
        self.k_proj = nn.Linear(key_size or d_model, d_model)  # W_K
        self.v_proj = nn.Linear(key_size or d_model, d_model)  # W_V
        self.out_proj = nn.Linear(d_model, out_size or d_model)  # W_O
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):  # nn.MultiheadAttention's init
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)
        self.additive = score == "additive"
        if self.additive:
            self.score_proj = nn.Parameter(nn.init.xavier_uniform_(torch.empty(n_heads, self.d_k)))  # w_v^h

    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, T, H d_k)`` -> ``(B, H, T, d_k)``."""
        return x.view(x.size(0), x.size(1), self.n_heads, self.d_k).transpose(1, 2)  # (B, H, T, d_k)

    def project_kv(self, key: Tensor, value: Tensor) -> Tuple[Tensor, Tensor]:
        """``(B, S, D_key)`` key and value -> per-head keys and values, each ``(B, H, S, d_k)``."""
        return self.normalized(self.split_heads(self.k_proj(key))), self.split_heads(self.v_proj(value))

    def attend(
        self,
        query: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor] = None,
        need_weights: bool = False,
        causal: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """From ``query`` ``(B, T, D_query)`` to projected ``k``, ``v`` ``(B, H, S, d_k)``: output
        ``(B, T, D_out)`` and weights ``(B, H, T, S)`` (None unless ``need_weights``)."""
        fused = not (self.additive or need_weights)  # the fused kernel returns no weights
        mask, causal = decide_mask(mask, query.size(1), k.size(2), causal, query.device, as_flag=fused)
        q = self.normalized(self.split_heads(self.q_proj(query)))  # (B, H, T, d_k) Q W_Q^h
        # the scale of the scores: 1 / sqrt(d_k), or g over unit vectors (qk_norm)
        scale = self.qk_scale if self.qk_norm else 1.0 / math.sqrt(self.d_k)
        weights = None
        if fused:
            heads = self.fused_heads(q, k, v, mask, causal, scale)  # (B, H, T, d_k)
        elif self.additive:
            hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, H, T, S, d_k) tanh(Q W_Q^h + K W_K^h)
            scores = torch.einsum("bhtsa,ha->bhts", hidden, self.score_proj)  # (B, H, T, S) w_v^h^T tanh(...)
            heads, weights = self.weigh(scores, v, mask)  # (B, H, T, d_k), (B, H, T, S)
        else:
            scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (B, H, T, S) Q K^T / sqrt(d_k)
            heads, weights = self.weigh(scores, v, mask)  # (B, H, T, d_k), (B, H, T, S)
        heads = self.gate(heads).transpose(1, 2).flatten(2)  # (B, T, H d_k) Concat(head_1, ..., head_H)
        out = self.out_proj(heads)  # (B, T, D_out) ... W_O
        if mask is not None:  # a query that sees no key in any head: zero, not W_O's bias
            has_key = mask.any(dim=-1, keepdim=True)  # (T, 1) or (B|1, H|1, T|1, 1)
            out = out * (has_key if has_key.dim() == 2 else has_key.any(dim=1))  # (B, T, D_out)
        return out, weights if need_weights else None

    def fused_heads(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor],
        causal: bool,
        scale: Union[float, Tensor],
    ) -> Tensor:
        """The same heads through ``F.scaled_dot_product_attention`` (no weights; little memory). Its
        output on a fully masked row depends on the backend, so such rows are opened and zeroed."""
        p = self.dropout_p if self.training else 0.0
        if isinstance(scale, Tensor):  # a learned scale: on the queries, the kernel's own scale 1
            q, scale = q * scale, 1.0
        else:
            scale = None  # the kernel's default, 1 / sqrt(d_k)
        if causal or mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal, scale=scale)
        visible, has_key = open_empty_rows(mask)  # (..., T, S), (..., T, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=p, scale=scale) * has_key
