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


def write_slice(source: Path, target: Path, sizes) -> Path:
    """Copy the first ``sizes[split]`` lines of each split of a raw-layout folder into ``target``."""
    from data.corpus import read_lines, split_files

    target.mkdir(parents=True, exist_ok=True)
    for split, langs in split_files(source).items():
        if split not in sizes:
            continue
        for lang, path in langs.items():
            lines = read_lines(path)[: sizes[split]]
            (target / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return target


@pytest.fixture(scope="session")
def multi30k_slice(multi30k_dir, tmp_path_factory) -> Path:
    """A small real slice of Multi30k in the raw layout: 400 train, 40 val, 30 test pairs."""
    return write_slice(multi30k_dir, tmp_path_factory.mktemp("m30k_slice"), {"train": 400, "val": 40, "test_2016_flickr": 30})


@pytest.fixture(scope="session")
def compose_config():
    """Compose ``conf/config.yaml`` with overrides through Hydra's compose API."""
    from hydra import compose, initialize_config_dir

    from training.config import register_configs

    register_configs()

    def make(overrides):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return compose("config", overrides=list(overrides))

    return make
