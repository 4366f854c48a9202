"""Two factors crossed: the architecture (the ``model`` group) and the attention function
(``model.attention``), as ``conf/experiment/attention_grid.yaml`` sweeps them. When the groups of
2+ seeds fill a 2 x 2 of them, the report's section: per cell the mean ± std over the seeds, and
each factor's effect within each level of the other, tested across seeds (significance.py). A
grid whose cells were trained at several peak rates is read under the protocols of
comparison/protocols.py.
"""

import itertools
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from comparison.formats import format_mean_std
from comparison.protocols import (
    BEST,
    SHARED,
    Cell,
    best_rate_grid,
    by_rate,
    rates_table,
    shared_rate_grid,
    verdicts_table,
)
from comparison.rates import Curve, rate_of
from comparison.runs import Run, group_labels, seed_scores, valid_scores
from comparison.significance import METRICS, SIGNIFICANT, seeds_verdict
from models.config import FAMILIES  # plain dataclasses: no torch


def attention_of(run: Run) -> str:
    """``model.attention`` of the run's config; a config without it (a run from before the key):
    its family's default (``RNNConfig``, ``TransformerConfig``)."""
    model = (run.config or {}).get("model") or {}
    return model.get("attention") or FAMILIES[model.get("name", run.results["model"])].attention


def cell_of(run: Run) -> Cell:
    """The architecture (the ``model`` group chosen, as the tables name it) and the attention."""
    return run.model_name(), attention_of(run)


def grid_cells(groups: Sequence[List[Run]]) -> Dict[Cell, List[List[Run]]]:
    """The groups of 2+ seeds by their cell, in the order of their first run (one group a cell in a
    grid; more when something else differs too)."""
    cells: Dict[Cell, List[List[Run]]] = {}
    for group in groups:
        if len(group) > 1:
            cells.setdefault(cell_of(group[0]), []).append(group)
    return cells


def crossed(cells: Sequence[Cell]) -> bool:
    """Whether two architectures share two attention functions: a 2 x 2 of cells, where each
    factor's effect can be seen within a level of the other."""
    by_architecture: Dict[str, set] = {}
    for architecture, attention in cells:
        by_architecture.setdefault(architecture, set()).add(attention)
    return any(len(x & y) >= 2 for x, y in itertools.combinations(by_architecture.values(), 2))


def levels(cells: Sequence[Cell], factor: int) -> List[str]:
    """The values of one factor (0: architecture, 1: attention) in the cells' order."""
    return list(dict.fromkeys(cell[factor] for cell in cells))


