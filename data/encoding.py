"""Text to ids on every core: chunks of pairs go to worker processes, the ids come back in order.

``encode_chunks`` keeps at most two chunks per worker in flight, so a corpus larger than memory
streams through in bounded memory. Each worker holds its own copy of the SentencePiece model(s);
ids come back as ``TokenArrays`` (flat arrays, cheap to send between processes), the same ids as
``Tokenizer.encode_src`` / ``encode_tgt`` give serially.
"""

import multiprocessing
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from data.arrays import TokenArrays
from data.errors import DataError
from data.tokenizer import Tokenizer

Chunk = List[Tuple[str, str]]  # (source, target) pairs
IN_FLIGHT = 2  # chunks per worker waiting or being encoded
MAX_WORKERS = 16  # more gain little (the reading and writing is one process) and cost a model each

_worker_tokenizer: Optional[Tokenizer] = None  # each worker's own, set by init_worker


def usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. under taskset or SLURM), at most
    ``MAX_WORKERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return min(cores, MAX_WORKERS)


def encode_pairs(tokenizer: Tokenizer, pairs: Sequence[Tuple[str, str]]) -> Tuple[TokenArrays, TokenArrays]:
    """The source and target ids of ``pairs``, as flat arrays."""
    src = tokenizer.encode_src([s for s, _ in pairs])
    tgt = tokenizer.encode_tgt([t for _, t in pairs])
    return TokenArrays.from_lists(src), TokenArrays.from_lists(tgt)


def init_worker(state: Dict[str, Optional[bytes]]) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer.from_state_dict(state)


def encode_in_worker(pairs: Chunk) -> Tuple[TokenArrays, TokenArrays]:
    return encode_pairs(_worker_tokenizer, pairs)


def pool_context() -> multiprocessing.context.BaseContext:
    """Fork where there is fork (quick to start, nothing to re-import; as torch's DataLoader
    workers: the children run SentencePiece and NumPy only, never torch), else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def encode_chunks(
    chunks: Iterable[Chunk], tokenizer: Tokenizer, workers: int
) -> Iterator[Tuple[Chunk, TokenArrays, TokenArrays]]:
    """``(chunk, source ids, target ids)`` for every chunk, in input order, encoded by ``workers``
    processes (1: in this process)."""
    if workers <= 1:
        for chunk in chunks:
            yield (chunk, *encode_pairs(tokenizer, chunk))
        return
    pool = ProcessPoolExecutor(
        workers, mp_context=pool_context(), initializer=init_worker, initargs=(tokenizer.state_dict(),)
    )
    try:
        pending: deque = deque()
        for chunk in chunks:
            pending.append((chunk, pool.submit(encode_in_worker, chunk)))
            if len(pending) >= IN_FLIGHT * workers:
                done, future = pending.popleft()
                yield (done, *future.result())
        while pending:
            done, future = pending.popleft()
            yield (done, *future.result())
    except BrokenProcessPool:  # a worker was killed (say, out of memory): fail instead of waiting
        raise DataError(
            "a worker encoding the training text died (out of memory, or it could not start): free memory and run again"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # also when the caller stops early


def chunked(pairs: Iterable[Tuple[str, str]], size: int) -> Iterator[Chunk]:
    """Lists of ``size`` consecutive pairs (the last one shorter)."""
    chunk: Chunk = []
    for pair in pairs:
        chunk.append(pair)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def keep_mask(src: TokenArrays, tgt: TokenArrays, max_len: int) -> np.ndarray:
    """``(N,)`` which pairs have at most ``max_len`` ids on both sides."""
    return (src.lengths <= max_len) & (tgt.lengths <= max_len)


def select(arrays: TokenArrays, keep: np.ndarray) -> TokenArrays:
    """The sequences where ``keep`` is true, as new flat arrays."""
    return TokenArrays(arrays.ids[np.repeat(keep, arrays.lengths)], arrays.lengths[keep])
