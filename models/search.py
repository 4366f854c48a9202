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
- it reaches its length limit (``SearchOptions.output_limit``: ``max_len``, else ``max_len_ratio``
  times its source length, EOS counted, plus ``max_len_extra``); its live hypotheses then compete
  as unfinished (``finished=False``).

(fairseq's rule, stop at ``K`` finished hypotheses, ended searches sooner but gave up better
hypotheses: 0.5 BLEU less on the Multi30k validation set for a Transformer, at the same speed.)

Only the ``2K`` best tokens of each hypothesis can extend it into its sentence's ``2K`` best, so each
step takes a top-``2K`` per row of logits and never writes a ``(K, V)`` table of scores. Rows of
the state that depend only on the source (``SOURCE_KEYS``) are not reordered.

``search(model, src, src_mask, bos_id, eos_id, options)`` is the one entry point of the rest of the
project: greedy search for a beam of 1, else beam search. Its ``SearchOptions`` were checked when
they were made, so nothing here checks them again. The live hypotheses of either search are one
``_Live`` (decoder state, tokens, scores, history, the sentences they belong to), and
each step of beam search's candidates one ``_Candidates``.
"""

from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, List, Optional, Tuple

import torch
from torch import Tensor, nn

from models.search_options import SearchOptions

# Entries of a decoder state that depend on the source sentence only (the encoder output, its mask
# and projections of it). Every hypothesis of a sentence holds the same rows there, so beam search
# leaves them as they are when it reorders hypotheses within their sentences.
SOURCE_KEYS = frozenset({"src_mask", "cross_k", "cross_v"})


def map_state(state: Any, fn: Callable[[Tensor], Tensor], skip: FrozenSet[str] = frozenset()) -> Any:
    """Apply ``fn`` to every tensor of a nested state (dict / list / tuple), except under dict keys in
    ``skip``."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, dict):
        return {key: value if key in skip else map_state(value, fn, skip) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(map_state(value, fn, skip) for value in state)
    return state


@dataclass
class Hypothesis:
    tokens: List[int]  # without BOS / EOS
    score: float  # sum of token log-probabilities (beam search: divided by the length penalty)
    # (len(tokens) + 1, S): source attention of each emitted token, EOS last ((len(tokens), S) when cut
    # at the length limit), from an engine that returns it while it decodes (CTranslate2). This
    # search leaves it None: the Translator reads alignments from a pass over the finished output.
    alignment: Optional[Tensor] = None
    finished: bool = True  # False when the search stopped at the length limit before EOS


def output_limits(src_mask: Tensor, options: SearchOptions, cap: Optional[int] = None) -> List[int]:
    """The longest output of each sentence of ``src_mask`` ``(B, S)``: ``options.output_limit`` of its
    source length, never more than ``cap`` (the model's ``max_positions``, where it has one)."""
    return [options.output_limit(n, cap) for n in src_mask.sum(dim=1).tolist()]


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


@dataclass
class _Live:
    """The hypotheses still searching, one row each, ``width`` per live sentence: ``R = A * width``
    rows for the ``A`` sentences of ``sentences`` (greedy search: width 1)."""

    state: Any  # the decoder state: (R, ...) in every tensor
    tokens: Tensor  # (R,) each hypothesis's last token (BOS before the first step)
    scores: Tensor  # (R,) the sum of its token log-probabilities
    history: Tensor  # (R, t) its tokens so far, without BOS
    sentences: List[int]  # (A,) the sentence of the batch each live beam belongs to
    width: int = 1  # hypotheses per sentence: 1 at beam search's first step, K after it

    def keep(self, beams: List[int]) -> "_Live":
        """Only the beams ``beams`` (indices into ``sentences``) and their rows, ``(A * width, ...)`` ->
        ``(A' * width, ...)``: the other sentences' searches are over, so they leave the batch."""
        device = self.tokens.device
        first = torch.tensor(beams, device=device).unsqueeze(1) * self.width  # (A', 1)
        take = _select((first + torch.arange(self.width, device=device)).view(-1))  # (A' * width,) rows
        state = map_state(self.state, take)
        sentences = [self.sentences[a] for a in beams]
        return _Live(state, take(self.tokens), take(self.scores), take(self.history), sentences, self.width)


def _start(model: nn.Module, src: Tensor, src_mask: Tensor, bos_id: int) -> _Live:
    """One hypothesis per sentence of ``src``/``src_mask`` ``(B, S)``: BOS alone, the source encoded."""
    batch, device = src.size(0), src.device
    state = model.start_state(model.encode(src, src_mask))  # (B, ...)
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (B,)
    scores = torch.zeros(batch, device=device)  # (B,)
    return _Live(state, tokens, scores, tokens.new_zeros(batch, 0), list(range(batch)))


@torch.no_grad()
def greedy_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    options: SearchOptions,
    pad_id: int = 0,
) -> List[Hypothesis]:
    """Most probable token at every step. ``src``/``src_mask`` ``(B, S)``; one hypothesis per sentence,
    its score not length-normalised. Of ``options`` it reads the length limit."""
    limits = torch.tensor(output_limits(src_mask, options, getattr(model, "max_positions", None)))  # (B,)
    live = _start(model, src, src_mask, bos_id)
    results: List[Optional[Hypothesis]] = [None] * src.size(0)
    for t in range(1, int(limits.max()) + 1):
        logits, state = model.decode_step(live.tokens, live.state)  # (A, V)
        best, tokens = top_log_probs(logits, 1, (bos_id, pad_id))  # (A, 1) each
        live.state, live.scores, live.tokens = state, live.scores + best[:, 0], tokens[:, 0]  # (A,) each
        live.history = torch.cat([live.history, live.tokens.unsqueeze(1)], dim=1)  # (A, t)
        ended = (live.tokens == eos_id).cpu()  # (A,)
        done = ended | (limits[live.sentences] <= t)  # (A,)
        for i in done.nonzero().flatten().tolist():
            results[live.sentences[i]] = _greedy_hypothesis(live, i, bool(ended[i]))
        if bool(done.all()):
            break
        if bool(done.any()):
            live = live.keep((~done).nonzero().flatten().tolist())
    return results  # type: ignore[return-value]


