"""The learning-rate sensitivity of each configuration (``+experiment=attention_lr``): runs that
differ only by ``trainer.lr`` and the seed form a curve; per rate the validation BLEU of each seed
and their mean, and the cross-attention's entropy at the run's last evaluation (``entropy/cross/
layer<l>`` in its TensorBoard events, the mean over layers: ``training/validation.py``), with the
best rate and whether it lies inside the range. ``learning_rates.png`` draws both against the rate,
a line per configuration.
"""

import json
import math
import statistics
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from common.collapse import COLLAPSE_NATS as COLLAPSED
from common.files import AtomicFile
from common.settings import flatten
from comparison.curves import run_events
from comparison.formats import format_score
from comparison.runs import NOT_A_SETTING, Run, override_key, valid_scores

Curve = Dict[float, List[Run]]  # the peak rate -> its runs (one a seed)


class Entropy(NamedTuple):
    """The cross-attention's entropy at a run's last evaluation (nats): the mean over its layers,
    and its lowest head (under ``COLLAPSED``: the run's cross-attention collapsed, as train.log says)."""

    mean: float
    lowest: float


def rate_of(run: Run) -> Optional[float]:
    """The run's peak learning rate, ``trainer.lr`` of its config."""
    value = ((run.config or {}).get("trainer") or {}).get("lr")
    return None if value is None else float(value)


def curve_key(run: Run, ignored: Sequence[str] = ("trainer.lr",)) -> str:
    """The run's configuration but its seed and the ``ignored`` keys (the rate): the runs of one
    curve share it."""
    settings = flatten(run.config or {})
    kept = {k: v for k, v in settings.items() if not k.startswith(NOT_A_SETTING) and k not in ignored}
    return json.dumps(kept, sort_keys=True, default=str)


def curve_label(run: Run, ignored: Sequence[str] = ("trainer.lr",)) -> str:
    """The model and the overrides that make the configuration, but the ``ignored`` keys (the rate)."""
    return " ".join([run.model_name(), *(o for o in run.settings() if override_key(o) not in ignored)])


def first_run(curve: Curve) -> Run:
    """A run of the curve (its first rate's first seed): what its runs share, they share with it."""
    return next(iter(curve.values()))[0]


def rate_curves(runs: Sequence[Run]) -> Dict[str, Curve]:
    """Every configuration run at two or more rates: its label -> its runs by rate (rising)."""
    curves: Dict[str, Dict[float, List[Run]]] = {}
    labels: Dict[str, str] = {}
    for run in runs:
        rate = rate_of(run)
        if run.config is None or rate is None or run.results["valid"].get("bleu") is None:
            continue  # a run stopped before its first evaluation has no point on a curve
        key = curve_key(run)
        labels.setdefault(key, curve_label(run))
        curves.setdefault(key, {}).setdefault(rate, []).append(run)
    return {labels[k]: dict(sorted(c.items())) for k, c in curves.items() if len(c) > 1}


def cross_entropy(run: Run) -> Optional[Entropy]:
    """The cross-attention's entropy at the run's last evaluation (``Entropy``), None when its
    events hold none (a run from before the scalars)."""
    events = run_events(run.path)
    if events is None:
        return None
    tags = [t for t in events.Tags().get("scalars", []) if t.startswith("entropy/cross/")]
    last = {tag: max(events.Scalars(tag), key=lambda e: e.step).value for tag in tags}
    layers = [v for tag, v in last.items() if "/head" not in tag]
    heads = [v for tag, v in last.items() if "/head" in tag] or layers
    return Entropy(statistics.fmean(layers), min(heads)) if layers else None


def mean_valid(runs: Sequence[Run]) -> float:
    """The mean validation BLEU over the runs' seeds (-inf for none: never the best)."""
    scores = valid_scores(runs, "bleu")
    return statistics.fmean(scores) if scores else -math.inf


def best_rate(curve: Curve) -> Tuple[float, bool]:
    """The rate of the highest mean validation BLEU (of equal means, the lowest rate), and whether
    it lies inside the range."""
    best = max(sorted(curve), key=lambda rate: mean_valid(curve[rate]))
    return best, min(curve) < best < max(curve)


