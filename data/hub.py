"""Parallel text from a data set on the Hugging Face hub (``data.hub``), and the network probe
that tells an unreachable hub in seconds.

A ``HubSplit`` is a source of the corpus (``data/corpus.py``) like a ``FileSplit``: it streams
its pairs from the Arrow files that ``datasets`` downloads once into the cache and memory-maps,
and its fingerprint names the data set without downloading anything, so a run whose token store
is built needs no network. ``fetch()`` downloads the split; the pipeline calls it on every split
before it announces a build, so that an unreachable hub, a missing split or language fails first.
"""

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple
from urllib.parse import urlparse

from data.config import DataConfig, HubConfig
from data.corpus import file_fingerprint
from data.errors import DataError

log = logging.getLogger(__name__)


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


def hub_name(hub: HubConfig) -> str:
    return f"{hub.path}" + (f" ({hub.name})" if hub.name else "")


@dataclass
class HubSplit:
    """One split of a hub data set, streamed from the Arrow files that ``datasets`` downloads
    once into ``cache_dir`` and memory-maps (no text files in between)."""

    hub: HubConfig
    split: str  # the hub's split name
    src: str
    tgt: str
    cache_dir: Path
    records: Any = field(default=None, repr=False)  # the datasets.Dataset, once fetched

    def fetch(self) -> Any:
        """The split's records, downloaded on first use; an unreachable hub is one line."""
        if self.records is not None:
            return self.records
        where = hub_name(self.hub)
        if not Path(self.hub.path).is_dir() and not hub_offline() and not check_hub_reachable():
            raise DataError(
                f"cannot reach the Hugging Face hub to download {where}; set data.root=DIR to a local "
                f"folder of {{split}}.{{lang}}[.gz] files (the raw Multi30k layout)"
            )
        import datasets

        log.info("loading split '%s' of %s (downloaded once into %s)", self.split, where, self.cache_dir)
        try:
            records = datasets.load_dataset(
                self.hub.path, self.hub.name, split=self.split, cache_dir=str(self.cache_dir)
            )
        except Exception as error:  # network, missing data set or split: one line, with the way out
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise DataError(
                f"could not load split '{self.split}' of {where} from the hub ({first_line}); "
                f"check data.hub or set data.root=DIR to a local copy"
            ) from None
        for lang in (self.src, self.tgt):
            check_language(records[0] if len(records) else {}, self.hub.field, lang, where)
        self.records = records
        return records

    def pairs(self) -> Iterator[Tuple[str, str]]:
        field_name = self.hub.field
        for columns in self.fetch().iter(batch_size=10_000):  # {column: [values]}, from the mapped Arrow
            if field_name:
                texts = columns[field_name]
                src, tgt = [t[self.src] for t in texts], [t[self.tgt] for t in texts]
            else:
                src, tgt = columns[self.src], columns[self.tgt]
            for pair in zip(src, tgt):
                yield pair[0].replace("\n", " "), pair[1].replace("\n", " ")

    def fingerprint(self) -> Dict[str, Any]:
        """The data set, configuration, split and field: a hub data set is downloaded once and
        never refreshed (delete the cache folder to download it again)."""
        local = Path(self.hub.path)  # a data set in a local folder: its files tell changes apart
        files = (
            [file_fingerprint(path) for path in sorted(local.rglob("*")) if path.is_file()]
            if local.is_dir()
            else []
        )
        return {
            "hub": self.hub.path,
            "name": self.hub.name,
            "split": self.split,
            "field": self.hub.field,
            "files": files,
        }

    def describe(self) -> str:
        return f"hub {hub_name(self.hub)} split {self.split}"


def check_language(record: dict, field_name: Optional[str], lang: str, where: str) -> None:
    texts = record.get(field_name, {}) if field_name else record
    if lang not in texts:
        raise DataError(
            f"{where} has no language '{lang}' (found: {', '.join(texts) or 'none'}); set data.src/data.tgt to one of them"
        )


def hub_splits(cfg: DataConfig) -> Dict[str, HubSplit]:
    """Our splits of the hub data set ``cfg.hub`` names (``cfg.hub.splits``), cached under
    ``{cache_dir}/datasets/hf``. Nothing is downloaded yet."""
    cache = Path(cfg.cache_dir) / "datasets" / "hf"
    return {
        ours: HubSplit(cfg.hub, theirs, cfg.src, cfg.tgt, cache) for ours, theirs in cfg.hub.splits.items()
    }
