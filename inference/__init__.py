"""Translation: the Python API (``Translator``), decoding whole splits, a model back from its
checkpoint, word alignments and their measurement (AER, heads), attention figures, the CTranslate2
export and engine, and what ``translate.py`` reads and writes around the translator
(``command_line``: no torch). It imports ``common``, ``data`` and ``models``, never ``training``."""
