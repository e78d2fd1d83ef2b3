"""Sessions that outlive the gateway process: each session's record and replay buffer on disk.

Theory of operation
-------------------
With ``[server] state_dir`` set, every session has a directory ``<state_dir>/sessions/<id>/``
(mode 0700, its files 0600; nothing in it holds the token) with two files:

* ``session.json``, the record: what ``GET /v1/session`` shows, the agent's session id, usage
  totals, the turn that was open, and ``clean`` (the gateway stopped gracefully). It is rewritten
  whole (temporary file, then rename) whenever one of its fields changes;
* ``frames.log``, the replay buffer: one line per frame the session broadcast,
  ``<seq> <message_id> <frame JSON>\\n``, and ``<seq> <message_id> -\\n`` for a frame sent to one
  connection only (a master may name it as the last frame it saw). Encoded JSON never holds a raw
  newline, so a line is a frame.

Flush policy: frames are collected in memory and written to the file ``FLUSH_INTERVAL_SEC`` (10 ms)
after the first of them (one ``writev`` for all the frames of that interval), so a crash of the
gateway process loses at most its last 10 ms of frames; the log is fsynced (in a worker thread) at the end of
every turn and at shutdown, so a crash of the machine loses at most the running
turn's frames. The log stays bounded: once it has grown past twice the buffer's size (plus
``COMPACT_SLACK``), it is rewritten from what the in-memory buffer still holds.

A full disk (or any failed write) loses nothing acknowledged and serves nothing torn. A record
that cannot be written is an error for its caller (a session create answers 507
``INSUFFICIENT_STORAGE``); a later rewrite that fails is kept and tried again. A flush that fails
part way is cut back to its last whole line (``ftruncate``); the frames not written stay in memory,
in order (at most ``MAX_UNSAVED_BYTES`` a session: past it the oldest go, and one id-only line, the
newest that went, keeps the sequence numbers exact, so a reattach after a restart is told how many
frames are missing: ``truncated``, ``lost_frame_count``), and every ``RETRY_SEC`` the session tries
again, by itself, until the disk takes them. While any session's files cannot be written,
``StateHealth`` says so (``/readyz``, the metrics). Reading a log checks every line (a sequence
number, an id, a whole JSON object) and stops at the first torn one: what follows it is not served,
the log is cut back there before it is written again, and the restart says so (a log line, a
metric, and a reattach from before it is ``truncated``).

Loading never raises: a session whose files are unreadable, corrupt or of another format version is
reported as a ``LoadError`` and skipped; its files stay where they are for a person to look at.

The directory is untrusted input. The agent runs as the gateway's user and may have written there
(a symlink, a hard link, a FIFO, a sparse file of a terabyte), so every file is reached through
``gateway/storage/nofollow.py``: relative to the session directory's descriptor (opened without following
a link), created ``O_EXCL | O_NOFOLLOW`` and renamed into place, read only when it is a regular
file whose size is within its bound (``MAX_RECORD_BYTES``; the log: what compaction lets it reach),
checked before reading. An entry of ``sessions/`` that is not a directory is skipped, never
followed nor deleted. Sessions are read one at a time, in the order of their records, so a start
holds one session's log at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.storage import nofollow
from gateway.storage.frame_log import Entry, log_lines, parse_log, write_all
from gateway.storage.health import StateHealth, StateMetrics
from gateway.storage.ledger import LedgerFile

__all__ = [
    "FORMAT",
    "VERSION",
    "LoadError",
    "Loaded",
    "SavedSession",
    "StateDir",
    "StateDirError",
    "StateHealth",
    "max_log_bytes",
]

log = logging.getLogger("rawp_gateway.persistence")

FORMAT: Final = "rawp-gateway-session"
VERSION: Final = 1
RECORD: Final = "session.json"
FRAMES: Final = "frames.log"
LOCK: Final = "lock"
COMPACT_SLACK: Final = 4 * 1024 * 1024
MAX_RECORD_BYTES: Final = 1024 * 1024  # a record is a few hundred bytes; more is not ours
FLUSH_INTERVAL_SEC: Final = 0.01  # frames are written at most this long after they were made
RETRY_SEC: Final = 1.0  # a write that failed (a full disk) is tried again this long after
MAX_UNSAVED_BYTES: Final = 8 * 1024 * 1024  # frames a session holds for its log while it fails


def max_log_bytes(max_buffer_bytes: int) -> int:
    """The largest frame log a session with a buffer of at most ``max_buffer_bytes`` can leave:
    compaction rewrites it past twice the buffer and ``COMPACT_SLACK``, and one flush interval's
    frames may come on top. A larger file is not the gateway's and is not read."""
    return 2 * max_buffer_bytes + 2 * COMPACT_SLACK


