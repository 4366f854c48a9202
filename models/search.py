"""Greedy and beam search over the encoder-decoder contract (``models/seq2seq.py``).

Both decode padded batches, return per sentence token ids without BOS and EOS, and drop a
sentence from the batch as soon as its search is over, so the decoder never runs for finished
sentences. Beam search keeps ``K`` live hypotheses per sentence in one ``(A * K)`` batch (``A``
sentences still searching). Each step it looks at the ``2K`` best one-token extensions: those that
end in EOS and rank among the first ``K`` go to the sentence's list of finished hypotheses, scored
with the GNMT length penalty ``((5 + |y|) / 6) ** alpha`` (Wu et al. 2016, section 7; ``|y|``
counts EOS); the best ``K`` others are the next live beam. A sentence's search ends when

- none of its live hypotheses can still beat its ``nbest`` best finished ones: a live score can only
  fall, so the best normalised score it can reach is its score now divided by the length penalty at
  the sentence's length limit (exact: no better hypothesis is given up), or
- it reaches its length limit, ``max_len_ratio`` times its source length plus ``max_len_extra``
  (source length counts EOS); its live hypotheses then compete as unfinished (``finished=False``).

(fairseq's rule, stop at ``K`` finished hypotheses, ended searches sooner but gave up better
hypotheses: 0.5 BLEU less on the Multi30k validation set for a Transformer, at the same speed.)

Only the ``2K`` best tokens of each hypothesis can extend it into its sentence's ``2K`` best, so each
step takes a top-``2K`` per row of logits and never writes a ``(K, V)`` table of scores. Rows of
the state that depend only on the source (``models.seq2seq.SOURCE_KEYS``) are not reordered.

``search`` is the one entry point of the rest of the project: greedy for a beam of 1, else beam search.
It checks the options; the functions it calls trust it (``run_search`` is it without the check, for a
caller that checked them already).
"""

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch import Tensor, nn

from models.search_options import MAX_LEN_EXTRA, MAX_LEN_RATIO, check_options, output_limit
from models.seq2seq import SOURCE_KEYS, map_state


@dataclass
class Hypothesis:
    tokens: List[int]  # without BOS / EOS
    score: float  # sum of token log-probabilities (beam search: divided by the length penalty)
    # (len(tokens) + 1, S): source attention of each emitted token, EOS last; (len(tokens), S) when
    # the search stopped at the length limit before EOS.
    alignment: Optional[Tensor] = None
    finished: bool = True  # False when the search stopped at the length limit before EOS


def output_limits(
    src_mask: Tensor,
    ratio: float = MAX_LEN_RATIO,
    extra: int = MAX_LEN_EXTRA,
    max_len: Optional[int] = None,
    cap: Optional[int] = None,
) -> List[int]:
    """Longest output of each sentence: ``ratio`` times its source length plus ``extra``, or ``max_len``
    for all; never more than ``cap`` (the model's ``max_positions``, where it has one). The options are
    the caller's to check (``search`` does)."""
    if max_len is not None:
        return [max_len if cap is None else min(max_len, cap)] * src_mask.size(0)
    return [output_limit(n, ratio, extra, cap) for n in src_mask.sum(dim=1).tolist()]


def top_log_probs(logits: Tensor, k: int, never: Tuple[int, ...]) -> Tuple[Tensor, Tensor]:
    """The ``k`` most probable next tokens of each row (``R`` rows: ``A`` or ``A * K`` hypotheses):
    ``(R, V)`` logits -> log-probabilities ``(R, k)`` and token ids ``(R, k)``, best first. Tokens in
    ``never`` (BOS, PAD: not outputs) are never chosen (the other tokens keep their probabilities:
    no renormalisation)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (R, V)
    log_probs[:, list(never)] = float("-inf")
    return log_probs.topk(k, dim=-1)  # (R, k) each


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ``((5 + length) / 6) ** alpha``; ``alpha = 0`` turns it off."""
    return ((5.0 + length) / 6.0) ** alpha


def _select(rows: Tensor) -> Callable[[Tensor], Tensor]:
    """A function that takes the rows ``rows`` of a tensor (its first dimension, the batch)."""
    return lambda x: x.index_select(0, rows)


def _keep_rows(rows: Tensor, state: Any, *tensors: Optional[Tensor]) -> Tuple[Any, List[Optional[Tensor]]]:
    """Drop finished sentences from the batch: keep only ``rows`` of the decoder state and of each tensor
    (None stays None), ``(A * K, ...)`` -> ``(A' * K, ...)`` (greedy: ``K = 1``), so they stay aligned."""
    take = _select(rows)
    return map_state(state, take), [None if t is None else take(t) for t in tensors]


