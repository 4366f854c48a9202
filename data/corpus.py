"""Find and read parallel text: a local folder in the raw Multi30k layout, the user's own files,
or a data set from the Hugging Face hub (``data/hub.py``).

A corpus is a dict ``split name -> source of (source, target) pairs``: ``train``, ``val`` and one
entry per ``test_*`` split. A source streams its pairs (``pairs()``), so a training corpus larger
than memory is read line by line, and says what it is made of (``fingerprint()``) without reading
it: the token store (``data/store.py``) is keyed by it; ``fetch()`` gets it ready to read (a hub
split downloads), so that a build fails before it starts. Files are read by one reader,
``FileSplit``, and every UTF-8 line by one decoder, ``decode_stream``, so every check holds for all
of them (and for ``translate.py``'s input). Bad input raises ``DataError`` with a one-line message
that names the file(s) and says what to do.
"""

import codecs
import gzip
import io
import logging
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Dict, Iterable, Iterator, List, Tuple

from data.config import DataConfig, FilePair
from data.errors import DataError

log = logging.getLogger(__name__)

Pairs = List[Tuple[str, str]]

TRAIN, VALID, TEST_PREFIX = "train", "val", "test"
_SPLIT_FILE = re.compile(r"^(?P<split>train|val|test\w*)\.(?P<lang>[A-Za-z_-]+?)(?:\.gz)?$")


# --- reading files ------------------------------------------------------------------------------


def decode_stream(chunks: Iterable[bytes], name: str) -> Iterator[str]:
    """Lines of UTF-8 text read line by line (``chunks``: each up to and including its ``b"\\n"``,
    as a binary file iterates), without line ends or a leading BOM: the one decoder of every reader.
    ``name`` says where the bytes come from (a path, "standard input"): bytes that are not UTF-8
    raise ``DataError`` naming it and the line."""
    for number, raw in enumerate(chunks, start=1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8) :]
            if not raw:
                return  # a BOM and nothing else: no text, no line
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                f"{name} line {number}: invalid UTF-8 ({error.reason}); "
                f"re-encode it as UTF-8, e.g. with iconv -t UTF-8"
            ) from None
        yield line.rstrip("\n").rstrip("\r")


def decode_lines(raw: bytes, name: str) -> List[str]:
    """UTF-8 bytes -> their lines (``decode_stream``), as a list."""
    return list(decode_stream(io.BytesIO(raw), name))  # split at b"\n" only, as a file is read


def open_binary(path: Path) -> BinaryIO:
    """``path`` opened for reading bytes, through gzip when it ends in ``.gz``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    return (gzip.open if path.suffix == ".gz" else open)(path, "rb")


def stream_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 text file, plain or gzip (by the ``.gz`` suffix), one at a time, without
    line ends or a leading BOM (the same lines as ``decode_lines`` of the whole file)."""
    number = 0  # lines read, for the message of a read error
    try:
        with open_binary(path) as stream:
            for line in decode_stream(stream, os.fspath(path)):
                number += 1
                yield line
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        where = f" after line {number}" if number else ""
        raise DataError(
            f"{path}: cannot read it{where} ({error}); replace the file with an intact copy"
        ) from None


def read_lines(path: Path) -> List[str]:
    """Every line of a UTF-8 text file (``stream_lines``), as a list."""
    return list(stream_lines(path))


def file_fingerprint(path: Path) -> List[Any]:
    """What tells a file's content apart without reading it: its path, size and modification time."""
    try:
        info = Path(path).stat()
    except OSError as error:
        raise DataError(f"{path}: file not found ({error.strerror})") from None
    return [os.fspath(Path(path).resolve()), info.st_size, info.st_mtime_ns]


