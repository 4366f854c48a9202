"""Greedy and beam search (models/search.py) over both model families.

Most tests decode with small randomly initialised models; ``Biased`` wraps a real model and adds a
bias to its logits, to make chosen tokens likely or certain.
"""

import dataclasses
import itertools
import re
from typing import List, Optional

import pytest
import torch
from torch import nn

from data.specials import BOS_ID, EOS_ID, PAD_ID
from models.build import build_model
from models.config import RNNConfig, TransformerConfig
from models.search import beam_search, greedy_search, output_limits, search
from models.search_options import SearchOptionError, SearchOptions

from helpers import HostReads

V = 40

FAMILIES = {
    "transformer": lambda: TransformerConfig(
        d_model=32, n_heads=4, ff_size=64, encoder_layers=2, decoder_layers=2
    ),
    "rnn": lambda: RNNConfig(embed_dim=24, hidden_size=32, attention_size=16),
}


def tiny(family: str, vocab: int = V, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(FAMILIES[family](), vocab, vocab).eval()


def sources(vocab: int = V):
    """A padded source batch ``(4, 7)`` (lengths 7, 5, 3, 1) and its mask."""
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (4, 7), generator=generator)
    for row, length in enumerate([7, 5, 3, 1]):
        src[row, length - 1] = EOS_ID
        src[row, length:] = PAD_ID
    return src, src != PAD_ID


class Biased(nn.Module):
    """A real model whose ``decode_step`` logits at step ``t`` (from 0) get ``bias + t * ramp`` added.

    Follows the seq2seq contract: the step count is part of the state, a ``(B,)`` tensor.
    """

    def __init__(self, model: nn.Module, bias: torch.Tensor, ramp: Optional[torch.Tensor] = None):
        super().__init__()
        self.model, self.bias = model, bias
        self.ramp = torch.zeros_like(bias) if ramp is None else ramp

    def encode(self, src, src_mask, need_weights=False):
        return self.model.encode(src, src_mask, need_weights)

    def start_state(self, encoded):
        return {"inner": self.model.start_state(encoded), "step": torch.zeros(encoded.memory.size(0))}

    def decode_step(self, tokens, state):
        logits, inner = self.model.decode_step(tokens, state["inner"])
        logits = logits + self.bias + state["step"].unsqueeze(1) * self.ramp  # (B, V)
        return logits, {"inner": inner, "step": state["step"] + 1}


def favour(token: int, vocab: int = V, amount: float = 100.0) -> torch.Tensor:
    bias = torch.zeros(vocab)
    bias[token] = amount
    return bias


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("eos_ramp", [0.0, 1.0], ids=["model", "eos-ramp"])
def test_beam_of_one_is_greedy(family, eos_ramp):
    model = Biased(tiny(family), torch.zeros(V), ramp=favour(EOS_ID, amount=eos_ramp))
    src, src_mask = sources()
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=12))
    beam = beam_search(
        model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=1, alpha=0.0, max_len=12)
    )
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam]
    for g, hyps in zip(greedy, beam):
        assert hyps[0].score == pytest.approx(g.score, abs=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_nbest_is_sorted_by_score(family, alpha):
    model = tiny(family)
    src, src_mask = sources()
    for hyps in beam_search(
        model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=5, alpha=alpha, nbest=5, max_len=10)
    ):
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_scores_at_least_the_greedy_hypothesis(family):
    """Not a theorem for a beam of 5, but it holds for these models (and see the exhaustive test)."""
    model = tiny(family)
    src, src_mask = sources()
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=10))
    beam = beam_search(
        model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=5, alpha=0.0, max_len=10)
    )
    for g, hyps in zip(greedy, beam):
        assert hyps[0].score >= g.score - 1e-5


