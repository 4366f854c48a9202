"""Typed schema of the ``data`` config group. Its defaults are the default data set's, Multi30k
(``conf/data/multi30k.yaml`` adds its hub); each ``conf/data/*.yaml`` lists only what differs.

Plain dataclasses, no Hydra import: the training entry point registers them with Hydra's
ConfigStore so that a typo or a wrong type fails when the config is composed.
"""

import dataclasses
from dataclasses import dataclass
from typing import Dict, Optional


@dataclass
class FilePair:
    """The two sides of one split of ``data=files``: paths to aligned text files (plain or .gz)."""

    src: str = "???"
    tgt: str = "???"


@dataclass
class HubConfig:
    """Where a data set lives on the Hugging Face hub and how its records map to our splits."""

    path: str = "???"  # e.g. bentrevett/multi30k
    name: Optional[str] = None  # the data set's configuration, e.g. "de-en" for wmt/wmt14
    # Records are either {lang: text, ...} (field null) or {field: {lang: text, ...}}.
    field: Optional[str] = None
    # Our split name -> the hub's split name. Our names: train, val, test_* (like the raw layout).
    splits: Dict[str, str] = dataclasses.field(
        default_factory=lambda: {"train": "train", "val": "validation"}
    )


@dataclass
class DataConfig:
    name: str = "multi30k"
    src: str = "de"
    tgt: str = "en"
    # A local folder in the Multi30k raw layout ({split}.{lang}[.gz]); null: download from the hub.
    root: Optional[str] = None
    hub: Optional[HubConfig] = None
    # data=files: {"train": FilePair, "val": FilePair, "test_<name>": FilePair, ...}
    files: Optional[Dict[str, FilePair]] = None
    # Downloads and tokenizer models are cached here (relative paths: to the working directory).
    cache_dir: str = ".cache"
    train_limit: Optional[int] = None  # use only the first N training pairs
    max_len: int = 100  # training pairs with a side longer than this (subword tokens) are dropped
    # Training batches' lengths rounded up to a multiple of this (1: the longest pair's), in the
    # tensors and in trainer.batch_tokens alike: fewer shapes for trainer.compile and GPU kernels.
    pad_multiple: int = 1
    vocab_size: int = 8000
    joint_vocab: bool = True
    spm_model_type: str = "unigram"  # SentencePiece model: unigram or bpe
    # Subword regularization (Kudo 2018): each epoch segments every training sentence anew, drawn
    # from its 64 most likely unigram segmentations with probability P ** alpha (0: uniform, 1: the
    # model's; 0.1-0.5 usual), a function of (seed, epoch, pair); null: off. Unigram models only.
    # Validation and test text is never sampled.
    sampling_alpha: Optional[float] = None
    # Guided alignment's reference links of the training pairs, read only when trainer.guided_alignment
    # is above 0 (alignment/reference.py): a Pharaoh file (a line per training pair, "i-j" links of
    # space-separated words, from 0) or fast_align (computed over the training text, then cached); null: none.
    alignments: Optional[str] = "fast_align"


def data_config(node) -> DataConfig:
    """A composed ``data`` config node checked against the schema (unknown key or wrong type: error)."""
    from omegaconf import OmegaConf

    from common.settings import check_keys

    check_keys(node, DataConfig, "data")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), node))
    if cfg.pad_multiple < 1:
        raise ValueError(f"data.pad_multiple must be 1 or more (1: no rounding), got {cfg.pad_multiple}")
    if cfg.sampling_alpha is not None and not 0.0 <= cfg.sampling_alpha <= 1.0:
        raise ValueError(f"data.sampling_alpha must be in [0, 1] or null, got {cfg.sampling_alpha}")
    if cfg.sampling_alpha is not None and cfg.spm_model_type != "unigram":
        raise ValueError(
            "data.sampling_alpha samples the segmentations of a unigram model: set data.spm_model_type=unigram "
            "or data.sampling_alpha=null"
        )
    return cfg
