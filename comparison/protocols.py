"""The grid under two learning-rate protocols, when its cells were trained at several peak rates
(``trainer.lr``; nothing else differs within a cell):

- *one rate per architecture*: the rate that every cell of the architecture was trained at (of
  several, the one with the highest validation BLEU averaged over the architecture's cells), as a
  schedule tuned once for the family trains each of its cells;
- *each cell at its best rate*: of the rates the cell was trained at, the one of its highest mean
  validation BLEU.

Both choose on validation only. A verdict that changes between them depends on the tuning; one
that holds under both does not (as far as the rates tried and the seeds can tell).
"""

import statistics
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from comparison.formats import format_p
from comparison.rates import Curve, best_rate, curve_key, mean_valid, rate_of
from comparison.runs import Run, seed_scores, valid_scores
from comparison.significance import METRICS, difference, seed_tests, welch_shows

Cell = Tuple[str, str]  # a cell of the grid: (architecture, attention)
Grid = Dict[Cell, List[Run]]  # a cell -> the runs of its one configuration (a run a seed)

SHARED = "one rate per architecture"
BEST = "each cell at its best rate"


def by_rate(found: Sequence[List[Run]]) -> Optional[Curve]:
    """A cell's configurations (groups of seeds) by their peak rate, rising; None when something
    besides the rate differs between them, or two of them share a rate."""
    if len({curve_key(group[0]) for group in found}) > 1:
        return None
    rates = {rate_of(group[0]): group for group in found}
    if None in rates or len(rates) < len(found):
        return None
    return dict(sorted(rates.items()))


def best_rate_grid(cells: Dict[Cell, Curve]) -> Grid:
    """Each cell at the rate of its highest mean validation BLEU (``rates.best_rate``)."""
    return {cell: rates[best_rate(rates)[0]] for cell, rates in cells.items()}


def averaged(cells: Iterable[Curve], rate: float) -> float:
    """The validation BLEU at ``rate`` averaged over the cells (each cell its mean over seeds)."""
    return statistics.fmean(mean_valid(rates[rate]) for rates in cells)


def shared_rate_grid(cells: Dict[Cell, Curve]) -> Tuple[Optional[Grid], str]:
    """Each architecture's cells at the one rate they were all trained at (of several, the highest
    validation BLEU averaged over the cells; of equal averages, the lowest rate), in the cells'
    order, and ``""``; or ``(None, why not)`` when an architecture's cells share no rate."""
    chosen: Grid = {}
    for architecture in dict.fromkeys(cell[0] for cell in cells):
        mine = {cell: rates for cell, rates in cells.items() if cell[0] == architecture}
        shared = sorted(set.intersection(*(set(rates) for rates in mine.values())))
        if not shared:
            return None, f"the cells of {architecture} were trained at no rate in common"
        rate = max(shared, key=lambda rate: averaged(mine.values(), rate))
        chosen.update({cell: rates[rate] for cell, rates in mine.items()})
    return {cell: chosen[cell] for cell in cells}, ""


def chosen_text(runs: Sequence[Run]) -> str:
    """A chosen configuration: its rate and its mean validation BLEU over its seeds."""
    seeds = len(valid_scores(runs, "bleu"))
    valid = f"valid BLEU {mean_valid(runs):.2f}, {seeds} seeds" if seeds else "no valid BLEU"
    return f"{rate_of(runs[0]):g} ({valid})"


def rates_table(cells: Dict[Cell, Curve], grids: Sequence[Tuple[str, Grid]]) -> List[str]:
    """A row per cell: the rates it was trained at, and under each protocol the rate chosen with its
    mean validation BLEU."""
    lines = [
        "| cell | rates trained | " + " | ".join(name for name, _ in grids) + " |",
        "| --- | --- | " + " | ".join(["---"] * len(grids)) + " |",
    ]
    for cell, rates in cells.items():
        tried = ", ".join(f"{rate:g}" for rate in rates)
        chosen = [chosen_text(grid[cell]) for _, grid in grids]
        lines.append(f"| {cell[0]} with {cell[1]} | {tried} | " + " | ".join(chosen) + " |")
    return lines


def verdict_cell(labels: Tuple[str, str], a: Sequence[float], b: Sequence[float]) -> str:
    """``b - a`` in the means over the seeds, Welch's p, and what it shows (as the grid's verdicts)."""
    if len(a) < 2 or len(b) < 2:
        return "fewer than 2 seeds: no test"
    welch = seed_tests(a, b).welch_p
    diff, leader = difference(labels, a, b)
    what = f"{leader} higher" if welch_shows(welch) else "no difference shown"
    p = format_p(welch)
    return f"{diff:+.2f}, p {p if p.startswith('<') else '= ' + p}: {what}"


def verdicts_table(
    grids: Sequence[Tuple[str, Grid]],
    comparisons: Sequence[Tuple[str, Cell, Cell, int]],
    splits: Sequence[str],
) -> List[str]:
    """A row per comparison, split and metric: under each protocol the difference of the means
    (the second cell minus the first), Welch's p and what it shows. ``comparisons``: (where, the
    first cell, the second, the factor that differs: 0 architecture, 1 attention)."""
    lines = [
        "| comparison | split | metric | " + " | ".join(name for name, _ in grids) + " |",
        "| --- | --- | --- | " + " | ".join(["---"] * len(grids)) + " |",
    ]
    for where, first, second, factor in comparisons:
        labels = (first[factor], second[factor])
        for split in splits:
            for metric, key in METRICS:
                found = [
                    verdict_cell(
                        labels, seed_scores(grid[first], split, key), seed_scores(grid[second], split, key)
                    )
                    for _, grid in grids
                ]
                row = [f"{labels[1]} - {labels[0]} {where}", split, metric, *found]
                lines.append("| " + " | ".join(row) + " |")
    return lines
