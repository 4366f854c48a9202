"""Model code: masks, attention, the two model families, search.

Imports only torch, so every module can be used on its own, in a notebook or another project.

Shapes in docstrings and comments use one letter scheme, each letter with one meaning:

- ``B`` batch, ``S`` source length, ``T`` target length (also the length of a sequence that may be
  either, as in embeddings and masks), ``t`` target positions decoded before the ``T`` new ones;
- ``D`` model size: the Transformer's ``d_model``, the RNN's ``hidden_size`` (its bidirectional
  encoder's states are ``2D``); ``E`` embedding size (the RNN's ``embed_dim``; the Transformer's is ``D``);
- ``H`` attention heads (1 for the RNN's additive attention), ``N`` layers, ``V`` vocabulary,
  ``K`` beam;
- inner sizes are lower case: ``d_k = D / H`` the size of a head, ``d_a`` the additive attention's
  hidden size (``attention_size``), ``d_ff`` the feed-forward size; ``D_query``, ``D_key``,
  ``D_value`` are the input sizes of additive attention (in the RNN ``D``, ``2D``, ``2D``).
"""
