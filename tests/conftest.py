"""Shared fixtures. The real Multi30k data is found through one fixture, ``multi30k_dir``."""
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def multi30k_dir(tmp_path_factory) -> Path:
    """A folder of Multi30k in the raw layout: ``$MULTI30K_DIR``, else ``../shared/data/multi30k``
    beside the repository (CI has it), else the project's own download from the hub (skipped with
    the reason when that is unreachable)."""
    if os.environ.get("MULTI30K_DIR"):
        return Path(os.environ["MULTI30K_DIR"])
    beside = ROOT.parent / "shared" / "data" / "multi30k"
    if beside.is_dir():
        return beside
    from data.config import data_config
    from data.corpus import hub_cache_folder, load_corpus
    from data.errors import DataError

    cfg = data_config(OmegaConf.load(ROOT / "conf" / "data" / "multi30k.yaml"))
    cfg.cache_dir = str(ROOT / cfg.cache_dir)
    try:
        load_corpus(cfg)
    except DataError as error:
        pytest.skip(f"no Multi30k: set MULTI30K_DIR ({error})")
    return hub_cache_folder(cfg.cache_dir, cfg.hub)


@pytest.fixture(scope="session")
def multi30k_config(multi30k_dir):
    """Factory of Multi30k data configs (conf/data/multi30k.yaml) reading ``multi30k_dir``."""
    from data.config import data_config

    def make(cache_dir: Path, **overrides):
        node = OmegaConf.load(ROOT / "conf" / "data" / "multi30k.yaml")
        cfg = data_config(OmegaConf.merge(node, {"root": str(multi30k_dir), "cache_dir": str(cache_dir), **overrides}))
        return cfg

    return make
