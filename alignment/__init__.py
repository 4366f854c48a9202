"""Word alignment from attention, and how well it aligns, one concept a module:

- ``method``: which maps make an alignment (a decoder layer, heads and a reading), the default;
- ``forced``: a model's cross-attention over a given output (forced decoding) and a method's map;
- ``words``: subword attention pooled into words, each target word linked to a source word;
- ``scores``: human gold links (sure and possible), AER, precision and recall, the diagonal;
- ``fast_align``: the reference aligner, trained on the parallel text;
- ``heads``: each head's entropy and importance;
- ``evaluation``: every method scored on a gold set, the choice on its dev part, the report.

``translate.py --alignments`` and the ``Translator`` read links through ``method``, ``forced`` and
``words``; ``scripts/align.py`` measures them with the rest."""
