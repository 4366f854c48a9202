"""Inline markup carried through a translation (``translate.py --tags``, ``Translator.translate(tags=True)``).

A source sentence may hold simple inline tags: pairs such as ``<b>...</b>``, ``<i>...</i>``,
``<a href="...">...</a>`` (nested as in HTML) and self-closing ones such as ``<br/>``. The text is
translated without them (``parse_markup``), then each tag is put back around the output words that
the word alignment links to the source words it enclosed (``alignment/transfer.py``), and a
self-closing tag before the output word linked to the source word it stood before
(``tagged_text``). A tag that nothing carries (its words linked to no output word, or a span that
would cross a tag kept before it) is left out: an output is left untagged rather than wrongly
tagged. Markup that is not well formed (a stray ``<`` or ``>``, a tag never closed or closed out of
order) is a ``MarkupError`` naming the character.

The source's words are its space-separated tokens once the tags are taken out (a tag touching a
word, as in ``<b>red</b>``, is not a space); a tag encloses every word it overlaps. No torch here.
"""

import re
from dataclasses import dataclass, replace
from typing import Dict, Iterable, List, Optional, Tuple

from alignment.transfer import project_point, project_span

TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:_-]*)((?:\s[^<>]*?)?)\s*(/?)>")  # closing, name, attributes, "/"
WORD = re.compile(r"\S+")


class MarkupError(ValueError):
    """Markup that is not well formed; the message says where."""


@dataclass(frozen=True)
class Tag:
    """One tag of a source sentence: where it opens and closes in the text without tags (characters),
    as written, and the tag it is inside (its index; None at the top)."""

    name: str
    opening: str  # e.g. '<a href="x">', '<br/>'
    start: int
    end: int  # == start for a self-closing tag
    parent: Optional[int]
    closing: Optional[str] = None  # '</a>'; None: self-closing

    @property
    def self_closing(self) -> bool:
        return self.closing is None


@dataclass(frozen=True)
class Markup:
    """A source sentence as its text without tags and the tags, in the order they open."""

    text: str
    tags: Tuple[Tag, ...]

    def word_spans(self) -> List[Tuple[int, int]]:
        """Each space-separated word's characters ``(start, end)`` in ``text``."""
        return [match.span() for match in WORD.finditer(self.text)]


def parse_markup(line: str) -> Markup:
    """The text and tags of ``line`` (``MarkupError`` for markup that is not well formed)."""
    pieces: List[str] = []
    length = position = 0
    tags: List[Tag] = []
    open_tags: List[int] = []
    for match in TAG.finditer(line):
        length += check_text(line, position, match.start(), pieces)
        closing, name, attributes, slash = match.groups()
        inside = open_tags[-1] if open_tags else None
        if closing:
            if not open_tags:
                raise MarkupError(f"{match.group(0)} at character {match.start() + 1} closes no open tag")
            opened = tags[open_tags.pop()]
            if opened.name != name or attributes.strip() or slash:
                raise MarkupError(
                    f"{match.group(0)} at character {match.start() + 1} does not close {opened.opening}: "
                    "close tags in the reverse order they opened"
                )
            index = tags.index(opened)
            tags[index] = replace(opened, end=length, closing=match.group(0))
        elif slash:
            tags.append(Tag(name, match.group(0), length, length, inside))
        else:
            open_tags.append(len(tags))
            tags.append(Tag(name, match.group(0), length, length, inside, closing=""))
        position = match.end()
    length += check_text(line, position, len(line), pieces)
    if open_tags:
        raise MarkupError(
            f"{tags[open_tags[-1]].opening} is never closed: close it, or write <{tags[open_tags[-1]].name}/>"
        )
    return Markup("".join(pieces), tuple(tags))


