"""Token ids to padded batches: id sequences kept flat, a dataset of them, a token-bucket batch
sampler, collate.

``TokenArrays`` is how a split's source or target side lives in memory: in NumPy arrays (the
token store maps them from disk, so many runs and ranks share one copy), never as Python lists of
ints; ``padded`` turns some of its rows into a padded tensor in a few vectorised steps.

Sequence layout (ids from ``data.tokenizer``)::

    src     = x_1 .. x_n EOS        (B, S)
    tgt_in  = BOS y_1 .. y_m        (B, T)   decoder input (teacher forcing)
    tgt_out = y_1 .. y_m EOS        (B, T)   what the decoder must predict

Batch size is a token budget, ``batch_tokens``, counted *with* padding: a batch of ``n`` pairs
costs ``n * (S + T)``, the positions of ``src`` plus those of ``tgt_in`` (``tgt_out`` is the same
sequence shifted), which is what the encoder and decoder compute over. Sorting pairs by length
before packing keeps the padding low. With a ``multiple`` (``data.pad_multiple``) every length is
rounded up to a multiple of it, in the tensors and in the budget alike: a bounded set of shapes
for a compiled model and for GPU kernels that want multiples of 8.
"""

import functools
from dataclasses import dataclass
from itertools import chain
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Sampler

from data.specials import BOS_ID, EOS_ID, PAD_ID


