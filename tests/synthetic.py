"""A synthetic translation task for fast tests: reverse a sequence of tokens.

The source is a random sequence of 3 to 8 words drawn from ``WORDS`` (the letters a to t); the
target is the same sequence reversed. A model learns it in a few hundred steps on the CPU, which a
slice of Multi30k cannot offer, and an untrained model gets it almost never right, so tests that
need "a model that has learnt something" (translate.py and its options, decoding tuning,
checkpoint averaging) run on it;
tests where real text matters (tokenization, BLEU on real sentences) keep Multi30k.

The corpus is written in the raw layout that ``data.root=DIR`` reads (``{split}.{lang}.gz``,
conf/data/multi30k.yaml), with the languages of that config: source ``de``, target ``en``. It is
a pure function of the sizes and the seed, byte for byte (the gzip headers carry no time).
"""

import gzip
import random
import string
from pathlib import Path
from typing import Dict, List, Set, Tuple

WORDS = list(string.ascii_lowercase[:20])
SRC, TGT = "de", "en"
SIZES = {"train": 3000, "val": 100, "test_2016_flickr": 100}
MIN_LEN, MAX_LEN = 3, 8
# data.vocab_size: the 256 byte pieces of byte_fallback, the 4 specials, the 21 characters (the
# letters and ``▁``) and one piece ``▁x`` per word. It is also the most SentencePiece finds in this
# text: every word is one piece, so a reversed sentence is its pieces reversed.
VOCAB_SIZE = 301


def reversal_pairs(count: int, rng: random.Random, seen: Set[str]) -> List[Tuple[str, str]]:
    """``count`` pairs (words, the same words reversed), lengths uniform in ``MIN_LEN..MAX_LEN``,
    none of whose sources is in ``seen`` (which gets them): the held-out splits are new sequences."""
    pairs = []
    while len(pairs) < count:
        words = rng.choices(WORDS, k=rng.randint(MIN_LEN, MAX_LEN))
        source = " ".join(words)
        if source not in seen:
            seen.add(source)
            pairs.append((source, " ".join(reversed(words))))
    return pairs


def write_gzip_lines(path: Path, lines: List[str]) -> None:
    """``lines`` as a gzip file whose bytes depend on nothing else (``mtime`` 0, no file name)."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as out:
        out.write(data)


def write_corpus(folder: Path, sizes: Dict[str, int] = SIZES, seed: int = 0) -> Path:
    """The reversal task in ``folder`` (created): ``{split}.de.gz`` and ``{split}.en.gz`` for each
    split of ``sizes``, drawn in that order from one seeded generator; no source occurs twice."""
    folder.mkdir(parents=True, exist_ok=True)
    rng, seen = random.Random(seed), set()
    for split, count in sizes.items():
        pairs = reversal_pairs(count, rng, seen)
        write_gzip_lines(folder / f"{split}.{SRC}.gz", [src for src, _ in pairs])
        write_gzip_lines(folder / f"{split}.{TGT}.gz", [tgt for _, tgt in pairs])
    return folder


def exact_match(hypotheses: List[str], references: List[str]) -> float:
    """The share of hypotheses equal to their reference (0 to 1)."""
    assert len(hypotheses) == len(references)
    return sum(h == r for h, r in zip(hypotheses, references)) / len(references)


def write_reversal_links(folder: Path, out: Path) -> Path:
    """The task's true word alignment of the training split in ``folder``, as a Pharaoh file for
    ``data.alignments``: source word ``i`` of ``n`` is target word ``n - 1 - i``."""
    with gzip.open(folder / f"train.{SRC}.gz", "rt", encoding="utf-8") as lines:
        counts = [len(line.split()) for line in lines]
    out.write_text("".join(" ".join(f"{i}-{n - 1 - i}" for i in range(n)) + "\n" for n in counts))
    return out
