"""From a data config to tokenized splits: the token store, built once, then mapped by every run.

``prepare_data(cfg)`` is the one call the trainer makes. It finds the corpus (``data/corpus.py``),
and opens its token store (``data/store.py``) or builds it, once every split is ready to read (a
hub split downloaded, ``data/hub.py``: an unreachable hub fails before the build is announced):

1. stream the training text (the first ``train_limit`` pairs, those with an empty side dropped)
   to hash it for the SentencePiece cache, which counts it; train SentencePiece on a sample of it
   (streamed again), or load the cached model(s);
2. encode it on every core in chunks (``data/encoding.py``), drop pairs longer than ``max_len``
   subword tokens on a side, and append the ids and text to the store; then the validation and
   test splits, kept whole and in order.

No pass holds the training text whole: each one reads the files (or Arrow records) anew.

``batch_stats`` and ``format_stats`` give the block logged at start.
"""

import logging
import statistics
import time
from contextlib import closing
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import sentencepiece as spm

from common.progress_bar import progress_bar
from data.batching import ParallelDataset, TokenBucketSampler, padding_ratio
from data.config import DataConfig
from data.corpus import TRAIN, VALID, Corpus, describe_source, eval_split_names
from data.encoding import chunked, encode_chunks, encode_pairs, keep_mask, select, usable_cores
from data.errors import DataError
from data.sources import corpus_splits
from data.store import StoreWriter, TextArrays, TokenStore, ids_dtype, open_store, store_key
from data.tokenizer import SAMPLE, Tokenizer, build_tokenizer, spm_options

log = logging.getLogger(__name__)

CHUNK = 20_000  # pairs encoded at a time by one worker


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    datasets: Dict[str, ParallelDataset]  # train, val, test_*: token ids, mapped from the store
    sources: Dict[str, List[str]]  # raw source text of val and test_* (input order)
    references: Dict[str, List[str]]  # raw target text of val and test_*, for sacrebleu
    stats: Dict[str, Any] = field(default_factory=dict)
    # the training pairs' source and target text (mapped), for data.sampling_alpha only
    train_text: Optional[Tuple[TextArrays, TextArrays]] = None
    store: Optional[Path] = None  # the token store's folder

    @property
    def test_splits(self) -> List[str]:
        return eval_split_names(self.datasets)


class TrainText:
    """The training pairs, read anew from the source each time they are iterated: the first
    ``limit`` pairs, without those that have an empty side. A full pass counts both."""

    def __init__(self, source: Any, limit: Optional[int]):
        self.source, self.limit = source, limit
        self.pairs = self.dropped = 0  # of the last full pass

    def __iter__(self) -> Iterator[Tuple[str, str]]:
        kept = dropped = 0
        for src, tgt in islice(self.source.pairs(), self.limit):
            if src.strip() and tgt.strip():
                kept += 1
                yield src, tgt
            else:
                dropped += 1
        self.pairs, self.dropped = kept, dropped


def store_settings(cfg: DataConfig, corpus: Corpus) -> Dict[str, Any]:
    """Everything a store's content depends on."""
    options = {k: v for k, v in spm_options(cfg.vocab_size, cfg.spm_model_type).items() if k != "num_threads"}
    return {
        "splits": {split: source.fingerprint() for split, source in sorted(corpus.items())},
        "src": cfg.src,
        "tgt": cfg.tgt,
        "train_limit": cfg.train_limit,
        "max_len": cfg.max_len,
        "spm": {**options, "joint": cfg.joint_vocab, "version": spm.__version__, "sample": SAMPLE},
    }


