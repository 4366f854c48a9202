"""Word alignments from attention: subword weights summed into words, each target word linked to one
source word (``alignment.scores.pharaoh`` writes the links as Pharaoh ``i-j``).

Subword pieces come from SentencePiece, where a piece that starts with ``▁`` (U+2581) starts a
word. A target word's attention row is the mean of its pieces' rows, a source word's weight the
sum of its pieces' weights; the source EOS column and the target EOS row are dropped (they align
to no word). Each target word ``j`` is aligned to its most-attended source word ``i``.

Shapes: ``T`` and ``S`` count output and source pieces, ``P`` the pieces of either, ``W`` words
(``W_tgt``, ``W_src``).
"""

from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from alignment.scores import AlignmentError
from data.tokenizer import Tokenizer

WORD_START = "\u2581"


def word_ids(pieces: Sequence[str]) -> List[int]:
    """The word index of each piece: a new word at every piece that starts with ``▁``."""
    ids, word = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        ids.append(word)
    return ids


def piece_words(pieces: Sequence[str]) -> List[str]:
    """The words the pieces make (labels for plots): ``["▁Ein", "▁Mann", "es"]`` ->
    ``["Ein", "Mannes"]``."""
    words: List[str] = []
    for piece, word in zip(pieces, word_ids(pieces)):
        if word == len(words):
            words.append("")
        words[word] += piece.replace(WORD_START, "")
    return words


def pool(weights: Tensor, word_of: Sequence[int], dim: int, reduce: str) -> Tensor:
    """Sum (``reduce="sum"``) or average (``"mean"``) the entries of ``weights`` along ``dim`` that belong
    to one word: ``(..., P, ...)`` -> ``(..., W, ...)`` with ``W = max(word_of) + 1``."""
    index = torch.tensor(word_of, device=weights.device)  # (P,)
    n_words = int(index.max()) + 1 if len(word_of) else 0
    shape = list(weights.shape)
    shape[dim] = n_words
    pooled = weights.new_zeros(shape).index_add_(dim, index, weights)  # (..., W, ...)
    if reduce == "mean":
        counts = torch.bincount(index, minlength=n_words).to(weights.dtype)  # (W,)
        view = [1] * weights.dim()
        view[dim] = n_words
        pooled = pooled / counts.view(view)  # (..., W, ...)
    return pooled


def word_attention(weights: Tensor, src_pieces: Sequence[str], tgt_pieces: Sequence[str]) -> Tensor:
    """``(T', S')`` attention over pieces (``T' >= T``, ``S' >= S``) -> ``(W_tgt, W_src)`` over words.

    ``weights`` may hold an extra EOS row and column beyond ``tgt_pieces`` and ``src_pieces``; they
    are dropped.
    """
    weights = weights[: len(tgt_pieces), : len(src_pieces)].float()  # (T, S) real pieces only
    if not len(src_pieces) or not len(tgt_pieces):
        n_tgt, n_src = len(set(word_ids(tgt_pieces))), len(set(word_ids(src_pieces)))
        return weights.new_zeros(n_tgt, n_src)  # (W_tgt, W_src)
    by_src_word = pool(weights, word_ids(src_pieces), dim=1, reduce="sum")  # (T, W_src)
    return pool(by_src_word, word_ids(tgt_pieces), dim=0, reduce="mean")  # (W_tgt, W_src)


def hard_alignment(words: Tensor) -> List[Tuple[int, int]]:
    """``(W_tgt, W_src)`` word attention -> ``(i, j)`` pairs: target word ``j`` to its argmax source
    word ``i``."""
    if words.numel() == 0:
        return []
    return [(int(i), j) for j, i in enumerate(words.argmax(dim=1).tolist())]


def piece_ids(
    tokenizer: Tokenizer, src_words: List[List[str]], tgt_words: List[List[str]]
) -> Tuple[List[List[int]], List[List[int]]]:
    """The subword ids of the space-joined words, and a one-line error when the pieces do not make
    the words back (so word ``i`` of the text is word ``i`` of the pieces)."""
    src_ids = tokenizer.encode_src([" ".join(w) for w in src_words])
    tgt_ids = tokenizer.encode_tgt([" ".join(w) for w in tgt_words])
    for side, ids_list, words_list, pieces in (
        ("source", src_ids, src_words, tokenizer.src_pieces),
        ("target", tgt_ids, tgt_words, tokenizer.tgt_pieces),
    ):
        for number, (ids, words) in enumerate(zip(ids_list, words_list), start=1):
            found = len(set(word_ids(pieces(ids))))
            if found != len(words):
                raise AlignmentError(
                    f"{side} line {number}: {len(words)} words but the tokenizer makes {found}: "
                    "a word the SentencePiece model drops or splits at a space"
                )
    return src_ids, tgt_ids