def best_score_by_enumeration(model, src, src_mask, vocab, max_len=3):
    """The best sum of log-probabilities over every output of up to ``max_len`` tokens (EOS ends one).

    BOS and PAD are never outputs: search gives them probability 0 without renormalising.
    """
    outputs = [i for i in range(vocab) if i not in (BOS_ID, PAD_ID)]
    prefixes = torch.tensor(list(itertools.product(outputs, repeat=max_len - 1)))  # (P, max_len - 1)
    steps = torch.cat([torch.full((len(prefixes), 1), BOS_ID), prefixes], dim=1)  # (P, max_len)
    with torch.no_grad():
        state = model.start_state(
            model.encode(src.expand(len(prefixes), -1), src_mask.expand(len(prefixes), -1))
        )
        log_probs = []
        for t in range(max_len):
            logits, state = model.decode_step(steps[:, t], state)
            step = torch.log_softmax(logits, dim=-1)
            step[:, [BOS_ID, PAD_ID]] = float("-inf")
            log_probs.append(step)
    best = float("-inf")
    for row, prefix in enumerate(prefixes.tolist()):
        score = 0.0
        for t in range(max_len):
            if t == max_len - 1:  # the last step: any token, EOS or not, ends the output
                best = max(best, score + float(log_probs[t][row].max()))
                break
            best = max(best, score + float(log_probs[t][row, EOS_ID]))  # stop here
            if prefix[t] == EOS_ID:
                break
            score += float(log_probs[t][row, prefix[t]])
    return best


@pytest.mark.parametrize("family", FAMILIES)
def test_an_exhaustive_beam_finds_the_best_output(family):
    """With ``K = V ** (max_len - 1)`` nothing is pruned before the last step: beam search is exact."""
    vocab, max_len = 6, 3
    model = tiny(family, vocab=vocab)
    src, src_mask = sources(vocab)
    beam = beam_search(
        model,
        src,
        src_mask,
        BOS_ID,
        EOS_ID,
        SearchOptions(beam_size=vocab ** (max_len - 1), alpha=0.0, max_len=max_len),
    )
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=max_len))
    for row in range(src.size(0)):
        best = best_score_by_enumeration(model, src[row : row + 1], src_mask[row : row + 1], vocab, max_len)
        assert beam[row][0].score == pytest.approx(best, abs=1e-4)
        assert best >= greedy[row].score - 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batch_decodes_like_single_sentences(family):
    model = tiny(family)
    src, src_mask = sources()
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=8))
    beam = beam_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=3, max_len=8))
    for row, length in enumerate(src_mask.sum(1).tolist()):
        one, one_mask = src[row : row + 1, :length], src_mask[row : row + 1, :length]
        assert (
            greedy_search(model, one, one_mask, BOS_ID, EOS_ID, SearchOptions(max_len=8))[0].tokens
            == greedy[row].tokens
        )
        assert (
            beam_search(model, one, one_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=3, max_len=8))[0][
                0
            ].tokens
            == beam[row][0].tokens
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_hold_no_eos_and_nothing_after_it(family):
    """EOS mid-way (more likely at every step) ends the hypothesis: no EOS and no PAD in the output."""
    model = Biased(tiny(family), torch.zeros(V), ramp=favour(EOS_ID, amount=1.0))
    src, src_mask = sources()
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=10))
    beams = beam_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=4, nbest=4, max_len=10))
    hypotheses = greedy + [h for hyps in beams for h in hyps]
    assert any(0 < len(h.tokens) < 10 for h in hypotheses)  # some end early, on EOS
    for h in hypotheses:
        assert EOS_ID not in h.tokens and PAD_ID not in h.tokens


def test_outputs_never_hold_bos_or_pad():
    model = Biased(tiny("rnn"), favour(BOS_ID, amount=5.0) + favour(PAD_ID, amount=5.0))
    src, src_mask = sources()
    hypotheses = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=6))
    hypotheses += [
        hyps[0]
        for hyps in beam_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=3, max_len=6))
    ]
    for h in hypotheses:
        assert BOS_ID not in h.tokens and PAD_ID not in h.tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_max_len_is_respected(family):
    model = Biased(tiny(family), favour(EOS_ID, amount=-100.0))  # never stops on its own
    src, src_mask = sources()
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=4))
    beams = beam_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=3, nbest=3, max_len=4))
    assert [len(h.tokens) for h in greedy] == [4] * 4
    assert all(len(h.tokens) == 4 for hyps in beams for h in hyps)


