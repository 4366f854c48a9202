"""Token ids to padded batches: a dataset of id sequences, a token-bucket batch sampler, collate.

Sequence layout (ids from ``data.tokenizer``)::

    src     = x_1 .. x_n EOS        (B, S)
    tgt_in  = BOS y_1 .. y_m        (B, T)   decoder input (teacher forcing)
    tgt_out = y_1 .. y_m EOS        (B, T)   what the decoder must predict

Batch size is a token budget, ``batch_tokens``, counted *with* padding: a batch of ``n`` pairs
costs ``n * (S + T)``, the positions of ``src`` plus those of ``tgt_in`` (``tgt_out`` is the same
sequence shifted), which is what the encoder and decoder compute over. Sorting pairs by length
before packing keeps the padding low.
"""

import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils.data import Dataset, Sampler

from data.specials import BOS_ID, EOS_ID, PAD_ID


class ParallelDataset(Dataset):
    """Aligned source and target id sequences (without BOS/EOS) of one split."""

    def __init__(self, src: List[List[int]], tgt: List[List[int]]):
        assert len(src) == len(tgt), "source and target must be aligned"
        self.src, self.tgt = src, tgt

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, index: int) -> Tuple[int, List[int], List[int]]:
        return index, self.src[index], self.tgt[index]

    def src_lengths(self) -> List[int]:
        """Length of every ``src`` row: tokens + EOS."""
        return [len(ids) + 1 for ids in self.src]

    def tgt_lengths(self) -> List[int]:
        """Length of every ``tgt_in`` / ``tgt_out`` row: tokens + BOS (or EOS)."""
        return [len(ids) + 1 for ids in self.tgt]


@dataclass
class Batch:
    src: Tensor  # (B, S) source ids + EOS, PAD after the end
    src_lengths: Tensor  # (B,)
    tgt_in: Tensor  # (B, T) BOS + target ids
    tgt_out: Tensor  # (B, T) target ids + EOS
    tgt_lengths: Tensor  # (B,)
    indices: Tensor  # (B,) each pair's position in its split: restores the input order

    def to(self, device: torch.device) -> "Batch":
        return Batch(
            *(getattr(self, name).to(device, non_blocking=True) for name in self.__dataclass_fields__)
        )

    @property
    def n_tgt_tokens(self) -> int:
        return int(self.tgt_lengths.sum())


def pad(sequences: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> Tensor:
    """List of id lists -> ``(B, L)`` long tensor padded with ``pad_id`` after each row's end
    (``L`` the longest row; ``(0, 0)`` for no rows)."""
    longest = max((len(seq) for seq in sequences), default=0)
    out = torch.full((len(sequences), longest), pad_id, dtype=torch.long)  # (B, L)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out


def collate(examples: Sequence[Tuple[int, List[int], List[int]]]) -> Batch:
    """``(index, src ids, tgt ids)`` examples -> a padded ``Batch`` (EOS, BOS added here)."""
    indices, src, tgt = zip(*examples)
    src_rows = [ids + [EOS_ID] for ids in src]
    return Batch(
        src=pad(src_rows),  # (B, S)
        src_lengths=torch.tensor([len(row) for row in src_rows]),  # (B,)
        tgt_in=pad([[BOS_ID] + ids for ids in tgt]),  # (B, T)
        tgt_out=pad([ids + [EOS_ID] for ids in tgt]),  # (B, T)
        tgt_lengths=torch.tensor([len(ids) + 1 for ids in tgt]),  # (B,)
        indices=torch.tensor(indices),  # (B,)
    )


def pack(
    order: Sequence[int], src_lengths: Sequence[int], tgt_lengths: Sequence[int], batch_tokens: int
) -> List[List[int]]:
    """Cut ``order`` into consecutive batches whose padded size stays within ``batch_tokens``.

    A batch of ``n`` pairs costs ``n * (longest src + longest tgt)``; a pair that alone exceeds the
    budget forms a batch of its own.
    """
    batches: List[List[int]] = []
    current: List[int] = []
    longest_src = longest_tgt = 0
    for index in order:
        src_len = max(longest_src, src_lengths[index])
        tgt_len = max(longest_tgt, tgt_lengths[index])
        if current and (len(current) + 1) * (src_len + tgt_len) > batch_tokens:
            batches.append(current)
            current, src_len, tgt_len = [], src_lengths[index], tgt_lengths[index]
        current.append(index)
        longest_src, longest_tgt = src_len, tgt_len
    if current:
        batches.append(current)
    return batches


class TokenBucketSampler(Sampler[List[int]]):
    """Batches of pair indices of similar length within a token budget.

    Training (``shuffle=True``): each epoch the pairs are shuffled, stably sorted by length (so
    equal lengths mix differently every epoch), packed, and the batches shuffled; the order is a
    function of ``(seed, epoch)`` only. Evaluation (``shuffle=False``): pairs sorted by length,
    batches in that order; ``Batch.indices`` gives the original positions back.

    Data parallel: rank ``r`` of ``world_size`` takes batches ``r, r + world_size, ...`` of the
    epoch's list, so the shards are disjoint. Every rank gets the same number of batches (a rank with
    one more would wait for the others at its extra gradient all-reduce): the last
    ``len % world_size`` batches of the shuffled list sit the epoch out, other ones every epoch.
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
    ):
        if batch_tokens <= 0:
            raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size})")
        self.src_lengths, self.tgt_lengths = list(src_lengths), list(tgt_lengths)
        self.batch_tokens, self.shuffle, self.seed = batch_tokens, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._cache: Dict[int, List[List[int]]] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_batches(self, epoch: Optional[int] = None) -> List[List[int]]:
        """All batches of an epoch, across every rank."""
        epoch = self.epoch if epoch is None else epoch
        if epoch not in self._cache:
            self._cache = {epoch: self._make_batches(epoch)}  # keep one epoch: the current one
        return self._cache[epoch]

    def _make_batches(self, epoch: int) -> List[List[int]]:
        order = list(range(len(self.src_lengths)))
        rng = random.Random(self.seed * 1_000_003 + epoch)
        if self.shuffle:
            rng.shuffle(order)
        order.sort(key=lambda i: (self.src_lengths[i], self.tgt_lengths[i]))
        batches = pack(order, self.src_lengths, self.tgt_lengths, self.batch_tokens)
        if self.shuffle:
            rng.shuffle(batches)
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
    padded = real = 0
    for batch in sampler.epoch_batches():
        src = [sampler.src_lengths[i] for i in batch]
        tgt = [sampler.tgt_lengths[i] for i in batch]
        padded += len(batch) * (max(src) + max(tgt))
        real += sum(src) + sum(tgt)
    return 1.0 - real / padded if padded else 0.0
