"""Word alignments measured against human gold alignments: alignment error rate (AER), precision
and recall (Och and Ney 2003, section 5), the gold's talp format, Pharaoh files, the diagonal
baseline and the dev / rest split of a gold set.

A sentence pair's alignment is a set of links ``(i, j)``: source word ``i`` to target word ``j``,
both 0-based, words the space-separated tokens of a line. A gold alignment holds sure links ``S``
and possible links ``P`` with ``S`` part of ``P`` (``read_gold`` adds every sure link to ``P``).
Scores are corpus-level: the counts are summed over all pairs before they are divided.

Imports no torch. A file that cannot be read raises ``DataError`` (``data.corpus``'s reader); a
file that does not hold what it should raises ``AlignmentError``, one line naming the file and line.
"""

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import FrozenSet, Iterable, List, NamedTuple, Sequence, Tuple, TypeVar

from data.corpus import read_lines

Link = Tuple[int, int]  # (i, j): source word i, target word j, 0-based
Links = FrozenSet[Link]  # one sentence pair's alignment
Item = TypeVar("Item")

_LINK = re.compile(r"^(\d+)([-p])(\d+)$")  # "3-4" sure, "3p4" possible


class AlignmentError(ValueError):
    """An alignment file or alignments that do not fit their texts; one line that says what to do."""


class Gold(NamedTuple):
    """One sentence pair's gold alignment: ``sure`` is part of ``possible``."""

    sure: Links
    possible: Links


@dataclass(frozen=True)
class AlignmentScores:
    """Corpus-level counts of predicted links ``A`` against gold ``S`` (sure) and ``P`` (possible),
    and the scores made of them.

    A score whose denominator is 0 is ``nan`` (undefined, never mistaken for a real value):
    precision with no predicted links, recall with no sure links, AER with neither. With no
    predicted links but some sure ones, AER is 1 and recall 0.
    """

    predicted: int  # |A|
    sure: int  # |S|
    predicted_sure: int  # |A & S|
    predicted_possible: int  # |A & P|

    @property
    def aer(self) -> float:
        """``1 - (|A & S| + |A & P|) / (|A| + |S|)`` (Och and Ney 2003, eq. 19); lower is better."""
        return 1.0 - _ratio(self.predicted_sure + self.predicted_possible, self.predicted + self.sure)

    @property
    def precision(self) -> float:
        """``|A & P| / |A|``: a predicted link counts when it is at least possible."""
        return _ratio(self.predicted_possible, self.predicted)

    @property
    def recall(self) -> float:
        """``|A & S| / |S|``: only sure links need to be found."""
        return _ratio(self.predicted_sure, self.sure)


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


def parse_link(token: str, one_based: bool) -> Tuple[Link, bool]:
    """``"3-4"`` -> ``((3, 4), True)`` (sure), ``"3p4"`` -> ``((3, 4), False)`` (possible), shifted to
    0-based when ``one_based``; ``ValueError`` for anything else (``"x-2"``, ``"3-"``, ``"0-1"``
    when 1-based)."""
    match = _LINK.match(token)
    if not match:
        raise ValueError(f"{token!r} is not a link (i-j or ipj)")
    i, j = int(match.group(1)) - one_based, int(match.group(3)) - one_based
    if i < 0 or j < 0:
        raise ValueError(
            f"link {token} has an index 0, but the file is read as 1-based (pass one_based=False)"
        )
    return (i, j), match.group(2) == "-"


def check_fits(
    path: Path, number: int, token: str, link: Link, n_src: int, n_tgt: int, one_based: bool
) -> None:
    """``AlignmentError`` unless ``link`` (read from ``token`` on line ``number``) indexes a word of
    a source line of ``n_src`` words and a target line of ``n_tgt`` words."""
    i, j = link
    for side, index, words in (("source", i, n_src), ("target", j, n_tgt)):
        if index >= words:
            raise AlignmentError(
                f"{path} line {number}: link {token}, but {side} line {number} has {words} words: "
                f"the gold file does not belong to these texts (or is {'0' if one_based else '1'}-based)"
            )


def check_counts(path: Path, n_lines: int, src_lines: Sequence[str], tgt_lines: Sequence[str]) -> None:
    """``AlignmentError`` unless the alignment file and both texts have one line per pair each."""
    if len(src_lines) != len(tgt_lines):
        raise AlignmentError(
            f"the texts of {path} have {len(src_lines)} source and {len(tgt_lines)} target lines: "
            f"give both sides of the same sentence pairs"
        )
    if n_lines != len(src_lines):
        raise AlignmentError(
            f"{path} has {n_lines} lines, the texts {len(src_lines)}: give the alignment file of these "
            f"texts (one line per sentence pair, an empty line for a pair without links)"
        )


