"""Reference word alignments of the training pairs, for guided alignment (``training/guided.py``).

``data.alignments`` names where they come from:

- a **Pharaoh file**: one line per pair of the training split, in its order (line ``k`` is pair
  ``k`` of the files, before ``data.train_limit`` and the dropping of empty or long pairs), each
  line the pair's links ``i-j`` separated by spaces: source word ``i``, target word ``j``, both
  0-based, words being the text's space-separated tokens (the words SentencePiece starts a piece at,
  ``▁``). An empty line is a pair without links.
- ``fast_align``: the project's aligner (``alignment/fast_align.py``: both directions,
  grow-diag-final-and) trained on the training text itself, its words lowercased.

Words become pieces: every piece of target word ``j`` takes every piece of each source word it is
linked to, so a target piece's reference is a set of source pieces (``distributions`` spreads it
evenly). A pair whose pieces do not make its words back (SentencePiece dropped a word) keeps no
links, counted in the log.

The links are computed once and cached in ``{data.cache_dir}/alignments/{key}.npz``, the key a hash
of the token store's (the text and tokenizer) and of the source (the file's path, size and
modification time, or fast_align's options): a second run reads them.

Shapes: ``B`` pairs, ``S`` source positions (EOS last), ``T`` target positions (``tgt_out``'s).
"""

import hashlib
import json
import logging
import os
import re
import tempfile
import time
import zipfile
from array import array
from itertools import islice
from pathlib import Path
from typing import FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from alignment.words import word_ids
from common.files import current_umask
from data.batching import PieceLinks, TokenArrays
from data.config import DataConfig
from data.corpus import TRAIN, file_fingerprint, stream_lines
from data.errors import DataError
from data.pipeline import PreparedData
from data.sources import corpus_splits
from data.store import TextArrays, TokenStore
from data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FORMAT = 1
FAST_ALIGN = "fast_align"
FAST_ALIGN_ITERATIONS = 5
NUMBER = re.compile(r"[0-9]+")
WordLinks = FrozenSet[Tuple[int, int]]  # (source word, target word), 0-based


def parse_pharaoh(line: str, where: str) -> WordLinks:
    """``"0-0 1-2 2-1"`` -> its links; ``DataError`` naming ``where`` (file and line) for anything else."""
    links = set()
    for token in line.split():
        i, dash, j = token.partition("-")
        if not (dash and NUMBER.fullmatch(i) and NUMBER.fullmatch(j)):
            raise DataError(
                f"{where}: {token!r} is not a link: write i-j (source word i, target word j, from 0), "
                "separated by spaces"
            )
        links.add((int(i), int(j)))
    return frozenset(links)


def word_pieces(pieces: Sequence[str]) -> List[List[int]]:
    """The positions of each word's pieces (a word starts at a piece with ``▁``)."""
    words: List[List[int]] = []
    for position, word in enumerate(word_ids(pieces)):
        if word == len(words):
            words.append([])
        words[word].append(position)
    return words


def to_pieces(
    links: WordLinks, src_words: List[List[int]], tgt_words: List[List[int]]
) -> Tuple[List[int], List[int]]:
    """Word links -> piece links (source positions, target positions): each piece of a target word to
    each piece of the source words it is linked to."""
    src, tgt = [], []
    for i, j in sorted(links):
        for t in tgt_words[j]:
            for s in src_words[i]:
                src.append(s)
                tgt.append(t)
    return src, tgt


def check_fit(links: WordLinks, n_src: int, n_tgt: int, where: str) -> None:
    """``DataError`` naming ``where`` when a link lies beyond the pair's words."""
    outside = sorted(link for link in links if link[0] >= n_src or link[1] >= n_tgt)
    if outside:
        i, j = outside[0]
        raise DataError(
            f"{where}: link {i}-{j}, but the pair has {n_src} source and {n_tgt} target words: the links do "
            "not fit the training text (a line per pair, in order; words split at spaces, counted from 0)"
        )


def piece_links(
    links: Iterable[Tuple[WordLinks, str]],
    texts: Tuple[TextArrays, TextArrays],
    ids: Tuple[TokenArrays, TokenArrays],
    tokenizer: Tokenizer,
) -> PieceLinks:
    """Every stored pair's word links, given in order with where they come from (for the error of a link
    beyond its words, ``check_fit``), as piece links, gathered pair by pair into flat arrays. A pair
    whose pieces do not make its space-separated words back keeps no links (counted in the log)."""
    src_all, tgt_all, counts = array("i"), array("i"), array("q")
    unmatched = 0
    for k, (pair_links, where) in enumerate(links):
        src_words = word_pieces(tokenizer.src_pieces(ids[0][k]))
        tgt_words = word_pieces(tokenizer.tgt_pieces(ids[1][k]))
        n_src, n_tgt = len(texts[0][k].split()), len(texts[1][k].split())
        check_fit(pair_links, n_src, n_tgt, where)
        if pair_links and (len(src_words) != n_src or len(tgt_words) != n_tgt):
            unmatched += 1
            pair_links = frozenset()
        src, tgt = to_pieces(pair_links, src_words, tgt_words)
        src_all.extend(src)
        tgt_all.extend(tgt)
        counts.append(len(src))
    if unmatched:
        log.info(
            "guided alignment: %d pairs keep no links (their pieces do not make their words back)", unmatched
        )
    lengths = np.frombuffer(counts, dtype=np.int64)
    return PieceLinks(
        TokenArrays(np.frombuffer(src_all, dtype=np.int32), lengths),
        TokenArrays(np.frombuffer(tgt_all, dtype=np.int32), lengths),
    )


