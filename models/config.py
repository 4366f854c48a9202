"""Typed configs of the two model families, with their defaults: the small models of
``conf/model/rnn.yaml`` and ``conf/model/transformer.yaml``; the larger ones list what differs.

Plain dataclasses, no Hydra: a model can be built in a notebook from ``RNNConfig()`` or
``TransformerConfig(d_model=512)``. The training entry point registers them as Hydra schemas, so
a typo or a wrong type in ``model.*`` fails when the config is composed. A value out of range fails
when the config is built (``check_values``), in one line naming the key: before any data is read.
"""

from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple, Union

SIZES = (  # the keys that count something: at least 1
    "embed_dim",
    "hidden_size",
    "encoder_layers",
    "decoder_layers",
    "attention_size",
    "d_model",
    "n_heads",
    "ff_size",
    "max_positions",
    "attention_heads",
)
CHOICES = {"cell": ("gru", "lstm"), "norm": ("pre", "post"), "positions": ("sinusoidal", "learned")}
ATTENTION = {  # model.attention of each family
    "rnn": ("additive", "general", "scaled_dot", "multihead"),
    "transformer": ("scaled_dot", "additive"),
}
RATES = ("dropout", "attention_dropout", "activation_dropout")  # probabilities of dropping: in [0, 1)
NULL_RATES = ("activation_dropout",)  # null: another rate's value (models/transformer.py)


def value_problem(cfg: Any) -> Tuple[str, str]:
    """The first value of a model config out of its range, as (key, what is wrong); ("", "") if none."""
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    for key in SIZES:
        if key in values and values[key] < 1:
            return key, f"must be at least 1, got {values[key]}"
    for key, allowed in CHOICES.items():
        if key in values and values[key] not in allowed:
            return key, f"must be {' or '.join(allowed)}, got {values[key]!r}"
    if values["attention"] not in ATTENTION[values["name"]]:
        return "attention", f"must be {' or '.join(ATTENTION[values['name']])}, got {values['attention']!r}"
    if values.get("qk_norm") and values["attention"] == "additive":
        return (
            "qk_norm",
            "normalises the queries and keys of a dot product; additive attention has none: leave it false",
        )
    key, problem = alignment_problem(cfg)
    if key:
        return key, problem
    for key in RATES:
        if key not in values or (values[key] is None and key in NULL_RATES):
            continue
        if values[key] is None or not 0.0 <= values[key] < 1.0:
            return key, f"must be in [0, 1), got {values[key]}"
    if values.get("attention") == "multihead" and values["attention_size"] % values["attention_heads"]:
        return "attention_size", (
            f"({values['attention_size']}) must be divisible by model.attention_heads "
            f"({values['attention_heads']}): each head takes attention_size / attention_heads dimensions"
        )
    if "n_heads" in values and values["d_model"] % values["n_heads"]:
        return "d_model", (
            f"({values['d_model']}) must be divisible by model.n_heads ({values['n_heads']}): each head "
            "takes d_model / n_heads dimensions"
        )
    return "", ""


def attention_layers(cfg: Any) -> int:
    """The model's cross-attention layers: the Transformer's decoder layers; the RNN's one attention."""
    return cfg.decoder_layers if cfg.name == "transformer" else 1


def heads_per_layer(cfg: Any) -> int:
    """The heads of each cross-attention layer."""
    if cfg.name == "transformer":
        return cfg.n_heads
    return cfg.attention_heads if cfg.attention == "multihead" else 1


def alignment_layer(cfg: Any) -> int:
    """The (1-based) cross-attention layer that guided alignment trains: ``model.alignment_layer``, or by
    default the second-to-last (the only one of a one-layer decoder)."""
    if cfg.alignment_layer is not None:
        return cfg.alignment_layer
    return max(1, attention_layers(cfg) - 1)


def alignment_problem(cfg: Any) -> Tuple[str, str]:
    """``model.alignment_layer`` or ``model.alignment_heads`` out of the model's range, as (key, what is
    wrong); ("", "") if neither."""
    layers, heads = attention_layers(cfg), heads_per_layer(cfg)
    if cfg.alignment_layer is not None and not 1 <= cfg.alignment_layer <= layers:
        return "alignment_layer", (
            f"must be a cross-attention layer from 1 to {layers} (or null: the second-to-last), "
            f"got {cfg.alignment_layer}"
        )
    if not 1 <= cfg.alignment_heads <= heads:
        return "alignment_heads", f"must be from 1 to the layer's {heads} head(s), got {cfg.alignment_heads}"
    return "", ""


def check_values(cfg: Any) -> None:
    """``ValueError`` naming the first key of ``cfg`` whose value is out of range (``value_problem``)."""
    key, problem = value_problem(cfg)
    if key:
        raise ValueError(f"model.{key} {problem}")


@dataclass
class RNNConfig:
    """Bidirectional RNN encoder, RNN decoder with attention (additive by default) and input feeding."""

    name: str = "rnn"
    cell: str = "gru"  # gru or lstm (encoder and decoder)
    embed_dim: int = 256
    hidden_size: int = 256  # D: per direction in the encoder; the decoder state size
    encoder_layers: int = 1
    decoder_layers: int = 1
    # The decoder's attention over the encoder states: additive, general, scaled_dot (one head) or
    # multihead (attention_heads heads); each one's formula is in its class, models/attention.py.
    attention: str = "additive"
    attention_size: int = 256  # d_a of additive, d_k of scaled_dot, heads x d_k of multihead
    attention_heads: int = 4  # heads of multihead attention (the other choices have one)
    qk_norm: bool = False  # general, scaled_dot, multihead: unit queries and keys, a learned scale
    # Guided alignment (trainer.guided_alignment) trains the mean of the first alignment_heads heads
    # of the attention (one but for multihead); alignment_layer: 1 or null (the RNN has one).
    alignment_layer: Optional[int] = None
    alignment_heads: int = 1
    dropout: float = 0.2  # on embeddings, between layers and on the pre-output layer
    tie_output: bool = True  # output projection shares the target embedding
    share_embeddings: bool = True  # one embedding for source and target (joint vocabulary only)

    def __post_init__(self) -> None:
        check_values(self)


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
    # inside the feed-forward block, after the ReLU (null: dropout; fairseq's --activation-dropout)
    activation_dropout: Optional[float] = None
    # Every attention of the model (encoder self, decoder self, cross): scaled_dot (multi-head) or
    # additive (multi-head additive); each one's formula is in its class, models/attention.py.
    attention: str = "scaled_dot"
    qk_norm: bool = False  # scaled_dot: unit queries and keys per head, a learned scale (Henry et al. 2020)
    # Guided alignment (trainer.guided_alignment) trains the mean of the first alignment_heads heads of
    # the cross-attention of decoder layer alignment_layer (1-based; null: the second-to-last, as
    # fairseq's transformer_align; docs/alignment.md).
    alignment_layer: Optional[int] = None
    alignment_heads: int = 1
    norm: str = "pre"  # pre (LayerNorm before each sub-layer, a final LayerNorm) or post
    positions: str = "sinusoidal"  # sinusoidal or learned
    max_positions: int = 1024  # longest sequence learned positions cover
    tie_output: bool = True  # output projection shares the target embedding
    share_embeddings: bool = True  # one embedding for source and target (joint vocabulary only)

    def __post_init__(self) -> None:
        check_values(self)


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
