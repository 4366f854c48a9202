"""The grid under two learning-rate protocols, when its cells were trained at several peak rates
(``trainer.lr``; nothing else differs within a cell):

- *one rate per architecture*: each family's schedule, the rate that every cell of the architecture
  was trained at (of several, the one with the highest validation BLEU averaged over the
  architecture's cells): how a toolkit compares attention functions when it tunes the schedule
  once, for its default cell;
- *each cell at its best rate*: the rate of the cell's highest mean validation BLEU.

Both choose on validation only. A verdict that holds under the first and not the second came from
the tuning, not from the attention function; the table of both side by side says which survive.
"""

import math
import statistics
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from comparison.formats import format_p
from comparison.rates import curve_key, rate_of
from comparison.runs import Run, seed_scores, valid_scores
from comparison.significance import METRICS, SIGNIFICANT, seed_tests

Cell = Tuple[str, str]  # (architecture, attention), as comparison/grid.py names a cell
Grid = Dict[Cell, List[Run]]  # a cell -> the runs of its one configuration (a run a seed)
Rates = Dict[float, List[Run]]  # a cell's configurations by their peak rate

SHARED = "one rate per architecture"
BEST = "each cell at its best rate"


def by_rate(found: Sequence[List[Run]]) -> Optional[Rates]:
    """A cell's configurations (groups of seeds) by their peak rate; None when something besides
    the rate differs between them, or two of them share a rate."""
    if len({curve_key(group[0]) for group in found}) > 1:
        return None
    rates = {rate_of(group[0]): group for group in found}
    if None in rates or len(rates) < len(found):
        return None
    return dict(sorted(rates.items()))


def mean_valid(runs: Sequence[Run]) -> float:
    """The mean validation BLEU over the runs' seeds (-inf for none: never chosen)."""
    scores = valid_scores(runs, "bleu")
    return statistics.fmean(scores) if scores else -math.inf


def best_rate_grid(cells: Dict[Cell, Rates]) -> Grid:
    """Each cell at the rate of its highest mean validation BLEU (of equal means, the lowest rate)."""
    return {cell: max(rates.values(), key=mean_valid) for cell, rates in cells.items()}


def averaged(cells: Iterable[Rates], rate: float) -> float:
    """The validation BLEU at ``rate`` averaged over the cells (each cell its mean over seeds)."""
    return statistics.fmean(mean_valid(rates[rate]) for rates in cells)


def shared_rate_grid(cells: Dict[Cell, Rates]) -> Tuple[Optional[Grid], str]:
    """Each architecture's cells at the one rate they were all trained at (of several, the highest
    validation BLEU averaged over the cells; of equal averages, the lowest rate), and ``""``; or
    ``(None, why not)`` when an architecture's cells share no rate."""
    grid: Grid = {}
    for architecture in dict.fromkeys(cell[0] for cell in cells):
        mine = {cell: rates for cell, rates in cells.items() if cell[0] == architecture}
        shared = sorted(set.intersection(*(set(rates) for rates in mine.values())))
        if not shared:
            return None, f"the cells of {architecture} were trained at no rate in common"
        rate = max(shared, key=lambda rate: averaged(mine.values(), rate))
        grid.update({cell: rates[rate] for cell, rates in mine.items()})
    return grid, ""


def rates_table(grids: Sequence[Tuple[str, Grid]]) -> List[str]:
    """A row per cell: under each protocol its peak rate and the mean validation BLEU there."""
    lines = [
        "| cell | " + " | ".join(name for name, _ in grids) + " |",
        "| --- | " + " | ".join(["---"] * len(grids)) + " |",
    ]
    for cell in grids[0][1]:
        found = [grid[cell] for _, grid in grids]
        chosen = [
            f"{rate_of(runs[0]):g} (valid BLEU {mean_valid(runs):.2f}, {len(runs)} seeds)" for runs in found
        ]
        lines.append(f"| {cell[0]} with {cell[1]} | " + " | ".join(chosen) + " |")
    return lines


def verdict_cell(labels: Tuple[str, str], a: Sequence[float], b: Sequence[float]) -> str:
    """``b - a`` in the means over the seeds, Welch's p, and what it shows (as the grid's verdicts)."""
    if len(a) < 2 or len(b) < 2:
        return "fewer than 2 seeds: no test"
    welch = seed_tests(a, b).welch_p
    diff = statistics.fmean(b) - statistics.fmean(a)
    shown = not math.isnan(welch) and welch < SIGNIFICANT
    what = f"{labels[1] if diff > 0 else labels[0]} higher" if shown else "no difference shown"
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
