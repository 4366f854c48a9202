"""Where a corpus comes from: the splits the data config names, from its ``files``, else its ``root``
folder (``data/corpus.py``), else the Hugging Face hub (``data/hub.py``). Nothing is read yet."""

from pathlib import Path

from data.config import DataConfig
from data.corpus import Corpus, folder_splits, own_splits
from data.errors import DataError
from data.hub import hub_splits


def corpus_splits(cfg: DataConfig) -> Corpus:
    """The splits the config names: ``files``, else ``root``, else the hub. Nothing is read yet."""
    if cfg.src == cfg.tgt:
        raise DataError(f"data.src and data.tgt are both '{cfg.src}': choose two different languages")
    if cfg.files:
        return own_splits(cfg.files)
    if cfg.root:
        return folder_splits(Path(cfg.root), cfg.src, cfg.tgt)
    if cfg.hub:
        return hub_splits(cfg)
    raise DataError("the data config names no source: set data.root=DIR, data.files or data.hub")
