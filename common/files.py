"""Files replaced whole or not at all: written to a temporary file in the same folder, flushed to
disk, then renamed over the target. A crash, a full disk or an error part-way leaves the previous
file as it was (a rename within one file system is atomic). Imports no torch: the command-line
tools use it before (or without) loading models."""

import os
import tempfile
from pathlib import Path
from typing import IO, Iterable, Optional


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class AtomicFile:
    """``path`` opened for writing through a temporary file beside it.

    ``commit()`` flushes, fsyncs and renames it into place; ``discard()`` removes it. As a context
    manager it yields the stream and commits on success, discards on an exception.
    """

    def __init__(self, path: Path, mode: str = "w", encoding: Optional[str] = "utf-8"):
        self.path = Path(path)
        handle, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        self.stream: IO = os.fdopen(handle, mode, encoding=None if "b" in mode else encoding)
        self.done = False

    def commit(self) -> None:
        if self.done:
            return
        try:
            self.stream.flush()
            os.fsync(self.stream.fileno())
            self.stream.close()
            os.chmod(
                self.tmp, 0o666 & ~current_umask()
            )  # mkstemp makes the file private: give it normal permissions
            os.replace(self.tmp, self.path)
            self.done = True
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.stream.close()  # may fail again (a full disk): the temporary file goes all the same
        except OSError:
            pass
        finally:
            Path(self.tmp).unlink(missing_ok=True)

    def __enter__(self) -> IO:
        return self.stream

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """A text file of ``lines``, one a line (UTF-8), written whole or not at all."""
    with AtomicFile(path) as out:
        for line in lines:
            out.write(line + "\n")
