"""Carrying a span of source words into the output through word links, and how well links carry them.

A tag around source words ``start .. end - 1`` goes around the output words linked to any of them:
the span from the first to the last of those (``project_span``; None when none is linked, and the
tag is then left out rather than put in the wrong place). A point between words (a self-closing
tag before source word ``k``) goes before the first output word linked to word ``k`` or, when that
one has no link, to the next linked source word; with none after it, to the output's end
(``project_point``).

``span_scores`` measures a system's links on a gold set the way a user of tag transfer meets them:
random source spans of 1 to 4 words, each carried by the system's links and by the human links,
scored by exact match of the two target spans and by word F1 between them. No torch here.
"""

import random
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

Links = Iterable[Tuple[int, int]]  # (source word, output word), 0-based
Span = Tuple[int, int]  # words start .. end - 1
MAX_SPAN = 4  # words of a random span in span_scores


def project_span(links: Links, start: int, end: int) -> Optional[Span]:
    """The output span linked to source words ``start .. end - 1``: from the first to the last linked
    output word; None when none is linked."""
    targets = [j for i, j in links if start <= i < end]
    return (min(targets), max(targets) + 1) if targets else None


def project_point(links: Links, before: int, n_out: int) -> int:
    """Where a point before source word ``before`` goes: before the first output word linked to it or to
    the next later source word that has links; ``n_out`` (the output's end) when no later word has one."""
    by_source: Dict[int, List[int]] = {}
    for i, j in links:
        by_source.setdefault(i, []).append(j)
    later = [i for i in by_source if i >= before]
    return min(by_source[min(later)]) if later else n_out


@dataclass(frozen=True)
class SpanScores:
    spans: int  # random spans the human links carry somewhere
    exact: float  # share carried to exactly the human span
    word_f1: float  # mean F1 of the carried span's words against the human span's (no span: 0)


def random_spans(lengths: Sequence[int], seed: int = 1) -> List[Tuple[int, Span]]:
    """One random span of 1 to ``MAX_SPAN`` words (no longer than its sentence) per sentence of
    ``lengths`` (source words), as ``(sentence, (start, end))``; the same for the same seed."""
    rng = random.Random(seed)
    spans = []
    for k, n in enumerate(lengths):
        if n == 0:
            continue
        size = rng.randint(1, min(MAX_SPAN, n))
        start = rng.randint(0, n - size)
        spans.append((k, (start, start + size)))
    return spans


def word_f1(found: Optional[Span], gold: Span) -> float:
    if found is None:
        return 0.0
    overlap = max(0, min(found[1], gold[1]) - max(found[0], gold[0]))
    if overlap == 0:
        return 0.0
    precision, recall = overlap / (found[1] - found[0]), overlap / (gold[1] - gold[0])
    return 2 * precision * recall / (precision + recall)


def span_scores(
    system: Sequence[Links], gold: Sequence[Links], spans: Sequence[Tuple[int, Span]]
) -> SpanScores:
    """``system``'s links (one set per sentence) carrying ``spans`` against the ``gold`` links carrying
    them; spans the gold links carry nowhere (unaligned words) are left out."""
    exact = f1 = counted = 0.0
    for k, (start, end) in spans:
        wanted = project_span(gold[k], start, end)
        if wanted is None:
            continue
        found = project_span(system[k], start, end)
        counted += 1
        exact += found == wanted
        f1 += word_f1(found, wanted)
    n = max(counted, 1)
    return SpanScores(int(counted), exact / n, f1 / n)