def check_text(line: str, start: int, end: int, pieces: List[str]) -> int:
    """Text between tags: kept in ``pieces``, its length returned; a ``<`` or ``>`` in it is an error."""
    chunk = line[start:end]
    stray = next((k for k, char in enumerate(chunk) if char in "<>"), None)
    if stray is not None:
        raise MarkupError(
            f"a '{chunk[stray]}' at character {start + stray + 1} is not part of a tag: with tags, every < and > "
            "belongs to one (<b>...</b>, <br/>)"
        )
    pieces.append(chunk)
    return len(chunk)


def enclosed_words(tag: Tag, words: List[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    """The source words a paired tag overlaps, ``(first, last + 1)``; None for none."""
    inside = [k for k, (start, end) in enumerate(words) if start < tag.end and end > tag.start]
    return (inside[0], inside[-1] + 1) if inside else None


def word_before(tag: Tag, words: List[Tuple[int, int]]) -> int:
    """The source word a self-closing tag stands before (the number of words at the end)."""
    return next((k for k, (start, _) in enumerate(words) if start >= tag.start), len(words))


def overlaps(span: Tuple[int, int], other: Tuple[int, int]) -> bool:
    return span[0] < other[1] and other[0] < span[1]


def place_tags(markup: Markup, links: List[Tuple[int, int]], n_out: int) -> Dict[int, Tuple[int, int]]:
    """Where each tag that is carried goes among ``n_out`` output words: a paired tag's output span
    ``(first, last + 1)``, a self-closing tag's ``(k, k)`` (before output word ``k``). A tag stays within
    the span of its nearest enclosing tag that is kept (a self-closing one strictly inside it), and a
    paired tag never overlaps a kept paired tag that does not enclose it: the markup stays well formed."""
    words = markup.word_spans()
    placed: Dict[int, Tuple[int, int]] = {}
    for index, tag in enumerate(markup.tags):
        ancestors = kept_ancestors(markup, index, placed)
        low, high = placed[ancestors[0]] if ancestors else (0, n_out)
        if tag.self_closing:
            point = project_point(links, word_before(tag, words), n_out)
            if low <= point and (point < high or not ancestors):
                placed[index] = (point, point)
            continue
        source = enclosed_words(tag, words)
        span = project_span(links, *source) if source else None
        if span is None:
            continue
        span = (max(span[0], low), min(span[1], high))
        others = [placed[k] for k in placed if k not in ancestors and not markup.tags[k].self_closing]
        if span[0] < span[1] and not any(overlaps(span, other) for other in others):
            placed[index] = span
    return placed


def kept_ancestors(markup: Markup, index: int, placed: Dict[int, Tuple[int, int]]) -> List[int]:
    """The tags enclosing tag ``index`` in the source that are kept (in ``placed``), nearest first."""
    found = []
    parent = markup.tags[index].parent
    while parent is not None:
        if parent in placed:
            found.append(parent)
        parent = markup.tags[parent].parent
    return found


def tagged_text(markup: Markup, text: str, links: Iterable[Tuple[int, int]]) -> str:
    """``text``, the translation of ``markup.text`` whose words ``links`` link to the source words
    (``(source word, output word)``), with the tags carried into it; ``text`` itself when it has no
    words or the markup no tags."""
    words = text.split()
    if not words or not markup.tags:
        return text
    placed = place_tags(markup, list(links), len(words))
    before: Dict[int, List[str]] = {}
    after: Dict[int, List[str]] = {}
    # by place, then in document order: an enclosing tag opens before the tags inside it (and closes
    # after them), a self-closing tag stays before or inside a tag opening at its place as it was
    order = sorted(placed, key=lambda k: (placed[k][0], k))
    for index in order:
        tag, (start, end) = markup.tags[index], placed[index]
        before.setdefault(start, []).append(tag.opening)
        if not tag.self_closing:
            after.setdefault(end - 1, []).insert(0, tag.closing)
    out = ["".join(before.get(k, [])) + word + "".join(after.get(k, [])) for k, word in enumerate(words)]
    return " ".join(out) + "".join(before.get(len(words), []))
