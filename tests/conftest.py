"""Shared fixtures. The real Multi30k data is found through one fixture, ``multi30k_dir``."""

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
TINY_RNN = [
    "model=rnn",
    "model.embed_dim=32",
    "model.hidden_size=32",
    "model.attention_size=32",
]  # 50k parameters


def tiny_run(run_dir: Path, data_root: Path, cache: Path, *extra: str):
    """``train.py`` overrides of a quick run of the tiny RNN in ``run_dir``: no epoch limit, no
    attention images, greedy test decoding, one thread; ``extra`` sets the steps and the rest."""
    return [
        f"hydra.run.dir={run_dir}",
        f"data.root={data_root}",
        f"data.cache_dir={cache}",
        "data.vocab_size=500",
        *TINY_RNN,
        "trainer.max_epochs=null",
        "trainer.attention_samples=0",
        "trainer.beam_size=1",
        "trainer.num_threads=1",
        *extra,
    ]


def scalars(tb_dir: Path, tag: str):
    """``{step: value}`` of one scalar tag in a run's TensorBoard events (all of them kept)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write into; the test is skipped for a user that ignores
    permissions (root), where the folder stays writable."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user can write into read-only folders")
        yield locked
    finally:
        locked.chmod(0o700)


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
        cfg = data_config(
            OmegaConf.merge(node, {"root": str(multi30k_dir), "cache_dir": str(cache_dir), **overrides})
        )
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
    return write_slice(
        multi30k_dir, tmp_path_factory.mktemp("m30k_slice"), {"train": 400, "val": 40, "test_2016_flickr": 30}
    )


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


LEARNING_PAIRS = 200
LEARNING_FAMILIES = {
    "transformer": [
        "model=transformer",
        "model.d_model=128",
        "model.n_heads=4",
        "model.ff_size=256",
        "model.encoder_layers=2",
        "model.decoder_layers=2",
        "model.dropout=0.0",
        "trainer.lr=2e-3",
        "trainer.max_steps=300",
    ],
    "rnn": [
        "model=rnn",
        "model.embed_dim=128",
        "model.hidden_size=128",
        "model.attention_size=128",
        "model.dropout=0.0",
        "trainer.lr=5e-3",
        "trainer.max_steps=300",
    ],
}


@pytest.fixture(scope="session")
def trained_slice_models(multi30k_slice, compose_config, tmp_path_factory):
    """Each family trained for real (300 steps) on the first 200 training pairs of the slice, once
    per session; ``{family: (trainer, checkpoint path, seconds)}``. Used by the learning test and
    by the translate.py tests (a model that has memorised its training pairs translates them)."""
    import time

    from training.trainer import Trainer

    models = {}
    for family, extra in LEARNING_FAMILIES.items():
        run = tmp_path_factory.mktemp(f"learn_{family}")
        overrides = [
            f"data.root={multi30k_slice}",
            f"data.cache_dir={run / 'cache'}",
            f"data.train_limit={LEARNING_PAIRS}",
            "data.vocab_size=600",
            "trainer.batch_tokens=2000",
            "trainer.schedule=constant",
            "trainer.warmup_steps=20",
            "trainer.label_smoothing=0.0",
            "trainer.eval_every=1000000",
            "trainer.log_every=1000000",
            "trainer.patience=null",
            "trainer.max_epochs=null",
            "trainer.attention_samples=0",
            *extra,
        ]
        trainer = Trainer(compose_config(overrides), run)
        start = time.perf_counter()
        trainer.fit()  # trainer.max_steps, then one evaluation that writes last.pt and best.pt
        trainer.close()
        models[family] = (trainer, run / "checkpoints" / "last.pt", time.perf_counter() - start)
    return models
