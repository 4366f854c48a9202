"""Read and validate parallel text: a local folder in the raw Multi30k layout, the user's own files,
or a data set from the Hugging Face hub (downloaded once into that same raw layout).

Every source ends in one reader, ``read_parallel``, so every check holds for all of them. A corpus
is a dict ``split name -> list of (source, target) strings``: ``train``, ``val`` and one entry per
``test_*`` split. Bad input raises ``DataError`` with a one-line message that names the file(s)
and says what to do.
"""

import codecs
import gzip
import logging
import os
import re
import socket
import threading
import zlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlparse

from common.files import write_lines
from data.config import DataConfig, FilePair, HubConfig
from data.errors import DataError

log = logging.getLogger(__name__)

Pairs = List[Tuple[str, str]]
Corpus = Dict[str, Pairs]  # split name -> aligned (source, target) pairs

TRAIN, VALID, TEST_PREFIX = "train", "val", "test"
_SPLIT_FILE = re.compile(r"^(?P<split>train|val|test\w*)\.(?P<lang>[A-Za-z_-]+?)(?:\.gz)?$")


# --- reading files ------------------------------------------------------------------------------


def decode_lines(raw: bytes, name: str) -> List[str]:
    """UTF-8 bytes (a leading BOM dropped) -> lines without their line ends. ``name`` says where the
    bytes come from (a path, "standard input"): bytes that are not UTF-8 raise ``DataError`` naming it
    and the line."""
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(
            f"{name} line {line}: invalid UTF-8 ({error.reason}); "
            f"re-encode it as UTF-8, e.g. with iconv -t UTF-8"
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final line end
    return [line.rstrip("\r") for line in lines]


def read_lines(path: Path) -> List[str]:
    """Lines of a UTF-8 text file, plain or gzip (by the ``.gz`` suffix), without line ends."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            raw = stream.read()
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read it ({error}); replace the file with an intact copy") from None
    return decode_lines(raw, str(path))


def read_parallel(src_path: Path, tgt_path: Path) -> Pairs:
    """Aligned (source, target) pairs from two files of the same number of lines."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: the two sides of a split "
            f"must be aligned line by line"
        )
    return list(zip(src, tgt))


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


def load_folder(root: Path, src: str, tgt: str) -> Corpus:
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
    corpus = {}
    for split, by_lang in files.items():
        if src in by_lang and tgt in by_lang:
            corpus[split] = read_parallel(by_lang[src], by_lang[tgt])
        elif split.startswith(TEST_PREFIX):
            log.warning("skipping %s: it has no %s file", split, src if src not in by_lang else tgt)
    return corpus


def load_files(files: Dict[str, FilePair]) -> Corpus:
    """The user's own parallel files: ``{split: FilePair}`` with at least train and val."""
    for required in (TRAIN, VALID):
        if required not in files:
            raise DataError(f"data.files has no '{required}' entry; give data.files.{required}.src and .tgt")
    for split in files:
        if split not in (TRAIN, VALID) and not split.startswith(TEST_PREFIX):
            raise DataError(
                f"data.files.{split}: unknown split name; use train, val, or a name starting with 'test'"
            )
    return {split: read_parallel(Path(pair.src), Path(pair.tgt)) for split, pair in files.items()}


def hub_cache_folder(cache_dir: str, hub: HubConfig) -> Path:
    key = hub.path.replace("/", "--") + (f"--{hub.name}" if hub.name else "")
    return Path(cache_dir) / "datasets" / key


def check_hub_reachable(timeout: float = 5.0) -> bool:
    """Whether the hub (or the HTTPS proxy in use) accepts a connection within ``timeout`` seconds.

    ``datasets`` itself retries for about 25 s before it gives up; this answers in seconds, name
    lookup included (run in a thread, because ``getaddrinfo`` has no timeout of its own).
    """
    from huggingface_hub import constants

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlparse(proxy or constants.ENDPOINT)
    address = (url.hostname, url.port or (80 if url.scheme == "http" else 443))
    reachable = threading.Event()

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            reachable.set()
        except OSError:
            pass

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout)
    return reachable.is_set()