@dataclass(frozen=True, slots=True)
class Loaded:
    """A session read back from disk."""

    record: dict[str, Any]
    entries: list[Entry]
    torn: bool  # a line of the log was cut short or unreadable: the log was read up to it
    saved: SavedSession
    torn_at: int | None = None  # the offset of that line in the log
    log_size: int = 0  # the log's size as found


@dataclass(frozen=True, slots=True)
class LoadError:
    session_id: str
    reason: str  # bounded, for metrics: unreadable, corrupt, version
    message: str


class StateDirError(Exception):
    """The state directory cannot be used (a file of that name, no permission, another gateway
    holds it): the gateway does not start, since it could not keep the sessions it promises to
    keep."""


class StateDir:
    """``<state_dir>/sessions/``: one ``SavedSession`` per session.

    One gateway at a time: ``<state_dir>/lock`` is held with ``flock`` while the ``StateDir`` is
    open (the kernel lets go of it when the process dies, SIGKILL included). Two gateways on one
    directory would each restore, run and rewrite the same sessions."""

    def __init__(self, root: Path, metrics: StateMetrics | None = None) -> None:
        self.root = root
        self.sessions = root / "sessions"
        self.health = StateHealth(metrics)
        old = os.umask(0o077)
        try:
            with contextlib.suppress(FileExistsError):  # a file there: open_dir says so
                root.mkdir(parents=True)
            self._root_fd = nofollow.open_dir(root)
            try:
                self._fd = nofollow.open_dir("sessions", dir_fd=self._root_fd, create=True)
                lock = os.open(
                    LOCK,
                    os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    0o600,
                    dir_fd=self._root_fd,
                )
            except BaseException:
                os.close(self._root_fd)
                raise
        except OSError as err:
            raise StateDirError(
                f"state_dir {str(root)!r} cannot be used: {err.strerror or err} "
                f"({err.filename or self.sessions})"
            ) from None
        finally:
            os.umask(old)
        try:
            nofollow.regular_fd(lock, LOCK)
            self._lock = open(lock, "r+")  # noqa: SIM115 - held until close()
        except OSError:
            self._close_dirs()
            raise StateDirError(f"state_dir {str(root)!r}: {LOCK} is not a regular file") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.seek(0)
            holder = self._lock.read(32).strip()
            self._lock.close()
            self._close_dirs()
            raise StateDirError(
                f"state_dir {str(root)!r} is in use by another gateway"
                + (f" (pid {holder})" if holder.isdigit() else "")
            ) from None
        self._lock.truncate(0)
        self._lock.write(f"{os.getpid()}\n")
        self._lock.flush()
        for fd in (self._root_fd, self._fd):
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o700)

    def _close_dirs(self) -> None:
        os.close(self._fd)
        os.close(self._root_fd)

    def close(self) -> None:
        """Let another gateway have the directory."""
        self._lock.close()
        self._close_dirs()

    def ledger(self) -> LedgerFile:
        """The budgets' ledger, beside ``sessions/`` (gateway/storage/ledger.py)."""
        return LedgerFile(self._root_fd)

    def create(self, session_id: str) -> SavedSession:
        """A new session's directory (``OSError`` if it cannot be made: nothing is left)."""
        os.mkdir(session_id, 0o700, dir_fd=self._fd)
        try:
            dir_fd = nofollow.open_dir(session_id, dir_fd=self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(session_id, dir_fd=self._fd)
            raise
        return SavedSession(
            self.sessions / session_id,
            dir_fd=dir_fd,
            parent_fd=os.dup(self._fd),
            health=self.health,
        )

    def load(self, *, max_buffer_bytes: int = 256 * 1024 * 1024) -> Iterator[Loaded | LoadError]:
        """Every session directory, oldest record first (the order they are listed in again),
        each read when the caller asks for it. A record whose history may hold more than
        ``max_buffer_bytes`` is not used, and a log over what its history can leave
        (``max_log_bytes``) is not read."""
        try:
            names = list(nofollow.subdirectories(self._fd))
        except OSError as err:
            yield LoadError("*", "unreadable", f"cannot list {self.sessions}: {err.strerror}")
            return
        order: list[tuple[str, str]] = []
        for name, is_dir in names:
            if is_dir:
                order.append((_created_at(self._fd, name), name))
            else:
                yield LoadError(
                    name, "corrupt", f"sessions/{name} is not a directory (a link or a file); left"
                )
        order.sort()
        for _, name in order:
            got = _load_one(self._fd, self.sessions, name, max_buffer_bytes)
            if isinstance(got, Loaded):
                got.saved.health = self.health
            yield got


def _created_at(parent_fd: int, name: str) -> str:
    """Where the session goes in the listing: its record's ``created_at`` ("" when unusable)."""
    try:
        fd = nofollow.open_dir(name, dir_fd=parent_fd)
    except OSError:
        return ""
    try:
        record = json.loads(nofollow.read_file(fd, RECORD, MAX_RECORD_BYTES))
        created = record.get("created_at") if isinstance(record, dict) else None
        return created if isinstance(created, str) else ""
    except (OSError, ValueError):
        return ""
    finally:
        os.close(fd)


def _load_one(parent_fd: int, parent: Path, sid: str, max_buffer: int) -> Loaded | LoadError:
    try:
        dir_fd = nofollow.open_dir(sid, dir_fd=parent_fd)
    except OSError as err:
        return LoadError(sid, "unreadable", f"cannot open the directory: {err.strerror}")
    got: Loaded | LoadError = LoadError(sid, "unreadable", "interrupted")
    try:
        got = _load_from(dir_fd, parent_fd, parent / sid, max_buffer)
    finally:
        if not isinstance(got, Loaded):
            os.close(dir_fd)
    return got


def _load_from(dir_fd: int, parent_fd: int, path: Path, max_buffer: int) -> Loaded | LoadError:
    sid = path.name
    try:
        raw = nofollow.read_file(dir_fd, RECORD, MAX_RECORD_BYTES)
    except nofollow.TooLarge:
        return LoadError(sid, "corrupt", f"{RECORD} is larger than {MAX_RECORD_BYTES} bytes")
    except OSError as err:
        return LoadError(sid, "unreadable", f"cannot read {RECORD}: {err.strerror}")
    try:
        record = json.loads(raw)
    except ValueError as err:
        return LoadError(sid, "corrupt", f"{RECORD} is not JSON: {err}")
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return LoadError(sid, "corrupt", f"{RECORD} is not a {FORMAT} record")
    if record.get("version") != VERSION:
        return LoadError(
            sid,
            "version",
            f"{RECORD} has format version {record.get('version')!r}; this gateway reads {VERSION}",
        )
    problem = _check_record(record, sid, max_buffer)
    if problem is not None:
        return LoadError(sid, "corrupt", f"{RECORD}: {problem}")
    max_log = max_log_bytes(record["buffer"]["max_bytes"])
    try:
        data = nofollow.read_file(dir_fd, FRAMES, max_log)
    except FileNotFoundError:
        data = b""
    except nofollow.TooLarge:
        return LoadError(
            sid, "corrupt", f"{FRAMES} is larger than {max_log} bytes, more than compaction leaves"
        )
    except OSError as err:
        return LoadError(sid, "unreadable", f"cannot read {FRAMES}: {err.strerror}")
    entries, torn_at = parse_log(data)
    good = len(data) if torn_at is None else torn_at
    last_seq = entries[-1][0] if entries else -2
    saved = SavedSession(
        path, dir_fd=dir_fd, parent_fd=os.dup(parent_fd), log_bytes=good, last_seq=last_seq
    )
    return Loaded(record, entries, torn_at is not None, saved, torn_at, len(data))


_FIELDS: Final[dict[str, type | tuple[type, ...]]] = {
    "session_id": str,
    "agent": str,
    "workspace_path": str,
    "origin": str,
    "created_at": str,
    "mode": str,
    "turn_index": int,
    "reattach_window_sec": (int, float),
    "clean": bool,
    "buffer": dict,
}


def _check_record(record: dict[str, Any], sid: str, max_buffer: int) -> str | None:
    for key, kind in _FIELDS.items():
        value = record.get(key)
        if isinstance(value, bool) and kind is not bool:
            return f"{key} has the wrong type"
        if not isinstance(value, kind):
            return f"{key} is missing or of the wrong type"
    if record["session_id"] != sid:
        return "session_id does not match its directory"
    max_bytes = record["buffer"].get("max_bytes")
    if type(max_bytes) is not int or not 0 <= max_bytes <= max_buffer:
        return f"buffer.max_bytes is not an integer from 0 to {max_buffer} (max_buffer_bytes)"
    for key in ("name", "agent_session_id", "open_turn_id"):
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key} has the wrong type"
    return None


