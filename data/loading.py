"""An epoch's batches collated in order, in this process or ahead of the training step by worker
processes (``trainer.loader_workers``).

A batch is a pure function of its pair indices (and, with subword sampling, of the epoch), so
the workers give the same tensors as this process would: the batch order, the training and exact
resume do not depend on how many workers there are. Workers pay off when collation is slow next
to the step (subword sampling on a GPU); on a CPU they take cores from the step.
"""

import multiprocessing
import signal
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data.batching import Batch
from data.errors import DataError

PREFETCH = 2  # batches each worker prepares ahead

Collate = Callable[[np.ndarray], Batch]


class CollatedBatches(Dataset):
    """Item ``i`` is ``collate(batches[i])``."""

    def __init__(self, batches: Sequence[np.ndarray], collate: Collate):
        self.batches, self.collate = batches, collate

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        return self.collate(self.batches[index])


def as_is(batch: Batch) -> Batch:
    """The DataLoader's ``collate_fn``: the item is a finished ``Batch`` already."""
    return batch


def ignore_stop_signals(worker_id: int) -> None:
    """A worker's start: Ctrl-C and SIGTERM are the training's to handle (it ends the workers),
    not each worker's (they would inherit the trainer's handler)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def collated(batches: Sequence[np.ndarray], collate: Collate, workers: int) -> Iterator[Batch]:
    """``collate(b)`` for every ``b`` of ``batches``, in order: here when ``workers`` is 0, else by
    ``workers`` processes (forked: nothing is pickled) that each keep ``PREFETCH`` batches ready.
    Close the iterator when stopping early: that ends the workers. A worker that fails or dies is
    one ``DataError``.

    The workers are forked after a GPU training has started CUDA (and NCCL), so they never touch
    either: they build CPU tensors, which the training process pins and copies (``Batch.to``);
    torch refuses CUDA in a forked child outright, an error rather than a hang (the token store's
    encoding workers follow the same rule, ``data/encoding.py``)."""
    if workers == 0:
        yield from map(collate, batches)
        return
    if "fork" not in multiprocessing.get_all_start_methods():
        raise DataError("trainer.loader_workers needs processes started by fork (Linux): set it to 0")
    loader = DataLoader(
        CollatedBatches(batches, collate),
        batch_size=None,  # each item is a whole batch
        collate_fn=as_is,
        num_workers=workers,
        prefetch_factor=PREFETCH,
        multiprocessing_context="fork",
        worker_init_fn=ignore_stop_signals,
        # the workers' seeds come from a generator of their own: drawn from torch's global one, they
        # would shift the dropout masks of the training (and its exact resume)
        generator=torch.Generator().manual_seed(0),
    )
    iterator = iter(loader)
    failure = None
    try:
        yield from iterator
    except Exception as error:  # raised in a worker, or a worker killed (say, out of memory)
        lines = str(error).strip().splitlines()  # a worker's error ends with its own last line
        failure = lines[-1] if lines else type(error).__name__
    finally:
        del iterator  # its last reference: the workers end now, not at some later collection
    if failure is not None:
        raise DataError(f"a trainer.loader_workers process failed ({failure}): set trainer.loader_workers=0")
