"""The options of a search and their ranges, without torch: ``translate.py`` checks its command
line with them before it loads a model, the library (``models/search.py``, the Translator) checks
its arguments with them, and both share the length-limit defaults."""

import inspect
from typing import Optional, Tuple

MAX_LEN_RATIO = 1.5  # the longest output: this times the source length (EOS included) ...
MAX_LEN_EXTRA = 10  # ... plus this many tokens


def option_problem(
    beam_size: int = 1,
    nbest: int = 1,
    alpha: float = 0.0,
    max_len_ratio: float = MAX_LEN_RATIO,
    max_len_extra: int = MAX_LEN_EXTRA,
) -> Optional[Tuple[str, str]]:
    """The first option out of range, as ``(name, what is wrong)``; None when all are fine."""
    if beam_size < 1:
        return "beam_size", "the beam size must be at least 1"
    if not 1 <= nbest <= beam_size:
        return "nbest", f"must be between 1 and the beam size ({beam_size})"
    if alpha < 0:
        return "alpha", "the length penalty must be >= 0"
    if max_len_ratio < 0 or max_len_extra < 0 or max_len_ratio == max_len_extra == 0:
        return (
            "max_len_ratio",
            f"the output length limit {max_len_ratio} x source + {max_len_extra} must be positive",
        )
    return None


def output_limit(source_length: int, ratio: float, extra: int, cap: Optional[int] = None) -> int:
    """The longest output of a source of ``source_length`` tokens (EOS included): ``ratio`` times it
    plus ``extra``, at least 1, never more than ``cap`` (a model's ``max_positions``)."""
    limit = max(1, int(ratio * source_length) + extra)
    return limit if cap is None else min(limit, cap)


def check_options(**options: float) -> None:
    """``ValueError`` naming the first option of ``option_problem`` out of range, as ``nbest=6: ...``."""
    problem = option_problem(**options)
    if problem is not None:
        name, what = problem
        given = inspect.signature(option_problem).bind(**options)
        given.apply_defaults()
        raise ValueError(f"{name}={given.arguments[name]}: {what}")
