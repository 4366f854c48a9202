"""Greedy and beam search over the encoder-decoder contract (``models/seq2seq.py``).

Both decode padded batches, return per sentence token ids without BOS and EOS, and keep their
progress on the device: the tokens and scores of every hypothesis, the best ones found so far
(``_Outputs``, ``_Found``) and whether each sentence's search goes on. The host reads that flag
every ``sync_every`` steps (``_checked``: one synchronisation; on a GPU each read waits for the
device's queue to drain, so a loop that read every step would be bound by the round trips) and
then drops the sentences whose search is over from the batch; between two reads their rows run
on, ignored. On the CPU the host reads every step (it costs nothing there): the decoder never runs
for a finished sentence. The interval never changes a search's decisions (on a GPU, kernels chosen
for another batch size may round the logits differently, as they may for any batch).

Beam search keeps ``K`` live hypotheses per sentence in one ``(A * K)`` batch (``A`` sentences
still searching). Each step it looks at the ``2K`` best one-token extensions: those that
end in EOS and rank among the first ``K`` join the sentence's found hypotheses, scored
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
``_Live`` (decoder state, tokens, scores, history, the sentences they belong to and whether each
one's search goes on), each step of beam search's candidates one ``_Candidates``, and what a search
has found ``_Outputs`` (greedy) or ``_Found`` (beam).
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

# Steps between two reads of a search's progress by the host on an accelerator (``sync_interval``).
SYNC_EVERY = 8


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


def sync_interval(device: torch.device) -> int:
    """Steps between two reads of the search's progress by the host: every step on the CPU (a read
    costs nothing there, and a finished sentence leaves the batch at once), every ``SYNC_EVERY`` on
    an accelerator (each read waits for the device: between two, a finished sentence's row runs on)."""
    return 1 if device.type == "cpu" else SYNC_EVERY


def top_log_probs(logits: Tensor, k: int, never: Tuple[int, ...]) -> Tuple[Tensor, Tensor]:
    """The ``k`` most probable next tokens of each row (``R`` rows: ``A`` or ``A * K`` hypotheses):
    ``(R, V)`` logits -> log-probabilities ``(R, k)`` and token ids ``(R, k)``, best first. Tokens in
    ``never`` (BOS, PAD: not outputs) are never chosen (the other tokens keep their probabilities:
    no renormalisation)."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (R, V)
    for token in never:  # a column at a time: a list as the index would be copied to the device first
        log_probs[:, token] = float("-inf")
    return log_probs.topk(k, dim=-1)  # (R, k) each


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ``((5 + length) / 6) ** alpha``; ``alpha = 0`` turns it off."""
    return ((5.0 + length) / 6.0) ** alpha


def _select(rows: Tensor) -> Callable[[Tensor], Tensor]:
    """A function that takes the rows ``rows`` of a tensor (its first dimension, the batch)."""
    return lambda x: x.index_select(0, rows)


@dataclass
class _Live:
    """The hypotheses still in the batch, one row each, ``width`` per sentence: ``R = A * width`` rows
    for the ``A`` sentences of ``sentences`` (greedy search: width 1). A sentence whose search is over
    stays until the host next reads the progress (``searching`` False), then leaves."""

    state: Any  # the decoder state: (R, ...) in every tensor
    tokens: Tensor  # (R,) each hypothesis's last token (BOS before the first step)
    scores: Tensor  # (R,) the sum of its token log-probabilities
    history: Tensor  # (R, t) its tokens so far, without BOS
    sentences: Tensor  # (A,) the sentence of the batch each beam belongs to
    searching: Tensor  # (A,) whether its search goes on
    width: int = 1  # hypotheses per sentence: 1 at beam search's first step, K after it

    def keep(self, beams: Tensor) -> "_Live":
        """Only the beams ``beams`` ``(A',)`` (indices into ``sentences``) and their rows,
        ``(A * width, ...)`` -> ``(A' * width, ...)``."""
        first = beams.unsqueeze(1) * self.width  # (A', 1)
        take = _select((first + torch.arange(self.width, device=beams.device)).view(-1))  # (A' * width,) rows
        state = map_state(self.state, take)
        return _Live(
            state,
            take(self.tokens),
            take(self.scores),
            take(self.history),
            self.sentences.index_select(0, beams),
            self.searching.index_select(0, beams),
            self.width,
        )


def _start(model: nn.Module, src: Tensor, src_mask: Tensor, bos_id: int) -> _Live:
    """One hypothesis per sentence of ``src``/``src_mask`` ``(B, S)``: BOS alone, the source encoded."""
    batch, device = src.size(0), src.device
    state = model.start_state(model.encode(src, src_mask))  # (B, ...)
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=device)  # (B,)
    scores = torch.zeros(batch, device=device)  # (B,)
    sentences = torch.arange(batch, device=device)  # (B,)
    searching = torch.ones(batch, dtype=torch.bool, device=device)  # (B,)
    return _Live(state, tokens, scores, tokens.new_zeros(batch, 0), sentences, searching)


