"""The token store (data/store.py) through prepare_data: built once, reused without reading the
text, rebuilt when a file or an option changes, never used damaged; parallel encoding."""

import logging
import multiprocessing
import os
import signal
import socket
import stat
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from data.config import data_config
from data.corpus import folder_splits
from data.encoding import chunked, encode_chunks, encode_pairs
from data.errors import DataError
from data.pipeline import TrainText, prepare_data
from data.store import MANIFEST
from data.tokenizer import normalize

from helpers import deadline, read_all, write_slice


@pytest.fixture
def corpus(multi30k_dir, tmp_path) -> Path:
    return write_slice(multi30k_dir, tmp_path / "m30k", {"train": 3000, "val": 60, "test_2016_flickr": 50})


def config(root: Path, cache: Path, **overrides):
    node = {
        "root": root and str(root),
        "cache_dir": str(cache),
        "vocab_size": 1000,
        "max_len": 30,
        **overrides,
    }
    return data_config(node)


def stores(cache: Path):
    return sorted(path.name for path in (cache / "store").iterdir())


def snapshot(data):
    """Copies of everything prepare_data gave (the arrays are maps of files a test may damage)."""
    arrays = {
        (split, side, part): np.array(getattr(getattr(dataset, side), part))
        for split, dataset in data.datasets.items()
        for side in ("src", "tgt")
        for part in ("ids", "lengths")
    }
    return arrays, data.sources, data.references


def same_data(a, b) -> bool:
    """Whether two snapshots hold the same arrays and text."""
    (arrays_a, *text_a), (arrays_b, *text_b) = a, b
    same_arrays = all(np.array_equal(arrays_a[key], arrays_b[key]) for key in arrays_a)
    return arrays_a.keys() == arrays_b.keys() and same_arrays and text_a == text_b


def test_the_store_holds_what_the_text_encodes_to(corpus, tmp_path):
    data = prepare_data(config(corpus, tmp_path / "cache"))
    raw = read_all(folder_splits(corpus, "de", "en"))
    tok = data.tokenizer
    for split in ("val", "test_2016_flickr"):  # whole, in order, raw text kept for sacrebleu
        assert data.sources[split] == [s for s, _ in raw[split]]
        assert data.references[split] == [t for _, t in raw[split]]
        assert [data.datasets[split].src[i] for i in range(len(raw[split]))] == tok.encode_src(
            data.sources[split]
        )
    train = data.datasets["train"]
    kept = [
        (s, t)
        for s, t in raw["train"]
        if len(tok.encode_src([s])[0]) <= 30 and len(tok.encode_tgt([t])[0]) <= 30
    ]
    assert len(train) == len(kept) == 3000 - data.stats["dropped_long"] > 0
    assert train.tgt[5] == tok.encode_tgt([kept[5][1]])[0]
    assert tok.decode_tgt([train.tgt[5]]) == [normalize(kept[5][1])]
    assert train.src.ids.dtype == np.uint16 and isinstance(train.src.ids, np.memmap)


def test_a_second_run_maps_the_store_without_reading_the_text(corpus, tmp_path, caplog):
    cfg = config(corpus, tmp_path / "cache")
    first = prepare_data(cfg)
    # the training files' bytes replaced, their size and time kept: a run that read them would differ
    for path in (corpus / "train.de", corpus / "train.en"):
        info = path.stat()
        path.write_bytes(b"x" * info.st_size)
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    with caplog.at_level(logging.INFO, logger="data.pipeline"):
        second = prepare_data(cfg)
    assert "using the token store" in caplog.text
    assert same_data(snapshot(first), snapshot(second)) and list(second.stats["seconds"]) == ["store"]
    assert len(stores(tmp_path / "cache")) == 1