def _append(history: Optional[Tensor], step: Optional[Tensor]) -> Optional[Tensor]:
    """``(R, t, ...)`` + ``(R, ...)`` -> ``(R, t + 1, ...)``; None when there is nothing to record."""
    if step is None:
        return None
    step = step.unsqueeze(1)
    return step if history is None else torch.cat([history, step], dim=1)


@torch.no_grad()
def greedy_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    max_len: Optional[int] = None,
    need_weights: bool = False,
    pad_id: int = 0,
    max_len_ratio: float = MAX_LEN_RATIO,
    max_len_extra: int = MAX_LEN_EXTRA,
) -> List[Hypothesis]:
    """Most probable token at every step. ``src``/``src_mask`` ``(B, S)``; one hypothesis per sentence.
    The options are the caller's to check (``search`` does)."""
    batch, device = src.size(0), src.device
    cap = getattr(model, "max_positions", None)
    limits = torch.tensor(output_limits(src_mask, max_len_ratio, max_len_extra, max_len, cap))  # (B,)
    state = model.start_state(model.encode(src, src_mask))
    alive = torch.arange(batch)  # (A,) sentence of each live row
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (A,)
    scores = torch.zeros(batch, device=device)  # (A,)
    history = tokens.new_zeros(batch, 0)  # (A, t)
    alignments: Optional[Tensor] = None  # (A, t, S)
    results: List[Optional[Hypothesis]] = [None] * batch
    for t in range(1, int(limits.max()) + 1):
        logits, state, weights = model.decode_step(tokens, state, need_weights)  # (A, V)
        best, tokens = top_log_probs(logits, 1, (bos_id, pad_id))  # (A, 1) each
        scores, tokens = scores + best[:, 0], tokens[:, 0]  # (A,) each
        history = torch.cat([history, tokens.unsqueeze(1)], dim=1)  # (A, t)
        alignments = _append(alignments, weights)
        ended = (tokens == eos_id).cpu()  # (A,)
        done = ended | (limits[alive] <= t)  # (A,)
        for i in done.nonzero().flatten().tolist():
            ids = history[i].tolist()
            results[int(alive[i])] = Hypothesis(
                ids[:-1] if ended[i] else ids,
                float(scores[i]),
                None if alignments is None else alignments[i].cpu(),
                finished=bool(ended[i]),
            )
        if bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero().flatten()  # (A',)
            alive = alive[keep]
            state, (tokens, scores, history, alignments) = _keep_rows(
                keep.to(device), state, tokens, scores, history, alignments
            )
    return results  # type: ignore[return-value]


class _Finished:
    """The finished hypotheses of one sentence, best first by normalised score."""

    def __init__(self) -> None:
        self.hyps: List[Hypothesis] = []

    def add(self, hyp: Hypothesis) -> None:
        self.hyps.append(hyp)
        self.hyps.sort(key=lambda h: h.score, reverse=True)

    def nth_score(self, n: int) -> float:
        return self.hyps[n - 1].score if len(self.hyps) >= n else float("-inf")


def _expand(
    scores: Tensor, logits: Tensor, alive: int, width: int, beam: int, never: Tuple[int, ...]
) -> Tuple[Tensor, Tensor, Tensor]:
    """The ``2K`` best one-token extensions of each sentence's ``width`` hypotheses, best first.

    ``scores`` ``(A * width,)`` and ``logits`` ``(A * width, V)`` -> their scores ``(A, 2K)``, the
    row of the hypothesis each extends ``(A, 2K)`` (into the ``A * width`` batch) and the new tokens
    ``(A, 2K)``. Where there are fewer than ``2K`` extensions (a tiny vocabulary) the rest are
    impossible ones, scored ``-inf``.
    """
    per_row = min(2 * beam, logits.size(1))
    log_probs, tokens = top_log_probs(logits, per_row, never)  # (A * width, per_row) each
    candidates = (scores.unsqueeze(1) + log_probs).view(alive, width * per_row)  # (A, width * per_row)
    tokens = tokens.view(alive, width * per_row)
    missing = 2 * beam - width * per_row
    if missing > 0:
        candidates = torch.cat([candidates, candidates.new_full((alive, missing), float("-inf"))], dim=1)
        tokens = torch.cat([tokens, tokens.new_zeros(alive, missing)], dim=1)
    top, index = candidates.topk(2 * beam, dim=1)  # (A, 2K)
    offsets = torch.arange(alive, device=scores.device).unsqueeze(1) * width  # (A, 1)
    rows = torch.div(index, per_row, rounding_mode="floor").clamp(max=width - 1) + offsets  # (A, 2K)
    return top, rows, tokens.gather(1, index)


