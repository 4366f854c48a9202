"""The parts of a run that the trainer builds before its first step: the seeds, the model for the
tokenizer's vocabularies and the sampler of training segmentations (``data.sampling_alpha``)."""

import logging
import random
from typing import Optional

import torch
from torch import nn

from data.config import DataConfig
from data.corpus import TRAIN
from data.pipeline import PreparedData
from data.sampling import Resegmenter
from data.specials import PAD_ID
from data.tokenizer import Tokenizer
from models.build import ModelConfig, build_model

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def model_for(model_cfg: ModelConfig, tokenizer: Tokenizer) -> nn.Module:
    """The model of ``model_cfg`` for the tokenizer's vocabularies (with separate vocabularies the
    source and target embeddings cannot be shared, whatever ``model.share_embeddings`` says)."""
    if not tokenizer.joint and model_cfg.share_embeddings:
        log.info(
            "separate vocabularies (data.joint_vocab=false): source and target embeddings are not shared"
        )
        model_cfg.share_embeddings = False
    return build_model(model_cfg, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, PAD_ID)


def resegmenter(data: PreparedData, data_cfg: DataConfig, seed: int) -> Optional[Resegmenter]:
    """The sampler of training segmentations when ``data.sampling_alpha`` is set, else None."""
    if data_cfg.sampling_alpha is None:
        return None
    return Resegmenter(
        data.tokenizer, data.train_text, data.datasets[TRAIN], data_cfg.sampling_alpha, seed, data_cfg.max_len
    )
