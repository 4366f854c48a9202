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
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from alignment.fast_align import fast_align_links, moses_tokenize
from alignment.heads import HeadStats
from alignment.scores import AlignmentScores, Gold, Links, alignment_scores, diagonal, read_gold, split_dev
from data.corpus import read_lines

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


def reference_about(gold: Optional[str]) -> str:
    """What the scores are measured against, for the report."""
    if gold:
        return f"`{gold}` (human sure and possible links)"
    return (
        "fast_align's links (trained on the training text plus these pairs): the scores are agreement "
        "with an aligner, not accuracy"
    )


def references_and_gold(
    src_words: List[List[str]],
    tgt_words: List[List[str]],
    gold_file: Optional[Path],
    train: Optional[Tuple[Path, Path]],
    langs: Tuple[str, str],
) -> Tuple[Dict[str, List[Links]], List[Gold]]:
    """The reference methods' links (the diagonal; fast_align with the training text) and the links
    every method is scored against: the human links of ``gold_file``, else fast_align's (every link
    sure), trained on the raw text ``train`` (source and target files) in the ``langs``."""
    references = {"diagonal": [diagonal(len(s), len(t)) for s, t in zip(src_words, tgt_words)]}
    gold = None
    if gold_file is not None:
        gold = read_gold(gold_file, [" ".join(w) for w in src_words], [" ".join(w) for w in tgt_words])
    if train is not None:
        text = tuple(moses_tokenize(read_lines(path), lang) for path, lang in zip(train, langs))
        pairs = (src_words, tgt_words)
        with_pairs = fast_align_links(text, pairs, added=True)
        if gold is None:
            gold = [Gold(links, links) for links in with_pairs]
        else:
            references["fast_align (training text)"] = fast_align_links(text, pairs, added=False)
            references["fast_align (training text + these pairs)"] = with_pairs
    return references, gold
