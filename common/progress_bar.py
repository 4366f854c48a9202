"""Progress of long work on standard error: a tqdm bar on a terminal, otherwise (a log file, a pipe)
a plain line every ``LINE_SECONDS``. Standard output is never touched, so what a command prints
there (translations, a report) stays clean to pipe.

    with progress_bar(len(lines), "translating", "sentences") as bar:
        for chunk in chunks:
            ...
            bar.update(len(chunk))
"""

import os
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
        self.shown = 0  # the count the last line showed (0: no line yet)

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
        self.last, self.shown = now, self.done

    def close(self) -> None:
        if self.shown and self.shown != self.done:  # the end, unless the last line showed it
            self.line(time.monotonic())

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NoProgress:
    """Nowhere to show progress: ``update`` and ``close`` do nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "NoProgress":
        return self

    def __exit__(self, *exc) -> None:
        pass


def on_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def same_file_as_stdout(stream: TextIO) -> bool:
    """Whether ``stream`` writes into the file standard output writes into (``> out 2>&1``, a SLURM
    job's output file): progress lines there would land among the output's own lines."""
    try:
        mine, out = os.fstat(stream.fileno()), os.fstat(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # not a file (a test's buffer), or closed
        return False
    return (mine.st_dev, mine.st_ino) == (out.st_dev, out.st_ino)


def progress_bar(
    total: Optional[int],
    desc: str,
    unit: str = "it",
    stream: Optional[TextIO] = None,
    every: Optional[float] = None,
):
    """A progress display of ``total`` items (None: unknown) on ``stream`` (standard error as it is
    when called): a tqdm bar, drawn at once, on a terminal; elsewhere ``LineProgress``, a line every
    ``every`` seconds (``LINE_SECONDS``), unless standard output goes into the same file, or there is
    no stream (a closed standard error). Each is a context manager with ``update(n)`` and ``close()``."""
    stream = sys.stderr if stream is None else stream
    if stream is None:
        return NoProgress()
    if on_terminal(stream):
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=f" {unit}", file=stream, leave=False, mininterval=0.2)
    if same_file_as_stdout(stream):
        return NoProgress()
    return LineProgress(total, desc, unit, stream, LINE_SECONDS if every is None else every)
