"""Text to ids on every core: chunks of pairs go to worker processes, the ids come back in order.

``encode_chunks`` keeps at most two chunks per worker in flight, so a corpus larger than memory
streams through in bounded memory. Each worker holds its own copy of the SentencePiece model(s);
ids come back as ``TokenArrays`` (flat arrays, cheap to send between processes), the same ids as
``Tokenizer.encode_src`` / ``encode_tgt`` give serially.

Each worker has two pipes of its own (chunks down, ids up) that no other process holds, so a
worker that dies (killed for memory, say) always shows: reading its ids ends in end-of-file and
sending it a chunk in a broken pipe, even when it died halfway through a message. (A pool that
shares one queue among its workers, as ``concurrent.futures.ProcessPoolExecutor`` does, can wait
forever on a message its dead worker never finished.)
"""

import multiprocessing
import os
import queue
import signal
import threading
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from data.batching import TokenArrays
from data.errors import DataError
from data.tokenizer import Tokenizer

Chunk = List[Tuple[str, str]]  # (source, target) pairs
IN_FLIGHT = 2  # chunks per worker waiting or being encoded
MAX_WORKERS = 16  # more gain little (the reading and writing is one process) and cost a model each
EXIT_SECONDS = 10  # for a finished worker to exit before it is terminated
DIED = "a worker encoding the training text died (out of memory, or it could not start): free memory and run again"


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


@dataclass
class Worker:
    """The parent's side of one encoding process: chunks go down ``tasks``, ids come up ``results``."""

    process: multiprocessing.process.BaseProcess
    tasks: Connection
    results: Connection


def encode_chunks(
    chunks: Iterable[Chunk], tokenizer: Tokenizer, workers: int, method: Optional[str] = None
) -> Iterator[Tuple[Chunk, TokenArrays, TokenArrays]]:
    """``(chunk, source ids, target ids)`` for every chunk, in input order, encoded by ``workers``
    processes (1: in this process) started by ``method`` (None: ``start_method``). Chunk ``i`` goes
    to worker ``i % workers``. A worker that dies or fails is one ``DataError``; the workers end with
    the iterator, also when it is closed early."""
    if workers <= 1:
        for chunk in chunks:
            yield (chunk, *encode_pairs(tokenizer, chunk))
        return
    pool = start_workers(workers, tokenizer.state_dict(), method)
    finished = False
    try:
        pending: deque = deque()  # (chunk, worker) in input order
        for index, chunk in enumerate(chunks):
            if len(pending) == IN_FLIGHT * workers:  # the oldest is on the worker chunk `index` goes to
                yield receive_ids(*pending.popleft())
            worker = pool[index % workers]
            send_chunk(worker, chunk)
            pending.append((chunk, worker))
        while pending:
            yield receive_ids(*pending.popleft())
        finished = True
    finally:
        stop_workers(pool, finished)


def send_chunk(worker: Worker, chunk: Chunk) -> None:
    """Hand ``chunk`` to ``worker`` (waits while its pipe is full); a dead worker is a ``DataError``."""
    try:
        worker.tasks.send(chunk)
    except OSError:  # a broken pipe: the worker is gone
        raise DataError(DIED) from None


def receive_ids(chunk: Chunk, worker: Worker) -> Tuple[Chunk, TokenArrays, TokenArrays]:
    """``(chunk, source ids, target ids)`` from ``worker``, the next chunk it was handed; a dead
    or failed worker is a ``DataError``."""
    try:
        ok, answer = worker.results.recv()
    except (EOFError, OSError):  # the worker is gone, perhaps halfway through sending
        raise DataError(DIED) from None
    if not ok:
        raise DataError(f"encoding the training text failed in a worker: {answer}")
    return (chunk, *answer)


def start_method(available: Sequence[str]) -> str:
    """Fork where there is fork (quick to start, nothing to re-import), else spawn. Forked from a
    training that has started CUDA (and NCCL), a worker never touches either: it runs
    SentencePiece and NumPy only (torch refuses CUDA in such a child: an error, not a hang)."""
    return "fork" if "fork" in available else "spawn"


