"""When an attention has collapsed: its mean row entropy (nats, over real query rows) under
``COLLAPSE_NATS``. Its average row then puts about 99.5% of its weight on one key, whatever the
word. Healthy cross-attentions measured on Multi30k sit far above it (0.8-1.9 nats; Luong's general
score 0.13); the RNN's collapsed dot products measured 0.000-0.001 (docs/attention_grid_de_en.md).
Training says so in ``train.log`` (``training/validation.py``); ``scripts/compare.py`` counts
collapsed runs in its learning-rate tables (``comparison/rates.py``)."""

COLLAPSE_NATS = 0.05
