"""A short budget as a proxy of full runs: a learning-rate sweep at a shortened budget
(``+experiment=attention_lr``: 3 epochs) chooses rates for full runs, which it may do only if it
ranks the rates as full runs do. Rate curves (``rates.rate_curves``) whose configurations differ by
their training budget alone (``BUDGET``: epochs, steps, minutes, the schedule's length) are set side
by side: at the rates trained at every budget, each budget's mean validation BLEU, its best rate, and
how many pairs of rates it orders as the longest budget (the most steps) does.
"""

import json
import statistics
from itertools import combinations
from typing import Dict, List, Sequence, Tuple

from common.settings import flatten
from comparison.formats import format_score
from comparison.rates import Curve, mean_valid
from comparison.runs import NOT_A_SETTING, Run

BUDGET = ("trainer.max_epochs", "trainer.max_steps", "trainer.max_minutes", "trainer.schedule_steps")
UNITS = (("max_epochs", "epochs"), ("max_steps", "steps"), ("max_minutes", "minutes"))  # of ``trainer``


def proxy_key(run: Run) -> str:
    """The run's configuration but its seed, rate and budget: the curves of one comparison share it."""
    settings = flatten(run.config or {})
    ignored = (*NOT_A_SETTING, *BUDGET, "trainer.lr")
    kept = {k: v for k, v in settings.items() if not k.startswith(ignored)}
    return json.dumps(kept, sort_keys=True, default=str)


def budget_label(run: Run) -> str:
    """The run's budget as its config sets it: ``3 epochs``, ``2000 steps`` (every limit set)."""
    trainer = (run.config or {}).get("trainer") or {}
    set_ = [f"{trainer[key]:g} {unit}" for key, unit in UNITS if trainer.get(key) is not None]
    return ", ".join(set_) or "no limit"


def mean_steps(curve: Curve) -> float:
    """The mean number of steps the curve's runs trained (the budgets' order)."""
    return statistics.fmean(run.results.get("steps") or 0 for runs in curve.values() for run in runs)


def budget_groups(curves: Dict[str, Curve]) -> List[Dict[str, Curve]]:
    """Curves that differ by their budget alone, two budgets or more: each group's budget label ->
    its curve, the longest budget (the most steps) last."""
    groups: Dict[str, Dict[str, Curve]] = {}
    for curve in curves.values():
        first = next(iter(curve.values()))[0]
        groups.setdefault(proxy_key(first), {})[budget_label(first)] = curve
    found = [g for g in groups.values() if len(g) > 1]
    return [dict(sorted(g.items(), key=lambda item: mean_steps(item[1]))) for g in found]


def pairs_alike(short: Sequence[float], full: Sequence[float]) -> Tuple[int, int]:
    """Of every pair of rates, how many the two budgets order alike (a tie at either counts as
    not alike), and how many pairs there are."""
    pairs = list(combinations(range(len(short)), 2))
    alike = sum((short[i] - short[j]) * (full[i] - full[j]) > 0 for i, j in pairs)
    return alike, len(pairs)


def proxy_verdict(
    budgets: Tuple[str, str], rates: Sequence[float], short: Sequence[float], full: Sequence[float]
) -> str:
    """A shorter budget against the longest (``budgets``: their labels): the best rate of each, and
    the pairs of rates ordered alike."""
    best, best_full = rates[short.index(max(short))], rates[full.index(max(full))]
    alike, pairs = pairs_alike(short, full)
    if best == best_full:
        first = f"{budgets[0]} and {budgets[1]} choose the same rate, {best:g}"
    else:
        first = f"{budgets[0]} chooses {best:g}, {budgets[1]} {best_full:g}: not a proxy here"
    return f"{first}; {alike} of {pairs} pairs of rates ordered alike."


def proxy_section(curves: Dict[str, Curve]) -> List[str]:
    """The report's part of the learning-rate section: a table per configuration trained at several
    budgets, at the rates every budget trained, and each shorter budget's verdict."""
    groups = budget_groups(curves)
    if not groups:
        return []
    lines = [
        "",
        "### Does the short budget rank the rates as full runs do?",
        "",
        "Configurations trained at several budgets (nothing else differing): at the rates every "
        "budget trained, the mean validation BLEU over the seeds (their number in brackets), the best "
        "rate of each budget in bold. A shorter budget is a proxy of the longest where it chooses the "
        "same rate and orders the pairs of rates alike.",
    ]
    for group in groups:
        budgets = list(group)
        shared = sorted(set.intersection(*(set(curve) for curve in group.values())))
        first = next(iter(next(iter(group.values())).values()))[0]
        lines += ["", f"`{' '.join([first.model_name(), *proxy_settings(first)])}`", ""]
        if len(shared) < 2:
            lines.append("Fewer than 2 rates trained at every budget: nothing to rank.")
            continue
        means = {b: [mean_valid(group[b][rate]) for rate in shared] for b in budgets}
        lines.append("| peak lr | " + " | ".join(f"valid BLEU, {b}" for b in budgets) + " |")
        lines.append("| ---: | " + " | ".join(["---:"] * len(budgets)) + " |")
        for i, rate in enumerate(shared):
            cells = []
            for b in budgets:
                mark = "**" if means[b][i] == max(means[b]) else ""
                cells.append(f"{mark}{format_score(means[b][i])}{mark} ({len(group[b][rate])})")
            lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
        lines.append("")
        longest = budgets[-1]
        lines += [f"- {proxy_verdict((b, longest), shared, means[b], means[longest])}" for b in budgets[:-1]]
    return lines


def proxy_settings(run: Run) -> List[str]:
    """The run's overrides but its rate and budget (and the experiment, which sets the budget)."""
    dropped = ("trainer.lr=", "+experiment=", *(f"{key}=" for key in BUDGET))
    return [o for o in run.settings() if not o.startswith(dropped)]