def grid_table(values: Dict[Cell, List[float]], title: str, fmt: str = "{:.2f}") -> List[str]:
    """Rows: architectures; columns: attention functions; a cell: mean ± std of its ``values``
    (each written with ``fmt``; their number in brackets), – for none or no such cell."""
    columns = levels(list(values), 1)
    lines = [
        f"| {title} | " + " | ".join(columns) + " |",
        "| --- | " + " | ".join(["---:"] * len(columns)) + " |",
    ]
    for architecture in levels(list(values), 0):
        cells = [architecture]
        for attention in columns:
            found = values.get((architecture, attention))
            cells.append(f"{format_mean_std(found, fmt)} ({len(found)})" if found else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# the cost of a cell: (title, results.json key, scale, format)
COSTS = (
    ("training minutes", "train_seconds", 1 / 60, "{:.1f}"),
    ("target tokens/s", "train_tokens_per_second", 1.0, "{:,.0f}"),
)


def valid_choice(values: Dict[Cell, List[float]]) -> str:
    """The cell with the highest mean validation BLEU: the grid's choice, made on validation only."""
    means = {cell: statistics.fmean(found) for cell, found in values.items() if found}
    if not means:
        return "No run has a validation BLEU: nothing to choose."
    best = max(means, key=means.get)  # the first of equal means, in the cells' order
    return (
        f"Highest mean validation BLEU: {best[0]} with {best[1]} ({means[best]:.2f}). Choices are made "
        "on validation only: the test scores below are reported, not ranked."
    )


def effects(grid: Dict[Cell, List[Run]], split: str, factor: int) -> List[str]:
    """The effect of one factor (0: architecture, 1: attention) within each level of the other, on
    ``split``: every cell of that level against its first (``comparisons``), per metric,
    ``seeds_verdict``'s sentence (a level with one cell: nothing to compare)."""
    lines, found = [], comparisons(grid)
    for level in levels(list(grid), 1 - factor):
        row = line_of(grid, factor, level)
        if len(row) < 2:
            lines.append(f"- Nothing to compare {where_of(factor, level)}: {row[0][factor]} only.")
        for where, first, cell, _ in (c for c in found if c[3] == factor and c[1] == row[0]):
            labels = (first[factor], cell[factor])
            for metric, key in METRICS:
                a, b = seed_scores(grid[first], split, key), seed_scores(grid[cell], split, key)
                lines.append(f"- {metric} {where}: {seeds_verdict(labels, metric, split, a, b)[1]}")
    return lines


def where_of(factor: int, level: str) -> str:
    """Where a factor's effect is seen: ``in rnn`` (the attention) or ``with additive attention``."""
    return f"in {level}" if factor == 1 else f"with {level} attention"


def line_of(grid: Dict[Cell, List[Run]], factor: int, level: str) -> List[Cell]:
    """The cells where the other factor is ``level``: a row of the tables (``factor`` 1, the
    attention varies) or a column (``factor`` 0), in the tables' order."""
    cells = [(level, v) if factor == 1 else (v, level) for v in levels(list(grid), factor)]
    return [cell for cell in cells if cell in grid]


def not_a_grid(groups: Sequence[List[Run]], cells: Dict[Cell, List[List[Run]]]) -> Optional[str]:
    """Why the groups of 2+ seeds are no grid of the two factors (``cells`` holds a cell of several
    configurations that differ by more than their peak rate: something else differs too), None
    when they are one."""
    crowded = [(cell, found) for cell, found in cells.items() if len(found) > 1]
    if not crowded:
        return None
    label = dict(zip(map(id, groups), group_labels(groups)))
    (architecture, attention), found = crowded[0]
    names = ", ".join(f"`{label[id(g)]}`" for g in found)
    return (
        f"No grid: {architecture} with {attention} attention is {len(found)} configurations with 2+ "
        f"seeds ({names}); the architecture and the attention are not all that differs between them."
    )


def comparisons(grid: Dict[Cell, object]) -> List[Tuple[str, Cell, Cell, int]]:
    """What the verdicts compare: (where, the first cell of a row or column, another cell of it, the
    factor that differs: 1 the attention within an architecture, 0 the architecture with an attention)."""
    found = []
    for factor in (1, 0):
        for level in levels(list(grid), 1 - factor):
            row = line_of(grid, factor, level)
            found += [(where_of(factor, level), row[0], cell, factor) for cell in row[1:]]
    return found


def grid_body(grid: Dict[Cell, List[Run]], splits: Sequence[str], heading: str = "###") -> List[str]:
    """The tables of one grid (a configuration a cell) and each factor's effect within each level
    of the other, per split under ``heading``."""
    valid = {cell: valid_scores(runs, "bleu") for cell, runs in grid.items()}
    lines = ["", *grid_table(valid, "valid BLEU"), "", valid_choice(valid)]
    chrf = {cell: valid_scores(runs, "chrf") for cell, runs in grid.items()}
    lines += ["", *grid_table(chrf, "valid chrF")]
    for title, key, scale, fmt in COSTS:
        cost = {cell: [run.results[key] * scale for run in runs] for cell, runs in grid.items()}
        lines += ["", *grid_table(cost, title, fmt)]
    for split in splits:
        lines += ["", f"{heading} {split}"]
        for metric, key in METRICS:
            scores = {cell: seed_scores(runs, split, key) for cell, runs in grid.items()}
            lines += ["", *grid_table(scores, f"{split} {metric}")]
        for factor, title in (
            (1, "attention function within each architecture"),
            (0, "architecture within each attention function"),
        ):
            lines += ["", f"**The {title}**", "", *effects(grid, split, factor)]
    return lines


def protocols_body(found: Dict[Cell, Curve], splits: Sequence[str]) -> List[str]:
    """The grid under the learning-rate protocols (comparison/protocols.py), each cell's
    configurations by their peak rate (``by_rate``): both, or each cell at its best rate alone when
    an architecture's cells share no rate."""
    shared, why = shared_rate_grid(found)
    grids = [(SHARED, shared)] if shared is not None else []
    grids.append((BEST, best_rate_grid(found)))
    lines = [
        "",
        "The cells were trained at several peak rates (`trainer.lr`; nothing else differs within a "
        "cell), so the grid is read under two protocols, each choosing one configuration a cell: "
        f"*{SHARED}* (the rate all the architecture's cells were trained at, as a schedule tuned "
        "once for the family trains them; of several, the highest validation BLEU averaged over "
        f"the cells) and *{BEST}* (of the rates it was trained at, its highest mean validation "
        "BLEU). Both choose on validation only. A verdict that changes between them depends on the "
        "tuning.",
    ]
    if shared is None:
        lines += ["", f"But {why}: no protocol of {SHARED}; the grid is read with {BEST} only."]
    lines += [
        "",
        "### The rates",
        "",
        *rates_table(found, grids),
        "",
        "### The verdicts",
        "",
        "Each entry: the second minus the first, in the means over the seeds; Welch's p; what it "
        f"shows (p < {SIGNIFICANT:g}).",
        "",
        *verdicts_table(grids, comparisons(grids[0][1]), splits),
    ]
    for name, grid in grids:
        lines += ["", f"### {name[0].upper()}{name[1:]}", *grid_body(grid, splits, "####")]
    return lines


def grid_section(groups: Sequence[List[Run]], splits: Sequence[str]) -> List[str]:
    """``## Architecture and attention`` (empty unless the groups of 2+ seeds cross the factors)."""
    cells = grid_cells(groups)
    if not crossed(list(cells)):
        return []
    lines = ["", "## Architecture and attention", ""]
    crowded = {cell: found for cell, found in cells.items() if len(found) > 1}
    rated = {cell: by_rate(found) for cell, found in cells.items()}
    why = not_a_grid(groups, {cell: found for cell, found in crowded.items() if rated[cell] is None})
    if why is not None:
        return lines + [why]
    unrated = [cell for cell, rates in rated.items() if rates is None]
    if crowded and unrated:
        architecture, attention = unrated[0]
        return lines + [
            f"No grid: some cells were trained at several peak rates, but {architecture} with "
            f"{attention} attention has no `trainer.lr` in its config to compare them by."
        ]
    defaults = ", ".join(f"{name} {family.attention}" for name, family in FAMILIES.items())
    one = "each protocol's" if crowded else "the"
    lines.append(
        "The runs cross two factors: the architecture (the `model` group) and the attention function "
        f"(`model.attention` in each run's config; without it, its family's default: {defaults}). In "
        f"{one} grid a cell is a configuration with 2+ seeds: mean ± standard deviation over its "
        "seeds (their number in brackets); configurations with one seed are in the next section. "
        "Each factor is tested within each level of the other, every cell against the first of its "
        "row or column, with the tests across seeds above (the verdict is Welch's; no seed pairs)."
    )
    if crowded:
        return lines + protocols_body(rated, splits)
    grid = {cell: found[0] for cell, found in cells.items()}
    return lines + rates_apart(grid) + grid_body(grid, splits)


def rates_apart(grid: Dict[Cell, List[Run]]) -> List[str]:
    """A line per architecture whose cells were trained at different peak rates: its attention
    functions are then compared each at its own rate, not under one schedule."""
    lines = []
    for architecture in levels(list(grid), 0):
        rates = {cell[1]: rate_of(runs[0]) for cell, runs in grid.items() if cell[0] == architecture}
        if None not in rates.values() and len(set(rates.values())) > 1:
            each = ", ".join(f"{attention} {rate:g}" for attention, rate in rates.items())
            lines += ["", f"The cells of {architecture} were trained at different peak rates ({each})."]
    return lines
