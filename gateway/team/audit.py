"""The audit log of docs/identities.md: who did what to which session, one JSON object per line.

Theory of operation
-------------------
``AuditLog.record(...)`` is called on the event loop by the request handlers and the sessions; it
only encodes the record and appends it to a bounded buffer (``MAX_PENDING`` records), then wakes
the writer. The writer task takes everything buffered and appends it to the file in a worker
thread, so a slow disk never stops the loop; when the file passes ``max_bytes`` it is rotated
(``audit.jsonl`` → ``audit.jsonl.1`` → ... → ``audit.jsonl.<keep>``, the oldest removed). A buffer
that is full (the disk cannot keep up) drops the newest records, counts them and says so in the
gateway log, once per burst. ``close()`` writes what is left.

Records: ``time``, ``user``, ``role``, ``peer``, ``action``, ``session_id``, ``result`` (``ok`` or
``refused``) and ``detail``. Callers pass no secrets: never a token, never file contents; a
permission's tool input is cut to ``MAX_INPUT_BYTES``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec

from gateway.team.roles import Identity

__all__ = ["MAX_INPUT_BYTES", "AuditLog", "cut_input"]

log = logging.getLogger("rawp_gateway.audit")

MAX_PENDING: Final = 10_000  # records waiting for the writer
MAX_INPUT_BYTES: Final = 1024  # of a permission's tool input
MAX_DETAIL_CHARS: Final = 512  # of any other string in a record's detail

_encoder = msgspec.json.Encoder()


def cut_input(value: Any) -> str:
    """A tool's input as JSON text, cut to ``MAX_INPUT_BYTES`` (on a character boundary)."""
    try:
        text = _encoder.encode(value)
    except (TypeError, msgspec.EncodeError):
        text = repr(value).encode()
    if len(text) <= MAX_INPUT_BYTES:
        return text.decode("utf-8", "replace")
    return text[:MAX_INPUT_BYTES].decode("utf-8", "ignore") + "…"


class AuditLog:
    def __init__(self, path: Path | None, *, max_bytes: int, keep: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._pending: list[bytes] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self._size = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def start(self) -> None:
        if self.path is None or self._task is not None:
            return
        try:  # a log that cannot be written stops the start: nothing would be recorded
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as f:
                self._size = f.tell()
        except OSError as err:
            raise SystemExit(
                f"rawp-gateway: cannot write the audit log {self.path}: {err.strerror or err}"
            ) from None
        self._task = asyncio.get_running_loop().create_task(self._writer())

    async def close(self) -> None:
        """Write what is buffered, then stop the writer (never two writes at once)."""
        task, self._task = self._task, None
        if task is not None:
            self._closing = True
            self._wake.set()
            await task

    def record(
        self,
        action: str,
        identity: Identity | None,
        *,
        peer: str | None,
        session_id: str | None = None,
        result: str = "ok",
        detail: dict[str, Any] | None = None,
    ) -> None:
        if self.path is None:
            return
        if len(self._pending) >= MAX_PENDING:
            if not self.dropped:
                log.error(
                    "audit log cannot keep up: records dropped", extra={"path": str(self.path)}
                )
            self.dropped += 1
            return
        self.dropped = 0
        entry = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "user": identity.user if identity is not None else None,
            "role": identity.role if identity is not None else None,
            "peer": peer,
            "action": action,
            "session_id": session_id,
            "result": result,
            "detail": detail or {},
        }
        self._pending.append(_encoder.encode(entry) + b"\n")
        self._idle.clear()
        self._wake.set()

    async def flush(self) -> None:
        """Wait until every record made so far is in the file."""
        if self._task is not None:
            await self._idle.wait()

    async def _writer(self) -> None:
        while not (self._closing and not self._pending):
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            if batch:
                try:
                    await asyncio.to_thread(self._write, batch)
                except OSError as err:
                    log.error("cannot write the audit log: %s", err, extra={"records": len(batch)})
            if not self._pending:
                self._idle.set()

    def _write(self, batch: list[bytes]) -> None:
        """Append ``batch`` (in a worker thread), rotating first when the file is full."""
        assert self.path is not None
        data = b"".join(batch)
        if self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        with open(self.path, "ab") as f:
            f.write(data)
        self._size += len(data)

    def _rotate(self) -> None:
        path = self.path
        assert path is not None
        oldest = path.with_name(f"{path.name}.{self.keep}")
        with contextlib.suppress(FileNotFoundError):
            oldest.unlink()
        for n in range(self.keep - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(
                    path.with_name(f"{path.name}.{n}"), path.with_name(f"{path.name}.{n + 1}")
                )
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, path.with_name(f"{path.name}.1"))
        self._size = 0
