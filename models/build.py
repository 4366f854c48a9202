"""``build_model``: the one place that turns a model config into a model."""
from dataclasses import fields
from typing import Any, Dict, Union

from torch import nn

from models.config import FAMILIES, RNNConfig, TransformerConfig
from models.rnn import RNNModel
from models.transformer import Transformer

ModelConfig = Union[RNNConfig, TransformerConfig]


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0) -> nn.Module:
    """A model of the family ``cfg`` names (``RNNConfig`` -> ``RNNModel``, ``TransformerConfig`` -> ``Transformer``)."""
    if isinstance(cfg, RNNConfig):
        return RNNModel(cfg, src_vocab_size, tgt_vocab_size, pad_id)
    elif isinstance(cfg, TransformerConfig):
        return Transformer(cfg, src_vocab_size, tgt_vocab_size, pad_id)
    raise TypeError(f"unknown model config {type(cfg).__name__}: expected RNNConfig or TransformerConfig")


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def config_from_dict(values: Dict[str, Any]) -> ModelConfig:
    """The model config saved in a checkpoint (``dataclasses.asdict``) as its dataclass again.

    Raises ``ValueError`` naming an unknown family or keys this version does not know.
    """
    family = FAMILIES.get(values.get("name"))
    if family is None:
        raise ValueError(f"unknown model family {values.get('name')!r} (expected one of {sorted(FAMILIES)})")
    unknown = sorted(set(values) - {f.name for f in fields(family)})
    if unknown:
        raise ValueError(f"model config has keys this version does not know: {', '.join(unknown)}")
    return family(**values)
