"""Validation BLEU at equal budgets: the report's tables of each group's validation BLEU after the
same training time and after the same number of epochs, and which group leads at each budget.
"""

import statistics
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from comparison.curves import Curves, group_curves, value_at
from comparison.formats import format_mean_std
from comparison.runs import Run, group_labels
from comparison.statistics import EPS, SIGNIFICANT, welch_t_test


def budgets(curves: Sequence[Optional[Curves]], axis: str, step: float) -> List[float]:
    """``step``, ``2 * step``, ... up to the last evaluation of the longest run on ``axis``."""
    ends = [c[axis][0][-1] for c in curves if c is not None and c[axis][0]]
    if not ends:
        return []
    return [round(k * step, 9) for k in range(1, int(max(ends) / step + EPS) + 1)]


def budget_values(curves: Sequence[Optional[Curves]], axis: str, x: float) -> List[float]:
    """The validation BLEU at ``x`` of each run that reached it."""
    return [v for c in curves if c is not None for v in [value_at(c[axis], x)] if v is not None]


def budget_cell(values: Sequence[float], runs: int) -> str:
    """Mean ± std of ``values`` (one value: itself); ``(k/n)`` when only k of the group's n runs
    reached the budget; – for none."""
    if not values:
        return "–"
    text = format_mean_std(values)
    return text if len(values) == runs else f"{text} ({len(values)}/{runs})"


def budget_table(
    groups: Sequence[List[Run]],
    curves: Dict[Path, Optional[Curves]],
    axis: str,
    columns: Sequence[float],
    unit: Callable[[float], str],
) -> List[str]:
    """Rows: the groups; columns: the budgets ``columns`` on ``axis``, named by ``unit(x)``."""
    lines = [
        "| configuration | seeds | " + " | ".join(unit(x) for x in columns) + " |",
        "| --- | ---: | " + " | ".join(["---:"] * len(columns)) + " |",
    ]
    for group, label in zip(groups, group_labels(groups)):
        found = group_curves(group, curves)
        seeds = str(len(found)) if len(found) == len(group) else f"{len(found)} of {len(group)} with events"
        cells = [budget_cell(budget_values(found, axis, x), len(found)) for x in columns]
        lines.append("| " + " | ".join([label, seeds, *cells]) + " |")
    return lines


def named_spans(marks: Sequence[Tuple[str, float, int]], span: Callable[[float, float], str]) -> str:
    """``leader at first-last, ...`` for ``(leader, budget, column)`` marks in column order,
    consecutive columns with the same leader together (``span(first, last)`` names them)."""
    spans: List[List[Any]] = []  # [leader, first budget, last budget, column index of the last]
    for leader, x, j in marks:
        if spans and spans[-1][0] == leader and spans[-1][3] == j - 1:
            spans[-1][2:] = [x, j]
        else:
            spans.append([leader, x, x, j])
    return ", ".join(f"{s[0]} at {span(s[1], s[2])}" for s in spans)


def leaders(
    groups: Sequence[List[Run]],
    curves: Dict[Path, Optional[Curves]],
    axis: str,
    columns: Sequence[float],
    span: Callable[[float, float], str],
) -> str:
    """Which group has the higher mean validation BLEU at each budget that every seed of two groups
    or more reached (a mean over the seeds that got there would favour the groups whose weak seeds
    had not), and where Welch's t-test over the seeds tells the leader from the next group. Where
    some groups have 2+ seeds, only they compete: a single run has no spread to test against."""
    marks: List[Tuple[str, float, int]] = []  # (leader, budget, column)
    shown: List[Tuple[str, float, int]] = []  # those where Welch's p < SIGNIFICANT
    seeded = any(len(group) > 1 for group in groups)
    competing = [(g, label) for g, label in zip(groups, group_labels(groups)) if len(g) > 1 or not seeded]
    for j, x in enumerate(columns):
        reached = []  # (mean, label, values) of the groups every seed of which reached x
        for group, label in competing:
            found = group_curves(group, curves)
            values = budget_values(found, axis, x)
            if values and len(values) == len(found):
                reached.append((statistics.fmean(values), label, values))
        if len(reached) < 2:
            continue
        reached.sort(key=lambda r: -r[0])
        top = [label for m, label, _ in reached if reached[0][0] - m <= EPS]
        leader = top[0] if len(top) == 1 else " and ".join(top) + " (equal)"
        marks.append((leader, x, j))
        p = welch_t_test(reached[1][2], reached[0][2])[2]
        if len(top) == 1 and p < SIGNIFICANT:  # NaN (a group of one seed, or no spread) compares False
            shown.append((leader, x, j))
    if not marks:
        return "No budget was reached by every seed of two configurations."
    return (
        f"Higher mean validation BLEU, at the budgets every seed reached: {named_spans(marks, span)}. "
        f"Shown by Welch's t-test over the seeds (the leader against the next, p < {SIGNIFICANT:g}): "
        f"{named_spans(shown, span) or 'none'}."
    )


def _minutes_span(first: float, last: float) -> str:
    return f"{first:g} min" if first == last else f"{first:g}-{last:g} min"


def _epochs_span(first: float, last: float) -> str:
    return f"epoch {first:g}" if first == last else f"epochs {first:g}-{last:g}"


def budget_sections(
    groups: Sequence[List[Run]], curves: Dict[Path, Optional[Curves]], minutes_step: float
) -> List[str]:
    """``## Validation BLEU at equal training time`` and ``## ... at equal epochs``."""
    found = list(curves.values())
    lines = []
    for axis, title, step, unit, span, what in (
        (
            "minutes",
            "training time",
            minutes_step,
            lambda x: f"{x:g} min",
            _minutes_span,
            "training time (`valid/train_seconds`: evaluations included)",
        ),
        (
            "epochs",
            "epochs",
            1.0,
            lambda x: f"epoch {x:g}",
            _epochs_span,
            "number of epochs (each evaluation's epoch, from `valid_history` in results.json)",
        ),
    ):
        lines += ["", f"## Validation BLEU at equal {title}", ""]
        columns = budgets(found, axis, step)
        if not columns:
            why = (
                "no run has a validation curve in its TensorBoard events"
                if all(c is None for c in found)
                else f"no run reached {unit(step)}"
            )
            lines.append(f"No budget to compare: {why}.")
            continue
        lines.append(
            f"Validation BLEU (greedy) after the same {what}, linearly interpolated between "
            "evaluations: mean ± std over the seeds that reached it; (k/n): only k of the n seeds "
            "have a value there (none before a run's first evaluation or after its last); –: none "
            "has."
        )
        lines += [""] + budget_table(groups, curves, axis, columns, unit)
        lines += ["", leaders(groups, curves, axis, columns, span)]
    return lines
