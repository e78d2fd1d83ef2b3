"""Frame factory: fills the §2.1 envelope (``message_id``, ``timestamp``, ids) around a payload.

Theory of operation
-------------------
Every frame the gateway sends needs a fresh UUID v4 and an ISO 8601 UTC timestamp with milliseconds.
Done naively (``str(uuid.uuid4())``, ``datetime.now(UTC).isoformat()``) those two cost more CPU than
decoding the agent's line and encoding the frame together, so:

* ``UuidSource`` draws random bytes from the OS 8 KiB at a time, hex-encodes them once, and slices
  32 hex digits per id, setting the version nibble to ``4`` and the variant nibble to one of
  ``89ab`` (RFC 4122 §4.4). The ids are as random as ``uuid4()``'s (same OS source, 122 random bits).
* ``Clock`` formats the ``YYYY-MM-DDTHH:MM:SS.`` prefix once per second and appends milliseconds;
  its timestamps never repeat, so ordering by timestamp is the order frames were made in.

Both sources are injectable (``random_bytes``, ``time``) so the core needs no real clock or entropy
in tests. Nothing here does I/O beyond reading entropy.
"""

from __future__ import annotations

import calendar
import os
import time as _time
from collections.abc import Callable
from typing import Any

from .frames import ENVELOPE_VERSION, Frame, Payload, frame_class

__all__ = ["Clock", "FrameFactory", "UuidSource"]

_VARIANT = {c: "89ab"[int(c, 16) & 3] for c in "0123456789abcdef"}
_BATCH = 512  # ids per entropy read


class UuidSource:
    """Cheap RFC 4122 version-4 UUID strings."""

    __slots__ = ("_buf", "_pos", "_random_bytes")

    def __init__(self, random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self._random_bytes = random_bytes
        self._buf = ""
        self._pos = 0

    def __call__(self) -> str:
        pos = self._pos
        if pos >= len(self._buf):
            self._buf = self._random_bytes(16 * _BATCH).hex()
            pos = 0
        h = self._buf[pos : pos + 32]
        self._pos = pos + 32
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


class Clock:
    """ISO 8601 UTC timestamps with millisecond precision and ``Z``, e.g. ``2026-03-16T09:00:00.123Z``,
    strictly increasing: a frame made in the same millisecond as the one before it gets the next
    millisecond. Masters replaying ``session.history`` order frames by ``timestamp`` then
    ``message_id`` (§2.3); with random UUIDs only distinct timestamps keep the order they were sent in.
    Bursts push the clock ahead by a millisecond per frame; it falls back to real time when they end.
    """

    __slots__ = ("_last_ms", "_prefix", "_second", "_time")

    def __init__(self, time: Callable[[], float] = _time.time) -> None:
        self._time = time
        self._second = -1
        self._prefix = ""
        self._last_ms = -1

    def __call__(self) -> str:
        ms = int(self._time() * 1000)
        if ms <= self._last_ms:
            ms = self._last_ms + 1
        self._last_ms = ms
        s, frac = divmod(ms, 1000)
        if s != self._second:
            self._second = s
            self._prefix = _time.strftime("%Y-%m-%dT%H:%M:%S.", _time.gmtime(s))
        return f"{self._prefix}{frac:03d}Z"


def _ms_of(timestamp: str) -> int | None:
    """Milliseconds since the epoch of a timestamp this clock made (``...T..:..:...mmmZ``)."""
    try:
        whole = _time.strptime(timestamp[:19], "%Y-%m-%dT%H:%M:%S")
        return calendar.timegm(whole) * 1000 + int(timestamp[20:23])
    except (ValueError, IndexError):
        return None


class FrameFactory:
    """Builds frames of one Agent Session: ``factory.frame(payload, turn_id=...)``."""

    __slots__ = ("clock", "new_id", "session_id")

    def __init__(
        self,
        session_id: str,
        *,
        new_id: Callable[[], str] | None = None,
        clock: Callable[[], str] | None = None,
    ) -> None:
        self.session_id = session_id
        self.new_id = new_id or UuidSource()
        self.clock = clock or Clock()

    def clock_not_before(self, timestamp: str | None) -> None:
        """Frames made from now on get timestamps after ``timestamp`` (a session read back after a
        restart goes on after its saved frames, whatever the wall clock says)."""
        ms = _ms_of(timestamp) if timestamp else None
        if ms is not None and isinstance(self.clock, Clock):
            self.clock._last_ms = max(self.clock._last_ms, ms)

    def frame(
        self,
        payload: Payload,
        *,
        turn_id: str | None = None,
        parent_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Frame:
        return frame_class(payload)(
            v=ENVELOPE_VERSION,
            message_id=self.new_id(),
            timestamp=self.clock(),
            session_id=self.session_id,
            turn_id=turn_id,
            parent_id=parent_id,
            metadata=metadata,
            payload=payload,
        )
