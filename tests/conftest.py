"""Shared fixtures (the shared plain functions are in helpers.py). The real Multi30k data is found
through one fixture, ``multi30k_dir``."""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest
from omegaconf import OmegaConf
from preloaded import PreloadedPopen

from helpers import (
    EVERY_CORE,
    ROOT,
    TrainedModel,
    compose,
    deadline,
    learning_overrides,
    synthetic_learning_overrides,
    train_once,
    write_slice,
)

TEST_SECONDS = 600  # far above the slowest test: a test that hangs fails, not the CI's whole budget


def pytest_configure(config):
    """A pytest-xdist worker (``make test`` runs one per core) keeps to a core of its own, it and the
    processes it starts (train.py and translate.py take their threads from the cores they may use):
    threads that outnumber the cores wait on each other many times over. The modules go to the
    workers in ``pytest_collection_modifyitems``'s order, not pytest-xdist's own (most tests first).
    The repository's scripts that a test runs with ``python SCRIPT`` start from a server that has
    imported torch already (``tests/preloaded.py``; ``TESTS_FRESH_PROCESSES=1``: each from nothing)."""
    if os.environ.get("TESTS_FRESH_PROCESSES") != "1":
        subprocess.Popen = PreloadedPopen
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's --no-loadscope-reorder
        config.option.loadscopereorder = False
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if worker and EVERY_CORE:
        cores = sorted(EVERY_CORE)
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})
        import torch

        torch.set_num_threads(1)


# The modules that take longest under `make test` (docs/development.md, "Where the suite's time
# goes"), longest first; the others follow in their own order.
LONGEST_FIRST = (
    "test_ctranslate2",  # its set-up trains the slice's Transformer and the attention variants
    "test_faults",
    "test_distributed",
    "test_align",
    "test_readme_commands",
    "test_store",
    "test_compare",
    "test_train_run",
    "test_bad_inputs",
    "test_viewer_browser",
    "test_benchmark",
)


def pytest_collection_modifyitems(config, items):
    """The longest modules first (``LONGEST_FIRST``), then those with slow tests, the order
    otherwise kept: pytest-xdist's workers take modules in this order, so the long ones start early
    and the workers end together, on the short ones."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}

    def rank(item) -> tuple:
        name = item.module.__name__
        first = LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
        return first, name not in slow_modules

    items.sort(key=rank)


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
    """A small real slice of Multi30k in the raw layout: 400 train, 40 val, 30 test pairs (written
    once per pytest run, read by every worker)."""
    sizes = {"train": 400, "val": 40, "test_2016_flickr": 30}
    return built_once(tmp_path_factory, "m30k_slice", lambda folder: write_slice(multi30k_dir, folder, sizes))


@pytest.fixture(scope="session")
def compose_config():
    """Compose ``conf/config.yaml`` with overrides through Hydra's compose API (``helpers.compose``)."""
    return compose


def built_once(
    tmp_path_factory, name: str, build: Callable[[Path], object], wait: bool = True
) -> Optional[Path]:
    """The folder ``name`` made by ``build(folder)`` once per pytest run and read by every test of
    it, in whichever pytest-xdist worker (``make test`` runs one per core): the workers share their base
    temporary folder's parent, and a file lock lets one build while the others wait (or, unless
    ``wait``, get None and do other work first). Tests only read what it holds."""
    from filelock import FileLock, Timeout

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder, done = base / "built_once" / name, base / "built_once" / f"{name}.done"
    folder.parent.mkdir(exist_ok=True)
    lock = FileLock(str(folder) + ".lock")
    try:
        lock.acquire(timeout=-1 if wait else 0)
    except Timeout:
        return None
    try:
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
            folder.mkdir()
            build(folder)
            done.touch()
    finally:
        lock.release()
    return folder


Overrides = Callable[[Path], List[str]]  # a data cache folder -> a run's overrides


def trained_once(
    tmp_path_factory, name: str, overrides: Overrides, wait: bool = True
) -> Optional[TrainedModel]:
    """A model trained for real with ``compose(overrides(cache))`` once per pytest run
    (``built_once``; None when another worker is training it and not ``wait``); in the worker that
    trained it the ``Trainer`` that did."""
    trained = {}

    def build(run: Path) -> None:
        trained["model"] = train_once(compose(overrides(run / "cache")), run)

    run = built_once(tmp_path_factory, name, build, wait)
    if run is None:
        return None
    if "model" in trained:
        return trained["model"]
    local = tmp_path_factory.mktemp(f"{name}_trainer")  # the folder of this worker's Trainer
    return TrainedModel.of_run(compose(overrides(run / "cache")), run, local)


def trained_all(tmp_path_factory, runs: Dict[str, Overrides]) -> Dict[str, TrainedModel]:
    """``{name: TrainedModel}`` of every run (``trained_once``): this worker first trains those no
    other worker is training, then waits for the rest, so that workers that need the same models
    at once train them side by side."""
    models: Dict[str, TrainedModel] = {}
    for wait in (False, True):
        for name, overrides in runs.items():
            if name not in models:
                found = trained_once(tmp_path_factory, name, overrides, wait)
                if found is not None:
                    models[name] = found
    return {name: models[name] for name in runs}


