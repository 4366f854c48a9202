"""Typed configs of the two model families, with their defaults: the small models of
``conf/model/rnn.yaml`` and ``conf/model/transformer.yaml``; the larger ones list what differs.

Plain dataclasses, no Hydra: a model can be built in a notebook from ``RNNConfig()`` or
``TransformerConfig(d_model=512)``. The training entry point registers them as Hydra schemas, so
a typo or a wrong type in ``model.*`` fails when the config is composed.
"""

from dataclasses import dataclass, fields
from typing import Any, Dict, Union


@dataclass
class RNNConfig:
    """Bidirectional RNN encoder, RNN decoder with additive attention and input feeding."""

    name: str = "rnn"
    cell: str = "gru"  # gru or lstm (encoder and decoder)
    embed_dim: int = 256
    hidden_size: int = 256  # D: per direction in the encoder; the decoder state size
    encoder_layers: int = 1
    decoder_layers: int = 1
    attention_size: int = 256  # d_a, the hidden size of the additive score w_v^T tanh(W_q q + W_k k)
    dropout: float = 0.2  # on embeddings, between layers and on the pre-output layer
    tie_output: bool = True  # output projection shares the target embedding
    share_embeddings: bool = True  # one embedding for source and target (joint vocabulary only)


@dataclass
class TransformerConfig:
    """Encoder-decoder Transformer (Vaswani et al. 2017) built from ``MultiHeadAttention``."""

    name: str = "transformer"
    d_model: int = 256
    n_heads: int = 4
    ff_size: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1  # on embeddings, sub-layer outputs and inside the feed-forward block
    attention_dropout: float = 0.0
    norm: str = "pre"  # pre (LayerNorm before each sub-layer, a final LayerNorm) or post
    positions: str = "sinusoidal"  # sinusoidal or learned
    max_positions: int = 1024  # longest sequence learned positions cover
    tie_output: bool = True  # output projection shares the target embedding
    share_embeddings: bool = True  # one embedding for source and target (joint vocabulary only)


FAMILIES = {"rnn": RNNConfig, "transformer": TransformerConfig}  # model.name -> its config class


def config_from_dict(values: Dict[str, Any]) -> Union[RNNConfig, TransformerConfig]:
    """Plain values (a checkpoint's ``dataclasses.asdict``, an untyped config node) as the config
    of the family ``values["name"]`` names; ``ValueError`` naming an unknown family or key."""
    family = FAMILIES.get(values.get("name"))
    if family is None:
        raise ValueError(f"model.name must be one of {sorted(FAMILIES)}, got {values.get('name')!r}")
    unknown = sorted(set(values) - {f.name for f in fields(family)})
    if unknown:
        raise ValueError(f"model config has keys this version does not know: {', '.join(unknown)}")
    return family(**values)
