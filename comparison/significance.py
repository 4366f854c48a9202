"""Significance: sacrebleu's paired bootstrap of runs on a test split (the table of every run
against the first), and the comparison of groups of seeds (the seed pairs' bootstrap, Welch's
t-test and the permutation test on the per-seed scores, and the sentence that says what they show).
"""

import math
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from common.progress_bar import progress_bar
from comparison.formats import format_mean_std, format_p, format_score, format_seeds
from comparison.runs import CompareError, Run, group_labels, score_of, seed_pairs, seed_scores
from comparison.statistics import (
    SIGNIFICANT,
    SeedTests,
    exact_permutations,
    seed_tests,
    smallest_permutation_p,
)
from data.corpus import read_lines

METRICS = (("BLEU", "bleu"), ("chrF", "chrf"))  # (name in the report, key in results.json)


def paired_bootstrap(
    runs: Sequence[Run], split: str, samples: int
) -> Tuple[Optional[Dict[str, List[Any]]], str]:
    """sacrebleu's paired bootstrap resampling of every run against the first on ``split``.

    Returns ``({"BLEU": [Result per run], "chrF": [...]}, signature text)``, or ``(None, why not)``
    when the runs cannot be paired on this split.
    """
    systems, references = [], None
    for run in runs:
        hyp, ref = run.path / f"{split}.hyp", run.path / f"{split}.ref"
        if not (hyp.is_file() and ref.is_file()):
            return None, f"{run.name} has no {hyp.name} and {ref.name}"
        hyps, refs = read_lines(hyp), read_lines(ref)
        if len(hyps) != len(refs):
            raise CompareError(
                f"{hyp}: {len(hyps)} lines for {len(refs)} references in {ref}: the run folder is damaged"
            )
        if references is None:
            references = refs
        elif refs != references:
            other = f"other references than {runs[0].name} (another data set or direction)"
            return None, f"{run.name} was scored against {other}"
        systems.append((run.name, hyps))
    if len(systems) < 2:
        return None, "one run: nothing to compare"
    return bootstrap_systems(systems, references, samples)


