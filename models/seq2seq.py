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
so ``map_state(state, fn)`` can reorder or repeat it for beam search.
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from torch import Tensor


@dataclass
class Encoded:
    memory: Tensor  # (B, S, D_enc) encoder output for every source position
    src_mask: Tensor  # (B, S) True at real source tokens
    final: Optional[Tensor] = None  # (B, D_final) a summary of the source (RNN: final states)
    attention: Dict[str, Any] = field(default_factory=dict)  # encoder weights when asked


def map_state(state: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """Apply ``fn`` to every tensor of a nested state (dict / list / tuple)."""
    if isinstance(state, Tensor):
        return fn(state)
    if isinstance(state, dict):
        return {key: map_state(value, fn) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(map_state(value, fn) for value in state)
    return state
