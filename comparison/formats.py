"""How the report writes its numbers: training time, scores, p-values and numbers of seeds."""

import math
from typing import Optional, Sequence

from comparison.statistics import mean_std


def format_minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def format_score(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_p(p: float) -> str:
    if math.isnan(p):
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def format_seeds(n_a: int, n_b: int) -> str:
    return f"{n_a} seeds" if n_a == n_b else f"{n_a} and {n_b} seeds"


def format_mean_std(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """``mean ± standard deviation`` of ``values``, each written with ``fmt``; one value alone (it
    has no spread to show)."""
    if len(values) == 1:
        return fmt.format(values[0])
    mean, std = mean_std(values)
    return f"{fmt.format(mean)} ± {fmt.format(std)}"
