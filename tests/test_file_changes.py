"""parsers/file_changes.py: diffs from before/after reads, the bounds on what waits for a report,
and reading only regular files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from parsers.file_changes import (
    MAX_DIFF_WORK,
    MAX_PENDING,
    MAX_PENDING_CHARS,
    FileChanges,
    read_text_file,
)


class Files:
    """A workspace in memory (paths to texts) that counts its reads."""

    def __init__(self, **files: str) -> None:
        self.files = dict(files)

    def read(self, path: str) -> str | None:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]


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


def test_only_regular_files_are_read_and_a_fifo_does_not_block(tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str | None] = []
    reader = threading.Thread(target=lambda: got.append(read_text_file(str(fifo))), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # blocked in open(): let it go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
    assert got == [None] and not reader.is_alive()
    assert read_text_file(str(tmp_path)) is None  # a directory
    (tmp_path / "t.txt").write_text("text\n")
    assert read_text_file(str(tmp_path / "t.txt")) == "text\n"