def prepare_data(cfg: DataConfig) -> PreparedData:
    """The corpus ``cfg`` names, tokenized: from its token store, built first if there is none."""
    corpus = corpus_splits(cfg)
    for required in (TRAIN, VALID):
        if required not in corpus:
            raise DataError(f"{describe_source(cfg)} has no '{required}' split: data.hub.splits must map one")
    folder = Path(cfg.cache_dir) / "store" / store_key(store_settings(cfg, corpus))
    start = time.perf_counter()
    # the training text is checked only when subword sampling reads it (it is most of the store)
    unread = () if cfg.sampling_alpha is not None else (f"{TRAIN}.src.text", f"{TRAIN}.tgt.text")
    store = open_store(folder, unread)
    if store is None:
        for source in corpus.values():  # a hub split downloads here: no build is announced that cannot start
            source.fetch()
        try:
            build_store(folder, corpus, cfg)
        except OSError as error:  # a full disk, a folder we may not write
            raise DataError(
                f"building the token store {folder} failed ({error}): free disk space or set data.cache_dir"
            ) from None
        store = open_store(folder, unread)
        if store is None:
            raise DataError(f"the token store {folder} was built but cannot be read back; check the disk")
        seconds = store.manifest["stats"]["seconds"]
    else:
        log.info("data: using the token store %s", folder)
        seconds = {"store": time.perf_counter() - start}
    return from_store(store, cfg, seconds)


def from_store(store: TokenStore, cfg: DataConfig, seconds: Dict[str, float]) -> PreparedData:
    tokenizer = Tokenizer(*store.models())
    splits = [TRAIN, VALID] + eval_split_names(store.splits)
    datasets = {
        split: ParallelDataset(store.tokens(split, "src"), store.tokens(split, "tgt")) for split in splits
    }
    evaluated = splits[1:]
    sources = {split: list(store.texts(split, "src")) for split in evaluated}
    references = {split: list(store.texts(split, "tgt")) for split in evaluated}
    built = store.manifest["stats"]
    stats = {
        "source": built["source"],
        "pair": f"{cfg.src}-{cfg.tgt}",
        "pairs": {split: len(ds) for split, ds in datasets.items()},
        "dropped_empty": built["dropped_empty"],
        "dropped_long": built["dropped_long"],
        "vocab": f"{tokenizer.src_vocab_size}"
        + ("" if tokenizer.joint else f" / {tokenizer.tgt_vocab_size}"),
        "joint_vocab": tokenizer.joint,
        "lengths": {split: length_stats(ds) for split, ds in datasets.items()},
        "store_bytes": store.size(),
        "seconds": dict(seconds),
    }
    train_text = None
    if cfg.sampling_alpha is not None:
        train_text = store.texts(TRAIN, "src"), store.texts(TRAIN, "tgt")
    return PreparedData(tokenizer, datasets, sources, references, stats, train_text, store.folder)


def build_store(folder: Path, corpus: Corpus, cfg: DataConfig) -> None:
    """Read, tokenize and encode every split of ``corpus`` into a new store at ``folder``."""
    log.info("data: building the token store %s", folder)
    start = time.perf_counter()
    text = TrainText(corpus[TRAIN], cfg.train_limit)
    if next(iter(text), None) is None:
        raise DataError(
            f"the training split of {describe_source(cfg)} holds no non-empty pair: check data.src/data.tgt and the files"
        )
    # reads the text at least once whole (the cache key), which counts it
    tokenizer = build_tokenizer(text, cfg.vocab_size, cfg.joint_vocab, cfg.spm_model_type, cfg.cache_dir)
    vocab_seconds = time.perf_counter() - start
    if text.dropped:
        log.info("dropped %d training pairs with an empty side", text.dropped)

    start = time.perf_counter()
    writer = StoreWriter(folder, ids_dtype(max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)))
    try:
        writer.models_from(*tokenizer_files(tokenizer))
        n_long = encode_train(writer, text, tokenizer, cfg.max_len)
        for split in [VALID] + eval_split_names(corpus):
            pairs = list(corpus[split].pairs())
            src, tgt = encode_pairs(tokenizer, pairs)
            sides = writer.split(split)
            sides["src"].append(src, [s for s, _ in pairs])
            sides["tgt"].append(tgt, [t for _, t in pairs])
        encode_seconds = time.perf_counter() - start
        writer.commit(
            {
                "source": describe_source(cfg),
                "dropped_empty": text.dropped,
                "dropped_long": n_long,
                "seconds": {"vocab": vocab_seconds, "encode": encode_seconds},
            }
        )
    except BaseException:
        writer.discard()
        raise