def test_default_output_limit_follows_each_source():
    _, src_mask = sources()  # lengths 7, 5, 3, 1
    assert output_limits(src_mask, SearchOptions()) == [int(1.5 * n) + 10 for n in (7, 5, 3, 1)]
    assert output_limits(src_mask, SearchOptions(max_len_ratio=2.0, max_len_extra=1)) == [15, 11, 7, 3]
    assert output_limits(src_mask, SearchOptions(max_len=4)) == [4] * 4
    assert output_limits(src_mask, SearchOptions(), cap=12) == [12, 12, 12, 11]  # a model's max_positions


@pytest.mark.parametrize("family", FAMILIES)
def test_each_sentence_stops_at_its_own_limit(family):
    model = Biased(tiny(family), favour(EOS_ID, amount=-100.0))  # never stops on its own
    src, src_mask = sources()
    expected = [int(0.5 * n) + 2 for n in (7, 5, 3, 1)]
    greedy = greedy_search(
        model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len_ratio=0.5, max_len_extra=2)
    )
    beams = beam_search(
        model,
        src,
        src_mask,
        BOS_ID,
        EOS_ID,
        SearchOptions(beam_size=3, nbest=2, max_len_ratio=0.5, max_len_extra=2),
    )
    assert [len(h.tokens) for h in greedy] == expected
    assert [[len(h.tokens) for h in hyps] for hyps in beams] == [[n, n] for n in expected]
    assert not any(h.finished for h in greedy)