def file_links(
    path: Path, raw_pairs: Iterable[Tuple[str, str]], texts: Tuple[TextArrays, TextArrays], limited: bool
) -> Iterator[Tuple[WordLinks, str]]:
    """The links of every stored training pair from the Pharaoh file ``path`` (line ``k``: raw pair
    ``k``), with where each came from (``"FILE, line N"``), one pair at a time. The stored pairs are the
    raw pairs kept, in order, so walking both finds each one's line. A file with more lines than the
    split has pairs is refused unless ``limited`` (``data.train_limit`` read the first pairs only)."""
    src_text, tgt_text = texts
    lines = stream_lines(path)
    number = kept = 0
    for number, (src, tgt) in enumerate(raw_pairs, start=1):
        line = next(lines, None)
        if line is None:
            raise DataError(
                f"{path} has {number - 1} lines but the training split has more pairs: data.alignments needs "
                "a line of links per training pair"
            )
        if kept < len(src_text) and src == src_text[kept] and tgt == tgt_text[kept]:
            here = f"{path}, line {number}"
            yield parse_pharaoh(line, here), here
            kept += 1
    if not limited and next(lines, None) is not None:
        raise DataError(
            f"{path} has more lines than the training split's {number} pairs: data.alignments needs a line "
            "of links per training pair"
        )
    if kept != len(src_text):
        raise DataError(f"{path}: the training text changed while it was read: run again")


def fast_align_word_links(
    texts: Tuple[TextArrays, TextArrays], work: Path
) -> Iterator[Tuple[WordLinks, str]]:
    """fast_align trained on the stored training pairs (words split at spaces, lowercased), then aligning
    them one at a time."""
    from alignment.fast_align import aligned_pairs, split_words, train_fast_align

    src, tgt = split_words(texts[0]), split_words(texts[1])
    model = train_fast_align(src, tgt, work, iterations=FAST_ALIGN_ITERATIONS)
    for k, links in enumerate(aligned_pairs(model, src, tgt)):
        yield links, f"fast_align, pair {k + 1}"


def links_key(store_folder: Path, source: str) -> str:
    """The cache key of the links of a token store (its folder's name is its content's hash) from
    ``source`` (``data.alignments``)."""
    origin = {"aligner": FAST_ALIGN, "iterations": FAST_ALIGN_ITERATIONS} if source == FAST_ALIGN else None
    settings = {
        "format": FORMAT,
        "store": Path(store_folder).name,
        "source": origin or file_fingerprint(source),
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def save_links(path: Path, links: PieceLinks) -> None:
    """``links`` into ``path`` (``.npz``), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            np.savez(
                stream,
                src_ids=links.src.ids,
                tgt_ids=links.tgt.ids,
                lengths=links.src.lengths,
            )
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def load_links(path: Path, n_pairs: int) -> Optional[PieceLinks]:
    """The cached links in ``path``, or None when there are none (or they cannot be read: they are made
    again)."""
    try:
        with np.load(path) as saved:
            lengths = saved["lengths"]
            links = PieceLinks(TokenArrays(saved["src_ids"], lengths), TokenArrays(saved["tgt_ids"], lengths))
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):  # missing, damaged or cut short
        return None
    return links if len(links) == n_pairs else None


def training_links(
    source: str,
    store_folder: Path,
    cache_dir: Path,
    raw_pairs: Iterable[Tuple[str, str]],
    limited: bool,
    texts: Tuple[TextArrays, TextArrays],
    ids: Tuple[TokenArrays, TokenArrays],
    tokenizer: Tokenizer,
) -> PieceLinks:
    """The piece links of the stored training pairs from ``source`` (``data.alignments``: a Pharaoh file
    or ``fast_align``), from the cache when they are there, else computed and cached."""
    path = Path(cache_dir) / "alignments" / f"{links_key(store_folder, source)}.npz"
    links = load_links(path, len(ids[0])) if path.is_file() else None
    if links is not None:
        log.info("guided alignment: the links of %s from %s", source, path)
        return links
    start = time.perf_counter()
    if source == FAST_ALIGN:
        log.info("guided alignment: training fast_align on %d pairs", len(ids[0]))
        with tempfile.TemporaryDirectory() as work:
            links = piece_links(fast_align_word_links(texts, Path(work)), texts, ids, tokenizer)
    else:
        links = piece_links(file_links(Path(source), raw_pairs, texts, limited), texts, ids, tokenizer)
    save_links(path, links)
    linked = int((links.src.lengths > 0).sum())
    log.info(
        "guided alignment: %d of %d training pairs have links (%.1f piece links each), from %s in %.1f s; cached in %s",
        linked,
        len(links),
        len(links.src.ids) / max(linked, 1),
        source,
        time.perf_counter() - start,
        path,
    )
    return links


def attach_links(data: PreparedData, cfg: DataConfig) -> None:
    """Give the training split of ``data`` (prepared from ``cfg``) the reference links ``data.alignments``
    names (``DataError`` when it names none)."""
    if cfg.alignments is None:
        raise DataError(
            "guided alignment needs reference links: set data.alignments (a Pharaoh file or fast_align)"
        )
    start = time.perf_counter()
    store, train = TokenStore(data.store), data.datasets[TRAIN]
    train.links = training_links(
        cfg.alignments,
        data.store,
        Path(cfg.cache_dir),
        islice(corpus_splits(cfg)[TRAIN].pairs(), cfg.train_limit),
        cfg.train_limit is not None,
        (store.texts(TRAIN, "src"), store.texts(TRAIN, "tgt")),
        (train.src, train.tgt),
        data.tokenizer,
    )
    data.stats["seconds"]["alignments"] = time.perf_counter() - start
