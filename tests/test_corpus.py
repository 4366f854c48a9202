import gzip
import time
from pathlib import Path

import pytest

from data.config import DataConfig, FilePair, HubConfig
from data.corpus import decode_lines, eval_split_names, folder_splits, read_lines
from data.errors import DataError
from data.pipeline import TrainText
from data.sources import corpus_splits

from helpers import read_all


def load_folder(root, src, tgt):
    return read_all(folder_splits(root, src, tgt))


def load_corpus(cfg):
    return read_all(corpus_splits(cfg))


def write(path: Path, lines, gz: bool = False) -> Path:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if gz:
        with gzip.open(path, "wb") as stream:
            stream.write(data)
    else:
        path.write_bytes(data)
    return path


def small_folder(root: Path, splits=("train", "val", "test_a"), langs=("xx", "yy"), n=3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for lang in langs:
            write(root / f"{split}.{lang}", [f"{split} {lang} {i}" for i in range(n)])
    return root


# --- the real Multi30k folder ---------------------------------------------------------------------


def test_folder_loader_finds_multi30k_splits_for_de_en(multi30k_dir):
    corpus = load_folder(multi30k_dir, "de", "en")
    assert len(corpus["train"]) == 29000 and len(corpus["val"]) == 1014
    assert len(corpus["test_2016_flickr"]) == 1000
    assert eval_split_names(corpus) == sorted(s for s in corpus if s.startswith("test"))
    assert corpus["train"][0][0].startswith("Zwei junge") and corpus["train"][0][1].startswith("Two young")


def test_folder_loader_finds_multi30k_splits_for_fr_en(multi30k_dir):
    if not list(Path(multi30k_dir).glob("train.fr*")):
        pytest.skip("this Multi30k copy has no French")
    corpus = load_folder(multi30k_dir, "fr", "en")
    assert {"train", "val", "test_2016_flickr"} <= set(corpus)
    assert len(corpus["train"]) == 29000 and corpus["train"][0][1].startswith("Two young")


def test_reversed_direction_swaps_sides(multi30k_dir):
    de_en = load_folder(multi30k_dir, "de", "en")
    en_de = load_folder(multi30k_dir, "en", "de")
    for split in de_en:
        assert en_de[split] == [(tgt, src) for src, tgt in de_en[split]]


# --- small folders the tests write ----------------------------------------------------------------


def test_every_test_split_present_is_an_evaluation_split(tmp_path):
    root = small_folder(tmp_path / "d", splits=("train", "val", "test_2016_flickr", "test_2017_flickr"))
    corpus = load_folder(root, "xx", "yy")
    assert eval_split_names(corpus) == ["test_2016_flickr", "test_2017_flickr"]
    assert corpus["test_2017_flickr"][1] == ("test_2017_flickr xx 1", "test_2017_flickr yy 1")


def test_gzip_and_plain_files_read_alike(tmp_path):
    lines = ["Ein Hund läuft.", "Zwei Männer  sprechen. ", "Ça va ?"]
    assert (
        read_lines(write(tmp_path / "a.de", lines))
        == read_lines(write(tmp_path / "a.de.gz", lines, gz=True))
        == lines
    )


def test_windows_line_ends_and_a_byte_order_mark_are_not_part_of_the_text(tmp_path):
    path = tmp_path / "a.en"
    path.write_bytes(b"\xef\xbb\xbfA dog.\r\nTwo cats.\r\n")
    assert read_lines(path) == ["A dog.", "Two cats."]


def test_bytes_in_memory_and_in_files_decode_alike(tmp_path):
    inputs = [
        b"",
        b"\xef\xbb\xbf",  # a BOM alone: no line
        b"no final line end",
        b"\xef\xbb\xbfA dog.\r\n\r\nTwo cats.",
        "Ça va ?\nx\ry\n\n".encode(),  # a lone \r is no line end
        b"fine\nbroken \xff here\n",
        b"fine\ncut short \xc3\nmore\n",  # a sequence cut by the line end
        b"fine\n\xe2\x82",  # cut by the end of the text
    ]
    for number, raw in enumerate(inputs):
        path = tmp_path / f"{number}.txt"
        path.write_bytes(raw)
        try:
            from_file = read_lines(path)
        except DataError as error:
            from_file = str(error)
        try:
            from_memory = decode_lines(raw, str(path))
        except DataError as error:
            from_memory = str(error)
        assert from_memory == from_file, raw
    assert read_lines(tmp_path / "1.txt") == [] and read_lines(tmp_path / "4.txt") == ["Ça va ?", "x\ry", ""]
    with pytest.raises(DataError, match=r"6\.txt line 2: invalid UTF-8 \(invalid continuation byte\)"):
        read_lines(tmp_path / "6.txt")


def test_plain_text_wins_over_gzip_of_the_same_split(tmp_path):
    root = small_folder(tmp_path / "d")
    write(root / "train.xx.gz", ["stale"] * 3, gz=True)
    assert load_folder(root, "xx", "yy")["train"][0] == ("train xx 0", "train yy 0")


def test_corrupt_gzip_is_named(tmp_path):
    root = small_folder(tmp_path / "d", langs=("de", "en"))
    (root / "val.de").unlink()
    (root / "val.de.gz").write_bytes(b"\x1f\x8b\x08\x00broken")
    with pytest.raises(DataError, match=r"val\.de\.gz: cannot read it"):
        load_folder(root, "de", "en")


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    root = small_folder(tmp_path / "d")
    write(root / "val.yy", ["only one line"])
    with pytest.raises(DataError, match=r"val\.xx has 3 lines but .*val\.yy has 1"):
        load_folder(root, "xx", "yy")


def test_missing_file_is_named(tmp_path):
    root = small_folder(tmp_path / "d")
    (root / "val.yy").unlink()
    with pytest.raises(DataError, match=r"val\.yy.*file not found"):
        load_folder(root, "xx", "yy")


def test_invalid_utf8_names_file_and_line(tmp_path):
    root = small_folder(tmp_path / "d")
    (root / "train.xx").write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    with pytest.raises(DataError, match=r"train\.xx line 3: invalid UTF-8"):
        load_folder(root, "xx", "yy")


def test_language_not_in_folder_lists_the_ones_found(tmp_path):
    root = small_folder(tmp_path / "d")
    with pytest.raises(DataError, match=r"language 'cs' \(data.tgt\) not found .*found: xx, yy"):
        load_folder(root, "xx", "cs")


def test_missing_folder_and_same_language_are_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_folder(tmp_path / "nowhere", "de", "en")
    with pytest.raises(DataError, match="both 'de'"):
        load_corpus(DataConfig(root=str(tmp_path), src="de", tgt="de"))


def test_empty_pairs_are_dropped_and_counted_after_the_train_limit(tmp_path):
    root = small_folder(tmp_path / "d", n=5)
    write(root / "train.xx", ["a", "", "y", "c", "e"])
    write(root / "train.yy", ["b", "x", "   ", "d", "f"])
    text = TrainText(folder_splits(root, "xx", "yy")["train"], limit=4)
    assert list(text) == [("a", "b"), ("c", "d")] and (text.pairs, text.dropped) == (2, 2)
    assert list(text) == [("a", "b"), ("c", "d")]  # read anew from the files
    everything = TrainText(folder_splits(root, "xx", "yy")["train"], limit=None)
    assert list(everything)[-1] == ("e", "f") and everything.pairs == 3


def test_sources_stream_and_say_what_they_are_made_of_without_reading(tmp_path):
    root = small_folder(tmp_path / "d", n=5)
    source = folder_splits(root, "xx", "yy")["train"]
    before = source.fingerprint()
    stream = source.pairs()
    assert next(stream) == ("train xx 0", "train yy 0")
    assert source.fingerprint() == before
    write(root / "train.yy", [f"other {i}" for i in range(5)])
    assert source.fingerprint() != before


def test_own_files_use_the_same_reader(tmp_path):
    root = small_folder(tmp_path / "d", langs=("de", "en"))
    files = {
        split: FilePair(src=str(root / f"{split}.de"), tgt=str(root / f"{split}.en"))
        for split in ("train", "val", "test_a")
    }
    corpus = load_corpus(DataConfig(files=files, src="de", tgt="en"))
    assert corpus == load_folder(root, "de", "en")
    files["val"] = FilePair(src=str(root / "val.de"), tgt=str(root / "missing.en"))
    with pytest.raises(DataError, match=r"missing\.en: file not found"):
        load_corpus(DataConfig(files=files))
    with pytest.raises(DataError, match=r"data.files.dev: unknown split name"):
        load_corpus(DataConfig(files={**files, "dev": files["train"]}))


def test_unreachable_hub_fails_fast_and_points_to_data_root(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")  # unreachable anywhere
    for name in ("HTTPS_PROXY", "https_proxy", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    cfg = DataConfig(hub=HubConfig(path="bentrevett/multi30k"), cache_dir=str(tmp_path))
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"cannot reach the Hugging Face hub .*set data.root=DIR") as error:
        load_corpus(cfg)
    assert time.perf_counter() - start < 15
    assert "\n" not in str(error.value)
