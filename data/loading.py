"""An epoch's batches collated in order, in this process or ahead of the training step by worker
processes (``trainer.loader_workers``).

A batch is a pure function of its pair indices (and, with subword sampling, of the epoch), so
the workers give the same tensors as this process would: the batch order, the training and exact
resume do not depend on how many workers there are. Workers pay off when collation is slow next
to the step (subword sampling on a GPU); on a CPU they take cores from the step.
"""

from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data.batching import Batch

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


def collated(batches: Sequence[np.ndarray], collate: Collate, workers: int) -> Iterator[Batch]:
    """``collate(b)`` for every ``b`` of ``batches``, in order: here when ``workers`` is 0, else by
    ``workers`` processes (forked: nothing is pickled) that each keep ``PREFETCH`` batches ready.
    Close the iterator when stopping early: that ends the workers."""
    if workers == 0:
        yield from map(collate, batches)
        return
    loader = DataLoader(
        CollatedBatches(batches, collate),
        batch_size=None,  # each item is a whole batch
        collate_fn=as_is,
        num_workers=workers,
        prefetch_factor=PREFETCH,
        multiprocessing_context="fork",
        # the workers' seeds come from a generator of their own: drawn from torch's global one, they
        # would shift the dropout masks of the training (and its exact resume)
        generator=torch.Generator().manual_seed(0),
    )
    iterator = iter(loader)
    try:
        yield from iterator
    finally:
        del iterator  # its last reference: the workers end now, not at some later collection
