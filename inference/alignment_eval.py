"""Which reading of the attention aligns words best: every method scored against a reference,
one chosen on a dev part, reported on the rest (``scripts/align.py`` is its command line).

A method (``inference/align_method.py``: a layer, heads and a reading) gives one set of word links
per sentence pair; so do the reference methods (the diagonal, fast_align). Each is scored by
alignment error rate, precision and recall (``inference/aer.py``) on the dev part (the first pairs)
and on the rest; the method with the lowest AER on the dev part is the chosen one, and only its
AER on the rest is the figure to report (choosing on the rest would flatter it).

The report is Markdown: the chosen method, the references, the whole grid, and every head's
entropy and importance when they were measured (``inference/heads.py``). The figure shows the
grid's AER on the dev part, one panel per reading, layers by heads.
"""

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, TypeVar

import matplotlib

matplotlib.use("Agg")  # no display: render to files
import matplotlib.pyplot as plt  # noqa: E402

from inference.aer import AlignmentScores, Gold, Links, alignment_scores, split_dev  # noqa: E402
from inference.align_method import READINGS, Method  # noqa: E402
from inference.heads import HeadStats  # noqa: E402

K = TypeVar("K")


@dataclass(frozen=True)
class Scored:
    """One method's scores on the dev part and on the rest."""

    name: str
    dev: AlignmentScores
    rest: AlignmentScores


def score(name: str, links: Sequence[Links], gold: Sequence[Gold], n_dev: int) -> Scored:
    """``links`` (one set per pair) scored against ``gold`` on the first ``n_dev`` pairs and on the rest."""
    dev_links, rest_links = split_dev(links, n_dev)
    dev_gold, rest_gold = split_dev(gold, n_dev)
    return Scored(name, alignment_scores(dev_links, dev_gold), alignment_scores(rest_links, rest_gold))


def choose(scored: Mapping[K, Scored]) -> K:
    """The method with the lowest AER on the dev part (the first of equals)."""
    return min(scored, key=lambda method: scored[method].dev.aer)


def percent(value: float) -> str:
    return f"{100 * value:.1f}"


def table(rows: Sequence[Scored]) -> List[str]:
    lines = [
        "| method | AER dev | AER rest | precision rest | recall rest |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {percent(row.dev.aer)} | {percent(row.rest.aer)} | "
            f"{percent(row.rest.precision)} | {percent(row.rest.recall)} |"
        )
    return lines


def heads_table(stats: Sequence[HeadStats]) -> List[str]:
    lines = [
        "| attention | layer | head | entropy (nats) | importance (loss rise when masked) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for s in stats:
        lines.append(f"| {s.kind} | {s.layer} | {s.head} | {s.entropy:.3f} | {s.importance:+.4f} |")
    return lines


def report(
    title: str,
    about: Sequence[str],
    chosen: Scored,
    references: Sequence[Scored],
    grid: Sequence[Scored],
    stats: Optional[Sequence[HeadStats]] = None,
    stats_about: str = "",
) -> str:
    """The Markdown report: what was measured (``about``: lines), the chosen method and its AER on
    the rest, the references, the grid, and the heads' numbers when given."""
    best_reference = min(references, key=lambda s: s.dev.aer) if references else None
    lines = [f"# {title}", "", *about, ""]
    lines += [
        "## The chosen method",
        "",
        f"Chosen on the dev part (lowest AER): **{chosen.name}**, AER {percent(chosen.rest.aer)} on the rest "
        f"(precision {percent(chosen.rest.precision)}, recall {percent(chosen.rest.recall)}).",
    ]
    if best_reference is not None:
        lines.append(
            f"Best reference on the dev part: {best_reference.name}, AER {percent(best_reference.rest.aer)} "
            "on the rest."
        )
    lines += ["", "## References", "", *table(references), ""]
    lines += ["## Every layer, head and reading", "", *table(grid), ""]
    if stats:
        lines += ["## Heads", "", stats_about, "", *heads_table(stats), ""]
    return "\n".join(lines)


def grid_figure(grid: Dict[Method, Scored], title: str):
    """AER on the dev part of every method: one panel per reading, rows the layers (then their
    mean), columns the heads (then their mean)."""
    layers = sorted({m.layer for m in grid if m.layer is not None}) + [None]
    heads = sorted({m.heads for m in grid if m.heads is not None}) + [None]
    fig, axes = plt.subplots(
        1, len(READINGS), figsize=(3 + 1.6 * len(heads) * len(READINGS), 2 + 0.7 * len(layers))
    )
    for ax, reading in zip(axes, READINGS):
        values = [
            [
                100 * grid[Method(layer, head, reading)].dev.aer
                if Method(layer, head, reading) in grid
                else float("nan")
                for head in heads
            ]
            for layer in layers
        ]
        image = ax.imshow(values, cmap="viridis_r", aspect="auto")
        for r, row in enumerate(values):
            for c, value in enumerate(row):
                ax.text(c, r, f"{value:.1f}", ha="center", va="center", color="white", fontsize=9)
        ax.set_xticks(range(len(heads)))
        ax.set_xticklabels(["mean" if h is None else ",".join(map(str, h)) for h in heads])
        ax.set_yticks(range(len(layers)))
        ax.set_yticklabels(["mean" if layer is None else str(layer) for layer in layers])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{reading} step")
        fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02, label="AER (dev), lower is better")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
