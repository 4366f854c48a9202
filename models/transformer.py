"""Encoder-decoder Transformer (Vaswani et al. 2017) on ``MultiHeadAttention``.

Pre-norm by default (``x + Dropout(SubLayer(LayerNorm(x)))`` and a final LayerNorm on both
stacks; Wang et al. 2019 find it trains more stably for small data and short schedules), post-norm
(``LayerNorm(x + Dropout(SubLayer(x)))``, the paper's original) as an option.

The decoder runs the same code for training and for step-wise decoding: its self-attention keys
and values are kept in a per-layer cache that a full pass starts empty, and a decoding step
extends by one position. The cross-attention keys and values are projected from the encoder
output once per sentence.

Shapes (the scheme of ``models/__init__.py``): ``D`` is ``d_model``, ``H`` heads, ``d_k = D / H``,
``d_ff`` the feed-forward size, ``t`` target positions already in the cache.
"""

from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from models.attention import MultiHeadAttention, causal_mask, combine_masks, key_mask
from models.config import TransformerConfig, alignment_layer
from models.dropout import Dropout
from models.embeddings import OutputLayer, PositionalEncoding, TokenEmbedding
from models.seq2seq import Attention, Encoded

LayerCache = Dict[str, Tensor]  # self_k, self_v (B, H, t, d_k) so far; cross_k, cross_v (B, H, S, d_k)


def target_self_mask(tgt_in: Tensor, pad_id: int) -> Tensor:
    """``(B, T)`` target ids -> ``(B, 1, T, T)``: earlier positions only, and no padding keys."""
    tgt_keys = key_mask(tgt_in != pad_id)  # (B, 1, 1, T)
    return combine_masks(causal_mask(tgt_in.size(1), device=tgt_in.device), tgt_keys)  # (B, 1, T, T)


def make_attention(cfg: TransformerConfig) -> MultiHeadAttention:
    """One attention of the model, of the function ``model.attention`` names (every attention of a
    model is of the same function)."""
    return MultiHeadAttention(
        cfg.d_model, cfg.n_heads, cfg.attention_dropout, score=cfg.attention, qk_norm=cfg.qk_norm
    )


def activation_dropout(cfg: TransformerConfig) -> float:
    """The dropout inside the feed-forward block: ``model.activation_dropout`` (fairseq's
    ``--activation-dropout``), or ``model.dropout`` where that is null."""
    return cfg.dropout if cfg.activation_dropout is None else cfg.activation_dropout


class FeedForward(nn.Module):
    """Position-wise ``W_2 ReLU(W_1 x)`` (section 3.3)."""

    def __init__(self, d_model: int, ff_size: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, ff_size), nn.ReLU(), Dropout(dropout), nn.Linear(ff_size, d_model)
        )

    def forward(self, x: Tensor) -> Tensor:
        """``(B, T, D)`` -> ``(B, T, D)`` (through ``d_ff`` hidden units), every position alike."""
        return self.net(x)  # (B, T, D)