def _finish(
    top: Tensor,
    rows: Tensor,
    is_eos: Tensor,
    beam: int,
    t: int,
    alpha: float,
    history: Tensor,
    alignments: Optional[Tensor],
    weights: Optional[Tensor],
    sentences: List[int],
    finished: List[_Finished],
) -> None:
    """Move extensions by EOS that rank among the first ``K`` of their sentence to its finished list.

    (Only the first ``K``: an EOS further down would not have survived pruning in a beam of ``K``.)
    """
    accepted = is_eos[:, :beam] & torch.isfinite(top[:, :beam])  # (A, K)
    if not bool(accepted.any()):
        return
    penalty = length_penalty(t, alpha)
    for a, r in accepted.nonzero().tolist():
        row = int(rows[a, r])
        alignment = None  # (t, S): the hypothesis's rows, then this step's (EOS)
        if weights is not None:
            before = None if alignments is None else alignments[row : row + 1]  # (1, t - 1, S)
            alignment = _append(before, weights[row : row + 1])[0].cpu()  # (t, S)
        score = float(top[a, r]) / penalty
        finished[sentences[a]].add(Hypothesis(history[row].tolist(), score, alignment, True))


def _prune(
    top: Tensor, rows: Tensor, tokens: Tensor, is_eos: Tensor, beam: int
) -> Tuple[Tensor, Tensor, Tensor]:
    """The next live beam: the ``K`` best extensions that do not end in EOS (flattened to ``(A * K,)`` each).

    Each of the ``K`` hypotheses has one EOS extension, so ``2K`` candidates hold at least ``K`` others.
    """
    # (A, K): the first K ranks that are not EOS
    picks = torch.sort(is_eos.to(torch.uint8), dim=1, stable=True).indices[:, :beam]
    return top.gather(1, picks).view(-1), rows.gather(1, picks).view(-1), tokens.gather(1, picks).view(-1)


def _search_over(best_live: float, limit: int, t: int, found: _Finished, nbest: int, alpha: float) -> bool:
    """Whether a sentence's search can end after step ``t`` (the rules in the module docstring)."""
    if t >= limit:
        return True
    bound = best_live / length_penalty(limit, alpha)  # the best normalised score a live hypothesis can reach
    return found.nth_score(nbest) >= bound


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    beam_size: int = 5,
    alpha: float = 1.0,
    nbest: int = 1,
    max_len: Optional[int] = None,
    need_weights: bool = False,
    pad_id: int = 0,
    max_len_ratio: float = MAX_LEN_RATIO,
    max_len_extra: int = MAX_LEN_EXTRA,
) -> List[List[Hypothesis]]:
    """Per sentence of ``src``/``src_mask`` ``(B, S)`` its ``nbest`` best hypotheses, best first. The
    options are the caller's to check (``search`` does)."""
    batch, beam, device = src.size(0), beam_size, src.device
    cap = getattr(model, "max_positions", None)
    limits = output_limits(src_mask, max_len_ratio, max_len_extra, max_len, cap)
    state = model.start_state(model.encode(src, src_mask))  # (B, ...): the first step has one hypothesis
    width = 1  # hypotheses per sentence in the batch: 1 at the first step, K after it
    scores = torch.zeros(batch, device=device)  # (A * width,)
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (A * width,)
    history = tokens.new_zeros(batch, 0)  # (A * width, t)
    alignments: Optional[Tensor] = None  # (A * width, t, S)
    sentences = list(range(batch))  # (A,) sentence of each live beam
    finished = [_Finished() for _ in range(batch)]
    for t in range(1, max(limits) + 1):
        logits, state, weights = model.decode_step(tokens, state, need_weights)  # (A * K, V)
        top, rows, new_tokens = _expand(scores, logits, len(sentences), width, beam, (bos_id, pad_id))
        is_eos = new_tokens == eos_id  # (A, 2K)
        _finish(top, rows, is_eos, beam, t, alpha, history, alignments, weights, sentences, finished)
        scores, rows, tokens = _prune(top, rows, new_tokens, is_eos, beam)  # (A * K,) each
        # Within sentences (K -> K): rows that depend on the source only stay; 1 -> K: all are copied.
        skip = SOURCE_KEYS if width == beam else frozenset()
        state = map_state(state, _select(rows), skip=skip)
        width = beam
        history = torch.cat([history.index_select(0, rows), tokens.unsqueeze(1)], dim=1)  # (A * K, t)
        if weights is not None:
            before = None if alignments is None else alignments.index_select(0, rows)  # (A * K, t - 1, S)
            alignments = _append(before, weights.index_select(0, rows))  # (A * K, t, S)
        best_live = scores.view(-1, beam)[:, 0].tolist()  # (A,) the live beams are sorted
        keep = []
        for a, sentence in enumerate(sentences):
            if not _search_over(best_live[a], limits[sentence], t, finished[sentence], nbest, alpha):
                keep.append(a)
            elif t >= limits[sentence]:
                _add_unfinished(finished[sentence], a, beam, t, alpha, scores, history, alignments)
        if not keep:
            break
        if len(keep) < len(sentences):
            sentences = [sentences[a] for a in keep]
            first_rows = torch.tensor(keep, device=device).unsqueeze(1) * beam  # (A', 1)
            keep_rows = (first_rows + torch.arange(beam, device=device)).view(-1)  # (A' * K,)
            state, (scores, tokens, history, alignments) = _keep_rows(
                keep_rows, state, scores, tokens, history, alignments
            )  # (A' * K, ...)
    return [found.hyps[:nbest] for found in finished]