def bootstrap_systems(
    systems: Sequence[Tuple[str, List[str]]], references: List[str], samples: int
) -> Tuple[Dict[str, List[Any]], str]:
    """sacrebleu's paired bootstrap of every system ``(name, hypotheses)`` against the first, on one
    set of ``references``: ``({"BLEU": [Result per system], "chrF": [...]}, signature text)``."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        systems, {"BLEU": BLEU(), "chrF": CHRF()}, [references], test_type="bs", n_samples=samples
    )
    what = f"paired bootstrap: {len(systems)} systems, {samples} resamples"
    with progress_bar(1, what, "tests") as bar:  # sacrebleu resamples in one call: a bar of one step
        signatures, scores = test()
        bar.update(1)
    text = "; ".join(f"{name} `{sig}`" for name, sig in signatures.items())
    scores = {name: scores[key] for name, key in (("BLEU", "BLEU"), ("chrF", _metric_key(scores, "chrF")))}
    for metric in scores.values():
        for result in metric[1:]:
            if result.score == metric[0].score:
                # No observed difference is no evidence of one: p = 1. (sacrebleu counts resampled
                # differences strictly above the observed one, so an output identical to the
                # baseline's, every resample differing by 0, would get its smallest p-value.)
                result.p_value = 1.0
    return scores, text


def _metric_key(scores: Dict[str, Any], prefix: str) -> str:
    return next(key for key in scores if key.startswith(prefix))  # sacrebleu names chrF "chrF2"


def significance_table(runs: Sequence[Run], split: str, scores: Dict[str, List[Any]]) -> List[str]:
    lines = [
        "| run | BLEU | mean ± 95% CI | p | chrF | mean ± 95% CI | p |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for i, run in enumerate(runs):
        cells = [f"`{run.name}`"]
        for metric in ("BLEU", "chrF"):
            result = scores[metric][i]
            p = "(baseline)" if i == 0 else f"{result.p_value:.4f}"
            cells += [f"{result.score:.2f}", f"{result.mean:.2f} ± {result.ci:.2f}", p]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def seed_pair_rows(
    pairs: Sequence[Tuple[Any, Run, Run]],
    tests: Dict[Any, Tuple[Optional[Dict[str, List[Any]]], str]],
    split: str,
    metric: str,
    key: str,
    labels: Tuple[str, str],
) -> Tuple[List[str], List[Tuple[float, Optional[float]]]]:
    """The table of the seed pairs on one metric, and each pair's ``(difference, bootstrap p)``."""
    lines = [
        f"| seed | {labels[0]} | {labels[1]} | difference | bootstrap p | higher |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    found = []
    for seed, a, b in pairs:
        score_a, score_b = score_of(a, split, key), score_of(b, split, key)
        scores, why = tests[seed]
        if score_a is None or score_b is None:
            lines.append(f"| {seed} | {format_score(score_a)} | {format_score(score_b)} | - | - | - |")
            continue
        p = None if scores is None else scores[metric][1].p_value
        better = labels[1] if score_b > score_a else labels[0] if score_a > score_b else "equal"
        cells = [str(seed), format_score(score_a), format_score(score_b), f"{score_b - score_a:+.2f}"]
        cells += [f"no paired test: {why}" if p is None else f"{p:.4f}", better]
        lines.append("| " + " | ".join(cells) + " |")
        found.append((score_b - score_a, p))
    return lines, found


def difference(labels: Tuple[str, str], a: Sequence[float], b: Sequence[float]) -> Tuple[float, str]:
    """The mean of ``b`` minus the mean of ``a``, and the label of the higher mean."""
    diff = statistics.fmean(b) - statistics.fmean(a)
    return diff, labels[1] if diff > 0 else labels[0]


def welch_shows(welch_p: float) -> bool:
    """Whether Welch's p shows a difference (the verdict's test: p < ``SIGNIFICANT``)."""
    return not math.isnan(welch_p) and welch_p < SIGNIFICANT


def verdict(
    labels: Tuple[str, str],
    metric: str,
    a: Sequence[float],
    b: Sequence[float],
    welch_p: float,
    permutation_p: float,
    pairs: Sequence[Tuple[float, Optional[float]]],
) -> str:
    """One sentence: the difference of the means, what the tests across seeds show, and how the
    seed pairs went. Welch's t-test decides (p < 0.05); the permutation test is reported beside it as
    a check that assumes no distribution (with few seeds it cannot reach 0.05 at all)."""
    diff, leader = difference(labels, a, b)
    text = (
        f"{labels[1]} - {labels[0]}: {diff:+.2f} {metric} (mean over {format_seeds(len(a), len(b))}); "
        f"Welch p = {format_p(welch_p)}, permutation p = {format_p(permutation_p)}: "
    )
    if welch_shows(welch_p):
        text += f"{leader}'s mean is higher across seeds (Welch p < {SIGNIFICANT:g})"
    else:
        text += f"no difference shown with {format_seeds(len(a), len(b))}"
    tested = [(d, p) for d, p in pairs if p is not None]
    if diff != 0 and tested:
        sign = 1 if diff > 0 else -1
        ahead = sum(d * sign > 0 for d, _ in tested)
        shown = sum(d * sign > 0 and p < SIGNIFICANT for d, p in tested)
        every = "every seed pair" if ahead == len(tested) else f"{ahead} of {len(tested)} seed pairs"
        text += f"; {leader} higher in {every} (bootstrap p < {SIGNIFICANT:g} in {shown} of {len(tested)})"
        against = sum(d * sign < 0 and p < SIGNIFICANT for d, p in tested)
        if against:
            other = labels[0] if leader == labels[1] else labels[1]
            text += f", {other} significantly higher in {against}"
    return text + "."


def across_seeds(
    base: Sequence[Run], group: Sequence[Run], labels: Tuple[str, str], split: str, samples: int
) -> List[str]:
    """The comparison of two groups of seeds on ``split``: per metric, the seed pairs' table, the
    tests across seeds and the verdict."""
    pairs = seed_pairs(base, group)
    lines = [f"### {labels[1]} against {labels[0]}", ""]
    if pairs:
        named = "; ".join(f"seed {seed}: `{a.name}` and `{b.name}`" for seed, a, b in pairs)
        lines.append(f"Runs with the same seed: {named}.")
    else:
        lines.append("The two groups have no seed in common: no seed pairs.")
    tests = {seed: paired_bootstrap([a, b], split, samples) for seed, a, b in pairs}
    for metric, key in METRICS:
        lines += ["", f"**{metric}**", ""]
        found: List[Tuple[float, Optional[float]]] = []
        if pairs:
            table, found = seed_pair_rows(pairs, tests, split, metric, key, labels)
            lines += table + [""]
        a, b = seed_scores(base, split, key), seed_scores(group, split, key)
        across, sentence = seeds_verdict(labels, metric, split, a, b, found)
        if across is None:
            lines.append(f"Across seeds: {sentence}")
            continue
        lines += [tests_line(labels, a, b, across), "", sentence]
    return lines


def seeds_verdict(
    labels: Tuple[str, str],
    metric: str,
    split: str,
    a: Sequence[float],
    b: Sequence[float],
    pairs: Sequence[Tuple[float, Optional[float]]] = (),
) -> Tuple[Optional[SeedTests], str]:
    """The tests across seeds of the per-seed scores ``a`` and ``b`` on ``split``, and ``verdict``'s
    sentence on them (``pairs``: the seed pairs' differences and bootstrap p); ``(None, why not)``
    when a group has fewer than 2 scores."""
    if len(a) < 2 or len(b) < 2:
        return None, f"fewer than 2 seeds with a {metric} score on {split} in a group: no test."
    tests = seed_tests(a, b)
    return tests, verdict(labels, metric, a, b, tests.welch_p, tests.permutation_p, pairs)


def tests_line(labels: Tuple[str, str], a: Sequence[float], b: Sequence[float], tests: SeedTests) -> str:
    """``Across seeds: ...``: each group's mean ± std and both tests in full."""
    welch = (
        "undefined (the scores vary in neither group)"
        if math.isnan(tests.t)
        else f"t = {tests.t:.2f}, df = {tests.df:.1f}, p = {format_p(tests.welch_p)}"
    )
    every = "all" if exact_permutations(len(a), len(b)) else "a sample of"
    return (
        f"Across seeds: {labels[0]} {format_mean_std(a)} ({len(a)} seeds), {labels[1]} "
        f"{format_mean_std(b)} ({len(b)} seeds). Welch's t-test: {welch}. Permutation test: "
        f"p = {format_p(tests.permutation_p)} over {every} {tests.splits} splits of the {len(a) + len(b)} "
        f"scores into {len(a)} + {len(b)} (the smallest p it can give: "
        f"{smallest_permutation_p(len(a), len(b)):.3f})."
    )


def across_seeds_section(groups: Sequence[List[Run]], split: str, samples: int) -> List[str]:
    """``## Significance across seeds on <split>``: every group of 2+ seeds against the first one
    (empty when fewer than two groups have 2+ seeds)."""
    labels = group_labels(groups)
    seeded = [(g, label) for g, label in zip(groups, labels) if len(g) > 1]
    if len(seeded) < 2:
        return []
    base, base_label = seeded[0]
    lines = ["", f"## Significance across seeds on {split}", ""]
    lines.append(
        f"Each configuration with 2+ seeds against `{base_label}`. Seed pairs: sacrebleu's paired "
        f"bootstrap ({samples} resamples of the test set) of the two runs with the same seed; it "
        "measures the test set's sampling noise for that one pair of trainings, not the spread over "
        "seeds. Across seeds: Welch's t-test (two-sided) on the per-seed test scores, and an exact "
        "permutation test of the difference of the means over the splits of the pooled per-seed "
        "scores, as a check that assumes no distribution (its smallest possible p is given with it: "
        f"with 3 + 3 seeds 0.1, 2 of the 20 splits, so it cannot show a difference at {SIGNIFICANT:g}). "
        f"The verdict is Welch's at p < {SIGNIFICANT:g}, and a t-test on a few seeds has little power: \"no "
        'difference shown" is not evidence that there is none.'
    )
    single = [label for g, label in zip(groups, labels) if len(g) == 1]
    if single:
        lines.append(f"Left out (one seed): {', '.join(f'`{label}`' for label in single)}.")
    for group, label in seeded[1:]:
        lines += [""] + across_seeds(base, group, (base_label, label), split, samples)
    return lines