@pytest.fixture(scope="session")
def trained_slice_transformer(multi30k_slice, tmp_path_factory) -> TrainedModel:
    """A small Transformer trained for real (300 steps) on the first 200 training pairs of the
    slice, once per pytest run. The CTranslate2 tests export it and decode real sentences with
    both engines (a model that has memorised its pairs)."""
    return trained_once(
        tmp_path_factory,
        "learn_transformer",
        lambda cache: learning_overrides(multi30k_slice, cache, "transformer"),
    )


@pytest.fixture(scope="session")
def synthetic_corpus(tmp_path_factory) -> Path:
    """The synthetic reversal task (tests/synthetic.py) in the raw layout, for ``data.root``:
    3000 train, 100 val, 100 test_2016_flickr pairs of letters, the target the source reversed."""
    from synthetic import write_corpus

    return built_once(tmp_path_factory, "synthetic", write_corpus)


def synthetic_runs(prefix: str, corpus: Path, *extra: str) -> Dict[str, Overrides]:
    """``{prefix_family: overrides}``: each family on the synthetic task in ``corpus``
    (``SYNTHETIC_FAMILIES`` in helpers.py) with ``extra`` overrides."""
    return {
        f"{prefix}_{family}": lambda cache, family=family: synthetic_learning_overrides(
            corpus, cache, family, *extra
        )
        for family in ("rnn", "transformer")
    }


@pytest.fixture(scope="session")
def trained_synthetic_models(synthetic_corpus, tmp_path_factory) -> Dict[str, TrainedModel]:
    """Each family trained for real on the synthetic task (``SYNTHETIC_FAMILIES`` in helpers.py),
    once per pytest run. A model that has learnt the reversal translates unseen sequences: the
    learning test (test_synthetic.py) and the tests of what is done with a trained model
    (translate.py, its options, decoding tuning) use them."""
    models = trained_all(tmp_path_factory, synthetic_runs("synthetic", synthetic_corpus))
    return {family: models[f"synthetic_{family}"] for family in ("rnn", "transformer")}


@pytest.fixture(scope="session")
def trained_guided_models(synthetic_corpus, tmp_path_factory) -> Dict[str, TrainedModel]:
    """Each family trained as ``trained_synthetic_models`` is, with guided alignment on the task's
    true links (``trainer.guided_alignment=1.0``)."""
    from synthetic import write_reversal_links

    links = built_once(
        tmp_path_factory,
        "links",
        lambda folder: write_reversal_links(synthetic_corpus, folder / "reversal.txt"),
    )
    guided = [f"data.alignments={links / 'reversal.txt'}", "trainer.guided_alignment=1.0"]
    models = trained_all(tmp_path_factory, synthetic_runs("guided", synthetic_corpus, *guided))
    return {family: models[f"guided_{family}"] for family in ("rnn", "transformer")}


# name -> the family and its overrides: model.attention, and the steps, rate and batch it needs. On
# the reversal task the RNN's dot-product scores stay flat longer than the additive ones (at 400
# steps general reaches 56 BLEU, scaled_dot 1), and multi-head attention at the RNN's rate of 5e-3
# never leaves a fixed position (0 BLEU after 1,600 steps): at 1e-3 and 500 tokens a batch it
# reverses (93-100 BLEU at 1,000 steps over seeds 1-3; 83 at 1,000 tokens a batch).
ATTENTION_VARIANTS = {
    "rnn general": ("rnn", ["model.attention=general", "trainer.max_steps=800"]),
    "rnn scaled_dot": ("rnn", ["model.attention=scaled_dot", "trainer.max_steps=800"]),
    "rnn multihead": (
        "rnn",
        [
            "model.attention=multihead",
            "model.attention_heads=4",
            "trainer.max_steps=1000",
            "trainer.lr=1e-3",
            "trainer.batch_tokens=500",
        ],
    ),
    "transformer additive": ("transformer", ["model.attention=additive"]),
}


@pytest.fixture(scope="session")
def trained_attention_variants(synthetic_corpus, tmp_path_factory) -> Dict[str, TrainedModel]:
    """Every attention function of both families trained for real on the synthetic task, as the
    families' defaults are (``SYNTHETIC_FAMILIES``, with ``ATTENTION_VARIANTS``' changes): the defaults
    of ``trained_synthetic_models`` as "rnn additive" and "transformer scaled_dot", the other
    functions trained here, once per pytest run."""
    runs = synthetic_runs("synthetic", synthetic_corpus)  # the defaults: synthetic_rnn, synthetic_transformer
    names = {"rnn additive": "synthetic_rnn", "transformer scaled_dot": "synthetic_transformer"}
    for name, (family, attention) in ATTENTION_VARIANTS.items():
        names[name] = f"synthetic_{name.replace(' ', '_')}"
        runs[names[name]] = lambda cache, family=family, attention=attention: synthetic_learning_overrides(
            synthetic_corpus, cache, family, *attention
        )
    models = trained_all(tmp_path_factory, runs)
    return {name: models[run] for name, run in names.items()}