def _add_unfinished(
    found: _Finished,
    a: int,
    beam: int,
    t: int,
    alpha: float,
    scores: Tensor,
    history: Tensor,
    alignments: Optional[Tensor],
) -> None:
    """At the length limit, the sentence's live hypotheses join its list as unfinished ones."""
    penalty = length_penalty(t, alpha)
    for row in range(a * beam, (a + 1) * beam):
        score = float(scores[row])
        if score > float("-inf"):
            alignment = None if alignments is None else alignments[row].cpu()
            found.add(Hypothesis(history[row].tolist(), score / penalty, alignment, finished=False))


def check_search_options(
    beam_size: int, alpha: float, nbest: int, max_len: Optional[int], max_len_ratio: float, max_len_extra: int
) -> None:
    """``ValueError`` naming the first option of ``search`` out of range. Those a search does not use
    are not looked at: the length penalty by greedy search, the length limit when ``max_len`` is given."""
    options = dict(beam_size=beam_size, nbest=nbest)
    if beam_size != 1:
        options.update(alpha=alpha)
    if max_len is None:
        options.update(max_len_ratio=max_len_ratio, max_len_extra=max_len_extra)
    check_options(**options)
    if max_len is not None and max_len < 1:
        raise ValueError(f"max_len={max_len} must be at least 1")


def search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    beam_size: int = 1,
    alpha: float = 1.0,
    nbest: int = 1,
    **limits: Any,
) -> List[List[Hypothesis]]:
    """Per sentence of ``src``/``src_mask`` ``(B, S)`` its ``nbest`` best hypotheses, best first: greedy
    search when ``beam_size`` is 1 (the same output as a beam of 1, without the bookkeeping; its
    score is not length-normalised), beam search otherwise; ``limits``: the keyword arguments of
    ``run_search`` after ``nbest``. An option out of range is a ``ValueError``."""
    ratio, extra = limits.get("max_len_ratio", MAX_LEN_RATIO), limits.get("max_len_extra", MAX_LEN_EXTRA)
    check_search_options(beam_size, alpha, nbest, limits.get("max_len"), ratio, extra)
    return run_search(model, src, src_mask, bos_id, eos_id, beam_size, alpha, nbest, **limits)


def run_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    beam_size: int = 1,
    alpha: float = 1.0,
    nbest: int = 1,
    need_weights: bool = False,
    pad_id: int = 0,
    max_len: Optional[int] = None,
    max_len_ratio: float = MAX_LEN_RATIO,
    max_len_extra: int = MAX_LEN_EXTRA,
) -> List[List[Hypothesis]]:
    """``search`` without the check of its options, for a caller that checked them once already
    (the Translator and ``decode_ids`` check once per call, not once per batch)."""
    limits = dict(
        max_len=max_len,
        need_weights=need_weights,
        pad_id=pad_id,
        max_len_ratio=max_len_ratio,
        max_len_extra=max_len_extra,
    )
    if beam_size == 1:
        return [[hyp] for hyp in greedy_search(model, src, src_mask, bos_id, eos_id, **limits)]
    return beam_search(model, src, src_mask, bos_id, eos_id, beam_size, alpha, nbest, **limits)