def hub_offline() -> bool:
    """The user asked the Hugging Face libraries to work from their cache only."""
    return any(
        os.environ.get(name, "").lower() in ("1", "true", "yes")
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def download_hub(cfg: DataConfig, folder: Path) -> None:
    """Download ``cfg.hub`` for ``cfg.src``/``cfg.tgt`` and write it to ``folder`` in the raw layout."""
    hub = cfg.hub
    where = f"{hub.path}" + (f" ({hub.name})" if hub.name else "")
    if not hub_offline() and not check_hub_reachable():
        raise DataError(
            f"cannot reach the Hugging Face hub to download {where}; set data.root=DIR to a local "
            f"folder of {{split}}.{{lang}}[.gz] files (the raw Multi30k layout)"
        )
    import datasets

    log.info("downloading %s from the Hugging Face hub into %s", where, folder)
    folder.mkdir(parents=True, exist_ok=True)
    for ours, theirs in hub.splits.items():
        try:
            records = datasets.load_dataset(
                hub.path, hub.name, split=theirs, cache_dir=str(folder.parent / "hf")
            )
        except Exception as error:  # network, missing data set or split: one line, with the way out
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise DataError(
                f"could not load split '{theirs}' of {where} from the hub ({first_line}); "
                f"check data.hub or set data.root=DIR to a local copy"
            ) from None
        for lang in (cfg.src, cfg.tgt):
            _check_language(records[0] if len(records) else {}, hub.field, lang, where)
            texts = (_record_text(record, hub.field, lang) for record in records)
            write_lines(folder / f"{ours}.{lang}", texts)  # a file present is complete


def _check_language(record: dict, field: Optional[str], lang: str, where: str) -> None:
    texts = record.get(field, {}) if field else record
    if lang not in texts:
        raise DataError(
            f"{where} has no language '{lang}' (found: {', '.join(texts) or 'none'}); set data.src/data.tgt to one of them"
        )


def _record_text(record: dict, field: Optional[str], lang: str) -> str:
    return (record[field] if field else record)[lang].replace("\n", " ")


def load_corpus(cfg: DataConfig) -> Corpus:
    """The corpus the config names: ``files``, else ``root``, else the hub (cached as a folder)."""
    if cfg.src == cfg.tgt:
        raise DataError(f"data.src and data.tgt are both '{cfg.src}': choose two different languages")
    if cfg.files:
        corpus = load_files(cfg.files)
    elif cfg.root:
        corpus = load_folder(Path(cfg.root), cfg.src, cfg.tgt)
    elif cfg.hub:
        folder = hub_cache_folder(cfg.cache_dir, cfg.hub)
        wanted = [folder / f"{split}.{lang}" for split in cfg.hub.splits for lang in (cfg.src, cfg.tgt)]
        if not all(path.is_file() for path in wanted):
            download_hub(cfg, folder)
        corpus = {
            split: pairs
            for split, pairs in load_folder(folder, cfg.src, cfg.tgt).items()
            if split in cfg.hub.splits
        }
    else:
        raise DataError("the data config names no source: set data.root=DIR, data.files or data.hub")
    if cfg.train_limit is not None:
        corpus[TRAIN] = corpus[TRAIN][: cfg.train_limit]
    return corpus


# --- cleaning -----------------------------------------------------------------------------------


def drop_empty_pairs(pairs: Pairs) -> Tuple[Pairs, int]:
    """Training pairs whose two sides both hold text, and how many were dropped."""
    kept = [(src, tgt) for src, tgt in pairs if src.strip() and tgt.strip()]
    return kept, len(pairs) - len(kept)


def eval_split_names(corpus: Corpus) -> List[str]:
    """Names of the evaluation splits (every ``test*`` split), sorted."""
    return sorted(split for split in corpus if split.startswith(TEST_PREFIX))


def describe_source(cfg: DataConfig) -> str:
    if cfg.files:
        return f"files {cfg.files[TRAIN].src} / {cfg.files[TRAIN].tgt}"
    if cfg.root:
        return os.fspath(cfg.root)
    return f"hub {cfg.hub.path}" if cfg.hub else "nothing"
