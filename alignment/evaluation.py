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

from torch import Tensor

from alignment.fast_align import fast_align_links, moses_tokenize, text_words
from alignment.forced import model_links
from alignment.heads import HeadStats
from alignment.method import Method, every_method
from alignment.scores import (
    AlignmentError,
    AlignmentScores,
    Gold,
    Links,
    alignment_scores,
    diagonal,
    read_gold,
    split_dev,
)
from alignment.transfer import random_spans, span_scores
from data.corpus import read_lines
from data.tokenizer import Tokenizer

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


def transfer_table(
    systems: Mapping[str, Sequence[Links]], gold: Sequence[Gold], n_src: Sequence[int], n_dev: int
) -> List[str]:
    """Tag transfer on the rest part: one random source span of 1 to 4 words per pair (seeded), carried
    through each system's links and through the gold sure links (``alignment/transfer.py``); the share
    carried to exactly the gold span and the mean word F1 against it."""
    spans = random_spans(n_src[n_dev:])
    sure = [g.sure for g in gold[n_dev:]]
    lines = [
        "| links | spans | exact match | word F1 |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, links in systems.items():
        found = span_scores(links[n_dev:], sure, spans)
        lines.append(f"| {name} | {found.spans} | {percent(found.exact)} | {percent(found.word_f1)} |")
    return lines


def report(
    title: str,
    about: Sequence[str],
    chosen: Scored,
    references: Sequence[Scored],
    grid: Sequence[Scored],
    stats: Optional[Sequence[HeadStats]] = None,
    stats_about: str = "",
    own: Optional[Scored] = None,
    transfer: Sequence[str] = (),
) -> str:
    """The Markdown report: what was measured (``about``: lines), the chosen method and its AER on
    the rest, the checkpoint's own method (``own``: its supervised heads when it was trained with guided
    alignment), the references, the tag transfer table (``transfer``: lines), the grid, and the heads'
    numbers when given."""
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
    if own is not None:
        lines.append(
            f"The checkpoint's own method ({own.name}): AER {percent(own.rest.aer)} on the rest "
            f"(precision {percent(own.rest.precision)}, recall {percent(own.rest.recall)})."
        )
    lines += ["", "## References", "", *table(references), ""]
    if transfer:
        lines += [
            "## Tag transfer",
            "",
            "A random span of 1 to 4 source words per pair of the rest, carried through each system's links to "
            "the target words from the first to the last linked one, against the span the sure gold links give "
            "(spans those link to nothing left out); in percent.",
            "",
            *transfer,
            "",
        ]
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


def read_pairs(
    src: Path, tgt: Path, n_dev: int, tokenize: bool, langs: Tuple[str, str]
) -> Tuple[List[str], List[str], List[List[str]], List[List[str]]]:
    """The two texts' lines and their words (cased, Moses tokens of raw text when ``tokenize``),
    checked to be pairs that the first ``n_dev`` of choose a method for the rest."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    if len(src_lines) != len(tgt_lines):
        raise AlignmentError(
            f"--src has {len(src_lines)} lines, --tgt {len(tgt_lines)}: give the two sides of the same pairs"
        )
    split_dev(src_lines, n_dev)  # both parts hold pairs
    words = [text_words(lines, tokenize, lang) for lines, lang in zip((src_lines, tgt_lines), langs)]
    return src_lines, tgt_lines, words[0], words[1]


def every_method_scored(
    maps: Sequence[Tensor],
    tokenizer: Tokenizer,
    src_ids: Sequence[List[int]],
    tgt_ids: Sequence[List[int]],
    gold: Sequence[Gold],
    n_dev: int,
    methods: Optional[Sequence[Method]] = None,
) -> Tuple[Dict[Method, List[Links]], Dict[Method, Scored]]:
    """Every method's links (``methods``; by default ``every_method`` of the maps' layers and heads) of
    the pairs whose cross-attention ``maps`` (``(L, H, T + 1, S)`` each) were read, and their scores
    against ``gold``."""
    if methods is None:
        methods = every_method(*maps[0].shape[:2])
    src_pieces = [tokenizer.src_pieces(ids) for ids in src_ids]
    tgt_pieces = [tokenizer.tgt_pieces(ids) for ids in tgt_ids]
    predicted = model_links(maps, methods, src_pieces, tgt_pieces)
    return predicted, {method: score(method.label, predicted[method], gold, n_dev) for method in methods}
