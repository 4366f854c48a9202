"""The Markdown report of ``scripts/compare.py``: the runs' table, the sacrebleu signatures, the
significance sections, the seeds' table, the grid of architecture and attention (when the runs
cross them), the configurations of one seed beside those of 2+, the learning-rate curves (when
runs differ by their rate) and the sections at equal budgets, in that order.
"""

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from comparison.budgets import budget_sections
from comparison.curves import Curves
from comparison.formats import format_mean_std, format_minutes, format_score
from comparison.grid import grid_section
from comparison.proxy import proxy_section
from comparison.rates import Entropy, rate_curves, rates_section
from comparison.runs import Run, group_labels, groups_of, test_splits, valid_scores
from comparison.significance import across_seeds_section, paired_bootstrap, significance_table


def runs_table(runs: Sequence[Run], splits: Sequence[str]) -> List[str]:
    head = ["run", "model", "seed", "params", "steps", "epochs", "train time", "tgt tok/s", "valid BLEU"]
    head += ["test weights"]  # which of best.pt and the weight averages decoded the test splits
    for split in splits:
        head += [f"{split} BLEU", f"{split} chrF"]
    lines = [
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + " |",
    ]
    for run in runs:
        r = run.results
        cells = [
            f"`{run.name}`",
            r["model"],
            str(run.seed if run.seed is not None else "-"),
            f"{r['params']:,}",
            f"{r['steps']:,}",
            f"{r['epochs']:g}",
            format_minutes(r["train_seconds"]),
            f"{r['train_tokens_per_second']:,.0f}",
            format_score(r["valid"].get("bleu")),
            f"`{used}`" if (used := (r.get("test_weights") or {}).get("used")) else "-",
        ]
        for split in splits:
            scores = r["test"].get(split, {})
            cells += [format_score(scores.get("bleu")), format_score(scores.get("chrf"))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def seeds_table(groups: Sequence[List[Run]], splits: Sequence[str]) -> List[str]:
    head = (
        ["configuration", "seeds", "valid BLEU"]
        + [f"{s} {m}" for s in splits for m in ("BLEU", "chrF")]
        + ["train time", "tgt tok/s"]
    )
    lines = [
        "| " + " | ".join(head) + " |",
        "| --- | ---: | " + " | ".join(["---:"] * (len(head) - 2)) + " |",
    ]
    for group, label in zip(groups, group_labels(groups)):

        def cell(values: List[Optional[float]], fmt: str = "{:.2f}") -> str:
            values = [v for v in values if v is not None]
            return format_mean_std(values, fmt) if values else "-"

        cells = [label, str(len(group)), cell([r.results["valid"].get("bleu") for r in group])]
        for split in splits:
            for metric in ("bleu", "chrf"):
                cells.append(cell([r.results["test"].get(split, {}).get(metric) for r in group]))
        cells.append(cell([r.results["train_seconds"] / 60 for r in group], "{:.1f}") + " min")
        cells.append(cell([r.results["train_tokens_per_second"] for r in group], "{:,.0f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def against_seeds(value: float, seeds: Sequence[float]) -> str:
    """Where ``value`` falls in the range of ``seeds``: below, within or above."""
    if value < min(seeds):
        return "below"
    return "above" if value > max(seeds) else "within"


def single_seed_section(groups: Sequence[List[Run]], splits: Sequence[str]) -> List[str]:
    """``## Configurations with one seed``, when other configurations have 2+: each single run's
    scores and cost, and its validation BLEU against the range of the seeds of every configuration
    of its model with 2+ seeds (empty otherwise)."""
    seeded = [g for g in groups if len(g) > 1]
    single = [g for g in groups if len(g) == 1]
    if not seeded or not single:
        return []
    label = dict(zip(map(id, groups), group_labels(groups)))
    head = ["configuration", "seed", "valid BLEU", "valid chrF"]
    head += [f"{s} {m}" for s in splits for m in ("BLEU", "chrF")]
    head += ["train time", "tgt tok/s", "valid BLEU against the seeds of its model"]
    lines = [
        "",
        "## Configurations with one seed",
        "",
        "Exploratory runs, one seed each: no spread of their own, so no test. Each is set beside every "
        "configuration of its model with 2+ seeds: whether its validation BLEU is below, within or "
        "above the range of their seeds (lowest-highest). Within the range, the seeds do not tell it "
        "from that configuration; outside it, more seeds of its own could still.",
        "",
        "| " + " | ".join(head) + " |",
        "| --- | ---: | " + " | ".join(["---:"] * (len(head) - 3)) + " | --- |",
    ]
    for group in single:
        run = group[0]
        r, bleu = run.results, run.results["valid"].get("bleu")
        cells = [label[id(group)], str(run.seed if run.seed is not None else "-"), format_score(bleu)]
        cells.append(format_score(r["valid"].get("chrf")))
        for split in splits:
            scores = r["test"].get(split, {})
            cells += [format_score(scores.get("bleu")), format_score(scores.get("chrf"))]
        cells += [format_minutes(r["train_seconds"]), f"{r['train_tokens_per_second']:,.0f}"]
        against = []
        for other in seeded:
            seeds = valid_scores(other, "bleu")
            if other[0].model_name() == run.model_name() and seeds and bleu is not None:
                where = against_seeds(bleu, seeds)
                against.append(f"{where} `{label[id(other)]}` ({min(seeds):.2f}-{max(seeds):.2f})")
        cells.append("; ".join(against) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def report(
    runs: Sequence[Run],
    samples: int,
    curves: Optional[Dict[Path, Optional[Curves]]] = None,
    minutes_step: float = 5.0,
    entropy: Optional[Dict[Path, Optional[Entropy]]] = None,
) -> str:
    """The Markdown report; ``curves`` (``run_curves`` of each run, by its path) make the budget
    sections, ``entropy`` (``cross_entropy`` of each run) the learning-rate tables' last column."""
    splits = test_splits(runs)
    lines = ["## Runs", ""] + runs_table(runs, splits) + [""]
    lines.append(
        "Valid BLEU: greedy search, best evaluation. Test scores: beam search with the test weights:"
        " whichever of `best.pt` and the run's weight averages validated best."
    )
    sacre = {
        json.dumps(r.results.get("sacrebleu"), sort_keys=True) for r in runs if r.results.get("sacrebleu")
    }
    for text in sorted(sacre):
        sig = json.loads(text)
        lines.append(f"sacrebleu signatures: BLEU `{sig.get('bleu')}`, chrF `{sig.get('chrf')}`")
    if len(sacre) > 1:
        lines.append(
            "**The runs were scored with different sacrebleu settings: their scores are not comparable.**"
        )
    for split in splits:
        lines += ["", f"## Significance on {split}", ""]
        scores, detail = paired_bootstrap(runs, split, samples)
        if scores is None:
            lines.append(f"No paired test: {detail}.")
            continue
        lines.append(
            f"Paired bootstrap resampling ({samples} resamples of the test set) of each run against "
            f"`{runs[0].name}`: p is the probability of a difference at least this large if the two "
            "systems were equally good. Mean and 95% confidence interval over the resamples."
        )
        lines += [""] + significance_table(runs, split, scores) + ["", f"sacrebleu: {detail}"]
    groups = groups_of(runs)
    lines += ["", "## Seeds", ""]
    if all(len(g) == 1 for g in groups):
        lines.append(
            "One seed per configuration. On Multi30k a difference of a point of BLEU or less between "
            "single runs can be seed noise: sweep `seed=1,2,3` to measure the spread."
        )
    else:
        lines.append("Runs whose configs differ only by `seed`: mean ± standard deviation over the seeds.")
        lines += [""] + seeds_table(groups, splits)
    for split in splits:
        lines += across_seeds_section(groups, split, samples)
    lines += grid_section(groups, splits)
    lines += single_seed_section(groups, splits)
    rates = rate_curves(runs)
    lines += rates_section(rates, entropy or {})
    lines += proxy_section(rates)
    if curves is not None:
        lines += budget_sections(groups, curves, minutes_step)
    return "\n".join(lines) + "\n"