def round_up(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """``lengths`` rounded up to a multiple of ``multiple`` (1: as they are)."""
    return -(-np.asarray(lengths, dtype=np.int64) // multiple) * multiple


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

    def padded(
        self, rows: np.ndarray, bos: bool = False, eos: bool = False, pad_id: int = PAD_ID, multiple: int = 1
    ) -> Tensor:
        """Sequences ``rows`` as a ``(B, L)`` long tensor: BOS first and/or EOS after the ids when
        asked, ``pad_id`` after each row's end (``L`` the longest row with its BOS/EOS, rounded up
        to a multiple of ``multiple``)."""
        rows = np.asarray(rows, dtype=np.int64)  # (B,)
        lengths = self.lengths[rows]  # (B,)
        first = int(bos)
        longest = int(lengths.max(initial=0))
        width = int(round_up(longest + first + int(eos), multiple))
        out = np.full((len(rows), width), pad_id, dtype=np.int64)  # (B, L)
        columns = np.arange(longest)  # (M,)
        inside = columns[None, :] < lengths[:, None]  # (B, M) which positions hold a token
        positions = self.offsets[rows][:, None] + columns[None, :]  # (B, M) where each token lies
        out[:, first : first + longest][inside] = self.ids[positions[inside]]
        if bos:
            out[:, 0] = BOS_ID
        if eos:
            out[np.arange(len(rows)), lengths + first] = EOS_ID
        return torch.from_numpy(out)


@dataclass
class PieceLinks:
    """Each training pair's links between pieces: link ``k`` of pair ``i`` joins source piece
    ``src[i][k]`` and target piece ``tgt[i][k]`` (positions without BOS/EOS, from 0)."""

    src: TokenArrays
    tgt: TokenArrays

    def __len__(self) -> int:
        return len(self.src)

    def distributions(self, rows: np.ndarray, n_src: int, n_tgt: int) -> Tensor:
        """``(B, T, S)`` float32 for pairs ``rows``: each target piece's links spread evenly over the
        source pieces they name; zeros where a piece has none (and at padding, BOS and EOS)."""
        rows = np.asarray(rows, dtype=np.int64)  # (B,)
        counts = self.src.lengths[rows]  # (B,) links of each pair
        starts = self.src.offsets[rows]  # (B,)
        pair = np.repeat(np.arange(len(rows)), counts)  # (K,) each link's row in the batch
        first = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)  # (K,)
        positions = first + np.arange(int(counts.sum()))  # (K,) where each link lies in the arrays
        out = np.zeros((len(rows), n_tgt, n_src), dtype=np.float32)  # (B, T, S)
        out[pair, self.tgt.ids[positions], self.src.ids[positions]] = 1.0
        totals = out.sum(axis=2, keepdims=True)  # (B, T, 1)
        return torch.from_numpy(out / np.maximum(totals, 1.0))  # (B, T, S)


Sequences = Union[TokenArrays, Sequence[Sequence[int]]]
SEED_MASK = (1 << 64) - 1


def token_arrays(sequences: Sequences) -> TokenArrays:
    return sequences if isinstance(sequences, TokenArrays) else TokenArrays.from_lists(sequences)


class ParallelDataset(Dataset):
    """Aligned source and target id sequences (without BOS/EOS) of one split, as ``TokenArrays``
    (lists of id lists are converted)."""

    def __init__(self, src: Sequences, tgt: Sequences, links: Optional[PieceLinks] = None):
        self.src, self.tgt = token_arrays(src), token_arrays(tgt)
        assert len(self.src) == len(self.tgt), "source and target must be aligned"
        self.links = (
            links  # guided alignment's reference links of every pair (alignment/reference.py), or None
        )

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index: int) -> Tuple[int, List[int], List[int]]:
        return index, self.src[index], self.tgt[index]

    def src_lengths(self) -> np.ndarray:
        """``(N,)`` length of every ``src`` row: tokens + EOS."""
        return self.src.lengths + 1

    def tgt_lengths(self) -> np.ndarray:
        """``(N,)`` length of every ``tgt_in`` / ``tgt_out`` row: tokens + BOS (or EOS)."""
        return self.tgt.lengths + 1

    def batch(self, indices: Sequence[int], multiple: int = 1) -> "Batch":
        """The pairs ``indices`` as a padded ``Batch`` (lengths rounded up to a multiple of ``multiple``)."""
        rows = np.asarray(indices, dtype=np.int64)
        return make_batch(self.src, self.tgt, rows, links=self.links, multiple=multiple)


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + EOS, PAD after the end
    src_lengths: Tensor  # (B,)
    tgt_in: Tensor  # (B, T) BOS + target ids
    tgt_out: Tensor  # (B, T) target ids + EOS
    tgt_lengths: Tensor  # (B,)
    indices: Tensor  # (B,) each pair's position in its split: restores the input order
    # (B, T, S) guided alignment's reference: each target piece's links spread over the source pieces
    # (alignment/reference.py); None without
    links: Optional[Tensor] = None

    def to(self, device: torch.device) -> "Batch":
        """The batch on ``device``. A copy to CUDA goes through pinned memory, so that it does not
        wait for the GPU's queue (a copy from pageable memory would: a host sync per batch)."""
        device = torch.device(device)
        pin = device.type == "cuda"
        return Batch(
            *(
                None
                if t is None
                else (t.pin_memory() if pin and t.device.type == "cpu" else t).to(device, non_blocking=True)
                for t in (getattr(self, name) for name in self.__dataclass_fields__)
            )
        )

    @property
    def src_mask(self) -> Tensor:
        """``source_mask`` of the source ids: ``(B, S)``, True at real tokens."""
        return source_mask(self.src)  # (B, S)

    @functools.cached_property
    def n_tgt_tokens(self) -> int:
        """The target tokens (EOS included): read once, from the batch as collated on the host."""
        return int(self.tgt_lengths.sum())


def source_mask(src: Tensor) -> Tensor:
    """The padding mask of source ids ``(B, S)`` padded with PAD, True at real tokens: built from the
    ids (no host sync, on any device). The one source mask of training, evaluation and translation."""
    return src != PAD_ID  # (B, S)


