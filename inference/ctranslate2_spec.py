"""Our Transformer as a CTranslate2 model: its public ``TransformerSpec`` filled from our weights.

CTranslate2 (the C++ inference engine) describes a Transformer by a specification object whose
fields are the weight tensors under its own names. This module is the one map from our parameter
names (``models/transformer.py``) to those fields; it builds the spec and checks nothing else.

What the spec must be told explicitly, because its defaults differ from ours:

- the position table. Its built-in sinusoidal table follows OpenNMT-tf (sines and cosines in two
  halves); ours interleaves them (Vaswani et al. 2017, section 3.5), so our own table, or the
  learned one, is written into ``position_encodings``. Row ``p`` is position ``p`` from 0 on both
  sides;
- the LayerNorm epsilon (PyTorch's 1e-5, not its 1e-6);
- query, key and value projections: fused into one ``linear[0]`` for self-attention, key and value
  fused into ``linear[1]`` for cross-attention (the engine's layout), each with its bias;
- the final LayerNorms of both stacks exist in the pre-norm layout only, as in ours.

Embeddings are scaled by ``sqrt(D)`` in both; a shared or tied embedding is written to each slot.
"""

from typing import Dict, List, Tuple

import ctranslate2
import numpy as np
import torch
from torch import Tensor

from models.config import TransformerConfig

LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which every LayerNorm of ours uses


def as_array(tensor: Tensor) -> np.ndarray:
    """A float32 NumPy copy of a weight (the spec takes NumPy arrays)."""
    return tensor.detach().to(torch.float32).cpu().numpy().copy()


def set_linear(spec, weights: Dict[str, Tensor], *names: str) -> None:
    """Fill a ``LinearSpec`` from one or several of our ``nn.Linear`` (by prefix), fused along outputs."""
    spec.weight = np.concatenate([as_array(weights[f"{name}.weight"]) for name in names])  # (sum out, in)
    biases = [weights.get(f"{name}.bias") for name in names]
    if all(bias is not None for bias in biases):
        spec.bias = np.concatenate([as_array(bias) for bias in biases])  # (sum out,)


def set_layer_norm(spec, weights: Dict[str, Tensor], name: str) -> None:
    spec.gamma = as_array(weights[f"{name}.weight"])  # (D,)
    spec.beta = as_array(weights[f"{name}.bias"])  # (D,)


def set_feed_forward(spec, weights: Dict[str, Tensor], layer: str) -> None:
    """``W_2 ReLU(W_1 x)``: our ``net.0`` and ``net.3`` (``net.1`` is the ReLU, ``net.2`` dropout)."""
    set_linear(spec.linear_0, weights, f"{layer}.feed_forward.net.0")
    set_linear(spec.linear_1, weights, f"{layer}.feed_forward.net.3")
    set_layer_norm(spec.layer_norm, weights, f"{layer}.ff_residual.norm")


def set_self_attention(spec, weights: Dict[str, Tensor], attention: str, norm: str) -> None:
    set_linear(spec.linear[0], weights, f"{attention}.q_proj", f"{attention}.k_proj", f"{attention}.v_proj")
    set_linear(spec.linear[1], weights, f"{attention}.out_proj")
    set_layer_norm(spec.layer_norm, weights, norm)


def set_cross_attention(spec, weights: Dict[str, Tensor], attention: str, norm: str) -> None:
    set_linear(spec.linear[0], weights, f"{attention}.q_proj")
    set_linear(spec.linear[1], weights, f"{attention}.k_proj", f"{attention}.v_proj")
    set_linear(spec.linear[2], weights, f"{attention}.out_proj")
    set_layer_norm(spec.layer_norm, weights, norm)


def set_encoder(spec, weights: Dict[str, Tensor], positions: np.ndarray) -> None:
    spec.embeddings[0].weight = as_array(weights["src_embed.embedding.weight"])  # (V_src, D)
    spec.scale_embeddings = True
    spec.position_encodings.encodings = positions  # (max_positions, D)
    if hasattr(spec, "layer_norm"):  # pre-norm only
        set_layer_norm(spec.layer_norm, weights, "encoder_norm")
    for i, layer_spec in enumerate(spec.layer):
        layer = f"encoder_layers.{i}"
        set_self_attention(
            layer_spec.self_attention, weights, f"{layer}.self_attn", f"{layer}.attn_residual.norm"
        )
        set_feed_forward(layer_spec.ffn, weights, layer)


def set_decoder(spec, weights: Dict[str, Tensor], positions: np.ndarray) -> None:
    spec.embeddings.weight = as_array(weights["tgt_embed.embedding.weight"])  # (V_tgt, D)
    spec.scale_embeddings = True
    spec.position_encodings.encodings = positions  # (max_positions, D)
    if hasattr(spec, "layer_norm"):  # pre-norm only
        set_layer_norm(spec.layer_norm, weights, "decoder_norm")
    spec.projection.weight = as_array(weights["output.proj.weight"])  # (V_tgt, D), no bias
    for i, layer_spec in enumerate(spec.layer):
        layer = f"decoder_layers.{i}"
        set_self_attention(
            layer_spec.self_attention, weights, f"{layer}.self_attn", f"{layer}.self_residual.norm"
        )
        set_cross_attention(
            layer_spec.attention, weights, f"{layer}.cross_attn", f"{layer}.cross_residual.norm"
        )
        set_feed_forward(layer_spec.ffn, weights, layer)


def transformer_spec(
    cfg: TransformerConfig,
    weights: Dict[str, Tensor],
    positions: Tensor,
    src_vocab: List[str],
    tgt_vocab: List[str],
    alignment: Tuple[int, int],
) -> "ctranslate2.specs.TransformerSpec":
    """The spec of a Transformer with config ``cfg``, ``weights`` (its state dict), the position table
    ``positions`` ``(max_positions, D)`` it adds, and the pieces of its vocabularies in id order.

    ``alignment`` ``(layer, heads)``: the engine's alignment is decoder layer ``layer``'s (1-based)
    cross-attention averaged over its first ``heads`` heads, at the predicting step
    (``inference/ctranslate2_export.py``: ``export_method``).
    """
    layer, heads = alignment
    spec = ctranslate2.specs.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm == "pre",
        activation=ctranslate2.specs.Activation.RELU,
        alignment_layer=layer - 1 - cfg.decoder_layers,  # counted from the end: -1 is the last
        alignment_heads=heads,
    )
    table = as_array(positions)  # (max_positions, D)
    set_encoder(spec.encoder, weights, table)
    set_decoder(spec.decoder, weights, table)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.config.add_source_eos = False  # our translator appends </s> itself, as in training
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    return spec
