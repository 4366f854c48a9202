"""Files replaced whole or not at all: written to a temporary file in the same folder, flushed to
disk, then renamed over the target. A crash, a full disk or an error part-way leaves the previous
file as it was (a rename within one file system is atomic). Folders are made whole the same way.
Imports no torch: the command-line tools use it before (or without) loading models."""

import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterable, Optional


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Atomic:
    """What a file and a folder made whole share: ``commit()`` publishes the temporary copy once
    (``publish``, the subclass's) and, should that fail, discards it before raising; ``discard()``
    removes it once (``remove``); as a context manager it commits on success, discards on an
    exception."""

    done = False

    def publish(self) -> None:
        raise NotImplementedError

    def remove(self) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        if self.done:
            return
        try:
            self.publish()
            self.done = True
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        if self.done:
            return
        self.done = True
        self.remove()

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


class AtomicFile(Atomic):
    """``path`` opened for writing through a temporary file beside it.

    ``commit()`` flushes, fsyncs and renames it into place; ``discard()`` removes it. As a context
    manager it yields the stream and commits on success, discards on an exception.
    """

    def __init__(self, path: Path, mode: str = "w", encoding: Optional[str] = "utf-8"):
        self.path = Path(path)
        handle, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        self.stream: IO = os.fdopen(handle, mode, encoding=None if "b" in mode else encoding)

    def publish(self) -> None:
        self.stream.flush()
        os.fsync(self.stream.fileno())
        self.stream.close()
        os.chmod(
            self.tmp, 0o666 & ~current_umask()
        )  # mkstemp makes the file private: give it normal permissions
        os.replace(self.tmp, self.path)

    def remove(self) -> None:
        try:
            self.stream.close()  # may fail again (a full disk): the temporary file goes all the same
        except OSError:
            pass
        finally:
            Path(self.tmp).unlink(missing_ok=True)

    def __enter__(self) -> IO:
        return self.stream


class AtomicFolder(Atomic):
    """The new folder ``path`` filled in a temporary folder beside it (``tmp``).

    ``commit()`` gives it the permissions the umask allows and renames it into place; ``discard()``
    removes it. The rename replaces a missing or empty ``path`` only: one that holds files (made
    meanwhile by another process, say) makes ``commit()`` raise ``OSError``, and this copy goes.
    ``prefix`` names the temporary folder (``.<name>.`` unless given); it ends in ``.tmp``. As a
    context manager it yields ``tmp`` and commits on success, discards on an exception.
    """

    def __init__(self, path: Path, prefix: Optional[str] = None):
        self.path = Path(path)
        prefix = f".{self.path.name}." if prefix is None else prefix
        self.tmp = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=prefix, suffix=".tmp"))

    def publish(self) -> None:
        os.chmod(self.tmp, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide it from other users
        os.rename(self.tmp, self.path)

    def remove(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> Path:
        return self.tmp


def same_file(source: Path, target: Path) -> None:
    """``target`` made the file ``source`` is, whole or not at all: a hard link beside ``target``
    (its bytes are not written again) renamed over it; a copy through ``AtomicFile`` where the file
    system has no hard links. The two names stay the same bytes because no file here is written in
    place: each is replaced by a rename."""
    source, target = Path(source), Path(target)
    link = target.parent / f".{target.name}.{os.urandom(4).hex()}.tmp"
    try:
        os.link(source, link)
    except OSError:  # no hard links on this file system (or across two): a copy
        with open(source, "rb") as read, AtomicFile(target, "wb") as out:
            shutil.copyfileobj(read, out)
        return
    try:
        os.replace(link, target)
    finally:  # gone after the rename, except where target already was source's file (a no-op rename)
        link.unlink(missing_ok=True)


def write_lines(path: Path, lines: Iterable[str]) -> None:
    """A text file of ``lines``, one a line (UTF-8), written whole or not at all."""
    with AtomicFile(path) as out:
        for line in lines:
            out.write(line + "\n")
