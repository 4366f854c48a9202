"""``build_model``: the one place that turns a model config into a model."""

from typing import Union

from torch import nn

from models.config import RNNConfig, TransformerConfig
from models.rnn import RNNModel
from models.transformer import Transformer

ModelConfig = Union[RNNConfig, TransformerConfig]


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0) -> nn.Module:
    """A model of the family ``cfg`` names (``RNNConfig`` -> ``RNNModel``, ``TransformerConfig`` ->
    ``Transformer``)."""
    if isinstance(cfg, RNNConfig):
        return RNNModel(cfg, src_vocab_size, tgt_vocab_size, pad_id)
    elif isinstance(cfg, TransformerConfig):
        return Transformer(cfg, src_vocab_size, tgt_vocab_size, pad_id)
    raise TypeError(f"unknown model config {type(cfg).__name__}: expected RNNConfig or TransformerConfig")


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
