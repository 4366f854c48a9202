"""The statistics of the comparison, pure functions of lists of numbers: mean and standard
deviation, Welch's t-test and the permutation test of a difference of means, both from
``scipy.stats``. numpy and scipy are imported where they are used, so that importing this module
(and ``scripts/compare.py --help``) stays quick; nothing of the project.
"""

import math
import statistics
import warnings
from typing import NamedTuple, Sequence, Tuple

EPS = 1e-9  # values this close are equal (budgets and evaluations at the same point, a split's difference)
DECIMALS = 9  # a split's |difference of means| is rounded to this many decimals (EPS) before comparing
SIGNIFICANT = 0.05  # the level at which a test's p shows a difference
SPLITS = 100_000  # the permutation test goes through every split up to this many, else draws this many


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> Tuple[float, float, float]:
    """Welch's t-test of mean(b) - mean(a): ``(t, degrees of freedom, two-sided p)``; all three NaN
    when a group has fewer than 2 values or neither group varies (no spread to test against)."""
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan, math.nan
    if statistics.variance(a) + statistics.variance(b) == 0:
        return math.nan, math.nan, math.nan
    from scipy import stats

    with warnings.catch_warnings():
        # a group of equal values (two seeds with the same score) has variance 0, exactly: not the
        # precision loss scipy warns of for nearly identical data
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        result = stats.ttest_ind(b, a, equal_var=False)
    return float(result.statistic), float(result.df), float(result.pvalue)


def permutation_test(a: Sequence[float], b: Sequence[float]) -> Tuple[float, int]:
    """Permutation test of the difference of means of two groups of 2 or more values: ``(p, number
    of splits)``, p the fraction of the splits of the pooled values into groups of ``len(a)`` and
    ``len(b)`` whose |difference of means| is at least the observed one (two-sided). Up to
    ``SPLITS`` splits, every one (the observed split included: exact); beyond (e.g. 10 + 10 seeds),
    that many random ones (seeded), the observed one counted in: p = (hits + 1) / (SPLITS + 1)."""
    import numpy as np
    from scipy import stats

    def distance(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
        # Rounded, so that splits whose differences are equal but for float error tie: scipy's own
        # tolerance is relative to the observed value only (100 ulp) and missed such ties between
        # scores with two decimals (e.g. 49.78, 49.68, 49.58 against 49.78, 49.28, 49.58).
        return np.round(np.abs(y.mean(axis=axis) - x.mean(axis=axis)), DECIMALS)

    result = stats.permutation_test(
        (np.asarray(a, dtype=float), np.asarray(b, dtype=float)),
        distance,
        permutation_type="independent",
        vectorized=True,
        n_resamples=SPLITS,
        alternative="greater",  # of the |difference|: a two-sided test of the difference
        rng=np.random.default_rng(0),
    )
    return float(result.pvalue), len(result.null_distribution)


def exact_permutations(n_a: int, n_b: int) -> bool:
    """Whether ``permutation_test`` goes through every split of groups of ``n_a`` and ``n_b``."""
    return math.comb(n_a + n_b, n_a) <= SPLITS


def smallest_permutation_p(n_a: int, n_b: int) -> float:
    """The smallest p ``permutation_test`` can give: the observed split, and with equal groups its
    mirror image, over all splits (random splits: 1 over their number and one)."""
    if not exact_permutations(n_a, n_b):
        return 1 / (SPLITS + 1)
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)


class SeedTests(NamedTuple):
    """Both tests of the difference of means of two groups of per-seed scores."""

    t: float  # Welch's t, its degrees of freedom and two-sided p (NaN: undefined)
    df: float
    welch_p: float
    permutation_p: float
    splits: int  # the permutation test's number of splits


def seed_tests(a: Sequence[float], b: Sequence[float]) -> SeedTests:
    """``welch_t_test`` and ``permutation_test`` of mean(b) - mean(a) (2 or more values a side)."""
    return SeedTests(*welch_t_test(a, b), *permutation_test(a, b))