class Recording(nn.Module):
    """A model that records the number of rows ``decode_step`` gets at each step."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.rows = model, []

    def encode(self, src, src_mask, need_weights=False):
        return self.model.encode(src, src_mask, need_weights)

    def start_state(self, encoded):
        return self.model.start_state(encoded)

    def decode_step(self, tokens, state):
        self.rows.append(tokens.size(0))
        return self.model.decode_step(tokens, state)


@pytest.mark.parametrize("family", FAMILIES)
def test_finished_sentences_leave_the_batch(family):
    """Limits 5, 4, 3, 2 (never EOS): the decoder runs for live sentences only (beam: K rows each)."""
    model = Recording(Biased(tiny(family), favour(EOS_ID, amount=-100.0)))
    src, src_mask = sources()
    limits = dict(max_len_ratio=0.5, max_len_extra=2)
    greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(**limits))
    assert model.rows == [4, 4, 3, 2, 1]
    model.rows.clear()
    beam_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=3, **limits))
    assert model.rows == [4, 12, 9, 6, 3]  # the first step: one hypothesis per sentence


@pytest.mark.parametrize("family", FAMILIES)
def test_finished_sentences_leave_at_the_next_read(family):
    """As above, the host reading the progress every second step: a finished sentence's rows run on
    until the next read."""
    model = Recording(Biased(tiny(family), favour(EOS_ID, amount=-100.0)))
    src, src_mask = sources()
    limits = SearchOptions(max_len_ratio=0.5, max_len_extra=2)
    greedy_search(model, src, src_mask, BOS_ID, EOS_ID, limits, sync_every=2)
    assert model.rows == [4, 4, 3, 3, 1]
    model.rows.clear()
    beams = dataclasses.replace(limits, beam_size=3)
    beam_search(model, src, src_mask, BOS_ID, EOS_ID, beams, sync_every=2)
    assert model.rows == [4, 12, 9, 9, 3]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("beam", [1, 3])
def test_the_host_reads_the_device_once_every_interval(family, beam):
    """The searches keep their progress on the device: decoding 32 more steps costs 4 more reads
    with a read every 8 steps (on a GPU each read waits for the device)."""
    model = Biased(tiny(family), favour(EOS_ID, amount=-100.0))  # never ends: every step runs
    src, src_mask = sources()

    def reads(steps: int) -> List[str]:
        options = SearchOptions(beam_size=beam, max_len=steps)
        with HostReads() as counted:
            search(model, src, src_mask, BOS_ID, EOS_ID, options, sync_every=8)
        return counted.names

    assert len(reads(48)) - len(reads(16)) == 4, reads(48)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("beam", [1, 4])
def test_the_interval_of_reads_never_changes_the_output(family, beam):
    """Sentences that end at different steps (EOS ever more likely): the same hypotheses and scores
    whether the host reads the progress every step or every few."""
    ramp = {"transformer": 0.5, "rnn": 0.02}[family]  # the untrained RNN's logits are close together
    model = Biased(tiny(family), torch.zeros(V), ramp=favour(EOS_ID, amount=ramp))
    src, src_mask = sources()
    options = SearchOptions(beam_size=beam, nbest=min(beam, 2), alpha=0.6, max_len=12)

    def found(every: int):
        hyps = search(model, src, src_mask, BOS_ID, EOS_ID, options, sync_every=every)
        # scores to 5 places: a finished row that runs on changes the batch's size, and a matrix
        # product's kernel (so its last bits) may depend on that; the CPU's default reads every step
        return [[(h.tokens, round(h.score, 5), h.finished) for h in sentence] for sentence in hyps]

    each_step = found(1)
    assert len({len(sentence[0][0]) for sentence in each_step}) > 1  # they end at different steps
    assert found(3) == each_step
    assert found(8) == each_step


@pytest.mark.parametrize("family", FAMILIES)
def test_search_dispatches_to_greedy_or_beam(family):
    model = tiny(family)
    src, src_mask = sources()
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=8))
    one = search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=8))
    assert [[h.tokens] for h in greedy] == [[h.tokens for h in hyps] for hyps in one]
    assert [h.score for h in greedy] == [hyps[0].score for hyps in one]
    beams = beam_search(
        model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=3, alpha=0.6, nbest=2, max_len=8)
    )
    found = search(
        model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=3, alpha=0.6, nbest=2, max_len=8)
    )
    assert [[h.tokens for h in hyps] for hyps in found] == [[h.tokens for h in hyps] for hyps in beams]
    with pytest.raises(ValueError, match="nbest=2"):
        search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=1, nbest=2))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_that_ends_at_once_gives_empty_hypotheses(family):
    model = Biased(tiny(family), favour(EOS_ID))
    src, src_mask = sources()
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions())
    beams = beam_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=3))
    for h in greedy + [hyps[0] for hyps in beams]:
        assert h.tokens == []
        assert h.score == pytest.approx(0.0, abs=1e-3)


def test_nbest_larger_than_the_beam_is_refused():
    model = tiny("rnn")
    src, src_mask = sources()
    with pytest.raises(ValueError, match="nbest"):
        search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=2, nbest=3))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(beam_size=0), "beam_size=0"),
        (dict(beam_size=2, alpha=-1.0), "alpha=-1.0"),
        (dict(max_len_ratio=0, max_len_extra=0), "max_len_ratio=0"),
        (dict(beam_size=2, max_len=0), "max_len=0 must be at least 1"),
    ],
)
def test_search_refuses_an_option_out_of_range_for_both_searches(options, message):
    model = tiny("rnn")
    src, src_mask = sources()
    with pytest.raises(ValueError, match=re.escape(message)):
        search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(**options))


class TableModel(nn.Module):
    """A hand-built model: the next-token distribution depends only on the previous token.

    Follows the seq2seq contract (state: the previous token; weights: uniform over the source).
    Vocabulary: 0 pad, 1 unk, 2 bos, 3 eos, 4 "a", 5 "b", 6 "c".
    """

    def __init__(self, table):
        super().__init__()
        self.table = {prev: torch.tensor(probs).log() for prev, probs in table.items()}

    def encode(self, src, src_mask, need_weights=False):
        from models.seq2seq import Encoded

        return Encoded(memory=torch.zeros(src.size(0), src.size(1), 1), src_mask=src_mask)

    def start_state(self, encoded):
        return {"src_mask": encoded.src_mask}

    def decode_step(self, tokens, state):
        logits = torch.stack([self.table[int(t)] for t in tokens])  # (B, V)
        return logits, state


def test_beam_finds_what_greedy_misses_on_a_hand_built_model():
    """Greedy takes "a" (0.6) and then has only 0.4 x 0.5 left at best; "b" (0.4) then EOS (0.9)
    is worth 0.36 > 0.6 x 0.4 = 0.24: beam search finds it, greedy cannot."""
    tiny_prob = 1e-6
    table = {
        BOS_ID: [tiny_prob, tiny_prob, tiny_prob, tiny_prob, 0.6, 0.4, tiny_prob],
        4: [tiny_prob, tiny_prob, tiny_prob, 0.4, 0.3, 0.3, tiny_prob],  # after "a": EOS 0.4 at best
        5: [tiny_prob, tiny_prob, tiny_prob, 0.9, 0.05, 0.05, tiny_prob],  # after "b": EOS 0.9
        6: [tiny_prob, tiny_prob, tiny_prob, 1.0, tiny_prob, tiny_prob, tiny_prob],
    }
    model = TableModel(table)
    src = torch.tensor([[4, 5, EOS_ID]])
    src_mask = src != PAD_ID
    greedy = greedy_search(model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(max_len=5))[0]
    beam = beam_search(
        model, src, src_mask, BOS_ID, EOS_ID, SearchOptions(beam_size=2, alpha=0.0, nbest=2, max_len=5)
    )[0]
    assert greedy.tokens == [4] and greedy.score == pytest.approx(
        float(torch.tensor(0.6 * 0.4).log()), abs=1e-4
    )
    assert beam[0].tokens == [5] and beam[0].score == pytest.approx(
        float(torch.tensor(0.4 * 0.9).log()), abs=1e-4
    )
    assert beam[1].tokens == [4] and beam[1].score == pytest.approx(greedy.score, abs=1e-4)
    assert beam[0].finished and beam[1].finished


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(beam_size=0), "beam_size=0: the beam size must be at least 1"),
        (dict(beam_size=4, nbest=5), "nbest=5: must be between 1 and the beam size (4)"),
        (dict(alpha=-0.5), "alpha=-0.5: the length penalty must be >= 0"),
        (dict(max_len_ratio=0, max_len_extra=0), "max_len_ratio=0: the output length limit 0 x source + 0"),
        (dict(max_len_extra=-1), "max_len_ratio=1.5: the output length limit 1.5 x source + -1"),
    ],
)
def test_search_options_out_of_range_are_named(options, message):
    """One check of the options for the search, the Translator and translate.py's command line: made
    with a value out of range, ``SearchOptions`` raises at once, one line naming the option, its
    value and what is wrong (the parts too, for translate.py's own names of the options)."""
    with pytest.raises(SearchOptionError, match=re.escape(message)) as raised:
        SearchOptions(**options)
    error = raised.value
    assert isinstance(error, ValueError) and "\n" not in str(error)
    assert str(error) == f"{error.name}={error.value}: {error.problem}"
    assert message.startswith(f"{error.name}={error.value}: ")
    SearchOptions()  # the defaults are fine


def test_search_options_are_checked_on_every_copy_and_cannot_change():
    options = SearchOptions(beam_size=4, nbest=4)
    with pytest.raises(
        SearchOptionError, match=re.escape("nbest=4: must be between 1 and the beam size (2)")
    ):
        dataclasses.replace(options, beam_size=2)
    with pytest.raises(SearchOptionError, match=re.escape("max_len=0 must be at least 1")):
        dataclasses.replace(options, max_len=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.beam_size = 0
