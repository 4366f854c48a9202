"""Id sequences kept flat: one array of every sequence's ids end to end, and their lengths.

``TokenArrays`` is how a split's source or target side lives in memory: in NumPy arrays (the
token store maps them from disk, so many runs and ranks share one copy), never as Python lists of
ints. ``padded`` turns some of its rows into a padded tensor in a few vectorised steps.
"""

from itertools import chain
from typing import Iterator, List, Sequence

import numpy as np
import torch
from torch import Tensor

from data.specials import BOS_ID, EOS_ID, PAD_ID


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """``(N,)`` lengths -> ``(N + 1,)`` int64 start positions (the last one is the total)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


class TokenArrays:
    """``N`` id sequences: sequence ``i`` is ``ids[offsets[i] : offsets[i + 1]]``.

    ``ids`` may be any integer array, a read-only memory map included (it is never written).
    """

    def __init__(self, ids: np.ndarray, lengths: np.ndarray):
        self.ids = ids  # (total,)
        self.lengths = np.asarray(lengths, dtype=np.int64)  # (N,)
        self.offsets = offsets_of(self.lengths)  # (N + 1,)
        if self.offsets[-1] != len(ids):
            raise ValueError(f"the lengths add up to {self.offsets[-1]} ids, but there are {len(ids)}")

    @classmethod
    def from_lists(cls, sequences: Sequence[Sequence[int]]) -> "TokenArrays":
        lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
        ids = np.fromiter(chain.from_iterable(sequences), dtype=np.int64, count=int(lengths.sum()))
        return cls(ids, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator:
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index: int) -> List[int]:
        """Sequence ``index`` as a list of ints."""
        return self.ids[self.offsets[index] : self.offsets[index + 1]].tolist()

    def padded(self, rows: np.ndarray, bos: bool = False, eos: bool = False, pad_id: int = PAD_ID) -> Tensor:
        """Sequences ``rows`` as a ``(B, L)`` long tensor: BOS first and/or EOS after the ids when
        asked, ``pad_id`` after each row's end (``L`` the longest row with its BOS/EOS)."""
        rows = np.asarray(rows, dtype=np.int64)  # (B,)
        lengths = self.lengths[rows]  # (B,)
        first = int(bos)
        longest = int(lengths.max(initial=0))
        out = np.full((len(rows), longest + first + int(eos)), pad_id, dtype=np.int64)  # (B, L)
        columns = np.arange(longest)  # (M,)
        inside = columns[None, :] < lengths[:, None]  # (B, M) which positions hold a token
        positions = self.offsets[rows][:, None] + columns[None, :]  # (B, M) where each token lies
        out[:, first : first + longest][inside] = self.ids[positions[inside]]
        if bos:
            out[:, 0] = BOS_ID
        if eos:
            out[np.arange(len(rows)), lengths + first] = EOS_ID
        return torch.from_numpy(out)
