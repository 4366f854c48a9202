"""The attention viewer: a TensorBoard plugin ("Attention" tab) that shows every attention map of
the validation samples, every layer and head, at any evaluation.

- ``format.py``: the summaries as stored (header and uint8 weights), read by the plugin;
- ``summaries.py``: a model's attention for one sentence in that format (training writes it:
  ``training/board.py``);
- ``plugin.py``: the TensorBoard plugin (data routes, static files);
- ``static/``: the tab's page (``index.js``).
"""
