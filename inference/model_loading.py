"""A model from its checkpoint: the config, the tokenizer and the weights a checkpoint holds, built
back into a model ready to translate (or to be averaged, exported, benchmarked)."""

from pathlib import Path
from typing import Any, Dict, Tuple

import torch
from torch import nn

from common.checkpoint import CheckpointError, load_checkpoint
from data.specials import PAD_ID
from data.tokenizer import Tokenizer
from models.build import build_model
from models.config import config_from_dict


def weights_mismatch(expected: Dict[str, Any], given: Dict[str, Any]) -> str:
    """How the weights ``given`` differ from a model's ``expected`` state dict, in one line; empty
    when they fit. Weights of the other model family show as missing and unexpected names."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    shapes = [
        k
        for k in sorted(set(expected) & set(given))
        if not isinstance(given[k], torch.Tensor) or given[k].shape != expected[k].shape
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} weights missing, e.g. {missing[0]}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected, e.g. {unexpected[0]}")
    if shapes:
        k = shapes[0]
        got = tuple(given[k].shape) if isinstance(given[k], torch.Tensor) else type(given[k]).__name__
        parts.append(f"{len(shapes)} of another shape, e.g. {k} {got} instead of {tuple(expected[k].shape)}")
    return "; ".join(parts)


def load_model(path: Path, device: Any = "cpu") -> Tuple[nn.Module, Tokenizer, Dict[str, Any]]:
    """The model (in eval mode, on ``device``) and the tokenizer of a checkpoint, and the checkpoint.

    Everything comes from the file: model config, weights and SentencePiece models.
    """
    return model_of(load_checkpoint(path), path, device)


def model_of(
    payload: Dict[str, Any], path: Path, device: Any = "cpu"
) -> Tuple[nn.Module, Tokenizer, Dict[str, Any]]:
    """``load_model`` of a checkpoint already read from ``path`` (named in the errors)."""
    if "tokenizer" not in payload:
        raise CheckpointError(f"{path} holds no tokenizer (not a checkpoint of this project)")
    try:
        cfg = config_from_dict(dict(payload["model_config"]))
        tokenizer = Tokenizer.from_state_dict(payload["tokenizer"])
        model = build_model(cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, PAD_ID)
        mismatch = weights_mismatch(model.state_dict(), payload["model"])
        if mismatch:
            raise ValueError(f"model {cfg.name}: {mismatch}")
    except (ValueError, TypeError, KeyError, RuntimeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint {path} does not match its model config ({first})") from None
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), tokenizer, payload