def tokenizer_files(tokenizer: Tokenizer) -> Tuple[List[str], List[bytes]]:
    if tokenizer.joint:
        return ["joint.model"], [tokenizer.src_model]
    return ["src.model", "tgt.model"], [tokenizer.src_model, tokenizer.tgt_model]


def encode_train(writer: StoreWriter, text: TrainText, tokenizer: Tokenizer, max_len: int) -> int:
    """Encode the training pairs on every core into ``writer``; the number dropped as too long."""
    total = text.pairs
    workers = usable_cores() if total >= 2 * CHUNK else 1
    sides = writer.split(TRAIN)
    encoded = closing(encode_chunks(chunked(text, CHUNK), tokenizer, workers))  # an error ends the pool too
    with encoded as chunks:
        n_long = write_train(sides, chunks, total, workers, max_len)
    if n_long:
        log.info("dropped %d training pairs longer than data.max_len=%d subword tokens", n_long, max_len)
    if n_long == total:
        raise DataError(
            f"every training pair is longer than data.max_len={max_len} subword tokens: raise data.max_len"
        )
    return n_long


def write_train(sides, chunks, total: int, workers: int, max_len: int) -> int:
    """Append the encoded chunks to the training split's writers, without the pairs longer than
    ``max_len`` on a side (their number is returned); the progress on standard error."""
    n_long = 0
    with progress_bar(total, f"encoding the training pairs on {workers} process(es)", "pairs") as bar:
        for chunk, src, tgt in chunks:
            keep = keep_mask(src, tgt, max_len)  # (N,)
            n_long += int(len(keep) - keep.sum())
            kept = [pair for pair, ok in zip(chunk, keep.tolist()) if ok]
            sides["src"].append(select(src, keep), [s for s, _ in kept])
            sides["tgt"].append(select(tgt, keep), [t for _, t in kept])
            bar.update(len(chunk))
    return n_long


def length_stats(dataset: ParallelDataset) -> Dict[str, float]:
    """Mean and max subword tokens per side (without BOS/EOS)."""
    src, tgt = dataset.src.lengths, dataset.tgt.lengths  # (N,)
    return {
        "src_mean": float(src.mean()) if len(src) else 0.0,
        "src_max": int(src.max(initial=0)),
        "tgt_mean": float(tgt.mean()) if len(tgt) else 0.0,
        "tgt_max": int(tgt.max(initial=0)),
    }


def batch_stats(sampler: TokenBucketSampler) -> Dict[str, float]:
    """Batches per epoch, mean pairs per batch and the padding ratio of the training batches."""
    batches = sampler.epoch_batches()
    return {
        "batch_tokens": sampler.batch_tokens,
        "batches": len(batches),
        "pairs_per_batch": statistics.fmean(len(b) for b in batches),
        "padding_ratio": padding_ratio(sampler),
    }


def format_stats(stats: Dict[str, object]) -> str:
    """The data block logged at the start of training, one fact per line."""
    lines = [f"data: {stats['source']} ({stats['pair']})"]
    for split, count in stats["pairs"].items():
        lengths = stats["lengths"][split]
        lines.append(
            f"  {split:<18} {count:>8} pairs  src mean/max {lengths['src_mean']:.1f}/{lengths['src_max']}"
            f"  tgt mean/max {lengths['tgt_mean']:.1f}/{lengths['tgt_max']} subwords"
        )
    lines.append(f"  dropped from train: {stats['dropped_empty']} empty, {stats['dropped_long']} too long")
    lines.append(f"  vocabulary: {stats['vocab']} ({'joint' if stats['joint_vocab'] else 'separate'})")
    if "batches" in stats:
        batches = stats["batches"]
        lines.append(
            f"  train batches: {batches['batches']} per epoch, {batches['pairs_per_batch']:.1f} pairs each, "
            f"padding {100 * batches['padding_ratio']:.1f}% (batch_tokens={batches['batch_tokens']})"
        )
    if "store_bytes" in stats:
        lines.append(f"  token store: {stats['store_bytes'] / 2**20:.1f} MiB")
    seconds = stats["seconds"]
    lines.append("  time: " + ", ".join(f"{name} {value:.2f} s" for name, value in seconds.items()))
    return "\n".join(lines)
