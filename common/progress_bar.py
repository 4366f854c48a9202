"""Progress of long work on standard error: a tqdm bar on a terminal, otherwise (a log file, a pipe)
a plain line every ``LINE_SECONDS``. Standard output is never touched, so what a command prints
there (translations, a report) stays clean to pipe.

    with progress_bar(len(lines), "translating", "sentences") as bar:
        for chunk in chunks:
            ...
            bar.update(len(chunk))
"""

import sys
import time
from typing import Optional, TextIO

LINE_SECONDS = 10.0  # without a terminal: at most one line this often (a short job prints none)


class LineProgress:
    """tqdm's ``update``/``close`` as plain lines, for a stream that is not a terminal: the first
    after ``every`` seconds, then every ``every`` seconds, and a last one when the work took long
    enough to have printed any."""

    def __init__(self, total: Optional[int], desc: str, unit: str, stream: TextIO, every: float):
        self.total, self.desc, self.unit, self.stream, self.every = total, desc, unit, stream, every
        self.done = 0
        self.start = self.last = time.monotonic()
        self.printed = False

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.line(now)

    def line(self, now: float) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        print(f"{self.desc}: {self.done}{of} {self.unit}{share}, {now - self.start:.0f} s", file=self.stream)
        self.stream.flush()
        self.last, self.printed = now, True

    def close(self) -> None:
        if self.printed:
            self.line(time.monotonic())
            self.printed = False

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def on_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(
    total: Optional[int],
    desc: str,
    unit: str = "it",
    stream: Optional[TextIO] = None,
    every: float = LINE_SECONDS,
):
    """A progress display of ``total`` items (None: unknown) on ``stream`` (standard error as it is
    when called): a tqdm bar, drawn at once, on a terminal; ``LineProgress`` elsewhere. Both are
    context managers with ``update(n)`` and ``close()``."""
    stream = sys.stderr if stream is None else stream
    if on_terminal(stream):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=f" {unit}", file=stream, leave=False, mininterval=0.2)
    return LineProgress(total, desc, unit, stream, every)
