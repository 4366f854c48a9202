"""The encoder-decoder contract both model families follow, so search is written once.

A model has:

- ``encode(src, src_mask, need_weights=False) -> Encoded``: run the encoder once per batch.
- ``start_state(encoded) -> state``: the decoder state before the first target token.
- ``decode_step(tokens, state) -> (logits, state)``: one target step for ``tokens`` ``(B,)``;
  logits ``(B, V)``. The state is new; the one passed in is not modified. (Alignments come from a
  teacher-forced ``forward`` over a finished output: ``alignment/forced.py``.)
- ``forward(src, src_mask, tgt_in, need_weights=False, alignment=False, project=True) -> (logits,
  attention)``: teacher-forced pass over a whole target, logits ``(B, T, V)``; ``attention`` is
  ``{}`` unless asked. With ``project=False`` it gives the output layer's input ``(B, T, E)`` in
  place of the logits: the training step projects it inside its loss, a block of rows at a time
  (``training/step.py``).
- ``output_layer``: the ``OutputLayer`` (``models/embeddings.py``) that makes the logits.

The attention of ``forward(..., need_weights=True)`` has one structure in both families, a dict
of lists with one ``(B, H, query, key)`` tensor per layer, first layer first::

    "cross":        [(B, H, T, S)]  per decoder layer: target positions over the source
    "encoder_self": [(B, H, S, S)]  per encoder layer: source over source
    "decoder_self": [(B, H, T, T)]  per decoder layer: target over target (causal)

The RNN's attention is one cross layer, ``[(B, H, T, S)]`` (one head but for ``multihead``); it
has no self-attention (empty lists). ``encode(..., need_weights=True)`` puts ``encoder_self`` in
``Encoded.attention``. Every row sums to 1 over the keys it may see and is 0 at the others.

``forward(..., alignment=True)`` adds ``"alignment": [(B, H_a, T, S)]``: the cross-attention heads
that guided alignment trains (``model.alignment_layer``, its first ``model.alignment_heads``
heads; ``training/guided.py``), computed even when the other weights are not.

``attention_modules()`` gives the attention functions behind those maps, in the same dict of
lists (``models/attention.py``'s ``masked_heads`` masks their heads).

``max_positions`` is the longest source or output the model can take (None: no limit).

A decoder state is a nest of dicts, lists and tuples whose tensors all have the batch on dim 0,
so beam search can reorder or repeat it (``models/search.py``: ``map_state``). Entries that depend
on the source only go under the keys in ``models.search.SOURCE_KEYS``.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from torch import Tensor

ATTENTION_KEYS = ("cross", "encoder_self", "decoder_self")  # the attention of forward(..., need_weights=True)
Attention = Dict[str, List[Tensor]]  # ATTENTION_KEYS -> one (B, H, query, key) tensor per layer


@dataclass
class Encoded:
    memory: Tensor  # (B, S, D) encoder output for every source position (RNN: (B, S, 2D))
    src_mask: Tensor  # (B, S) True at real source tokens
    final: Optional[Tensor] = None  # (B, 2D) a summary of the source (RNN: final states; else None)
    attention: Attention = field(default_factory=dict)  # {"encoder_self": [(B, H, S, S)]} when asked
