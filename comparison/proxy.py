"""A short budget as a proxy of full runs: a learning-rate sweep at a shortened budget
(``+experiment=attention_lr``: 3 epochs) chooses rates for full runs, which it may do only if it
ranks the rates as full runs do. Rate curves (``rates.rate_curves``) whose configurations differ by
their training budget alone (``BUDGET``) are set side by side, each shorter budget against the
longest (the most steps trained): at the rates both trained, each one's mean validation BLEU, the
rate each ranks first, and how many pairs of rates the two order alike.
"""

from itertools import combinations
from typing import Dict, List, Sequence, Tuple

from comparison.formats import format_score
from comparison.rates import Curve, best_rate, curve_key, curve_label, first_run, mean_valid

# The trainer's keys that set how long a run trains (and its schedule's length): what a proxy changes.
BUDGET = ("trainer.max_epochs", "trainer.max_steps", "trainer.max_minutes", "trainer.schedule_steps")
UNITS = (("max_epochs", "epochs"), ("max_steps", "steps"), ("max_minutes", "minutes"))  # of ``trainer``
# What the curves set side by side may differ by, as config keys (``curve_key``) and override keys
# (``curve_label``): the rate, the budget, and the experiment that sets the budget (attention_lr).
NOT_RANKED = ("trainer.lr", *BUDGET, "experiment")

Budgets = Dict[str, Curve]  # a configuration's curves by their budget's label, the shortest first


def budget_label(curve: Curve) -> str:
    """The curve's budget as its config sets it: ``3 epochs``, ``2000 steps`` (every limit set, and
    the schedule's length when it is set apart from them)."""
    trainer = (first_run(curve).config or {}).get("trainer") or {}
    limits = [(trainer.get(key), unit) for key, unit in UNITS]
    limits.append((trainer.get("schedule_steps"), "scheduled steps"))
    shown = [
        f"{v:g} {unit}" if isinstance(v, (int, float)) else f"{v} {unit}"
        for v, unit in limits
        if v is not None
    ]
    return ", ".join(shown) or "no limit"


def longest_steps(curve: Curve) -> int:
    """The most steps a run of the curve trained: the budgets' order (a run stopped early by its
    patience trains fewer, the curve's longest does not)."""
    return max(run.results["steps"] for runs in curve.values() for run in runs)


def budget_groups(curves: Sequence[Curve]) -> List[Budgets]:
    """Curves whose configurations differ by their budget alone, two budgets or more, each group
    shortest first (curves of one budget and configuration are one curve: ``rate_curves``)."""
    groups: Dict[str, List[Curve]] = {}
    for curve in curves:
        groups.setdefault(curve_key(first_run(curve), NOT_RANKED), []).append(curve)
    return [
        {budget_label(curve): curve for curve in sorted(group, key=longest_steps)}
        for group in groups.values()
        if len(group) > 1
    ]


def pairs_alike(short: Sequence[float], full: Sequence[float]) -> Tuple[int, int]:
    """Of every pair of rates (``short`` and ``full``: the two budgets' means at the same rates, in
    one order), how many the two order alike (a tie at either is not alike), and how many there are."""
    pairs = list(combinations(range(len(short)), 2))
    alike = sum((short[i] - short[j]) * (full[i] - full[j]) > 0 for i, j in pairs)
    return alike, len(pairs)


def at_rates(curve: Curve, rates: Sequence[float]) -> Curve:
    """The curve at ``rates`` only."""
    return {rate: curve[rate] for rate in rates}


def proxy_verdict(
    labels: Tuple[str, str], short: Curve, full: Curve, rates: Sequence[float], firsts: Tuple[float, float]
) -> str:
    """A shorter budget against the longest (``labels``: theirs), at the ``rates`` both trained: the
    rate each ranks first (``firsts``), the pairs of rates ordered alike, and the rate the shorter
    budget chose from all its rates when the longest did not train it."""
    first, first_full = firsts
    alike, pairs = pairs_alike([mean_valid(short[r]) for r in rates], [mean_valid(full[r]) for r in rates])
    proxy = first == first_full and alike == pairs
    text = (
        f"{labels[0]} ranks {first:g} first, {labels[1]} {first_full:g}; {alike} of {pairs} pairs of "
        f"rates ordered alike: {'a proxy' if proxy else 'not a proxy'} at these rates"
    )
    chosen = best_rate(short)[0]
    if chosen not in full:
        text += f" (its best rate of all, {chosen:g}, was not trained at {labels[1]})"
    if any(len(curve[r]) < 2 for curve in (short, full) for r in rates):
        text += "; a single seed at some rate: a seed's spread can reorder rates close together"
    return text + "."


def proxy_table(budgets: Budgets, short: str, full: str) -> List[str]:
    """The mean validation BLEU of two budgets at the rates both trained (the seeds in brackets),
    the rate each ranks first in bold, and the verdict; a line instead when they share one rate."""
    rates = sorted(set(budgets[short]) & set(budgets[full]))
    if len(rates) < 2:
        return [f"{short} and {full} share fewer than 2 rates: nothing to rank."]
    lines = [f"| peak lr | valid BLEU, {short} | valid BLEU, {full} |", "| ---: | ---: | ---: |"]
    firsts = (best_rate(at_rates(budgets[short], rates))[0], best_rate(at_rates(budgets[full], rates))[0])
    for rate in rates:
        cells = []
        for label, first in zip((short, full), firsts):
            mark = "**" if rate == first else ""
            runs = budgets[label][rate]
            cells.append(f"{mark}{format_score(mean_valid(runs))}{mark} ({len(runs)})")
        lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
    return lines + ["", proxy_verdict((short, full), budgets[short], budgets[full], rates, firsts)]


def proxy_section(curves: Dict[str, Curve]) -> List[str]:
    """The learning-rate section's part on budgets: per configuration trained at several budgets, a
    table of each shorter budget against the longest."""
    groups = budget_groups(list(curves.values()))
    if not groups:
        return []
    lines = [
        "",
        "### Does the short budget rank the rates as full runs do?",
        "",
        "Configurations trained at several budgets (nothing else differing), each shorter budget "
        "against the longest: at the rates both trained, the mean validation BLEU over the seeds "
        "(their number in brackets), the rate each ranks first in bold. The shorter budget is a proxy "
        "where it ranks the same rate first and orders every pair of rates alike.",
    ]
    for budgets in groups:
        labels = list(budgets)
        lines += ["", f"`{curve_label(first_run(budgets[labels[-1]]), NOT_RANKED)}`"]
        for short in labels[:-1]:
            lines += [""] + proxy_table(budgets, short, labels[-1])
    return lines