def test_a_changed_file_or_option_gets_its_own_store(corpus, tmp_path):
    cache = tmp_path / "cache"
    first = prepare_data(config(corpus, cache))
    prepare_data(config(corpus, cache, max_len=20))
    assert len(stores(cache)) == 2
    with open(corpus / "val.en", "a") as out:  # a line more on both sides
        out.write("One more dog.\n")
    with open(corpus / "val.de", "a") as out:
        out.write("Noch ein Hund.\n")
    changed = prepare_data(config(corpus, cache))
    assert len(stores(cache)) == 3
    assert changed.references["val"] == first.references["val"] + ["One more dog."]
    sampled = prepare_data(config(corpus, cache, sampling_alpha=0.2))  # sampling reads the store's text
    assert len(stores(cache)) == 3
    src_text, tgt_text = sampled.train_text  # the kept pairs' text, aligned with their ids
    train = sampled.datasets["train"]
    for i in (0, 3, len(train) - 1):
        assert sampled.tokenizer.encode_src([src_text[i]])[0] == train.src[i]
        assert sampled.tokenizer.encode_tgt([tgt_text[i]])[0] == train.tgt[i]


@pytest.mark.parametrize(
    "damage", ["flipped byte", "truncated", "missing file", "no manifest", "bad manifest"]
)
def test_a_damaged_store_is_built_again_not_used(corpus, tmp_path, caplog, damage):
    cfg = config(corpus, tmp_path / "cache")
    prepared = prepare_data(cfg)
    first, folder = snapshot(prepared), prepared.store
    ids = folder / "train.src.ids"
    if damage == "flipped byte":
        raw = bytearray(ids.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        ids.write_bytes(bytes(raw))
    elif damage == "truncated":
        ids.write_bytes(ids.read_bytes()[:-2])
    elif damage == "missing file":
        (folder / "val.tgt.text").unlink()
    elif damage == "no manifest":
        (folder / MANIFEST).unlink()
    else:
        (folder / MANIFEST).write_text('{"format": 1}')  # JSON, but not a manifest
    with caplog.at_level(logging.WARNING, logger="data.store"):
        again = prepare_data(cfg)
    assert "is damaged" in caplog.text and "removing it" in caplog.text
    assert same_data(first, snapshot(again)) and "encode" in again.stats["seconds"]


def test_a_build_cut_short_leaves_no_store(corpus, tmp_path):
    (corpus / "val.en").write_text("only one line\n")  # the build fails at the validation split
    cache = tmp_path / "cache"
    with pytest.raises(Exception, match="val.de has 60 lines but .*val.en has 1"):
        prepare_data(config(corpus, cache))
    assert stores(cache) == []  # no folder, not even a temporary one


@pytest.mark.parametrize("method", [None, "spawn"])  # spawn: where there is no fork (macOS, Windows)
def test_parallel_encoding_gives_the_serial_ids(corpus, tmp_path, method):
    tokenizer = prepare_data(config(corpus, tmp_path / "cache")).tokenizer
    text = TrainText(folder_splits(corpus, "de", "en")["train"], None)
    serial_src, serial_tgt = encode_pairs(tokenizer, list(text))
    parts = list(encode_chunks(chunked(text, 170), tokenizer, workers=2, method=method))
    assert sum(len(chunk) for chunk, _, _ in parts) == 3000 and len(parts) == 18
    assert np.array_equal(np.concatenate([src.ids for _, src, _ in parts]), serial_src.ids)
    assert np.array_equal(np.concatenate([tgt.lengths for _, _, tgt in parts]), serial_tgt.lengths)


def test_a_killed_encoding_worker_fails_the_build_instead_of_hanging(corpus, tmp_path):
    """Killed at whatever point it has reached (reading a chunk, encoding, halfway through sending
    its ids): the build fails at once and leaves no process behind."""
    tokenizer = prepare_data(config(corpus, tmp_path / "cache")).tokenizer
    pairs = list(TrainText(folder_splits(corpus, "de", "en")["train"], None))
    for victim in (0, 1):
        with (
            deadline(60, "encoding with a killed worker"),
            closing(encode_chunks(chunked(pairs * 20, 500), tokenizer, workers=2)) as stream,
        ):
            next(stream)
            workers = multiprocessing.active_children()
            assert len(workers) == 2
            os.kill(workers[victim].pid, signal.SIGKILL)
            with pytest.raises(DataError, match="a worker encoding the training text died"):
                for _ in stream:
                    pass
        assert multiprocessing.active_children() == []


def test_an_encoding_error_in_a_worker_is_one_error_and_an_early_stop_ends_the_workers(corpus, tmp_path):
    tokenizer = prepare_data(config(corpus, tmp_path / "cache")).tokenizer
    failing = [[("ein Hund", "a dog")], [(None, "no source")]]
    with (
        deadline(60, "encoding a chunk that fails"),
        closing(encode_chunks(failing, tokenizer, workers=2)) as stream,
    ):
        next(stream)
        with pytest.raises(DataError, match="encoding the training text failed in a worker: TypeError"):
            next(stream)
    assert multiprocessing.active_children() == []
    with deadline(60, "closing the encoding early"):
        stream = encode_chunks(chunked([("ein Hund", "a dog")] * 100, 10), tokenizer, workers=2)
        next(stream)
        stream.close()
    assert multiprocessing.active_children() == []


def test_a_store_that_cannot_be_read_is_kept_and_named_in_one_error(corpus, tmp_path):
    cache = tmp_path / "cache"
    prepare_data(config(corpus, cache))
    (store,) = (cache / "store").iterdir()
    (store / MANIFEST).unlink()
    (store / MANIFEST).mkdir()  # reading it fails, but not as a missing or damaged manifest does
    with pytest.raises(DataError, match=f"cannot read the token store {store}: .*check data.cache_dir"):
        prepare_data(config(corpus, cache))
    assert (store / "train.src.ids").is_file()  # not removed


def test_a_store_that_cannot_be_written_is_one_error_naming_it(corpus, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "store").write_text("not a folder\n")
    with pytest.raises(
        DataError, match=f"building the token store {cache / 'store'}/.* failed .*data.cache_dir"
    ):
        prepare_data(config(corpus, cache))


def test_the_store_gets_the_permissions_of_the_umask_for_other_users_of_the_cache(corpus, tmp_path):
    previous = os.umask(0o022)
    try:
        prepare_data(config(corpus, tmp_path / "cache"))
    finally:
        os.umask(previous)
    (store,) = (tmp_path / "cache" / "store").iterdir()
    assert stat.S_IMODE(store.stat().st_mode) == 0o755  # not mkdtemp's 0700


def test_a_hub_data_set_streams_from_its_arrow_files_into_the_same_store(corpus, tmp_path):
    import datasets

    raw = read_all(folder_splits(corpus, "de", "en"))
    hub = tmp_path / "hub"  # a data set in a local folder: load_dataset reads it as from the hub
    hub.mkdir()
    splits = {"train": "train", "val": "validation", "test_2016_flickr": "test"}
    for ours, theirs in splits.items():
        records = {"translation": [{"de": s, "en": t} for s, t in raw[ours]]}
        datasets.Dataset.from_dict(records).to_parquet(str(hub / f"{theirs}.parquet"))
    cache = tmp_path / "cache"
    node = {"hub": {"path": str(hub), "field": "translation", "splits": splits}, "cache_dir": str(cache)}
    from_hub = prepare_data(config(None, cache, **node))
    from_files = prepare_data(config(corpus, cache))
    assert same_data(snapshot(from_hub), snapshot(from_files))
    assert not [path for path in cache.rglob("*") if path.suffix in (".de", ".en")]  # no text files between
    assert from_hub.stats["source"].startswith("hub ")


def test_the_folders_of_builds_that_died_are_removed_and_running_ones_kept(corpus, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "store").mkdir(parents=True)
    host = socket.gethostname() + ".cluster.example"  # a name with dots, as on many clusters
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    abandoned = cache / "store" / f".0123456789abcdef.{host}.{int(dead.stdout)}.x1y2.tmp"
    running = cache / "store" / f".0123456789abcdef.{host}.{os.getpid()}.z3w4.tmp"
    for folder in (abandoned, running):
        folder.mkdir()
        (folder / "train.src.ids").write_bytes(b"partial")
    prepare_data(config(corpus, cache))
    assert not abandoned.exists() and running.is_dir()
    assert len(stores(cache)) == 2  # the new store, and the running build's folder