def _greedy_hypothesis(live: _Live, row: int, ended: bool) -> Hypothesis:
    """The hypothesis of row ``row``, whose search is over: it ``ended`` with EOS (not kept in its
    tokens), or it reached its length limit."""
    ids = live.history[row].tolist()
    return Hypothesis(ids[:-1] if ended else ids, float(live.scores[row]), finished=ended)


class _Finished:
    """The finished hypotheses of one sentence, best first by normalised score."""

    def __init__(self) -> None:
        self.hyps: List[Hypothesis] = []

    def add(self, hyp: Hypothesis) -> None:
        self.hyps.append(hyp)
        self.hyps.sort(key=lambda h: h.score, reverse=True)

    def nth_score(self, n: int) -> float:
        return self.hyps[n - 1].score if len(self.hyps) >= n else float("-inf")


@dataclass
class _Candidates:
    """The ``2K`` best one-token extensions of each live sentence's hypotheses, best first: ``(A, 2K)``
    each. Where there are fewer than ``2K`` (a tiny vocabulary) the rest are impossible ones, scored
    ``-inf``."""

    scores: Tensor  # the sum of the token log-probabilities of each extended hypothesis
    rows: Tensor  # the row of the hypothesis each extends (into the live batch)
    tokens: Tensor  # the token each adds
    is_eos: Tensor  # whether that token is EOS


def _expand(live: _Live, logits: Tensor, beam: int, never: Tuple[int, ...], eos_id: int) -> _Candidates:
    """The ``2K`` best extensions of each live sentence: ``logits`` ``(A * width, V)`` of the live rows
    -> ``(A, 2K)`` candidates."""
    alive, width = len(live.sentences), live.width
    per_row = min(2 * beam, logits.size(1))
    log_probs, tokens = top_log_probs(logits, per_row, never)  # (A * width, per_row) each
    candidates = (live.scores.unsqueeze(1) + log_probs).view(alive, width * per_row)  # (A, width * per_row)
    tokens = tokens.view(alive, width * per_row)
    missing = 2 * beam - width * per_row
    if missing > 0:
        candidates = torch.cat([candidates, candidates.new_full((alive, missing), float("-inf"))], dim=1)
        tokens = torch.cat([tokens, tokens.new_zeros(alive, missing)], dim=1)
    top, index = candidates.topk(2 * beam, dim=1)  # (A, 2K)
    offsets = torch.arange(alive, device=live.scores.device).unsqueeze(1) * width  # (A, 1)
    rows = torch.div(index, per_row, rounding_mode="floor").clamp(max=width - 1) + offsets  # (A, 2K)
    tokens = tokens.gather(1, index)  # (A, 2K)
    return _Candidates(top, rows, tokens, tokens == eos_id)


def _finish(
    step: _Candidates, live: _Live, t: int, options: SearchOptions, finished: List[_Finished]
) -> None:
    """Move extensions by EOS that rank among the first ``K`` of their sentence to its finished list.

    (Only the first ``K``: an EOS further down would not have survived pruning in a beam of ``K``.)
    """
    beam = options.beam_size
    accepted = step.is_eos[:, :beam] & torch.isfinite(step.scores[:, :beam])  # (A, K)
    if not bool(accepted.any()):
        return
    penalty = length_penalty(t, options.alpha)
    for a, r in accepted.nonzero().tolist():
        row = int(step.rows[a, r])
        score = float(step.scores[a, r]) / penalty
        finished[live.sentences[a]].add(Hypothesis(live.history[row].tolist(), score, finished=True))