@dataclass(frozen=True)
class FileSplit:
    """One split as two aligned text files (plain or .gz)."""

    src: Path
    tgt: Path

    def pairs(self) -> Iterator[Tuple[str, str]]:
        """The aligned (source, target) pairs, streamed; two files of different lengths raise
        ``DataError`` naming both and their line counts (once the shorter one ends)."""
        src_lines, tgt_lines = stream_lines(self.src), stream_lines(self.tgt)
        count = 0
        for count, src in enumerate(src_lines, start=1):
            tgt = next(tgt_lines, None)
            if tgt is None:
                self.mismatch(count - 1 + 1 + sum(1 for _ in src_lines), count - 1)
            yield src, tgt
        rest = sum(1 for _ in tgt_lines)
        if rest:
            self.mismatch(count, count + rest)

    def mismatch(self, src_count: int, tgt_count: int) -> None:
        raise DataError(
            f"{self.src} has {src_count} lines but {self.tgt} has {tgt_count}: the two sides of a split "
            f"must be aligned line by line"
        )

    def fetch(self) -> None:
        """Nothing to get ready: files are read where they are."""

    def fingerprint(self) -> List[Any]:
        return [file_fingerprint(self.src), file_fingerprint(self.tgt)]

    def describe(self) -> str:
        return f"{self.src} / {self.tgt}"


# --- sources ------------------------------------------------------------------------------------


def split_files(root: Path) -> Dict[str, Dict[str, Path]]:
    """``{split: {lang: path}}`` of the files in a raw-layout folder (``{split}.{lang}[.gz]``)."""
    found: Dict[str, Dict[str, Path]] = {}
    for path in sorted(root.iterdir()):
        match = _SPLIT_FILE.match(path.name)
        if match and path.is_file():
            langs = found.setdefault(match["split"], {})
            if match["lang"] not in langs or path.suffix != ".gz":  # plain text wins over .gz
                langs[match["lang"]] = path
    return found


Corpus = Dict[str, Any]  # split name -> FileSplit or hub.HubSplit: pairs(), fetch() and fingerprint()


def folder_splits(root: Path, src: str, tgt: str) -> Dict[str, FileSplit]:
    """Train, val and every ``test_*`` split of a folder in the raw Multi30k layout."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(
            f"data folder {root} does not exist: set data.root to a folder of {{split}}.{{lang}}[.gz] files"
        )
    files = split_files(root)
    langs = sorted({lang for by_lang in files.values() for lang in by_lang})
    for lang, key in ((src, "data.src"), (tgt, "data.tgt")):
        if lang not in langs:
            raise DataError(
                f"language '{lang}' ({key}) not found in {root} (found: {', '.join(langs) or 'none'}); "
                f"set {key} to one of them"
            )
    for required in (TRAIN, VALID):
        for lang in (src, tgt):
            if lang not in files.get(required, {}):
                raise DataError(
                    f"{root / f'{required}.{lang}'}[.gz]: file not found; the folder needs train and val splits"
                )
    splits = {}
    for split, by_lang in files.items():
        if src in by_lang and tgt in by_lang:
            splits[split] = FileSplit(by_lang[src], by_lang[tgt])
        elif split.startswith(TEST_PREFIX):
            log.warning("skipping %s: it has no %s file", split, src if src not in by_lang else tgt)
    return splits


def own_splits(files: Dict[str, FilePair]) -> Dict[str, FileSplit]:
    """The user's own parallel files: ``{split: FilePair}`` with at least train and val."""
    for required in (TRAIN, VALID):
        if required not in files:
            raise DataError(f"data.files has no '{required}' entry; give data.files.{required}.src and .tgt")
    for split in files:
        if split not in (TRAIN, VALID) and not split.startswith(TEST_PREFIX):
            raise DataError(
                f"data.files.{split}: unknown split name; use train, val, or a name starting with 'test'"
            )
    return {split: FileSplit(Path(pair.src), Path(pair.tgt)) for split, pair in files.items()}


# --- cleaning -----------------------------------------------------------------------------------


def eval_split_names(corpus: Corpus) -> List[str]:
    """Names of the evaluation splits (every ``test*`` split), sorted."""
    return sorted(split for split in corpus if split.startswith(TEST_PREFIX))


def describe_source(cfg: DataConfig) -> str:
    if cfg.files:
        return f"files {cfg.files[TRAIN].src} / {cfg.files[TRAIN].tgt}"
    if cfg.root:
        return os.fspath(cfg.root)
    return f"hub {cfg.hub.path}" if cfg.hub else "nothing"
