"""Greedy and beam search over the encoder-decoder contract (``models/seq2seq.py``).

Both work on padded batches and return, per sentence, token ids without BOS and EOS. Beam
search keeps ``K`` hypotheses per sentence in one ``(B * K)`` batch; a finished hypothesis stays
in its beam and may only emit EOS at no cost, so every step is one batched ``decode_step``.
Final scores are normalised with the GNMT length penalty ``((5 + |y|) / 6) ** alpha``
(Wu et al. 2016, section 7).
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from models.seq2seq import map_state


@dataclass
class Hypothesis:
    tokens: List[int]  # without BOS / EOS
    score: float  # sum of token log-probabilities (beam search: divided by the length penalty)
    # (len(tokens) + 1, S): source attention of each emitted token, EOS last; (len(tokens), S) when
    # the search stopped at max_len before EOS.
    alignment: Optional[Tensor] = None
    finished: bool = True  # False when the search stopped at max_len before EOS


def output_limit(src_mask: Tensor, ratio: float = 1.5, extra: int = 10) -> int:
    """Longest output to search for a batch: ``ratio`` times its longest source plus ``extra``."""
    return int(ratio * int(src_mask.sum(dim=1).max())) + extra


def step_log_probs(logits: Tensor, never: Tuple[int, ...]) -> Tensor:
    """``(N, V)`` logits -> log-probabilities, with ``never`` (BOS, PAD: not outputs) at ``-inf``."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    log_probs[:, list(never)] = float("-inf")
    return log_probs


def _trim(ids: List[int], eos_id: int) -> List[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


@torch.no_grad()
def greedy_search(
    model: nn.Module, src: Tensor, src_mask: Tensor, bos_id: int, eos_id: int,
    max_len: Optional[int] = None, need_weights: bool = False, pad_id: int = 0,
) -> List[Hypothesis]:
    """Most probable token at every step. ``src``/``src_mask`` ``(B, S)``; one hypothesis per sentence."""
    max_len = max_len or output_limit(src_mask)
    state = model.start_state(model.encode(src, src_mask))
    batch = src.size(0)
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=src.device)  # (B,)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
    scores = torch.zeros(batch, device=src.device)  # (B,)
    steps, weights = [], []
    for _ in range(max_len):
        logits, state, step_weights = model.decode_step(tokens, state, need_weights)  # (B, V)
        log_probs = step_log_probs(logits, (bos_id, pad_id))  # (B, V)
        best, tokens = log_probs.max(dim=-1)  # (B,) each
        tokens = tokens.masked_fill(finished, eos_id)  # (B,)
        scores += best.masked_fill(finished, 0.0)
        steps.append(tokens)
        if need_weights:
            weights.append(step_weights)
        finished |= tokens == eos_id
        if bool(finished.all()):
            break
    ids = torch.stack(steps, 1).tolist()  # (B, t)
    alignments = torch.stack(weights, 1) if need_weights else None  # (B, t, S)
    return [_hypothesis(row, float(scores[i]), alignments, i, eos_id) for i, row in enumerate(ids)]


def _hypothesis(ids: List[int], score: float, alignments: Optional[Tensor], row: int, eos_id: int) -> Hypothesis:
    tokens = _trim(ids, eos_id)
    alignment = alignments[row, : len(tokens) + 1].cpu() if alignments is not None else None  # (|y| + 1, S)
    return Hypothesis(tokens, score, alignment, finished=eos_id in ids)


def length_penalty(lengths: Tensor, alpha: float) -> Tensor:
    """GNMT length penalty ``((5 + length) / 6) ** alpha``; ``alpha = 0`` turns it off."""
    return ((5.0 + lengths.float()) / 6.0) ** alpha


def _expand(log_probs: Tensor, scores: Tensor, finished: Tensor, eos_id: int) -> Tensor:
    """Scores of every one-token extension: ``(B * K, V)`` log-probs -> ``(B * K, V)``.

    A finished hypothesis can only be extended by EOS, at no cost, so it keeps its score.
    """
    carry = torch.full_like(log_probs, float("-inf"))  # (B * K, V)
    carry[:, eos_id] = 0.0
    log_probs = torch.where(finished.unsqueeze(1), carry, log_probs)  # (B * K, V)
    return scores.unsqueeze(1) + log_probs  # (B * K, V)