def _prune(step: _Candidates, beam: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The next live beam: the ``K`` best extensions that do not end in EOS, their scores, rows and
    tokens (flattened to ``(A * K,)`` each).

    Each of the ``K`` hypotheses has one EOS extension, so ``2K`` candidates hold at least ``K`` others.
    """
    # (A, K): the first K ranks that are not EOS
    picks = torch.sort(step.is_eos.to(torch.uint8), dim=1, stable=True).indices[:, :beam]
    scores, rows, tokens = (x.gather(1, picks).view(-1) for x in (step.scores, step.rows, step.tokens))
    return scores, rows, tokens


def _advance(live: _Live, state: Any, step: _Candidates, beam: int) -> _Live:
    """The live hypotheses after this step: the pruned extensions of ``step`` and their rows of the
    new decoder ``state``, ``(A * width)`` -> ``(A * K)`` rows."""
    scores, rows, tokens = _prune(step, beam)  # (A * K,) each
    # Within sentences (K -> K): rows that depend on the source only stay; 1 -> K: all are copied.
    skip = SOURCE_KEYS if live.width == beam else frozenset()
    state = map_state(state, _select(rows), skip=skip)
    history = torch.cat([live.history.index_select(0, rows), tokens.unsqueeze(1)], dim=1)  # (A * K, t)
    return _Live(state, tokens, scores, history, live.sentences, beam)


def _search_over(best_live: float, limit: int, t: int, found: _Finished, options: SearchOptions) -> bool:
    """Whether a sentence's search can end after step ``t`` (the rules in the module docstring)."""
    if t >= limit:
        return True
    # the best normalised score a live hypothesis can reach
    bound = best_live / length_penalty(limit, options.alpha)
    return found.nth_score(options.nbest) >= bound


def _add_unfinished(found: _Finished, live: _Live, a: int, t: int, alpha: float) -> None:
    """At the length limit, the live hypotheses of beam ``a`` join its sentence's list as unfinished ones."""
    penalty = length_penalty(t, alpha)
    for row in range(a * live.width, (a + 1) * live.width):
        score = float(live.scores[row])
        if score > float("-inf"):
            found.add(Hypothesis(live.history[row].tolist(), score / penalty, finished=False))


def _still_searching(
    live: _Live, limits: List[int], t: int, finished: List[_Finished], options: SearchOptions
) -> List[int]:
    """The live beams whose search goes on after step ``t``; a sentence that reached its length limit
    gives its list its live hypotheses, as unfinished ones."""
    best_live = live.scores.view(-1, options.beam_size)[:, 0].tolist()  # (A,) the live beams are sorted
    keep = []
    for a, sentence in enumerate(live.sentences):
        if not _search_over(best_live[a], limits[sentence], t, finished[sentence], options):
            keep.append(a)
        elif t >= limits[sentence]:
            _add_unfinished(finished[sentence], live, a, t, options.alpha)
    return keep


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    options: SearchOptions,
    pad_id: int = 0,
) -> List[List[Hypothesis]]:
    """Per sentence of ``src``/``src_mask`` ``(B, S)`` its ``options.nbest`` best hypotheses, best first,
    in a beam of ``options.beam_size``."""
    beam = options.beam_size
    limits = output_limits(src_mask, options, getattr(model, "max_positions", None))
    live = _start(model, src, src_mask, bos_id)  # the first step extends one hypothesis per sentence
    finished = [_Finished() for _ in range(src.size(0))]
    for t in range(1, max(limits) + 1):
        logits, state = model.decode_step(live.tokens, live.state)  # (A * width, V)
        step = _expand(live, logits, beam, (bos_id, pad_id), eos_id)  # (A, 2K) each
        _finish(step, live, t, options, finished)
        live = _advance(live, state, step, beam)  # (A * K) rows
        keep = _still_searching(live, limits, t, finished, options)
        if not keep:
            break
        if len(keep) < len(live.sentences):
            live = live.keep(keep)  # (A' * K) rows
    return [found.hyps[: options.nbest] for found in finished]


def search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    options: SearchOptions,
    pad_id: int = 0,
) -> List[List[Hypothesis]]:
    """Per sentence of ``src``/``src_mask`` ``(B, S)`` its ``options.nbest`` best hypotheses, best first:
    greedy search when ``options.beam_size`` is 1 (the same output as a beam of 1, without the
    bookkeeping; its score is not length-normalised), beam search otherwise. BOS and ``pad_id`` are
    never output."""
    if options.beam_size == 1:
        return [[hyp] for hyp in greedy_search(model, src, src_mask, bos_id, eos_id, options, pad_id)]
    return beam_search(model, src, src_mask, bos_id, eos_id, options, pad_id)
