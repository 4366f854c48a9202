"""Translation: the Python API (``Translator``), decoding whole splits, a model back from its
checkpoint, word alignments, attention figures and the CTranslate2 export and engine. It imports
``common``, ``data`` and ``models``, never ``training``."""
