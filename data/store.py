"""The token store: every split of a corpus encoded once, on disk, memory-mapped by every run.

One folder per (corpus content, tokenizer options, data options), under
``{data.cache_dir}/store/{key}``. The key is a hash of the sources' fingerprints (a file's path,
size and modification time; a hub data set's path, config, split and field), the languages,
``train_limit``, ``max_len``, the SentencePiece options and the format version: a run whose key
finds a complete store starts without reading or encoding any text; a changed file or option
gives another key, so another store.

For every split and side (``src``, ``tgt``) the folder holds::

    {split}.{side}.ids        every sequence's ids end to end (uint16, or uint32 for vocabularies
                              over 65,536), without BOS/EOS
    {split}.{side}.lengths    each sequence's id count (uint32)
    {split}.{side}.text       the UTF-8 text, sentence after sentence (subword sampling reads the
                              training text from here; sacrebleu the validation and test text)
    {split}.{side}.bytes      each sentence's byte count (uint32)

the SentencePiece model(s), and ``manifest.json``: the format, every file's size and CRC-32, the
pairs of every split and the statistics of the build. A store is written into a temporary folder
beside its place and renamed into it once the manifest is written: a folder in place is
complete. Opening checks every file's size against the manifest, and its CRC-32 (the training
text's only when subword sampling reads it); a store that fails (a file missing, truncated or
changed) is removed and built again, never used.
"""

import hashlib
import json
import logging
import os
import shutil
import socket
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from common.files import AtomicFolder
from data.batching import TokenArrays
from data.errors import DataError

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
SIDES = ("src", "tgt")
LENGTHS = np.uint32
READ_CHUNK = 1 << 24  # bytes read at a time when checking a file