def _checked(live: _Live, t: int, last: int, every: int) -> Optional[_Live]:
    """The host's read of the progress after step ``t``, every ``every`` steps and at the last step
    ``last`` (one synchronisation): None when no search goes on, else ``live`` without the sentences
    whose search is over."""
    if t >= last:
        return None
    if t % every:
        return live
    searching = live.searching.nonzero().flatten()  # (A',): the one read of the device
    if searching.numel() == 0:
        return None
    return live if searching.numel() == live.searching.numel() else live.keep(searching)


@dataclass
class _Outputs:
    """The output of each sentence of a greedy search, kept on the device until the end: ``(B, L)``
    tokens (``L``: the longest limit), ``(B,)`` lengths (EOS counted), scores, whether it ended in EOS."""

    tokens: Tensor
    lengths: Tensor
    scores: Tensor
    ended: Tensor

    def hypotheses(self) -> List[Hypothesis]:
        """The hypotheses, EOS dropped (the end of the search's reads of the device)."""
        tokens, lengths = self.tokens.tolist(), self.lengths.tolist()
        scores, ended = self.scores.tolist(), self.ended.tolist()
        return [
            Hypothesis(ids[: n - 1] if end else ids[:n], score, finished=end)
            for ids, n, score, end in zip(tokens, lengths, scores, ended)
        ]


@torch.no_grad()
def greedy_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    options: SearchOptions,
    pad_id: int = 0,
    sync_every: Optional[int] = None,
) -> List[Hypothesis]:
    """Most probable token at every step. ``src``/``src_mask`` ``(B, S)``; one hypothesis per sentence,
    its score not length-normalised. Of ``options`` it reads the length limit. The host reads the
    progress every ``sync_every`` steps (None: ``sync_interval`` of the device)."""
    device, batch = src.device, src.size(0)
    cap = getattr(model, "max_positions", None)
    limit_list = output_limits(src_mask, options, cap)
    limits, last = torch.tensor(limit_list, device=device), max(limit_list)  # (B,)
    every = sync_every or sync_interval(device)
    out = _Outputs(
        torch.full((batch, last), pad_id, dtype=torch.long, device=device),
        torch.zeros(batch, dtype=torch.long, device=device),
        torch.zeros(batch, device=device),
        torch.zeros(batch, dtype=torch.bool, device=device),
    )
    live: Optional[_Live] = _start(model, src, src_mask, bos_id)
    for t in range(1, last + 1):
        assert live is not None
        logits, live.state = model.decode_step(live.tokens, live.state)  # (A, V)
        best, tokens = top_log_probs(logits, 1, (bos_id, pad_id))  # (A, 1) each
        on, rows = live.searching, live.sentences  # (A,) each: the rows of a finished search are ignored
        live.tokens = tokens[:, 0]  # (A,)
        live.scores = torch.where(on, live.scores + best[:, 0], live.scores)  # (A,)
        out.tokens[rows, t - 1] = torch.where(on, live.tokens, pad_id)  # (A,) into (B, L)
        out.scores[rows] = torch.where(on, live.scores, out.scores[rows])  # (A,) into (B,)
        out.lengths[rows] = torch.where(on, t, out.lengths[rows])  # (A,) into (B,)
        ended = on & (live.tokens == eos_id)  # (A,)
        out.ended[rows] |= ended  # (A,) into (B,)
        live.searching = on & ~ended & (limits[rows] > t)  # (A,)
        live = _checked(live, t, last, every)  # (A',) rows
        if live is None:
            break
    return out.hypotheses()


