"""Shared fixtures (the shared plain functions are in helpers.py). The real Multi30k data is found
through one fixture, ``multi30k_dir``."""

import os
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from helpers import ROOT, compose, deadline, learning_overrides, train_once, write_slice

TEST_SECONDS = 600  # far above the slowest test: a test that hangs fails, not the CI's whole budget


@pytest.fixture(autouse=True)
def no_test_hangs(request):
    """Every test fails with ``Hung`` after ``TEST_SECONDS`` (pytest.ini's faulthandler_timeout
    prints every thread's stack before that)."""
    with deadline(TEST_SECONDS, request.node.nodeid):
        yield


@pytest.fixture(autouse=True)
def torch_threads_as_they_were():
    """torch's thread count back after each test (a Trainer or ``translate.py --threads`` run in
    this process sets it): the kernels' sums, and so the near ties, do not depend on test order."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    if threads is not None:
        torch.set_num_threads(threads)


@pytest.fixture
def seed():
    """torch's global generator seeded (0) before the test: its random tensors and initial weights
    are the same in every run. A module of such tests uses it in all of them with
    ``pytestmark = pytest.mark.usefixtures("seed")``."""
    import torch

    torch.manual_seed(0)


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
    from common.files import write_lines
    from data.config import data_config
    from data.errors import DataError
    from data.sources import corpus_splits

    cfg = data_config(OmegaConf.load(ROOT / "conf" / "data" / "multi30k.yaml"))
    cfg.cache_dir = str(ROOT / cfg.cache_dir)
    folder = Path(cfg.cache_dir) / "multi30k-raw"  # the hub's records as the raw layout, for the tests
    if not (folder / "done").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            for split, source in corpus_splits(cfg).items():
                pairs = list(source.pairs())
                write_lines(folder / f"{split}.{cfg.src}", [s for s, _ in pairs])
                write_lines(folder / f"{split}.{cfg.tgt}", [t for _, t in pairs])
        except DataError as error:
            pytest.skip(f"no Multi30k: set MULTI30K_DIR ({error})")
        (folder / "done").touch()
    return folder


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


@pytest.fixture(scope="session")
def multi30k_slice(multi30k_dir, tmp_path_factory) -> Path:
    """A small real slice of Multi30k in the raw layout: 400 train, 40 val, 30 test pairs."""
    return write_slice(
        multi30k_dir, tmp_path_factory.mktemp("m30k_slice"), {"train": 400, "val": 40, "test_2016_flickr": 30}
    )


@pytest.fixture(scope="session")
def compose_config():
    """Compose ``conf/config.yaml`` with overrides through Hydra's compose API (``helpers.compose``)."""
    return compose


@pytest.fixture(scope="session")
def trained_slice_transformer(multi30k_slice, compose_config, tmp_path_factory):
    """A small Transformer trained for real (300 steps) on the first 200 training pairs of the
    slice, once per session: ``(trainer, checkpoint path, seconds)``. The CTranslate2 tests export
    it and decode real sentences with both engines (a model that has memorised its pairs)."""
    run = tmp_path_factory.mktemp("learn_transformer")
    return train_once(compose_config(learning_overrides(multi30k_slice, run / "cache", "transformer")), run)


@pytest.fixture(scope="session")
def synthetic_corpus(tmp_path_factory) -> Path:
    """The synthetic reversal task (tests/synthetic.py) in the raw layout, for ``data.root``:
    3000 train, 100 val, 100 test_2016_flickr pairs of letters, the target the source reversed."""
    from synthetic import write_corpus

    return write_corpus(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="session")
def trained_synthetic_models(synthetic_corpus, compose_config, tmp_path_factory):
    """Each family trained for real on the synthetic task (``SYNTHETIC_FAMILIES`` in helpers.py),
    once per session; ``{family: (trainer, checkpoint path, seconds)}``. A model that has learnt
    the reversal translates unseen sequences: the learning test (test_synthetic.py) and the tests of what is done
    with a trained model (translate.py, its options, decoding tuning) use them."""
    from helpers import synthetic_learning_overrides

    models = {}
    for family in ("rnn", "transformer"):
        run = tmp_path_factory.mktemp(f"synthetic_{family}")
        models[family] = train_once(
            compose_config(synthetic_learning_overrides(synthetic_corpus, run / "cache", family)), run
        )
    return models


@pytest.fixture(scope="session")
def trained_guided_models(synthetic_corpus, compose_config, tmp_path_factory):
    """Each family trained as ``trained_synthetic_models`` is, with guided alignment on the task's true
    links (``trainer.guided_alignment=1.0``); ``{family: (trainer, checkpoint path, seconds)}``."""
    from synthetic import write_reversal_links

    from helpers import synthetic_learning_overrides

    links = write_reversal_links(synthetic_corpus, tmp_path_factory.mktemp("links") / "reversal.txt")
    models = {}
    for family in ("rnn", "transformer"):
        run = tmp_path_factory.mktemp(f"guided_{family}")
        guided = [f"data.alignments={links}", "trainer.guided_alignment=1.0"]
        overrides = synthetic_learning_overrides(synthetic_corpus, run / "cache", family, *guided)
        models[family] = train_once(compose_config(overrides), run)
    return models


# name -> the family and its overrides: model.attention, and the steps and rate it needs. On the
# reversal task the RNN's dot-product scores stay flat longer than the additive ones (at 400 steps
# general reaches 56 BLEU, scaled_dot 1), and multi-head attention at the RNN's rate of 5e-3 never
# leaves a fixed position (0 BLEU after 1,600 steps): at 1e-3 it reverses (95 BLEU at 1,000 steps).
ATTENTION_VARIANTS = {
    "rnn general": ("rnn", ["model.attention=general", "trainer.max_steps=800"]),
    "rnn scaled_dot": ("rnn", ["model.attention=scaled_dot", "trainer.max_steps=800"]),
    "rnn multihead": (
        "rnn",
        ["model.attention=multihead", "model.attention_heads=4", "trainer.max_steps=1000", "trainer.lr=1e-3"],
    ),
    "transformer additive": ("transformer", ["model.attention=additive"]),
}


@pytest.fixture(scope="session")
def trained_attention_variants(synthetic_corpus, trained_synthetic_models, compose_config, tmp_path_factory):
    """Every attention function of both families trained for real on the synthetic task, as the
    families' defaults are (``SYNTHETIC_FAMILIES``, with ``ATTENTION_VARIANTS``' changes): the defaults
    of ``trained_synthetic_models`` as "rnn additive" and "transformer scaled_dot", the other
    functions trained here once per session; ``{name: (trainer, checkpoint path, seconds)}``."""
    from helpers import synthetic_learning_overrides

    models = {
        "rnn additive": trained_synthetic_models["rnn"],
        "transformer scaled_dot": trained_synthetic_models["transformer"],
    }
    for name, (family, attention) in ATTENTION_VARIANTS.items():
        run = tmp_path_factory.mktemp(f"synthetic_{name.replace(' ', '_')}")
        overrides = synthetic_learning_overrides(synthetic_corpus, run / "cache", family, *attention)
        models[name] = train_once(compose_config(overrides), run)
    return models