def store_key(settings: Dict[str, Any]) -> str:
    """A short hash of everything the store's content depends on (JSON-serializable ``settings``)."""
    text = json.dumps({"format": FORMAT, **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ids_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id of a vocabulary of ``vocab_size``."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class TextArrays(TokenArrays):
    """Sentences kept as one array of UTF-8 bytes and their byte counts; ``[i]`` is a ``str``."""

    def __getitem__(self, index: int) -> str:
        return self.ids[self.offsets[index] : self.offsets[index + 1]].tobytes().decode("utf-8")

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> "TextArrays":
        raw = [text.encode("utf-8") for text in texts]
        lengths = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
        return cls(np.frombuffer(b"".join(raw), dtype=np.uint8), lengths)


class AppendFile:
    """A file written by appending arrays, with its size and CRC-32 kept as it grows."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        self.stream = open(path, "wb")
        self.crc, self.size, self.count = 0, 0, 0

    def append(self, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=self.dtype).tobytes()
        self.stream.write(data)
        self.crc = zlib.crc32(data, self.crc)
        self.size += len(data)
        self.count += len(values)

    def abandon(self) -> None:
        self.stream.close()

    def close(self) -> Dict[str, Any]:
        """Flush to disk; the file's entry of the manifest."""
        self.stream.flush()
        os.fsync(self.stream.fileno())
        self.stream.close()
        return {"bytes": self.size, "crc32": self.crc, "dtype": self.dtype.name, "count": self.count}


class SplitWriter:
    """The four files of one split and side, appended chunk by chunk."""

    def __init__(self, folder: Path, split: str, side: str, dtype: np.dtype):
        stem = f"{split}.{side}"
        self.files = {
            f"{stem}.ids": AppendFile(folder / f"{stem}.ids", dtype),
            f"{stem}.lengths": AppendFile(folder / f"{stem}.lengths", LENGTHS),
            f"{stem}.text": AppendFile(folder / f"{stem}.text", np.uint8),
            f"{stem}.bytes": AppendFile(folder / f"{stem}.bytes", LENGTHS),
        }
        self.ids, self.lengths, self.text, self.bytes = self.files.values()

    def append(self, ids: TokenArrays, texts: Sequence[str]) -> None:
        """Sequences (``ids``) and their sentences (``texts``), in order."""
        text = TextArrays.from_texts(texts)
        self.ids.append(ids.ids)
        self.lengths.append(ids.lengths)
        self.text.append(text.ids)
        self.bytes.append(text.lengths)

    def close(self) -> Dict[str, Dict[str, Any]]:
        return {name: file.close() for name, file in self.files.items()}

    def abandon(self) -> None:
        for file in self.files.values():
            file.abandon()


class StoreWriter:
    """A store being built, in a temporary folder beside ``folder`` until ``commit``."""

    def __init__(self, folder: Path, dtype: np.dtype):
        self.folder, self.dtype = Path(folder), np.dtype(dtype)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned_builds(self.folder.parent)
        prefix = f".{self.folder.name}.{socket.gethostname()}.{os.getpid()}."  # see remove_abandoned_builds
        self.staging = AtomicFolder(self.folder, prefix)
        self.tmp = self.staging.tmp
        self.splits: Dict[str, Dict[str, SplitWriter]] = {}
        self.models: List[str] = []

    def split(self, name: str) -> Dict[str, SplitWriter]:
        """The writers of split ``name``'s two sides."""
        self.splits[name] = {side: SplitWriter(self.tmp, name, side, self.dtype) for side in SIDES}
        return self.splits[name]

    def models_from(self, names: Sequence[str], models: Sequence[bytes]) -> None:
        for name, model in zip(names, models):
            (self.tmp / name).write_bytes(model)
        self.models = list(names)

    def commit(self, stats: Dict[str, Any]) -> None:
        """Write the manifest last, then rename the folder into place. Another process that
        built the same store first wins: this copy goes."""
        files: Dict[str, Any] = {}
        pairs = {}
        for name, sides in self.splits.items():
            for writer in sides.values():
                files.update(writer.close())
            pairs[name] = files[f"{name}.src.lengths"]["count"]
        for model in self.models:
            files[model] = {"bytes": (self.tmp / model).stat().st_size, "crc32": file_crc(self.tmp / model)}
        manifest = {"format": FORMAT, "dtype": self.dtype.name, "models": self.models, "pairs": pairs}
        manifest.update(files=files, stats=stats)
        (self.tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        try:
            self.staging.commit()
        except OSError:
            if not (self.folder / MANIFEST).is_file():
                raise
            self.discard()  # built meanwhile by another run: keep that one

    def discard(self) -> None:
        for sides in self.splits.values():
            for writer in sides.values():
                writer.abandon()
        self.staging.discard()


def remove_abandoned_builds(parent: Path) -> None:
    """Remove the temporary folders of builds on this machine whose process is gone (killed, or
    out of memory, before it could clean up); those of running builds stay."""
    host = socket.gethostname()
    for tmp in parent.glob(".*.tmp"):
        parts = tmp.name.split(".")  # "", key, host (dots allowed), pid, random, "tmp"
        pid, builder = parts[-3], ".".join(parts[2:-3])
        if len(parts) >= 6 and builder == host and pid.isdigit() and not process_alive(int(pid)):
            log.info("removing %s, the folder of a token store build that did not finish", tmp)
            shutil.rmtree(tmp, ignore_errors=True)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(READ_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


class StoreError(Exception):
    """A store in place that cannot be used; the message says why."""


class TokenStore:
    """A complete store, checked and memory-mapped: ``tokens``, ``texts``, ``models``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        self.dtype = np.dtype(self.manifest["dtype"])

    def check(self, skip_crc: Sequence[str] = ()) -> None:
        """Every file of the manifest is there with its size and, but for ``skip_crc``, its CRC-32
        (``StoreError`` if not)."""
        for name, entry in self.manifest["files"].items():
            path = self.folder / name
            try:
                if not path.is_file() or path.stat().st_size != entry["bytes"]:
                    raise StoreError(f"{name} is missing or has the wrong size")
                if name not in skip_crc and file_crc(path) != entry["crc32"]:
                    raise StoreError(f"{name} does not match its checksum")
            except FileNotFoundError:  # removed meanwhile, say by another run that found it damaged
                raise StoreError(f"{name} is missing") from None

    @property
    def splits(self) -> List[str]:
        return list(self.manifest["pairs"])

    def mapped(self, name: str, dtype: np.dtype) -> np.ndarray:
        count = self.manifest["files"][name]["count"]
        if count == 0:  # np.memmap refuses empty files
            return np.zeros(0, dtype=dtype)
        return np.memmap(self.folder / name, dtype=dtype, mode="r", shape=(count,))

    def tokens(self, split: str, side: str) -> TokenArrays:
        """The ids of ``split``'s ``side``, mapped from disk (shared by every process that maps them)."""
        lengths = np.fromfile(self.folder / f"{split}.{side}.lengths", dtype=LENGTHS)
        return TokenArrays(self.mapped(f"{split}.{side}.ids", self.dtype), lengths)

    def texts(self, split: str, side: str) -> TextArrays:
        """The sentences of ``split``'s ``side``, mapped from disk."""
        lengths = np.fromfile(self.folder / f"{split}.{side}.bytes", dtype=LENGTHS)
        return TextArrays(self.mapped(f"{split}.{side}.text", np.uint8), lengths)

    def models(self) -> List[bytes]:
        return [(self.folder / name).read_bytes() for name in self.manifest["models"]]

    def size(self) -> int:
        """Bytes on disk."""
        return sum(entry["bytes"] for entry in self.manifest["files"].values())


def read_manifest(folder: Path) -> Dict[str, Any]:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (FileNotFoundError, ValueError) as error:  # a folder without its manifest is no store
        raise StoreError(f"{MANIFEST} is missing or not JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{MANIFEST} is not of format {FORMAT}")
    if not isinstance(manifest.get("files"), dict) or not isinstance(manifest.get("pairs"), dict):
        raise StoreError(f"{MANIFEST} lists no files or pairs")
    return manifest


def open_store(folder: Path, skip_crc: Sequence[str] = ()) -> Optional[TokenStore]:
    """The store in ``folder`` when it is complete and intact (``TokenStore.check``); None when
    there is none. A damaged one is removed (with a warning) and None returned, so that it is
    built again."""
    if not folder.is_dir():
        return None
    try:
        store = TokenStore(folder)
        store.check(skip_crc)
        return store
    except (StoreError, KeyError, TypeError, ValueError) as error:
        log.warning("token store %s is damaged (%s): removing it", folder, error)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    except OSError as error:  # not damage (permissions, too many open files): keep the store
        raise DataError(f"cannot read the token store {folder}: {error}; check data.cache_dir") from None