@dataclass
class _Found:
    """Each sentence's ``N`` (``nbest``) best hypotheses so far, best first, on the device: ``(B, N)``
    normalised scores (``-inf``: none yet) and ``finished`` flags, ``(B, N, L)`` tokens (``L``: the
    longest limit), ``(B, N)`` lengths. Only the ``N`` best are kept: no other is ever returned, and
    the end of a search looks at the ``N``-th best."""

    scores: Tensor
    tokens: Tensor
    lengths: Tensor
    finished: Tensor

    @staticmethod
    def empty(batch: int, nbest: int, longest: int, device: torch.device) -> "_Found":
        return _Found(
            torch.full((batch, nbest), float("-inf"), dtype=torch.float64, device=device),
            torch.zeros(batch, nbest, longest, dtype=torch.long, device=device),
            torch.zeros(batch, nbest, dtype=torch.long, device=device),
            torch.zeros(batch, nbest, dtype=torch.bool, device=device),
        )

    def add(self, sentences: Tensor, scores: Tensor, tokens: Tensor, finished: bool) -> None:
        """Candidates ``(A, C)`` of the beams' ``sentences`` ``(A,)``: normalised ``scores`` (float64;
        ``-inf``: not a candidate), ``tokens`` ``(A, C, t)``; a candidate ranks after those found
        before it with an equal score, and after the candidates to its left."""
        nbest, t = self.scores.size(1), tokens.size(2)
        held = self.tokens[sentences]  # (A, N, L)
        new = held.new_zeros(held.size(0), scores.size(1), held.size(2))  # (A, C, L)
        new[:, :, :t] = tokens  # (A, C, t) into (A, C, L)
        scores = torch.cat([self.scores[sentences], scores], dim=1)  # (A, N + C)
        best = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :nbest]  # (A, N)
        lengths = torch.cat(
            [self.lengths[sentences], torch.full_like(scores[:, nbest:], t, dtype=torch.long)], 1
        )  # (A, N + C)
        flags = torch.cat(
            [self.finished[sentences], torch.full_like(lengths[:, nbest:], finished, dtype=torch.bool)], 1
        )  # (A, N + C)
        self.scores[sentences] = scores.gather(1, best)  # (A, N)
        self.lengths[sentences] = lengths.gather(1, best)  # (A, N)
        self.finished[sentences] = flags.gather(1, best)  # (A, N)
        both = torch.cat([held, new], dim=1)  # (A, N + C, L)
        self.tokens[sentences] = both.gather(1, best.unsqueeze(2).expand(-1, -1, both.size(2)))  # (A, N, L)

    def nth(self, sentences: Tensor) -> Tensor:
        """``(A,)`` the ``N``-th best score of each sentence (``-inf`` while fewer are found)."""
        return self.scores[sentences, -1]

    def hypotheses(self) -> List[List[Hypothesis]]:
        """Per sentence its hypotheses, best first (the end of the search's reads of the device)."""
        scores, tokens = self.scores.tolist(), self.tokens.tolist()
        lengths, finished = self.lengths.tolist(), self.finished.tolist()
        return [
            [
                Hypothesis(ids[:n], score, finished=end)
                for score, ids, n, end in zip(*sentence)
                if score > float("-inf")
            ]
            for sentence in zip(scores, tokens, lengths, finished)
        ]


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
    alive, width = live.sentences.size(0), live.width
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


def _finish(step: _Candidates, live: _Live, t: int, penalty: Tensor, found: _Found) -> None:
    """Extensions by EOS that rank among the first ``K`` of a sentence still searching join its
    found hypotheses, scored by ``penalty`` (``(L + 1,)``: the length penalty of each length).

    (Only the first ``K``: an EOS further down would not have survived pruning in a beam of ``K``.)
    """
    alive, beam = step.scores.size(0), step.scores.size(1) // 2
    top = step.scores[:, :beam]  # (A, K)
    accepted = step.is_eos[:, :beam] & torch.isfinite(top) & live.searching.unsqueeze(1)  # (A, K)
    scores = torch.where(accepted, top.double() / penalty[t], float("-inf"))
    tokens = live.history.index_select(0, step.rows[:, :beam].reshape(-1)).view(alive, beam, t - 1)
    found.add(live.sentences, scores, tokens, finished=True)


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
    return _Live(state, tokens, scores, history, live.sentences, live.searching, beam)


