"""The options of a search, checked once: ``SearchOptions`` refuses a value out of range when it
is made, so ``translate.py`` (before it loads a model), the Translator and ``models/search.py`` all
report a bad option at once, in the same words. Imports no torch."""

from dataclasses import dataclass
from typing import Optional

MAX_LEN_RATIO = 1.5  # the longest output: this times the source length (EOS included) ...
MAX_LEN_EXTRA = 10  # ... plus this many tokens


class SearchOptionError(ValueError):
    """An option of ``SearchOptions`` out of range, in one line: ``nbest=6: must be between ...``.

    ``name``, ``value`` and ``problem`` are its parts, for a caller that names the option its own
    way (``translate.py``: ``--nbest 6: must be between ...``)."""

    def __init__(self, name: str, value: object, problem: str, message: Optional[str] = None):
        super().__init__(message or f"{name}={value}: {problem}")
        self.name, self.value, self.problem = name, value, problem


@dataclass(frozen=True)
class SearchOptions:
    """How ``models.search.search`` decodes: greedy search for a beam of 1, else beam search.

    Every value is checked when the options are made (``dataclasses.replace`` too): the first one
    out of range raises ``SearchOptionError``.
    """

    beam_size: int = 1
    alpha: float = 1.0  # the GNMT length penalty of beam search (0: none); greedy search has none
    nbest: int = 1  # hypotheses returned per sentence, best first (at most the beam)
    max_len: Optional[int] = None  # the longest output of every sentence; None: by source length ...
    max_len_ratio: float = MAX_LEN_RATIO  # ... this times its source tokens (EOS included) ...
    max_len_extra: int = MAX_LEN_EXTRA  # ... plus this many

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise SearchOptionError("beam_size", self.beam_size, "the beam size must be at least 1")
        if not 1 <= self.nbest <= self.beam_size:
            raise SearchOptionError(
                "nbest", self.nbest, f"must be between 1 and the beam size ({self.beam_size})"
            )
        if self.alpha < 0:
            raise SearchOptionError("alpha", self.alpha, "the length penalty must be >= 0")
        ratio, extra = self.max_len_ratio, self.max_len_extra
        if ratio < 0 or extra < 0 or ratio == extra == 0:
            problem = f"the output length limit {ratio} x source + {extra} must be positive"
            raise SearchOptionError("max_len_ratio", ratio, problem)
        if self.max_len is not None and self.max_len < 1:
            message = f"max_len={self.max_len} must be at least 1"
            raise SearchOptionError("max_len", self.max_len, "must be at least 1", message)

    def output_limit(self, source_length: int, cap: Optional[int] = None) -> int:
        """The longest output of a source of ``source_length`` tokens (EOS included): ``max_len``, else
        ``max_len_ratio`` times the length plus ``max_len_extra`` (at least 1); never more than ``cap``
        (a model's ``max_positions``)."""
        if self.max_len is not None:
            limit = self.max_len
        else:
            limit = max(1, int(self.max_len_ratio * source_length) + self.max_len_extra)
        return limit if cap is None else min(limit, cap)
