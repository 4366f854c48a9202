"""Comparing finished training runs, the library behind ``scripts/compare.py``:

- runs.py: which runs there are (finding and reading run folders) and how they group by seed;
- statistics.py: mean and spread, Welch's t-test and the permutation test (scipy.stats);
- significance.py: the paired bootstrap of runs, and the comparison of groups of seeds;
- curves.py: validation curves from TensorBoard events, their values and their mean over seeds;
- budgets.py: validation BLEU at equal training time and at equal epochs;
- rates.py: the learning-rate curves, a configuration trained at several peak rates; protocols.py:
  the grid read at one rate per architecture and at each cell's best rate; proxy.py: whether a
  short budget ranks the rates as full runs do;
- grid.py: the grid of two factors, architecture and attention function, and each one's effect;
- figure.py: ``comparison.png``;
- ensembles.py: ensembles of finished runs decoded and scored next to their members (this one
  loads torch, when ``--ensemble`` asks for it);
- formats.py: how the report writes its numbers;
- report.py: the Markdown report.

Nothing here imports torch: the command starts quickly (matplotlib, sacrebleu, scipy, TensorBoard
and omegaconf are imported where they are used).
"""