class Residual(nn.Module):
    """A sub-layer's residual connection with its LayerNorm before (pre-norm) or after (post-norm)."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def inputs(self, x: Tensor) -> Tensor:
        """What the sub-layer reads: the normalised ``x`` (pre-norm) or ``x`` itself, ``(B, T, D)``."""
        return self.norm(x) if self.pre_norm else x  # (B, T, D)

    def add(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        """``x`` plus the dropped-out sub-layer output, both ``(B, T, D)`` (post-norm: then normalised)."""
        out = x + self.dropout(sublayer_out)  # (B, T, D)
        return out if self.pre_norm else self.norm(out)  # (B, T, D)


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward sub-layers, each in a ``Residual``."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = make_attention(cfg)
        self.feed_forward = FeedForward(cfg.d_model, cfg.ff_size, activation_dropout(cfg))
        self.attn_residual = Residual(cfg.d_model, cfg.dropout, pre)
        self.ff_residual = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """``x`` ``(B, S, D)``, ``mask`` ``(B, 1, 1, S)`` -> ``(B, S, D)`` and self-attention weights
        ``(B, H, S, S)`` (None unless ``need_weights``)."""
        h = self.attn_residual.inputs(x)  # (B, S, D)
        attended, weights = self.self_attn(h, h, h, mask, need_weights)  # (B, S, D), (B, H, S, S) or None
        x = self.attn_residual.add(x, attended)  # (B, S, D)
        x = self.ff_residual.add(x, self.feed_forward(self.ff_residual.inputs(x)))  # (B, S, D)
        return x, weights


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention over the encoder output and feed-forward sub-layers."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = make_attention(cfg)
        self.cross_attn = make_attention(cfg)
        self.feed_forward = FeedForward(cfg.d_model, cfg.ff_size, activation_dropout(cfg))
        self.self_residual = Residual(cfg.d_model, cfg.dropout, pre)
        self.cross_residual = Residual(cfg.d_model, cfg.dropout, pre)
        self.ff_residual = Residual(cfg.d_model, cfg.dropout, pre)

    def start_cache(self, memory: Tensor) -> LayerCache:
        """Project the encoder output ``(B, S, D)`` for cross-attention; empty self-attention cache."""
        cross_k, cross_v = self.cross_attn.project_kv(memory, memory)  # (B, H, S, d_k) x 2
        empty = cross_k.new_zeros(cross_k.size(0), cross_k.size(1), 0, cross_k.size(3))  # (B, H, 0, d_k)
        return {"self_k": empty, "self_v": empty, "cross_k": cross_k, "cross_v": cross_v}

    def forward(
        self,
        x: Tensor,
        cache: LayerCache,
        self_mask: Optional[Tensor],
        cross_mask: Tensor,
        need_weights: bool = False,
        causal: bool = False,
        cross_weights: bool = False,
    ) -> Tuple[Tensor, LayerCache, Tuple[Optional[Tensor], Optional[Tensor]]]:
        """Decode ``T`` new positions ``x`` ``(B, T, D)`` after the ``t`` positions in ``cache``.

        ``self_mask`` broadcastable to ``(B, H, T, t + T)`` (None: every cached and new position
        up to the query is visible, as in a one-step decode); ``cross_mask`` ``(B, 1, 1, S)``.
        ``causal`` hides later positions without a mask tensor (for the fused kernel's
        ``is_causal``); it needs an empty cache, ``t = 0`` (ValueError otherwise).
        Returns ``(B, T, D)``, the extended cache, and the self ``(B, H, T, t + T)`` and cross
        ``(B, H, T, S)`` weights (None unless ``need_weights``; the cross weights also with
        ``cross_weights``).
        """
        h = self.self_residual.inputs(x)  # (B, T, D)
        new_k, new_v = self.self_attn.project_kv(h, h)  # (B, H, T, d_k) x 2
        self_k = torch.cat([cache["self_k"], new_k], dim=2)  # (B, H, t + T, d_k)
        self_v = torch.cat([cache["self_v"], new_v], dim=2)  # (B, H, t + T, d_k)
        attended, self_weights = self.self_attn.attend(
            h, self_k, self_v, self_mask, need_weights, causal
        )  # (B, T, D), (B, H, T, t + T) or None
        x = self.self_residual.add(x, attended)  # (B, T, D)
        h = self.cross_residual.inputs(x)  # (B, T, D)
        attended, cross_weights = self.cross_attn.attend(
            h, cache["cross_k"], cache["cross_v"], cross_mask, need_weights or cross_weights
        )  # (B, T, D), (B, H, T, S) or None
        x = self.cross_residual.add(x, attended)  # (B, T, D)
        x = self.ff_residual.add(x, self.feed_forward(self.ff_residual.inputs(x)))  # (B, T, D)
        cache = dict(cache, self_k=self_k, self_v=self_v)  # cross_k, cross_v as they were
        return x, cache, (self_weights, cross_weights)


class Transformer(nn.Module):
    """Transformer encoder-decoder following the contract in ``models/seq2seq.py``."""

    def __init__(self, cfg: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0):
        super().__init__()
        self.cfg, self.pad_id = cfg, pad_id
        self.max_positions = cfg.max_positions  # longest source or output it can take
        self.tgt_embed = TokenEmbedding(tgt_vocab_size, cfg.d_model, pad_id, scale=True)
        share = cfg.share_embeddings and src_vocab_size == tgt_vocab_size
        if share:
            self.src_embed = self.tgt_embed
        else:
            self.src_embed = TokenEmbedding(src_vocab_size, cfg.d_model, pad_id, scale=True)
        self.positions = PositionalEncoding(cfg.d_model, cfg.positions, cfg.max_positions)
        self.dropout = Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm leaves the residual stream unnormalised: normalise once at the top of each stack.
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.output = OutputLayer(cfg.d_model, tgt_vocab_size, self.tgt_embed if cfg.tie_output else None)

    @property
    def output_layer(self) -> OutputLayer:
        """The layer that makes the logits (``models/seq2seq.py``)."""
        return self.output

    def attention_modules(self) -> Dict[str, List[nn.Module]]:
        """Every attention of the model under its key in the attention dict, first layer first."""
        return {
            "cross": [layer.cross_attn for layer in self.decoder_layers],
            "encoder_self": [layer.self_attn for layer in self.encoder_layers],
            "decoder_self": [layer.self_attn for layer in self.decoder_layers],
        }

    def encode(self, src: Tensor, src_mask: Tensor, need_weights: bool = False) -> Encoded:
        """``src`` ids ``(B, S)``, ``src_mask`` ``(B, S)`` -> ``Encoded`` with memory ``(B, S, D)``.

        With ``need_weights`` the encoder self-attention of every layer, ``(B, H, S, S)`` each, is
        in ``attention["encoder_self"]``; else the attention is ``{}``.
        """
        x = self.dropout(self.positions(self.src_embed(src)))  # (B, S, D)
        mask = key_mask(src_mask)  # (B, 1, 1, S)
        weights: List[Optional[Tensor]] = []
        for layer in self.encoder_layers:
            x, layer_weights = layer(x, mask, need_weights)  # (B, S, D), (B, H, S, S) or None
            weights.append(layer_weights)
        attention: Attention = {"encoder_self": weights} if need_weights else {}
        memory = self.encoder_norm(x)  # (B, S, D)
        return Encoded(memory=memory, src_mask=src_mask, attention=attention)

    def start_state(self, encoded: Encoded) -> Dict[str, object]:
        """``{"src_mask": (B, S), "layers": [LayerCache per decoder layer]}``: cross-attention keys and
        values of the source, empty self-attention caches."""
        layers = [layer.start_cache(encoded.memory) for layer in self.decoder_layers]
        return {"src_mask": encoded.src_mask, "layers": layers}

    def decode(
        self,
        tokens: Tensor,
        state: Dict[str, object],
        self_mask: Optional[Tensor],
        need_weights: bool = False,
        causal: bool = False,
        cross_layer: Optional[int] = None,
        project: bool = True,
    ) -> Tuple[Tensor, Dict[str, object], Dict[str, List[Optional[Tensor]]]]:
        """Run the decoder over ``T`` new target tokens ``(B, T)`` after the ``t`` in ``state``.

        ``self_mask`` as in ``DecoderLayer.forward``; ``causal=True`` with ``self_mask=None`` is
        "earlier positions only, no mask tensor" and needs an empty cache (``t = 0``).
        ``cross_layer`` (0-based): that layer's cross weights are computed even without ``need_weights``.

        Returns logits ``(B, T, V)`` (``project=False``: the output layer's input ``(B, T, D)``), the
        extended state, and per-layer weights ``{"cross": [(B, H, T, S)], "decoder_self": [(B, H, T,
        t + T)]}`` (None entries unless asked).
        """
        offset = state["layers"][0]["self_k"].size(2) if state["layers"] else 0  # t
        x = self.dropout(self.positions(self.tgt_embed(tokens), offset))  # (B, T, D)
        cross_mask = key_mask(state["src_mask"])  # (B, 1, 1, S)
        caches, self_weights, cross_weights = [], [], []
        for number, (layer, cache) in enumerate(zip(self.decoder_layers, state["layers"])):
            x, cache, (self_w, cross_w) = layer(
                x, cache, self_mask, cross_mask, need_weights, causal, number == cross_layer
            )  # (B, T, D), weights (B, H, T, t + T) and (B, H, T, S) or None
            caches.append(cache)
            self_weights.append(self_w)
            cross_weights.append(cross_w)
        x = self.decoder_norm(x)  # (B, T, D)
        out = self.output(x) if project else x  # (B, T, V) logits, or (B, T, D)
        state = {"src_mask": state["src_mask"], "layers": caches}
        return out, state, {"cross": cross_weights, "decoder_self": self_weights}

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor,
        tgt_in: Tensor,
        need_weights: bool = False,
        alignment: bool = False,
        project: bool = True,
    ) -> Tuple[Tensor, Attention]:
        """Teacher-forced pass: ``src`` ``(B, S)``, ``src_mask`` ``(B, S)``, ``tgt_in`` ``(B, T)`` ->
        logits ``(B, T, V)`` (``project=False``: the output layer's input ``(B, T, D)``) and the attention.

        The decoder self-attention sees earlier positions only. With ``need_weights`` it also
        hides padding keys (``target_self_mask``), so the logged weights are exactly 0 there.
        Without, it is causal only (``is_causal``, no mask tensor: the form CUDA's flash-attention
        kernel takes). Both give the same logits at every real target position: padding only
        follows a row's real tokens (``data/batching.py``), so a real query, which sees keys up to
        itself, never sees a padding key. Only padded queries differ, and the loss ignores them
        (``training/step.py``: target padding is at the same positions). With ``need_weights`` the
        attention (``models/seq2seq.py``) holds ``cross`` ``[(B, H, T, S)]`` and
        ``decoder_self`` ``[(B, H, T, T)]`` per decoder layer, ``encoder_self`` ``[(B, H, S, S)]`` per
        encoder layer; else ``{}``. With ``alignment`` it also holds ``alignment``: the heads that
        guided alignment trains (``models/seq2seq.py``).
        """
        encoded = self.encode(src, src_mask, need_weights)
        self_mask = target_self_mask(tgt_in, self.pad_id) if need_weights else None  # (B, 1, T, T)
        layer = alignment_layer(self.cfg) - 1
        out, _, attention = self.decode(
            tgt_in,
            self.start_state(encoded),
            self_mask,
            need_weights,
            not need_weights,
            layer if alignment else None,
            project,
        )  # (B, T, V) or (B, T, D)
        found = {**attention, **encoded.attention} if need_weights else {}
        if alignment:
            found["alignment"] = [attention["cross"][layer][:, : self.cfg.alignment_heads]]  # (B, H_a, T, S)
        return out, found

    def decode_step(self, tokens: Tensor, state: Dict[str, object]) -> Tuple[Tensor, Dict[str, object]]:
        """One step: ``tokens`` ``(B,)`` -> logits ``(B, V)`` and the new state."""
        logits, state, _ = self.decode(tokens.unsqueeze(1), state, None)  # (B, 1, V)
        return logits[:, 0], state  # (B, V), state