class SavedSession:
    """One session's directory: the record and the frame log, reached through ``dir_fd`` (its
    descriptor, owned); ``parent_fd`` (owned) is ``sessions/``, to remove it."""

    def __init__(
        self,
        path: Path,
        *,
        dir_fd: int,
        parent_fd: int,
        log_bytes: int = 0,
        last_seq: int = -2,
        health: StateHealth | None = None,
    ) -> None:
        self.path = path  # for messages and the file store's own path
        self.dir_fd = dir_fd
        self._parent_fd = parent_fd
        self._fd: int | None = None
        self._pending: list[Entry] = []  # not written yet: in order, after what the log has
        self._flush_scheduled = False
        self.log_bytes = log_bytes  # the log's whole lines: what it is cut back to on a failure
        self.last_seq = last_seq  # the seq of the log's last line
        self.compact_above: int | None = None  # set by the owner from its history's size
        self.entries: Callable[[], list[Entry]] | None = None  # the history's, for compaction
        self.health = health or StateHealth()
        self._record: bytes | None = None  # a record that could not be written yet
        self._log_error: OSError | None = None  # the last write of the log failed (until one works)
        self._retry: asyncio.TimerHandle | None = None
        self._sync: asyncio.Future[Any] | None = None
        self.removed = False

    @property
    def failing(self) -> bool:
        """Something of this session could not be written and is held in memory meanwhile."""
        return self._log_error is not None or self._record is not None

    # --- the record ---------------------------------------------------------------------------

    def write_record(self, record: dict[str, Any]) -> None:
        """Rewrite the record; ``OSError`` if it cannot be (then it is tried again every
        ``RETRY_SEC``, unless a newer one is written first)."""
        if self.removed or self.dir_fd < 0:
            return
        self._record = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
        self._write_record()

    def _write_record(self) -> None:
        assert self._record is not None
        try:
            nofollow.replace_file(self.dir_fd, RECORD, self._record, fsync=False)
        except OSError as err:
            self._failed("record", err)
            raise
        self._record = None
        self._recovered()

    # --- the frame log ------------------------------------------------------------------------

    def append(self, seq: int, message_id: str, data: bytes | None) -> None:
        """Add a frame (``None``: an id only); written within ``FLUSH_INTERVAL_SEC`` (while the
        log cannot be written: at the next retry)."""
        self._pending.append((seq, message_id, data))
        if not self._flush_scheduled and self._retry is None:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(FLUSH_INTERVAL_SEC, self.flush)

    def _log_fd(self) -> int:
        if self._fd is None:
            fd = nofollow.append_fd(self.dir_fd, FRAMES)
            try:
                # Whatever is past the last whole line (a torn line found at load, a cut-back that
                # failed) goes before anything is appended: a new line never fuses with it.
                if os.fstat(fd).st_size != self.log_bytes:
                    os.ftruncate(fd, self.log_bytes)
            except OSError:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd

    def flush(self) -> None:
        self._flush_scheduled = False
        if self.removed or self.dir_fd < 0:  # ended, or released: nothing is written any more
            self._pending.clear()
            return
        if not self._pending:
            return
        records, self._pending = self._pending, []
        parts, ends = log_lines(records)
        try:
            fd = self._log_fd()
        except OSError as cannot:
            self._not_written(records, cannot)
            return
        written, err = write_all(fd, parts)
        whole = bisect_right(ends, written)  # the records written whole
        cut = ends[whole - 1] if whole else 0
        if whole:
            self.last_seq = records[whole - 1][0]
        if err is None:
            self.log_bytes += cut
            if self._log_error is not None:
                self._log_error = None
                self._recovered()
            if self.compact_above is not None and self.log_bytes > self.compact_above:
                self.compact()
            return
        try:  # the torn line goes: back to the last whole record
            if written > cut:
                os.ftruncate(fd, self.log_bytes + cut)
        except OSError:
            self._close_log()  # reopened (and cut back) by the next try
        self.log_bytes += cut
        self._not_written(records[whole:], err)

    def _not_written(self, records: list[Entry], err: OSError) -> None:
        """``records`` could not be written: held, in order, before what came since, for the
        next try; past ``MAX_UNSAVED_BYTES`` the oldest go, and one id-only line (the newest of
        them) stands for them, so the log's sequence numbers say how many are missing."""
        self._pending[:0] = records
        held = 0
        keep = len(self._pending)
        for i in range(len(self._pending) - 1, -1, -1):
            data = self._pending[i][2]
            held += 64 + (len(data) if data is not None else 0)
            if held > MAX_UNSAVED_BYTES:
                keep = len(self._pending) - 1 - i
                break
        if keep < len(self._pending):
            gone = self._pending[: len(self._pending) - keep]
            frames = sum(1 for _, _, data in gone if data is not None)
            seq, mid, _ = gone[-1]
            self._pending = [(seq, mid, None), *self._pending[len(gone) :]]
            if self.health.metrics is not None and frames:
                self.health.metrics.history_gap(frames)
            log.error(
                "frames dropped from the frame log: the disk did not take them in time",
                extra={"path": str(self.path), "frames": frames},
            )
        self._log_error = err
        self._failed("log", err)

    def _failed(self, file: str, err: OSError) -> None:
        if self.health.failed(self.path.name, file, err):
            log.error(
                "cannot write the session's %s; held in memory, tried again every %ss",
                file,
                RETRY_SEC,
                extra={"path": str(self.path), "error": err},
            )
        if self._retry is None and not self.removed:
            self._retry = asyncio.get_running_loop().call_later(RETRY_SEC, self._try_again)

    def _recovered(self) -> None:
        if not self.failing and self.health.recovered(self.path.name):
            log.warning("the session's files are written again", extra={"path": str(self.path)})

    def _try_again(self) -> None:
        self._retry = None
        if self.removed or self.dir_fd < 0:
            return
        if self._record is not None:
            with contextlib.suppress(OSError):  # said once, when it first failed
                self._write_record()
        if self._pending:
            self.flush()  # compacts too, once the log takes them
        elif self.compact_above is not None and self.log_bytes > self.compact_above:
            self.compact()  # what failed last
        elif self._log_error is not None:
            self._log_error = None
            self._recovered()

    def compact(self) -> None:
        """Rewrite the log from the history's entries (it holds what a reattach can still get)."""
        if self.entries is None or self.removed:
            return
        entries = self.entries()
        parts, _ = log_lines(entries)
        data = b"".join(parts)
        try:
            nofollow.replace_file(self.dir_fd, FRAMES, data, fsync=True)
        except OSError as err:  # the log as it is stays whole; tried again later
            self._log_error = err
            self._failed("log", err)
            return
        self._close_log()
        self.log_bytes = len(data)
        if entries:
            self.last_seq = entries[-1][0]
        self._pending = [e for e in self._pending if e[0] > self.last_seq]
        if self._log_error is not None:
            self._log_error = None
            self._recovered()

    def _close_log(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def sync(self) -> None:
        """Write what is pending and fsync the log, now (shutdown)."""
        self.flush()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)

    def sync_soon(self) -> None:
        """Write what is pending and fsync the log in a worker thread (end of a turn)."""
        self.flush()
        if self._fd is None or (self._sync is not None and not self._sync.done()):
            return
        fd = os.dup(self._fd)  # the thread's own descriptor: ours may be closed meanwhile

        def fsync() -> None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        self._sync = asyncio.get_running_loop().run_in_executor(None, fsync)

    def close(self) -> None:
        self.flush()
        self._close_log()

    def release(self) -> None:
        """Close the directory's descriptors (the gateway stops; the files stay)."""
        self.close()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.failing:
            log.error(
                "the session's last frames or record could not be written before the stop; "
                "a reattach after the restart is told frames are missing",
                extra={"path": str(self.path), "frames": len(self._pending)},
            )
        self._pending.clear()
        self._record = None
        self._log_error = None
        self.health.recovered(self.path.name)
        for fd in (self.dir_fd, self._parent_fd):
            if fd >= 0:
                os.close(fd)
        self.dir_fd = self._parent_fd = -1

    def remove(self) -> None:
        """The session ended: its files go (never through a link: see ``nofollow.remove_tree``)."""
        self._pending.clear()
        self._record = None
        self._log_error = None
        self.removed = True
        parent_fd, self._parent_fd = self._parent_fd, -1
        self.release()
        if parent_fd < 0:
            return
        try:
            if not nofollow.remove_tree(parent_fd, self.path.name):
                log.warning(
                    "session directory not removed: it is not a directory any more",
                    extra={"path": str(self.path)},
                )
        finally:
            os.close(parent_fd)
