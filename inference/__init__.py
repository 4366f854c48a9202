"""Translation: the Python API (``Translator``, chosen by engine in ``engines``), decoding whole
splits, a model back from its checkpoint, attention figures, the CTranslate2 export and engine, and
what ``translate.py`` reads and writes around the translator (``command_line``: no torch). It
imports ``common``, ``data``, ``models`` and ``alignment`` (the links of ``--alignments``), never
``training``."""
