"""Which reading of the attention aligns words best: every method scored against a reference,
one chosen on a dev part, reported on the rest (``scripts/align.py`` is its command line).

A method (``alignment/method.py``: a layer, heads and a reading) gives one set of word links
per sentence pair; so do the reference methods (the diagonal, fast_align). Each is scored by
alignment error rate, precision and recall (``alignment/scores.py``) on the dev part (the first pairs)
and on the rest; the method with the lowest AER on the dev part is the chosen one, and only its
AER on the rest is the figure to report (choosing on the rest would flatter it).

The report is Markdown: the chosen method, the references, the whole grid, and every head's
entropy and importance when they were measured (``alignment/heads.py``); its figure is
``inference/figures.py``'s ``alignment_grid_figure``.
"""

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, TypeVar

from alignment.heads import HeadStats
from alignment.scores import AlignmentScores, Gold, Links, alignment_scores, split_dev

Key = TypeVar("Key")


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


def choose(scored: Mapping[Key, Scored]) -> Key:
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
