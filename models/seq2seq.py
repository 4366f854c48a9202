"""The encoder-decoder contract both model families follow, so search is written once.

A model has:

- ``encode(src, src_mask, need_weights=False) -> Encoded``: run the encoder once per batch.
- ``start_state(encoded) -> state``: the decoder state before the first target token.
- ``decode_step(tokens, state, need_weights=False) -> (logits, state, weights)``: one target
  step for ``tokens`` ``(B,)``; logits ``(B, V)``; weights ``(B, S)`` (attention of this step over
  the source, for alignments) or None. The state is new; the one passed in is not modified.
- ``forward(src, src_mask, tgt_in, need_weights=False) -> (logits, attention)``: teacher-forced
  pass over a whole target, logits ``(B, T, V)``; ``attention`` maps names to weights when asked.

``max_positions`` is the longest source or output the model can take (None: no limit).

A decoder state is a nest of dicts, lists and tuples whose tensors all have the batch on dim 0,
so ``map_state(state, fn)`` can reorder or repeat it for beam search. Entries that depend on the
source only go under the keys in ``SOURCE_KEYS``.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Optional

from torch import Tensor


@dataclass
class Encoded:
    memory: Tensor  # (B, S, D_enc) encoder output for every source position
    src_mask: Tensor  # (B, S) True at real source tokens
    final: Optional[Tensor] = None  # (B, D_final) a summary of the source (RNN: final states)
    attention: Dict[str, Any] = field(default_factory=dict)  # encoder weights when asked


# Entries of a decoder state that depend on the source sentence only (the encoder output, its mask
# and projections of it). Every hypothesis of a sentence holds the same rows there, so beam search
# leaves them as they are when it reorders hypotheses within their sentences.
SOURCE_KEYS = frozenset({"src_mask", "memory", "keys", "cross_k", "cross_v"})


def map_state(state: Any, fn: Callable[[Tensor], Tensor], skip: FrozenSet[str] = frozenset()) -> Any:
    """Apply ``fn`` to every tensor of a nested state (dict / list / tuple), except under dict keys in ``skip``."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, dict):
        return {key: value if key in skip else map_state(value, fn, skip) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(map_state(value, fn, skip) for value in state)
    return state