def _end_searches(live: _Live, limits: Tensor, t: int, penalty: Tensor, found: _Found) -> None:
    """Mark the searches that are over after step ``t`` (the rules in the module docstring); a
    sentence that reached its length limit (``limits`` ``(B,)``) gets its live hypotheses, as
    unfinished ones. ``penalty`` ``(L + 1,)``: the length penalty of each length."""
    alive = live.sentences.size(0)
    limit = limits[live.sentences]  # (A,)
    scores = live.scores.view(alive, live.width)  # (A, K), best first
    # the best normalised score a live hypothesis can reach (float64, as the found scores)
    bound = scores[:, 0].double() / penalty[limit]  # (A,)
    at_limit = live.searching & (limit <= t)  # (A,)
    unfinished = torch.where(
        at_limit.unsqueeze(1) & (scores > float("-inf")), scores.double() / penalty[t], float("-inf")
    )  # (A, K)
    over = at_limit | (found.nth(live.sentences) >= bound)  # (A,)
    found.add(live.sentences, unfinished, live.history.view(alive, live.width, t), finished=False)
    live.searching = live.searching & ~over


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    options: SearchOptions,
    pad_id: int = 0,
    sync_every: Optional[int] = None,
) -> List[List[Hypothesis]]:
    """Per sentence of ``src``/``src_mask`` ``(B, S)`` its ``options.nbest`` best hypotheses, best first,
    in a beam of ``options.beam_size``. The host reads the progress every ``sync_every`` steps (None:
    ``sync_interval`` of the device)."""
    device, beam = src.device, options.beam_size
    limit_list = output_limits(src_mask, options, getattr(model, "max_positions", None))
    limits, last = torch.tensor(limit_list, device=device), max(limit_list)  # (B,)
    # (L + 1,) the length penalty of each length, divided by on the device: a true division, as the
    # host's (a tensor divided by a Python float is a multiplication by its inverse on CUDA)
    penalty_list = [length_penalty(n, options.alpha) for n in range(last + 1)]
    penalty = torch.tensor(penalty_list, dtype=torch.float64, device=device)
    every = sync_every or sync_interval(device)
    found = _Found.empty(src.size(0), options.nbest, last, device)
    # the first step extends one hypothesis per sentence
    live: Optional[_Live] = _start(model, src, src_mask, bos_id)
    for t in range(1, last + 1):
        assert live is not None
        logits, state = model.decode_step(live.tokens, live.state)  # (A * width, V)
        step = _expand(live, logits, beam, (bos_id, pad_id), eos_id)  # (A, 2K) each
        _finish(step, live, t, penalty, found)
        live = _advance(live, state, step, beam)  # (A * K) rows
        _end_searches(live, limits, t, penalty, found)
        live = _checked(live, t, last, every)  # (A' * K) rows
        if live is None:
            break
    return found.hypotheses()


def search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    bos_id: int,
    eos_id: int,
    options: SearchOptions,
    pad_id: int = 0,
    sync_every: Optional[int] = None,
) -> List[List[Hypothesis]]:
    """Per sentence of ``src``/``src_mask`` ``(B, S)`` its ``options.nbest`` best hypotheses, best first:
    greedy search when ``options.beam_size`` is 1 (the same output as a beam of 1, without the
    bookkeeping; its score is not length-normalised), beam search otherwise. BOS and ``pad_id`` are
    never output. The host reads the search's progress every ``sync_every`` steps (None:
    ``sync_interval`` of the device); the output does not depend on it."""
    if options.beam_size == 1:
        greedy = greedy_search(model, src, src_mask, bos_id, eos_id, options, pad_id, sync_every)
        return [[hyp] for hyp in greedy]
    return beam_search(model, src, src_mask, bos_id, eos_id, options, pad_id, sync_every)
