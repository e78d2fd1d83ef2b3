"""parsers/file_changes.py: diffs from before/after reads, the bounds on what waits for a report,
and reading only regular files inside the workspace, as the agent names them."""

from __future__ import annotations

import os
import posixpath
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from parsers.file_changes import (
    MAX_DIFF_WORK,
    MAX_PATH_CHARS,
    MAX_PENDING,
    MAX_PENDING_CHARS,
    FileChanges,
    Reader,
    no_files,
    read_text_file,
    workspace_reader,
)
from tests.support.parsing import Files


def test_a_change_read_before_and_after_is_a_diff_and_is_then_forgotten():
    files = Files(a="one\n")
    changes = FileChanges(files.read)
    changes.before(["a"])
    files.files["a"] = "two\n"
    assert changes.diff("a") == "--- a\n+++ a\n@@ -1 +1 @@\n-one\n+two\n"
    assert changes.diff("a") is None  # reported: no baseline left


def test_a_file_changed_in_too_many_places_for_difflib_gets_no_diff():
    """One changed line in a long file is diffed; with every seventh line changed, the lines
    between the first and the last difference times the lines that differ are past MAX_DIFF_WORK:
    no diff (the change is reported without one) rather than seconds of difflib."""
    lines = [f"line {i}\n" for i in range(20_000)]
    files = Files(big="".join(lines), scattered="".join(lines))
    changes = FileChanges(files.read)
    changes.before(["big", "scattered"])
    files.files["big"] = "".join(lines[:9_999] + ["changed\n"] + lines[10_000:])
    edited = [line if i % 7 else "changed\n" for i, line in enumerate(lines)]
    files.files["scattered"] = "".join(edited)
    one = changes.diff("big")
    assert one is not None and "-line 9999\n+changed\n" in one
    assert 2 * len(lines) * 2 * (len(lines) // 7) > MAX_DIFF_WORK
    assert changes.diff("scattered") is None


def test_the_oldest_announcements_are_forgotten_past_the_text_bound():
    """Past MAX_PENDING_CHARS of announced files' text, the oldest change loses its baseline
    (reported without a diff); the newest keep theirs."""
    size = 1 << 20
    count = MAX_PENDING_CHARS // size + 2
    files = Files(**{f"f{i}": "x" * (size - 1) + "\n" for i in range(count)})
    changes = FileChanges(files.read)
    changes.before(files.files)
    for path in files.files:
        files.files[path] = "changed\n"
    assert changes.diff("f0") is None and changes.diff("f1") is None
    assert all(changes.diff(f"f{i}") is not None for i in range(2, count))
    assert count < MAX_PENDING  # the text bound, not the count, decided


def test_clear_forgets_every_baseline():
    files = Files(a="one\n")
    changes = FileChanges(files.read)
    changes.before(["a"])
    changes.clear()
    files.files["a"] = "two\n"
    assert changes.diff("a") is None


def read_in_thread(read: Callable[[], str | None], fifo: Path) -> list[str | None]:
    """``read()`` in a thread: a read that blocks in open() on ``fifo`` is let go, and fails."""
    got: list[str | None] = []
    reader = threading.Thread(target=lambda: got.append(read()), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked in open(): let it go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
    assert not reader.is_alive()
    return got


def test_read_text_file_reads_only_regular_files_and_a_fifo_does_not_block(tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert read_in_thread(lambda: read_text_file(str(fifo)), fifo) == [None]
    assert read_text_file(str(tmp_path)) is None  # a directory
    assert read_text_file("a\0b") is None  # no file name holds a NUL: not a crash
    (tmp_path / "t.txt").write_text("text\n")
    assert read_text_file(str(tmp_path / "t.txt")) == "text\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A workspace with a file, beside a secret outside it (and a gateway cwd elsewhere)."""
    (tmp_path / "secret.txt").write_text("SECRET\n")
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "secret.txt").write_text("SECRET\n")
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("in the workspace\n")
    return ws


def outcome(read: Reader, path: str) -> str | None:
    try:
        return read(path)
    except FileNotFoundError:
        return "<absent>"


def test_a_relative_path_is_read_from_the_workspace_not_the_gateways_cwd(ws, tmp_path, monkeypatch):
    """The agent runs with the workspace as its cwd: "src/a.py" is the workspace's file, whatever
    the gateway's own cwd holds under that name."""
    gateway_cwd = tmp_path / "gateway"
    (gateway_cwd / "src").mkdir(parents=True)
    (gateway_cwd / "src" / "a.py").write_text("the gateway's own file\n")
    monkeypatch.chdir(gateway_cwd)
    read = workspace_reader(ws)
    assert read("src/a.py") == read("./src/a.py") == "in the workspace\n"
    assert read(str(ws / "src" / "a.py")) == "in the workspace\n"
    assert read("src/../src/a.py") == "in the workspace\n"  # ".." that stays inside


def test_paths_outside_the_workspace_are_not_read(ws, tmp_path):
    """Absolute paths, ".." and links that lead out, to a file or a directory, are refused: None,
    never the outside file's text, and not "absent" either (that would make a creation diff)."""
    (ws / "link.txt").symlink_to(tmp_path / "secret.txt")
    (ws / "linkdir").symlink_to(tmp_path / "outdir")
    (ws / "src" / "up").symlink_to("../..")  # a relative link that climbs out
    (ws / "dangling").symlink_to(tmp_path / "not-yet")
    read = workspace_reader(ws)
    outside = [
        str(tmp_path / "secret.txt"),
        "../secret.txt",
        "src/../../secret.txt",
        "../outdir/secret.txt",
        "link.txt",
        "linkdir/secret.txt",
        "src/up/secret.txt",
        "linkdir/missing.txt",  # not there, but not inside either
        "dangling",
        "/etc/hostname",
        "/dev/zero",
        str(ws) + "/../secret.txt",
    ]
    assert {path: outcome(read, path) for path in outside} == dict.fromkeys(outside)


def test_links_that_stay_inside_the_workspace_are_followed(ws):
    (ws / "alias.py").symlink_to("src/a.py")
    (ws / "lib").symlink_to(ws / "src")
    read = workspace_reader(ws)
    assert read("alias.py") == read("lib/a.py") == "in the workspace\n"


def test_only_regular_files_inside_are_read_not_a_fifo_a_device_or_a_directory(ws):
    fifo = ws / "pipe"
    os.mkfifo(fifo)
    read = workspace_reader(ws)
    assert read_in_thread(lambda: read("pipe"), fifo) == [None]
    assert read("src") is None and read(".") is None and read("") is None  # directories
    # Devices: /dev as the workspace, so they are inside it. /dev/zero would never end.
    devices = workspace_reader("/dev")
    assert devices("zero") is None and devices("null") is None and devices("/dev/zero") is None


def test_a_missing_file_inside_the_workspace_is_one_to_create(ws):
    read = workspace_reader(ws)
    assert outcome(read, "new.txt") == outcome(read, "newdir/deeper/new.txt") == "<absent>"
    changes = FileChanges(read)
    changes.before(["newdir/new.txt"])
    (ws / "newdir").mkdir()
    (ws / "newdir" / "new.txt").write_text("made\n")
    assert changes.diff("newdir/new.txt") == (
        "--- /dev/null\n+++ newdir/new.txt\n@@ -0,0 +1 @@\n+made\n"
    )


def test_odd_paths_are_refused_without_raising(ws):
    read = workspace_reader(ws)
    (ws / ("x" * 200)).write_text("long name\n")
    assert read("x" * 200) == "long name\n"
    odd = ["a\0b", "src/\0", "a/" * (MAX_PATH_CHARS // 2 + 1), "/" * (MAX_PATH_CHARS + 1)]
    assert [outcome(read, path) for path in odd] == [None] * len(odd)


def test_a_link_swapped_in_after_the_check_is_not_followed(ws, tmp_path, monkeypatch):
    """A race: the path is checked while "src" is a directory and "src/a.py" a file, then the
    agent swaps them for links out before the file is opened. The open walks the workspace
    following no link, so the swap is refused, not followed."""
    read = workspace_reader(ws)
    resolve = posixpath.realpath

    def swap_after_check(swap: Callable[[], None]) -> None:
        def realpath(path, *args, **kwargs):
            real = resolve(path, *args, **kwargs)
            swap()
            return real

        monkeypatch.setattr(posixpath, "realpath", realpath)

    def swap_directory() -> None:
        (ws / "src").rename(ws / "src.old")
        (ws / "src").symlink_to(tmp_path / "outdir")

    (tmp_path / "outdir" / "a.py").write_text("SECRET\n")
    swap_after_check(swap_directory)
    assert read("src/a.py") is None
    monkeypatch.undo()

    (ws / "src").unlink()
    (ws / "src.old").rename(ws / "src")

    def swap_file() -> None:
        (ws / "src" / "a.py").unlink()
        (ws / "src" / "a.py").symlink_to(tmp_path / "secret.txt")

    swap_after_check(swap_file)
    assert read("src/a.py") is None


def test_a_parser_not_told_its_workspace_reads_nothing(ws):
    """``no_files``, the default: every change is reported without a diff."""
    changes = FileChanges()
    path = str(ws / "src" / "a.py")
    changes.before([path])
    (ws / "src" / "a.py").write_text("changed\n")
    assert changes.diff(path) is None and changes.created(path) is None
    assert no_files(path) is None


def test_an_outside_file_announced_and_reported_gets_no_diff(ws, tmp_path):
    """Through FileChanges: a change of an outside file, announced then reported, or reported as
    added, makes no diff (the parser reports the change without one)."""
    changes = FileChanges(workspace_reader(ws))
    secret = str(tmp_path / "secret.txt")
    changes.before([secret, "../outdir/secret.txt"])
    (tmp_path / "secret.txt").write_text("")
    assert changes.diff(secret) is None and changes.diff("../outdir/secret.txt") is None
    assert changes.created("../outdir/secret.txt") is None
