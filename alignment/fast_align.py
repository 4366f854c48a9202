"""A reference word aligner: fast_align (Dyer, Chahuneau and Smith 2013, a reparameterised IBM
Model 2) through SYSTRAN's Python binding, the PyPI package ``systran-align``.

``systran_align.generate_alignment_probabilities`` trains both directions on a file of
``source ||| target`` lines and writes two binary probability files: forward (each target word
drawn from a source word, fast_align's default direction) and backward (fast_align's ``-r``).
``systran_align.Aligner(forward, backward).align(src_tokens, tgt_tokens)`` returns a dict:

- ``"alignments"``: a list of ``(i, j)`` tuples, ``i`` the source and ``j`` the target word,
  0-based: the two directions' Viterbi alignments symmetrised with grow-diag-final-and (Koehn et
  al. 2003; fast_align's ``atools -c grow-diag-final-and``). The binding does not return the two
  directions themselves. Found by experiment with systran-align 3.5.0: a target word linked to two
  source words and a source word linked to two target words both occur (so neither one direction
  nor their intersection); trained without the NULL word, where each direction links every word,
  some words still come out unlinked (so neither the union nor grow-diag-final, whose final step
  would link them); and of atools' symmetrisers the library holds grow-diag-final-and's alone
  (``GDFACommand``), which also tells it from plain grow-diag.
- ``"forward_log_prob"``, ``"backward_log_prob"``: each direction's log-probability of the pair.

Training uses fast_align's recommended settings (its README's ``-d -o -v``): a prior that favours
the diagonal, its tension optimised, variational Bayes on the lexical table. The aligner should
see text prepared like the text it aligns: ``moses_tokenize`` for raw text, ``split_words`` for
text already tokenized (the gold set), both lowercased the same way (``str.lower``).

Training runs on OpenMP threads, as many as cores unless ``OMP_NUM_THREADS`` says otherwise (read
when the library is first loaded). ``systran_align`` and ``sacremoses`` are imported where they are
used, so this module's other helpers work without them.
"""

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Sequence, Tuple

from alignment.scores import AlignmentError, Links
from common.files import write_lines
from common.progress_bar import progress_bar

log = logging.getLogger(__name__)

SEPARATOR = "|||"  # between the sides of a training line; a pair with this token is left out


@dataclass(frozen=True)
class FastAlignModel:
    """The two probability files of a trained fast_align (``train_fast_align``)."""

    forward: Path  # each target word drawn from a source word
    backward: Path  # each source word drawn from a target word


def moses_tokenize(lines: Iterable[str], lang: str, lowercase: bool = True) -> List[List[str]]:
    """Raw sentences -> their Moses tokens (sacremoses, no escaping: ``'`` stays ``'``, not
    ``&apos;``), lowercased unless ``lowercase=False``."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [
        [token.lower() if lowercase else token for token in tokenizer.tokenize(line, escape=False)]
        for line in lines
    ]


def split_words(lines: Iterable[str], lowercase: bool = True) -> List[List[str]]:
    """Tokenized sentences (a gold set's texts) -> their space-separated words, lowercased unless
    ``lowercase=False``, as ``moses_tokenize`` lowercases."""
    return [(line.lower() if lowercase else line).split() for line in lines]


def check_pairs(src: Sequence[Sequence[str]], tgt: Sequence[Sequence[str]]) -> None:
    if len(src) != len(tgt):
        raise AlignmentError(
            f"fast_align: {len(src)} source and {len(tgt)} target sentences: give both sides of the same pairs"
        )


def training_lines(src: Sequence[Sequence[str]], tgt: Sequence[Sequence[str]]) -> Tuple[List[str], int]:
    """``(lines, left_out)``: the ``source ||| target`` lines fast_align trains on, and how many
    pairs were left out: those with an empty side (nothing to learn) or a ``|||`` token (the
    reader would take it for the separator)."""
    check_pairs(src, tgt)
    lines = [
        f"{' '.join(s)} {SEPARATOR} {' '.join(t)}"
        for s, t in zip(src, tgt)
        if s and t and SEPARATOR not in s and SEPARATOR not in t
    ]
    return lines, len(src) - len(lines)


def train_fast_align(
    src: Sequence[Sequence[str]], tgt: Sequence[Sequence[str]], work_dir: Path, iterations: int = 5
) -> FastAlignModel:
    """fast_align trained in both directions on the token lists ``src`` and ``tgt`` (one list per
    sentence, tokens without spaces), with ``-d -o -v``; its files are written into ``work_dir``."""
    import systran_align

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    lines, left_out = training_lines(src, tgt)
    if not lines:
        raise AlignmentError(
            f"fast_align: none of the {len(src)} pairs can train it (each has an empty side or a '|||' "
            f"token): give sentence pairs with words on both sides"
        )
    if left_out:
        log.info("fast_align: %d of %d pairs left out (an empty side or a '|||' token)", left_out, len(src))
    corpus = work_dir / "corpus.txt"
    write_lines(corpus, lines)
    model = FastAlignModel(forward=work_dir / "forward.probs", backward=work_dir / "backward.probs")
    with progress_bar(1, f"fast_align: training on {len(lines)} pairs", "models") as bar:
        systran_align.generate_alignment_probabilities(
            str(corpus),
            str(model.forward),
            str(model.backward),
            iterations=iterations,
            favor_diagonal=True,  # -d
            optimize_tension=True,  # -o
            variational_bayes=True,  # -v
        )
        bar.update(1)
    return model


def aligned_pairs(
    model: FastAlignModel, src: Sequence[Sequence[str]], tgt: Sequence[Sequence[str]]
) -> Iterator[Links]:
    """Each pair's links ``(i, j)`` (source word ``i``, target word ``j``, 0-based), symmetrised
    with grow-diag-final-and, one pair at a time; none for a pair with an empty side."""
    import systran_align

    check_pairs(src, tgt)
    aligner = systran_align.Aligner(str(model.forward), str(model.backward))
    with progress_bar(len(src), "fast_align: aligning", "pairs") as bar:
        for s, t in zip(src, tgt):
            yield (
                frozenset(tuple(link) for link in aligner.align(list(s), list(t))["alignments"])
                if s and t
                else frozenset()
            )
            bar.update(1)


def align_pairs(
    model: FastAlignModel, src: Sequence[Sequence[str]], tgt: Sequence[Sequence[str]]
) -> List[Links]:
    """``aligned_pairs`` as a list."""
    return list(aligned_pairs(model, src, tgt))


def text_words(lines: Sequence[str], tokenize: bool, lang: str) -> List[List[str]]:
    """Each line's words, cased: Moses tokens of raw text, or the space-separated tokens."""
    return moses_tokenize(lines, lang, lowercase=False) if tokenize else split_words(lines, lowercase=False)


def lowered(sentences: Sequence[Sequence[str]]) -> List[List[str]]:
    return [[word.lower() for word in words] for words in sentences]


def fast_align_links(
    train: Tuple[List[List[str]], List[List[str]]],
    pairs: Tuple[List[List[str]], List[List[str]]],
    added: bool,
) -> List[Links]:
    """fast_align trained on ``train`` (plus ``pairs`` when ``added``), aligning ``pairs``; both are
    lowercased here (fast_align's own text, as ``moses_tokenize`` gives it)."""
    pairs = lowered(pairs[0]), lowered(pairs[1])
    src, tgt = train
    if added:
        src, tgt = src + pairs[0], tgt + pairs[1]
    with tempfile.TemporaryDirectory() as work:
        model = train_fast_align(src, tgt, Path(work))
        return align_pairs(model, *pairs)