def read_gold(
    path: Path, src_lines: Sequence[str], tgt_lines: Sequence[str], one_based: bool = True
) -> List[Gold]:
    """The gold alignments of a talp file (one line per pair: ``i-j`` sure, ``ipj`` possible links,
    1-based unless ``one_based=False``), 0-based, each checked against its pair's words (the
    space-separated tokens of ``src_lines`` and ``tgt_lines``). Every sure link is also possible."""
    path = Path(path)
    lines = read_lines(path)
    check_counts(path, len(lines), src_lines, tgt_lines)
    golds = []
    for number, (line, src, tgt) in enumerate(zip(lines, src_lines, tgt_lines), start=1):
        sure, possible = set(), set()
        for token in line.split():
            try:
                link, is_sure = parse_link(token, one_based)
            except ValueError as error:
                raise AlignmentError(f"{path} line {number}: {error}") from None
            check_fits(path, number, token, link, len(src.split()), len(tgt.split()), one_based)
            (sure if is_sure else possible).add(link)
        golds.append(Gold(frozenset(sure), frozenset(possible | sure)))
    return golds


def read_pharaoh(path: Path) -> List[Links]:
    """Predicted alignments of a Pharaoh file: one line per pair of 0-based ``i-j`` links."""
    path = Path(path)
    alignments = []
    for number, line in enumerate(read_lines(path), start=1):
        links = set()
        for token in line.split():
            match = _LINK.match(token)
            if not match or match.group(2) != "-":
                raise AlignmentError(f"{path} line {number}: {token!r} is not a link (i-j, 0-based)")
            links.add((int(match.group(1)), int(match.group(3))))
        alignments.append(frozenset(links))
    return alignments


def pharaoh(links: Iterable[Link]) -> str:
    """``[(0, 0), (2, 1)]`` -> ``"0-0 2-1"``: one Pharaoh line (source index first, 0-based), the
    links in the order given."""
    return " ".join(f"{i}-{j}" for i, j in links)


def alignment_scores(predicted: Sequence[Iterable[Link]], gold: Sequence[Gold]) -> AlignmentScores:
    """The corpus-level counts of ``predicted`` (one link set per pair) against ``gold``
    (``read_gold``); ``AlignmentError`` when they do not hold the same number of pairs."""
    if len(predicted) != len(gold):
        raise AlignmentError(
            f"{len(predicted)} predicted alignments but {len(gold)} gold ones: "
            f"align every pair of the gold set, in its order"
        )
    n_a = n_s = n_as = n_ap = 0
    for links, (sure, possible) in zip(predicted, gold):
        links = set(links)
        n_a, n_s = n_a + len(links), n_s + len(sure)
        n_as, n_ap = n_as + len(links & sure), n_ap + len(links & possible)
    return AlignmentScores(predicted=n_a, sure=n_s, predicted_sure=n_as, predicted_possible=n_ap)


def diagonal(n_src: int, n_tgt: int) -> Links:
    """The diagonal baseline: target word ``j`` to source word ``floor((j + 0.5) * n_src / n_tgt)``,
    no link when either side is empty."""
    if n_src <= 0 or n_tgt <= 0:
        return frozenset()
    # (j + 0.5) * n_src / n_tgt in integers: exact, and always below n_src
    return frozenset(((2 * j + 1) * n_src // (2 * n_tgt), j) for j in range(n_tgt))


def split_dev(items: Sequence[Item], n_dev: int = 100) -> Tuple[List[Item], List[Item]]:
    """``(dev, rest)``: the first ``n_dev`` items choose a method (its settings, its layer), the rest
    report it, so the reported figure was not tuned on."""
    if len(items) < 2:
        raise AlignmentError(
            f"{len(items)} pair(s): a dev part (--dev) and a rest to report on need 2 or more"
        )
    if not 1 <= n_dev < len(items):
        raise AlignmentError(
            f"--dev {n_dev}: the first pairs choose the method and the rest report it, so with "
            f"{len(items)} pairs give a number from 1 to {len(items) - 1}"
        )
    return list(items[:n_dev]), list(items[n_dev:])
