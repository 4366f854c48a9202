"""common/files.py: ``AtomicFile`` replaces a file whole or not at all; ``AtomicFolder`` makes a folder so."""

import os
import stat
from pathlib import Path

import pytest

from common.files import AtomicFile, AtomicFolder, same_file, write_lines


def leftovers(folder: Path, name: str):
    """Temporary files of ``name`` in ``folder`` (``.<name>.*.tmp``)."""
    return sorted(folder.glob(f".{name}.*.tmp"))


@pytest.fixture
def old(tmp_path) -> Path:
    path = tmp_path / "results.json"
    path.write_text("the old content, longer than the new one\n" * 100, encoding="utf-8")
    return path


def test_a_commit_replaces_the_whole_file_and_only_then(old):
    before = old.read_text(encoding="utf-8")
    with AtomicFile(old) as out:
        out.write("new\n")
        out.flush()
        assert old.read_text(encoding="utf-8") == before  # written beside it, not into it
        (tmp,) = leftovers(old.parent, old.name)  # in the same folder: the rename stays on one file system
        assert tmp.read_text(encoding="utf-8") == "new\n"
    assert old.read_text(encoding="utf-8") == "new\n"
    assert sorted(p.name for p in old.parent.iterdir()) == [old.name]


def test_an_exception_in_the_block_leaves_the_old_file_and_no_temporary_file(old):
    before = old.read_bytes()
    with pytest.raises(RuntimeError, match="half-way"):
        with AtomicFile(old) as out:
            out.write("half of the new")
            raise RuntimeError("half-way")
    assert old.read_bytes() == before
    assert sorted(p.name for p in old.parent.iterdir()) == [old.name]


def test_an_exception_before_a_first_commit_creates_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with AtomicFile(tmp_path / "new.txt") as out:
            out.write("never")
            raise KeyboardInterrupt  # not an Exception: still discarded
    assert list(tmp_path.iterdir()) == []


def test_discard_keeps_the_old_file_and_a_later_commit_does_nothing(old):
    before = old.read_bytes()
    atomic = AtomicFile(old)
    atomic.stream.write("replacement")
    atomic.discard()
    assert atomic.stream.closed and leftovers(old.parent, old.name) == []
    atomic.commit()
    atomic.discard()  # twice: nothing to do
    assert old.read_bytes() == before


def test_commit_twice_writes_once(tmp_path):
    path = tmp_path / "a.txt"
    atomic = AtomicFile(path)
    atomic.stream.write("one")
    atomic.commit()
    path.write_text("changed since", encoding="utf-8")
    atomic.commit()
    assert path.read_text(encoding="utf-8") == "changed since"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_the_new_file_gets_the_permissions_of_the_umask_not_the_private_ones_of_a_temporary_file(
    tmp_path, umask, mode
):
    previous = os.umask(umask)
    try:
        with AtomicFile(tmp_path / "out.txt") as out:
            out.write("x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == mode


def test_binary_mode_writes_the_bytes_as_they_are(tmp_path):
    data = bytes(range(256)) + b"\r\n\n\x89PNG"
    with AtomicFile(tmp_path / "image.png", "wb") as out:
        out.write(data)
    assert (tmp_path / "image.png").read_bytes() == data


def test_text_mode_writes_utf8_whatever_the_locale(tmp_path):
    with AtomicFile(tmp_path / "de.txt") as out:
        out.write("Ein Mann schläft auf einer Bank.\n")
    assert (tmp_path / "de.txt").read_bytes() == "Ein Mann schläft auf einer Bank.\n".encode("utf-8")


def test_a_failed_rename_raises_and_removes_the_temporary_file(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside").write_text("kept")
    with pytest.raises(OSError):
        with AtomicFile(target) as out:  # a folder cannot be replaced by a file
            out.write("x")
    assert (target / "inside").read_text() == "kept"
    assert leftovers(tmp_path, target.name) == []


def test_a_missing_folder_fails_at_once(tmp_path):
    with pytest.raises(FileNotFoundError):
        AtomicFile(tmp_path / "missing" / "out.txt")
    assert list(tmp_path.iterdir()) == []


def test_write_lines_writes_one_line_each_and_keeps_the_old_file_when_the_lines_fail(tmp_path):
    path = tmp_path / "test.hyp"
    write_lines(path, ["Ein Mann.", "", "Zwei Hunde."])
    assert path.read_text(encoding="utf-8") == "Ein Mann.\n\nZwei Hunde.\n"

    def failing():
        yield "half"
        raise RuntimeError("decoding failed")

    with pytest.raises(RuntimeError):
        write_lines(path, failing())
    assert path.read_text(encoding="utf-8") == "Ein Mann.\n\nZwei Hunde.\n"
    assert [p.name for p in tmp_path.iterdir()] == ["test.hyp"]


def test_a_folder_appears_whole_on_commit_with_the_permissions_of_the_umask(tmp_path):
    target = tmp_path / "export"
    previous = os.umask(0o022)
    try:
        with AtomicFolder(target) as folder:
            (folder / "a.bin").write_bytes(b"a")
            assert not target.exists()  # filled beside it, not in it
            assert (
                folder.parent == tmp_path and folder.name.startswith(".export.") and folder.suffix == ".tmp"
            )
    finally:
        os.umask(previous)
    assert (target / "a.bin").read_bytes() == b"a"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # not mkdtemp's 0700
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_an_exception_while_filling_a_folder_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with AtomicFolder(tmp_path / "export") as folder:
            (folder / "half").write_text("x")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_folder_replaces_an_empty_one_but_not_one_that_holds_files(tmp_path):
    (tmp_path / "empty").mkdir()
    with AtomicFolder(tmp_path / "empty") as folder:
        (folder / "new").write_text("x")
    assert (tmp_path / "empty" / "new").read_text() == "x"
    full = tmp_path / "full"
    full.mkdir()
    (full / "old").write_text("kept")
    staging = AtomicFolder(full)
    (staging.tmp / "new").write_text("x")
    with pytest.raises(OSError):
        staging.commit()
    assert [p.name for p in full.iterdir()] == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full"]  # the temporary folder went
    staging.discard()  # nothing left to do


def test_a_folder_prefix_names_the_temporary_folder(tmp_path):
    staging = AtomicFolder(tmp_path / "store", prefix=".key.host.123.")
    assert staging.tmp.name.startswith(".key.host.123.") and staging.tmp.name.endswith(".tmp")
    staging.discard()
    assert list(tmp_path.iterdir()) == []


def test_same_file_links_the_target_to_the_source_and_replaces_it_whole(old, tmp_path):
    source = tmp_path / "last.pt"
    source.write_bytes(b"weights of step 9")
    same_file(source, old)  # an existing target: replaced by the link's rename
    assert old.samefile(source) and old.read_bytes() == b"weights of step 9"
    with AtomicFile(source, "wb") as out:  # the source replaced later, as every save replaces it
        out.write(b"weights of step 12")
    assert old.read_bytes() == b"weights of step 9"  # the target keeps the file it was given
    assert leftovers(tmp_path, old.name) == []


def test_same_file_copies_where_the_file_system_has_no_hard_links(old, tmp_path, monkeypatch):
    source = tmp_path / "last.pt"
    source.write_bytes(b"weights")

    def no_links(*args):
        raise OSError(1, "Operation not permitted")  # what a file system without hard links answers

    monkeypatch.setattr(os, "link", no_links)
    same_file(source, old)
    assert old.read_bytes() == b"weights" and not old.samefile(source)
    assert leftovers(tmp_path, old.name) == []