def rates_section(curves: Dict[str, Curve], entropy: Dict[Path, Optional[Entropy]]) -> List[str]:
    """The report's section: a table per configuration, its best rate and the collapses."""
    if not curves:
        return []
    lines = [
        "",
        "## Learning rate",
        "",
        "Runs that differ only by `trainer.lr` and the seed: validation BLEU (greedy, best evaluation) "
        "of each seed and their mean, and the cross-attention's entropy at the last evaluation (nats, "
        f"the mean over layers and seeds; a run whose lowest head is under {COLLAPSED} has collapsed "
        "onto one source position). "
        "The best rate is the highest mean; a best rate at an end of the range asks for a wider range.",
    ]
    for label, curve in curves.items():
        best, inside = best_rate(curve)
        lines += [
            "",
            f"`{label}`",
            "",
            "| peak lr | seeds | valid BLEU by seed | mean | cross-attention entropy |",
        ]
        lines.append("| ---: | --- | --- | ---: | ---: |")
        for rate, runs in curve.items():
            runs = sorted(runs, key=lambda r: r.seed if r.seed is not None else -1)
            bleus = [r.results["valid"]["bleu"] for r in runs]
            nats = [v for v in (entropy.get(r.path) for r in runs) if v is not None]
            collapsed = sum(v.lowest < COLLAPSED for v in nats)
            shown = f"{statistics.fmean(v.mean for v in nats):.3f}" if nats else "-"
            shown += f" ({collapsed} collapsed)" if collapsed else ""
            mark = "**" if rate == best else ""
            lines.append(
                f"| {mark}{rate:g}{mark} | {', '.join(str(r.seed) for r in runs)} | "
                f"{', '.join(format_score(b) for b in bleus)} | {format_score(statistics.fmean(bleus))} | {shown} |"
            )
        where = "inside the range" if inside else "at an end of the range: try rates beyond it"
        lines += ["", f"Best rate {best:g} ({where})."]
    return lines


def plot_rates(curves: Dict[str, Curve], entropy: Dict[Path, Optional[Entropy]], path: Path) -> None:
    """``learning_rates.png``: validation BLEU (each seed a dot, the mean a line) and the
    cross-attention's entropy against the peak rate (log scale), a line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for c, (label, curve) in enumerate(curves.items()):
        color = colors[c % len(colors)]
        rates = list(curve)
        for rate, runs in curve.items():
            left.plot(
                [rate] * len(runs), [r.results["valid"]["bleu"] for r in runs], "o", color=color, alpha=0.5
            )
        means = [statistics.fmean(r.results["valid"]["bleu"] for r in curve[rate]) for rate in rates]
        left.plot(rates, means, "-", color=color, label=label)
        found = [(rate, entropy.get(r.path)) for rate in rates for r in curve[rate]]
        points = [(rate, e.mean) for rate, e in found if e is not None]
        if points:
            right.plot(*zip(*points), "o", color=color, alpha=0.5)
            by_rate = {rate: statistics.fmean(v for x, v in points if x == rate) for rate, _ in points}
            right.plot(list(by_rate), list(by_rate.values()), "-", color=color, label=label)
    right.axhline(COLLAPSED, color="grey", linestyle=":", linewidth=1, label=f"collapse ({COLLAPSED} nats)")
    left.set_ylabel("validation BLEU (greedy, best evaluation)", fontsize=11)
    right.set_ylabel("cross-attention entropy at the end (nats)", fontsize=11)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate", fontsize=11)
        ax.grid(alpha=0.3)
    # one legend under both panels, where it hides no point: the configurations, then the threshold
    handles, labels = left.get_legend_handles_labels()
    extra = [(h, t) for h, t in zip(*right.get_legend_handles_labels()) if t not in labels]
    handles, labels = handles + [h for h, _ in extra], labels + [t for _, t in extra]
    rows = (len(labels) + 1) // 2
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=9, frameon=False)
    fig.suptitle("Learning-rate sensitivity: each seed a dot, the mean a line", fontsize=12)
    fig.tight_layout(rect=(0, 0.04 + 0.05 * rows, 1, 1))
    with AtomicFile(path, "wb") as out:
        fig.savefig(out, format="png")
    plt.close(fig)
