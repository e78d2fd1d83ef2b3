"""Frame factory: fills the §2.1 envelope (``message_id``, ``timestamp``, ids) around a payload.

Theory of operation
-------------------
Every frame the gateway sends needs a fresh UUID v4 and an ISO 8601 UTC timestamp with milliseconds.
Done naively (``str(uuid.uuid4())``, ``datetime.now(UTC).isoformat()``) those two cost more CPU than
decoding the agent's line and encoding the frame together, so:

* ``UuidSource`` draws random bytes from the OS 8 KiB at a time and formats the 512 ids they make
  in one go (C-level slice assignments), setting the version nibble to ``4`` and the variant nibble
  to one of ``89ab`` (RFC 4122 §4.4); a frame's id is then a list pop. The ids are as random as
  ``uuid4()``'s (same OS source, 122 random bits).
* ``Clock`` formats the ``YYYY-MM-DDTHH:MM:SS.`` prefix once per second and appends milliseconds
  from a table; its timestamps never repeat, so ordering by timestamp is the order frames were made
  in.

Both sources are injectable (``random_bytes``, ``time``) so the core needs no real clock or entropy
in tests. Nothing here does I/O beyond reading entropy.
"""

from __future__ import annotations

import calendar
import os
import time as _time
from collections.abc import Callable
from typing import Any, Final

from gateway.protocol.frames import ENVELOPE_VERSION, Frame, Payload, frame_class

__all__ = ["Clock", "FrameFactory", "UuidSource"]

_BATCH = 512  # ids per entropy read
# Where each of the 32 hex digits of an id goes in its 37-character slot "8-4-4-4-12 ".
_SLOT = 37
_POSITION = [i + (i >= 8) + (i >= 12) + (i >= 16) + (i >= 20) for i in range(32)]
_VARIANT = bytes.maketrans(b"0123456789abcdef", b"89ab89ab89ab89ab")  # RFC 4122 variant 10xx
_MILLIS = tuple(f"{ms:03d}Z" for ms in range(1000))


# The last second _second_prefix() was asked for and its prefix, one tuple: read and replaced
# whole, so a frame made in a worker thread (a conversation replayed) never sees half of it.
_last_prefix: tuple[int, str] = (-1, "")


def _second_prefix(second: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS.`` of a second since the epoch. The clocks of many sessions at a few
    frames a second each cross into a new second with nearly every frame: they share one strftime
    a second instead of one per frame."""
    global _last_prefix
    last = _last_prefix
    if last[0] != second:
        last = _last_prefix = (second, _time.strftime("%Y-%m-%dT%H:%M:%S.", _time.gmtime(second)))
    return last[1]


def _format_ids(random: bytes) -> list[str]:
    """Version-4 UUID strings made of ``random`` (16 bytes each), in order. Built for a whole batch
    at once with slice assignments over a ``bytearray`` (C loops), so one id costs a list pop rather
    than five slices and an f-string."""
    n = len(random) // 16
    digits = random.hex().encode()
    out = bytearray(b"-" * (_SLOT * n))
    for i, position in enumerate(_POSITION):
        out[position::_SLOT] = digits[i::32]
    out[14::_SLOT] = b"4" * n  # the version nibble
    out[19::_SLOT] = digits[16::32].translate(_VARIANT)
    out[36::_SLOT] = b" " * n
    return out.decode().split()


class UuidSource:
    """Cheap RFC 4122 version-4 UUID strings."""

    __slots__ = ("_ids", "_random_bytes")

    def __init__(self, random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        self._random_bytes = random_bytes
        self._ids: list[str] = []  # the batch, last id first

    def __call__(self) -> str:
        ids = self._ids
        if not ids:
            ids = self._ids = _format_ids(self._random_bytes(16 * _BATCH))
            ids.reverse()
        return ids.pop()


class Clock:
    """ISO 8601 UTC timestamps with millisecond precision and ``Z``, e.g. ``2026-03-16T09:00:00.123Z``,
    strictly increasing: a frame made in the same millisecond as the one before it gets the next
    millisecond. Masters replaying ``session.history`` order frames by ``timestamp`` then
    ``message_id`` (§2.3); with random UUIDs only distinct timestamps keep the order they were sent in.
    Bursts push the clock ahead by a millisecond per frame; it falls back to real time when they end.
    """

    __slots__ = ("_last_ms", "_prefix", "_second_ms", "_time")

    def __init__(self, time: Callable[[], float] = _time.time) -> None:
        self._time = time
        self._second_ms = -1000  # the first millisecond of the second ``_prefix`` is for
        self._prefix = ""
        self._last_ms = -1

    def __call__(self) -> str:
        ms = int(self._time() * 1000)
        if ms <= self._last_ms:
            ms = self._last_ms + 1
        self._last_ms = ms
        frac = ms - self._second_ms  # never negative: ms only grows
        if frac >= 1000:
            second, frac = divmod(ms, 1000)
            self._second_ms = ms - frac
            self._prefix = _second_prefix(second)
        return self._prefix + _MILLIS[frac]

    def not_before(self, timestamp: str) -> None:
        """Timestamps from now on come after ``timestamp`` (one this clock's format), whatever the
        time source says; a timestamp it cannot read changes nothing."""
        ms = _ms_of(timestamp)
        if ms is not None:
            self._last_ms = max(self._last_ms, ms)


def _ms_of(timestamp: str) -> int | None:
    """Milliseconds since the epoch of a timestamp this clock made (``...T..:..:...mmmZ``)."""
    try:
        whole = _time.strptime(timestamp[:19], "%Y-%m-%dT%H:%M:%S")
        return calendar.timegm(whole) * 1000 + int(timestamp[20:23])
    except (ValueError, IndexError):
        return None


# One batch of ready ids for the whole process, not one per session: 512 formatted ids are ~45 KiB.
_SHARED_IDS: Final = UuidSource()


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
        self.new_id = new_id or _SHARED_IDS
        self.clock = clock or Clock()

    def clock_not_before(self, timestamp: str | None) -> None:
        """Frames made from now on get timestamps after ``timestamp`` (a session read back after a
        restart goes on after its saved frames, whatever the wall clock says)."""
        if timestamp and isinstance(self.clock, Clock):
            self.clock.not_before(timestamp)

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
