"""Subword regularization: every epoch trains on a fresh SentencePiece segmentation of each
training sentence (Kudo 2018), drawn from a seed that is a function of (run seed, epoch, pair), so
that an epoch's batches are the same however the run was stopped and resumed."""

import hashlib
from typing import List, Sequence, Tuple

from data.batching import ParallelDataset
from data.tokenizer import Tokenizer

SEED_RANGE = 2**31 - 1


def pair_seed(seed: int, epoch: int, index: int, side: str) -> int:
    """The sampling seed of one side (``src``, ``tgt``) of training pair ``index`` in ``epoch`` of
    a run with ``seed``: a hash, so that no two (epoch, pair, side) share a draw."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{index}/{side}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_RANGE


class Resegmenter:
    """The training pairs' text and their plain ids; ``example(index, epoch)`` gives the pair with a
    sampled segmentation on both sides. Only the segmentation changes: the batches are packed by the
    plain lengths, so a batch's tokens vary a little around ``trainer.batch_tokens``. A sample
    longer than ``max_len`` falls back to the plain ids."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        text: Tuple[Sequence[str], Sequence[str]],
        plain: ParallelDataset,
        alpha: float,
        seed: int,
        max_len: int,
    ):
        self.tokenizer, self.plain, self.max_len = tokenizer, plain, max_len
        self.alpha, self.seed = alpha, seed
        self.src_text, self.tgt_text = text

    def example(self, index: int, epoch: int) -> Tuple[int, List[int], List[int]]:
        """``(index, src ids, tgt ids)`` of training pair ``index``, sampled for ``epoch``."""
        src = self.tokenizer.sample_src(
            self.src_text[index], self.alpha, pair_seed(self.seed, epoch, index, "src")
        )
        tgt = self.tokenizer.sample_tgt(
            self.tgt_text[index], self.alpha, pair_seed(self.seed, epoch, index, "tgt")
        )
        if len(src) > self.max_len or len(tgt) > self.max_len:
            return self.plain[index]
        return index, src, tgt
