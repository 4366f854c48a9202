"""The statistics of the comparison, pure functions of lists of numbers: mean and standard
deviation, Student's t distribution (by the regularized incomplete beta function), Welch's t-test
and the exact permutation test of a difference of means. Only the standard library (and numpy,
lazily, for the sampled permutation test): nothing of the project.
"""

import itertools
import math
import statistics
from typing import Sequence, Tuple

EPS = 1e-9  # values this close are equal (budgets and evaluations at the same point, a split's difference)
SIGNIFICANT = 0.05  # the level at which a test's p shows a difference
SPLITS = 100_000  # the permutation test goes through every split up to this many, else draws this many


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def regularized_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):  # where the fraction converges fast; else by I_x(a, b) = 1 - I_(1-x)(b, a)
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


ITERATIONS = 10_000  # the fraction converges in tens of terms for the t-tests here


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300

    def guard(value: float) -> float:
        return value if abs(value) > tiny else tiny

    c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1))
    h = d
    for m in range(1, ITERATIONS):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 / guard(1.0 + numerator * d)
            c = guard(1.0 + numerator / c)
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"the incomplete beta function's fraction did not converge for a={a}, b={b}, x={x}")


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t distribution with ``df`` degrees of freedom (df > 0, any real)."""
    if math.isinf(t):
        return 0.0
    return regularized_beta(df / 2, 0.5, df / (df + t * t))


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> Tuple[float, float, float]:
    """Welch's t-test of mean(b) - mean(a): ``(t, degrees of freedom, two-sided p)``; all three NaN
    when a group has fewer than 2 values or neither group varies (no spread to test against)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan, math.nan
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return math.nan, math.nan, math.nan
    t = (statistics.fmean(b) - statistics.fmean(a)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return t, df, t_two_sided_p(t, df)


def permutation_test(a: Sequence[float], b: Sequence[float]) -> Tuple[float, int]:
    """Exact permutation test of the difference of means: ``(p, number of splits)``, p the fraction
    of all splits of the pooled values into groups of ``len(a)`` and ``len(b)`` whose |difference
    of means| is at least the observed one (the observed split included). Beyond ``SPLITS`` splits
    (e.g. 10 + 10 seeds), that many random ones (seeded), the observed one counted in."""
    pooled = [*a, *b]
    observed = abs(statistics.fmean(b) - statistics.fmean(a))
    floor = observed - EPS * max(1.0, observed)
    if not exact_permutations(len(a), len(b)):
        import numpy as np

        rng = np.random.default_rng(0)
        shuffled = np.array(pooled)[np.argsort(rng.random((SPLITS, len(pooled))), axis=1)]
        diffs = np.abs(shuffled[:, len(a) :].mean(axis=1) - shuffled[:, : len(a)].mean(axis=1))
        return (int((diffs >= floor).sum()) + 1) / (SPLITS + 1), SPLITS
    total = hits = 0
    for chosen in itertools.combinations(range(len(pooled)), len(a)):
        first = [pooled[i] for i in chosen]
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += abs(statistics.fmean(rest) - statistics.fmean(first)) >= floor
    return hits / total, total


def exact_permutations(n_a: int, n_b: int) -> bool:
    """Whether ``permutation_test`` goes through every split of groups of ``n_a`` and ``n_b``."""
    return math.comb(n_a + n_b, n_a) <= SPLITS


def smallest_permutation_p(n_a: int, n_b: int) -> float:
    """The smallest p ``permutation_test`` can give: the observed split, and with equal groups its
    mirror image, over all splits (random splits: 1 over their number and one)."""
    if not exact_permutations(n_a, n_b):
        return 1 / (SPLITS + 1)
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)
