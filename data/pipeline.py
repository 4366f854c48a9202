"""From a data config to tokenized splits: load, clean, build the vocabulary, encode, filter, count.

``prepare_data(cfg)`` is the one call the trainer makes; ``batch_stats`` and ``format_stats``
give the block logged at start.
"""

import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from data.batching import ParallelDataset, TokenBucketSampler, padding_ratio
from data.config import DataConfig
from data.corpus import TRAIN, VALID, Pairs, describe_source, drop_empty_pairs, eval_split_names, load_corpus
from data.errors import DataError
from data.tokenizer import Tokenizer, build_tokenizer

log = logging.getLogger(__name__)


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    datasets: Dict[str, ParallelDataset]  # train, val, test_*: token ids
    sources: Dict[str, List[str]]  # raw source text of val and test_* (input order)
    references: Dict[str, List[str]]  # raw target text of val and test_*, for sacrebleu
    stats: Dict[str, object] = field(default_factory=dict)
    # the training pairs' source and target text, kept for data.sampling_alpha only
    train_text: Optional[Tuple[List[str], List[str]]] = None

    @property
    def test_splits(self) -> List[str]:
        return eval_split_names(self.datasets)


def short_pairs(src: List[List[int]], tgt: List[List[int]], max_len: int) -> List[int]:
    """The indices of the pairs whose two sides have at most ``max_len`` subword tokens."""
    return [i for i, (s, t) in enumerate(zip(src, tgt)) if len(s) <= max_len and len(t) <= max_len]


def prepare_data(cfg: DataConfig) -> PreparedData:
    """Load the corpus ``cfg`` names, build or reuse the tokenizer and encode every split.

    Training pairs that are empty on a side, or longer than ``cfg.max_len`` subword tokens on a
    side, are dropped (counted in ``stats``); validation and test splits are kept whole, in order.
    """
    start = time.perf_counter()
    corpus = load_corpus(cfg)
    train, n_empty = drop_empty_pairs(corpus[TRAIN])
    if not train:
        raise DataError(
            f"the training split of {describe_source(cfg)} holds no non-empty pair: check data.src/data.tgt and the files"
        )
    if n_empty:
        log.info("dropped %d training pairs with an empty side", n_empty)
    load_seconds = time.perf_counter() - start

    start = time.perf_counter()
    tokenizer = build_tokenizer(train, cfg.vocab_size, cfg.joint_vocab, cfg.spm_model_type, cfg.cache_dir)
    vocab_seconds = time.perf_counter() - start

    start = time.perf_counter()
    src, tgt = tokenizer.encode_src([s for s, _ in train]), tokenizer.encode_tgt([t for _, t in train])
    keep = short_pairs(src, tgt, cfg.max_len)
    src, tgt, n_long = [src[i] for i in keep], [tgt[i] for i in keep], len(src) - len(keep)
    if n_long:
        log.info("dropped %d training pairs longer than data.max_len=%d subword tokens", n_long, cfg.max_len)
    if not src:
        raise DataError(
            f"every training pair is longer than data.max_len={cfg.max_len} subword tokens: raise data.max_len"
        )
    datasets = {TRAIN: ParallelDataset(src, tgt)}
    sources, references = {}, {}
    for split in [VALID] + eval_split_names(corpus):
        pairs: Pairs = corpus[split]
        sources[split] = [s for s, _ in pairs]
        references[split] = [t for _, t in pairs]
        datasets[split] = ParallelDataset(
            tokenizer.encode_src(sources[split]), tokenizer.encode_tgt(references[split])
        )
    encode_seconds = time.perf_counter() - start

    stats = {
        "source": describe_source(cfg),
        "pair": f"{cfg.src}-{cfg.tgt}",
        "pairs": {split: len(ds) for split, ds in datasets.items()},
        "dropped_empty": n_empty,
        "dropped_long": n_long,
        "vocab": f"{tokenizer.src_vocab_size}"
        + ("" if tokenizer.joint else f" / {tokenizer.tgt_vocab_size}"),
        "joint_vocab": tokenizer.joint,
        "lengths": {split: length_stats(ds) for split, ds in datasets.items()},
        "seconds": {"load": load_seconds, "vocab": vocab_seconds, "encode": encode_seconds},
    }
    train_text = None
    if cfg.sampling_alpha is not None:
        train_text = [train[i][0] for i in keep], [train[i][1] for i in keep]
    return PreparedData(tokenizer, datasets, sources, references, stats, train_text)


def length_stats(dataset: ParallelDataset) -> Dict[str, float]:
    """Mean and max subword tokens per side (without BOS/EOS)."""
    src = [len(ids) for ids in dataset.src] or [0]
    tgt = [len(ids) for ids in dataset.tgt] or [0]
    return {
        "src_mean": statistics.fmean(src),
        "src_max": max(src),
        "tgt_mean": statistics.fmean(tgt),
        "tgt_max": max(tgt),
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
    seconds = stats["seconds"]
    lines.append("  time: " + ", ".join(f"{name} {value:.2f} s" for name, value in seconds.items()))
    return "\n".join(lines)