def start_workers(n: int, state: Dict[str, Optional[bytes]], method: Optional[str] = None) -> List[Worker]:
    """``n`` started workers, each with its own pair of pipes, started by ``method`` (None:
    ``start_method`` of this process)."""
    method = method or start_method(multiprocessing.get_all_start_methods())
    fork = method == "fork"
    context = multiprocessing.get_context(method)
    pool: List[Worker] = []
    try:
        for _ in range(n):
            task_reader, task_writer = context.Pipe(duplex=False)
            result_reader, result_writer = context.Pipe(duplex=False)
            copied = [end for worker in pool for end in (worker.tasks, worker.results)]
            copied += [task_writer, result_reader]  # what a forked worker must close (the parent's ends)
            args = (state, task_reader, result_writer, copied if fork else [])
            process = context.Process(target=run_worker, args=args, name="encoder", daemon=True)
            process.start()
            task_reader.close()  # the worker's ends are the worker's alone
            result_writer.close()
            pool.append(Worker(process, task_writer, result_reader))
    except OSError as error:  # fork failed: no memory or no processes left
        stop_workers(pool, finished=False)
        raise DataError(
            f"cannot start the workers encoding the training text ({error}): free memory and run again"
        ) from None
    except BaseException:  # no process left behind by a start cut short (Ctrl-C, say)
        stop_workers(pool, finished=False)
        raise
    return pool


def stop_workers(pool: List[Worker], finished: bool) -> None:
    """End the workers and wait for them: a finished pool's workers exit when their chunks end
    (or are terminated after ``EXIT_SECONDS``); after an error or an early stop they are terminated
    at once (no one reads what they have left)."""
    for worker in pool:
        worker.tasks.close()
        if not finished:
            worker.process.terminate()
    for worker in pool:
        worker.process.join(EXIT_SECONDS)
        if worker.process.is_alive():  # its chunks never ended: a later fork holds a copy of the pipe
            worker.process.terminate()
            worker.process.join()
        worker.process.close()
        worker.results.close()


def run_worker(
    state: Dict[str, Optional[bytes]], tasks: Connection, results: Connection, parent_ends: List[Connection]
) -> None:
    """A worker's life: encode every chunk read from ``tasks`` and send the ids up ``results``,
    until the parent closes ``tasks``. ``parent_ends``: the parent's ends of this worker's pipes
    and of the workers forked before it, which the fork copied; closed here, so that each pipe
    ends with its two processes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle (it ends the workers)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not a training's inherited handler: terminate() ends it
    for end in parent_ends:
        end.close()
    tokenizer = Tokenizer.from_state_dict(state)
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    sender = threading.Thread(target=send_all, args=(outbox, results))
    sender.start()
    try:
        while True:
            try:
                chunk = tasks.recv()
            except EOFError:  # the parent has sent everything
                break
            outbox.put(encoded_or_error(tokenizer, chunk))
    finally:
        outbox.put(None)
        sender.join()


def send_all(outbox: queue.SimpleQueue, results: Connection) -> None:
    """Send ``outbox``'s answers up ``results`` until ``None``. A thread of its own, so that the
    worker goes back to reading chunks while an answer waits to be read: the parent and the worker
    never both wait to send. The pipe is closed when the thread ends, however it ends: the parent
    then reads an end-of-file instead of waiting for answers that will not come."""
    try:
        for answer in iter(outbox.get, None):
            results.send(answer)
    except OSError:  # a broken pipe: the parent stopped early
        pass
    finally:
        results.close()


def encoded_or_error(tokenizer: Tokenizer, chunk: Chunk) -> Tuple[bool, object]:
    """``(True, (source ids, target ids))``, or ``(False, the error)`` when encoding fails."""
    try:
        return True, encode_pairs(tokenizer, chunk)
    except Exception as error:  # sent to the parent, which raises it as a DataError
        return False, f"{type(error).__name__}: {error}"


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
