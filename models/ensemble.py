"""Several trained models that decode as one: an ensemble for ``models.search``.

At every output step each member reads the same target prefix with its own decoder state and
gives its log-probabilities ``log p_m(y_t | y_<t, x)``; the ensemble's score of a token is their
mean, ``(1/M) sum_m log p_m``. The search normalises it again with its own log-softmax, so the
ensemble's next-token distribution is the normalised geometric mean of the members' (a token
must be likely under every member to score well). The members may be of different families (an
RNN with additive attention beside a Transformer): they share only the vocabulary, which is
the caller's to check (``inference.translator.Translator.from_checkpoints`` does).

The ensemble follows the decoding half of the encoder-decoder contract (``models/seq2seq.py``):
``encode``, ``start_state``, ``decode_step`` and ``max_positions``; it is not trained, so it has
no ``forward``. Its encoding and its state are lists with one entry per member, so beam search
reorders every member's state as one (``map_state`` walks lists) and each member keeps its own
incremental state (RNN hidden state, Transformer key/value cache).
"""

from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn


def mean_log_probs(logits: Sequence[Tensor]) -> Tensor:
    """The mean over members of their log-probabilities: ``M`` tensors ``(R, V)`` -> ``(R, V)``
    (float32, whatever precision the members ran in)."""
    return torch.stack([torch.log_softmax(x.float(), dim=-1) for x in logits]).mean(dim=0)  # (R, V)


def shortest_limit(models: Sequence[nn.Module]) -> Optional[int]:
    """The longest input every member takes: the smallest ``max_positions`` (None: no member has one)."""
    limits = [m.max_positions for m in models if getattr(m, "max_positions", None) is not None]
    return min(limits) if limits else None


class Ensemble(nn.Module):
    """Models that decode together with the mean of their log-probabilities (module docstring)."""

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least 2 models, got {len(members)}")
        self.members = nn.ModuleList(members)
        self.max_positions = shortest_limit(members)

    def encode(self, src: Tensor, src_mask: Tensor, need_weights: bool = False) -> List[Any]:
        """Every member's ``Encoded`` of the same source ``(B, S)``."""
        return [m.encode(src, src_mask, need_weights) for m in self.members]

    def start_state(self, encoded: List[Any]) -> List[Any]:
        """Every member's decoder state before the first target token."""
        return [m.start_state(e) for m, e in zip(self.members, encoded)]

    def decode_step(self, tokens: Tensor, state: List[Any]) -> Tuple[Tensor, List[Any]]:
        """One step of every member for ``tokens`` ``(R,)``: the mean log-probabilities ``(R, V)``
        (the search's logits) and the members' new states."""
        steps = [m.decode_step(tokens, s) for m, s in zip(self.members, state)]
        logits, states = zip(*steps)
        return mean_log_probs(logits), list(states)
