"""Model code: masks, attention, the two model families, search.

Imports only torch, so every module can be used on its own, in a notebook or another project.

Shapes in docstrings and comments, here and in ``inference/``, ``data/batching.py`` and
``training/``, use one letter scheme, each letter with one meaning:

- ``B`` sentences (pairs) in a batch, ``N`` sentences (pairs) of a whole split or data set, ``A``
  sentences of a batch still being searched (``A'`` after some ended), ``R`` rows of logits a
  search step ranks (``A``, or ``A * K`` in beam search);
- ``S`` source length, ``T`` target length (also the length of a sequence that may be either, as
  in embeddings, masks and ``data.batching.pad``), ``t`` target positions decoded before the ``T``
  new ones;
- ``D`` model size: the Transformer's ``d_model``, the RNN's ``hidden_size`` (its bidirectional
  encoder's states are ``2D``); ``E`` embedding size (the RNN's ``embed_dim``; the Transformer's is ``D``);
- ``H`` attention heads (1 for the RNN's attention but ``multihead``), ``L`` layers, ``V`` vocabulary
  (``V_src``, ``V_tgt`` when they differ), ``K`` beam size;
- ``M`` the target tokens that count in a loss (the non-padding positions of a batch);
- ``P`` subword pieces and ``W`` words of one sentence (``W_src``, ``W_tgt``), in alignments;
- inner sizes are lower case: ``d_k = D / H`` the size of a head's queries and keys, ``d_v`` that of
  its values (``d_k`` too here), ``d_a`` the additive attention's hidden size (``attention_size``),
  ``d_ff`` the feed-forward size; ``D_query``, ``D_key``, ``D_value`` are the input sizes of
  a single-head attention (in the RNN ``D``, ``2D``, ``2D``);
- any other size is written as the name of its variable, as ``(window,)``; letters inside a formula
  of a paper (``softmax(Q K^T / sqrt(d_k)) V``, ``W_k h``) name matrices, not sizes.
"""