def pad(sequences: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> Tensor:
    """List of id lists -> ``(B, T)`` long tensor padded with ``pad_id`` after each row's end
    (``T`` the longest row; ``(0, 0)`` for no rows)."""
    return TokenArrays.from_lists(sequences).padded(np.arange(len(sequences)), pad_id=pad_id)


def make_batch(
    src: TokenArrays,
    tgt: TokenArrays,
    rows: np.ndarray,
    indices: Optional[np.ndarray] = None,
    links: Optional[PieceLinks] = None,
    multiple: int = 1,
) -> Batch:
    """Rows ``rows`` of aligned ``src`` and ``tgt`` -> a padded ``Batch`` (EOS, BOS added here);
    ``indices`` are the pairs' positions in their split (default: ``rows``); ``links`` their reference
    alignments (guided alignment); ``S`` and ``T`` rounded up to a multiple of ``multiple``."""
    src_lengths = src.lengths[rows] + 1  # (B,)
    padded_src = src.padded(rows, eos=True, multiple=multiple)  # (B, S)
    tgt_out = tgt.padded(rows, eos=True, multiple=multiple)  # (B, T)
    return Batch(
        src=padded_src,  # (B, S)
        src_lengths=torch.from_numpy(src_lengths),  # (B,)
        tgt_in=tgt.padded(rows, bos=True, multiple=multiple),  # (B, T)
        tgt_out=tgt_out,  # (B, T)
        tgt_lengths=torch.from_numpy(tgt.lengths[rows] + 1),  # (B,)
        indices=torch.from_numpy(np.asarray(rows if indices is None else indices, dtype=np.int64)),  # (B,)
        links=None if links is None else links.distributions(rows, padded_src.size(1), tgt_out.size(1)),
    )


def collate(examples: Sequence[Tuple[int, Sequence[int], Sequence[int]]], multiple: int = 1) -> Batch:
    """``(index, src ids, tgt ids)`` examples -> a padded ``Batch`` (EOS, BOS added here; lengths
    rounded up to a multiple of ``multiple``)."""
    indices, src, tgt = zip(*examples)
    rows = np.arange(len(examples))
    src_arrays, tgt_arrays = TokenArrays.from_lists(src), TokenArrays.from_lists(tgt)
    return make_batch(src_arrays, tgt_arrays, rows, np.asarray(indices), multiple=multiple)


def pack(
    order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray, batch_tokens: int
) -> List[np.ndarray]:
    """Cut ``order`` into consecutive batches whose padded size stays within ``batch_tokens``.

    A batch of ``n`` pairs costs ``n * (longest src + longest tgt)``; each batch takes as many of
    the next pairs as fit (a pair that alone exceeds the budget forms a batch of its own). One
    vectorised step per batch: the cost of every prefix of a window is non-decreasing, so the
    number that fit is a binary search.
    """
    order = np.asarray(order, dtype=np.int64)
    src = np.asarray(src_lengths, dtype=np.int64)[order]  # (N,) in batch order
    tgt = np.asarray(tgt_lengths, dtype=np.int64)[order]  # (N,)
    starts, start, n = [], 0, len(order)
    if n == 0:
        return []
    while start < n:
        # no batch from here holds more than this: every pair costs at least the first one's lengths
        window = max(1, min(n - start, batch_tokens // int(src[start] + tgt[start])))
        counts = np.arange(1, window + 1)  # (window,)
        cost = (
            counts
            * (  # (window,) the cost of the first 1, 2, ..., window pairs
                np.maximum.accumulate(src[start : start + window])
                + np.maximum.accumulate(tgt[start : start + window])
            )
        )
        starts.append(start)
        start += max(1, int(np.searchsorted(cost, batch_tokens, side="right")))
    return np.split(order, starts[1:])


def length_key(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """``(N,)`` one integer per pair that sorts like ``(src length, tgt length)``: 16 bits when it
    fits (NumPy sorts those stably by radix, in linear time), else 64."""
    if not len(src_lengths):
        return np.zeros(0, dtype=np.int64)
    key = src_lengths * (int(tgt_lengths.max()) + 1) + tgt_lengths  # (N,) int64
    return key.astype(np.uint16) if key.max() < 1 << 16 else key


class TokenBucketSampler(Sampler[np.ndarray]):
    """Batches of pair indices of similar length within a token budget.

    Training (``shuffle=True``): each epoch the pairs are shuffled, stably sorted by source length,
    then target length (so equal lengths mix differently every epoch), packed, and the batches
    shuffled; the order is a function of ``(seed, epoch)`` only (NumPy's PCG64 seeded with both).
    Evaluation (``shuffle=False``): pairs sorted by length (ties in input order), batches in that
    order; ``Batch.indices`` gives the original positions back. Lengths are NumPy arrays and every
    step is vectorised but the packing (one step per batch).

    Data parallel: rank ``r`` of ``world_size`` takes batches ``r, r + world_size, ...`` of the
    epoch's list, so the shards are disjoint. Every rank gets the same number of batches (a rank with
    one more would wait for the others at its extra gradient all-reduce): the last
    ``len % world_size`` batches of the shuffled list sit the epoch out, other ones every epoch.

    With a ``multiple`` the budget counts each length rounded up to a multiple of it, as the
    batches' tensors are padded (``data.pad_multiple``).
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        batch_tokens: int,
        shuffle: bool = True,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
        multiple: int = 1,
    ):
        if batch_tokens <= 0:
            raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)  # (N,)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)  # (N,)
        self.batch_tokens, self.shuffle, self.seed = batch_tokens, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.multiple = multiple
        self.epoch = 0
        self._cache: Dict[int, List[np.ndarray]] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_batches(self, epoch: Optional[int] = None) -> List[np.ndarray]:
        """All batches of an epoch, across every rank: arrays of pair indices."""
        epoch = self.epoch if epoch is None else epoch
        if epoch not in self._cache:
            self._cache = {epoch: self._make_batches(epoch)}  # keep one epoch: the current one
        return self._cache[epoch]

    def _make_batches(self, epoch: int) -> List[np.ndarray]:
        n = len(self.src_lengths)
        rng = np.random.default_rng([self.seed & SEED_MASK, epoch])  # NumPy seeds are not negative
        shuffled = rng.permutation(n) if self.shuffle else np.arange(n)  # (N,)
        key = length_key(self.src_lengths, self.tgt_lengths)[shuffled]  # (N,)
        order = shuffled[np.argsort(key, kind="stable")]  # (N,) by src, then tgt, then shuffled place
        padded = round_up(self.src_lengths, self.multiple), round_up(self.tgt_lengths, self.multiple)
        batches = pack(order, *padded, self.batch_tokens)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def shard(self) -> List[List[int]]:
        """This rank's batches of the current epoch."""
        batches = self.epoch_batches()
        usable = len(batches) - len(batches) % self.world_size
        return batches[:usable][self.rank :: self.world_size]

    def __iter__(self):
        return iter(self.shard())

    def __len__(self) -> int:
        return len(self.shard())


def padding_ratio(sampler: TokenBucketSampler) -> float:
    """Share of the batch tensors' positions that are padding, over one epoch of ``sampler``."""
    batches = sampler.epoch_batches()
    if not batches:
        return 0.0
    order = np.concatenate(batches)  # (N,) the epoch's pairs, batch after batch
    sizes = np.array([len(batch) for batch in batches])  # (n_batches,)
    starts = offsets_of(sizes)[:-1]  # (n_batches,) where each batch begins
    src, tgt = sampler.src_lengths[order], sampler.tgt_lengths[order]  # (N,)
    widths = [round_up(np.maximum.reduceat(lengths, starts), sampler.multiple) for lengths in (src, tgt)]
    padded = int((sizes * (widths[0] + widths[1])).sum())
    return 1.0 - int(src.sum() + tgt.sum()) / padded


def ordered_batches(dataset: ParallelDataset, batch_tokens: int) -> Iterator[Batch]:
    """Length-sorted batches of a whole split (``Batch.indices`` restore the input order): what
    decoding, validation and the attention statistics go through."""
    sampler = TokenBucketSampler(dataset.src_lengths(), dataset.tgt_lengths(), batch_tokens, shuffle=False)
    for indices in sampler:
        yield dataset.batch(indices)