def _prune(candidates: Tensor, batch: int, beam: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Keep the ``K`` best of each sentence's ``K * V`` candidates.

    Returns their scores ``(B * K,)``, the flat index of the hypothesis each extends ``(B * K,)``
    and the new tokens ``(B * K,)``.
    """
    vocab = candidates.size(1)
    scores, index = candidates.view(batch, beam * vocab).topk(beam, dim=1)  # (B, K) each
    origin = torch.div(index, vocab, rounding_mode="floor")  # (B, K) beam within the sentence
    offsets = torch.arange(batch, device=candidates.device).unsqueeze(1) * beam  # (B, 1)
    return scores.view(-1), (origin + offsets).view(-1), (index % vocab).view(-1)


def _finish(
    history: Tensor, scores: Tensor, lengths: Tensor, alignments: Optional[Tensor],
    batch: int, beam: int, alpha: float, nbest: int, eos_id: int,
) -> List[List[Hypothesis]]:
    """Rank each sentence's ``K`` hypotheses by length-normalised score; keep the ``nbest`` best."""
    normalised = (scores / length_penalty(lengths, alpha)).view(batch, beam)  # (B, K)
    order = normalised.argsort(dim=1, descending=True)[:, :nbest]  # (B, n)
    rows = history.tolist()
    results = []
    for b in range(batch):
        picks = [b * beam + int(k) for k in order[b]]
        results.append([_hypothesis(rows[i], float(normalised.view(-1)[i]), alignments, i, eos_id) for i in picks])
    return results


@torch.no_grad()
def beam_search(
    model: nn.Module, src: Tensor, src_mask: Tensor, bos_id: int, eos_id: int, beam_size: int = 5,
    alpha: float = 1.0, nbest: int = 1, max_len: Optional[int] = None, need_weights: bool = False, pad_id: int = 0,
) -> List[List[Hypothesis]]:
    """Beam search; per sentence the ``nbest`` best hypotheses, best first. ``src``/``src_mask`` ``(B, S)``."""
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest} must be between 1 and the beam size {beam_size}")
    max_len = max_len or output_limit(src_mask)
    batch, beam, device = src.size(0), beam_size, src.device
    state = model.start_state(model.encode(src, src_mask))
    state = map_state(state, lambda t: t.repeat_interleave(beam, dim=0))  # batch -> (B * K)
    scores = torch.full((batch, beam), float("-inf"), device=device)  # (B, K) only one live start per sentence
    scores[:, 0] = 0.0
    scores = scores.view(-1)  # (B * K,)
    tokens = torch.full((batch * beam,), bos_id, dtype=torch.long, device=device)  # (B * K,)
    finished = torch.zeros(batch * beam, dtype=torch.bool, device=device)  # (B * K,)
    lengths = torch.zeros(batch * beam, dtype=torch.long, device=device)  # (B * K,) tokens up to EOS
    history = tokens.new_zeros(batch * beam, 0)  # (B * K, t)
    alignments = None
    for _ in range(max_len):
        logits, state, weights = model.decode_step(tokens, state, need_weights)  # (B * K, V)
        candidates = _expand(step_log_probs(logits, (bos_id, pad_id)), scores, finished, eos_id)  # (B * K, V)
        scores, origin, tokens = _prune(candidates, batch, beam)
        state = map_state(state, lambda t: t.index_select(0, origin))
        lengths = lengths.index_select(0, origin) + (~finished.index_select(0, origin)).long()  # (B * K,)
        finished = finished.index_select(0, origin) | (tokens == eos_id)  # (B * K,)
        history = torch.cat([history.index_select(0, origin), tokens.unsqueeze(1)], dim=1)  # (B * K, t + 1)
        if need_weights:
            step = weights.index_select(0, origin).unsqueeze(1)  # (B * K, 1, S)
            alignments = step if alignments is None else torch.cat([alignments.index_select(0, origin), step], 1)
        if bool(finished.all()):
            break
    return _finish(history, scores, lengths, alignments, batch, beam, alpha, nbest, eos_id)
