"""A one-shot timer for the event loop with microsecond resolution (a Linux ``timerfd``).

uvloop's timers (libuv's) count whole milliseconds: ``call_later(0.0004)`` fires in the next loop
iteration and ``call_later(0.0006)`` after about 1.1 ms. Letting an agent's lines gather for half a
millisecond (``gateway/agent/stdout.py``) needs better, so this arms a ``timerfd`` that the loop watches
as a reader. Python 3.11 has no ``os.timerfd_*`` (3.13 does): libc is called through ctypes, with the
``itimerspec`` built again only when the delay changes. (Arming costs a few microseconds here, most of it the system
call itself in a virtual machine: worth it once per gathered batch, not once per line.)
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Callable
from typing import Final

__all__ = ["FineTimer"]

_CLOCK_MONOTONIC: Final = 1
_TFD_NONBLOCK: Final = os.O_NONBLOCK
_TFD_CLOEXEC: Final = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_create: Callable[..., int] | None
try:
    _create = _libc.timerfd_create
    _settime = _libc.timerfd_settime
except AttributeError:  # not Linux: FineTimer() raises OSError, and callers do without
    _create = None  # no FineTimer is made, so nothing calls _settime
else:
    _create.argtypes = (ctypes.c_int, ctypes.c_int)
    _create.restype = ctypes.c_int
    _settime.restype = ctypes.c_int
# All zero: stops the timer and clears an expiry not yet read.
_DISARM: Final = ctypes.byref(_Itimerspec())


def _spec(seconds: float) -> object:
    """A pointer to the ``itimerspec`` of a one-shot expiry in ``seconds`` (kept alive with it)."""
    ns = max(1, round(seconds * 1e9))  # zero would disarm
    spec = _Itimerspec()
    spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
    return ctypes.byref(spec)


class FineTimer:
    """Calls ``callback()`` from the loop once, ``seconds`` after ``start(seconds)``.

    ``start`` again re-arms it (the earlier expiry is dropped), ``cancel`` disarms it, ``close``
    releases the file descriptor (the timer is unusable after that).
    """

    __slots__ = ("_callback", "_fd", "_loop", "_seconds", "_spec")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        if _create is None:
            raise OSError("timerfd is not available on this system")
        fd = _create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self._fd = fd
        self._loop = loop
        self._callback = callback
        self._seconds = 0.0
        self._spec: object = _DISARM  # built again only when the delay changes
        loop.add_reader(fd, self._fired)

    def start(self, seconds: float) -> None:
        if seconds != self._seconds:
            self._seconds, self._spec = seconds, _spec(seconds)
        self._set(self._spec)

    def cancel(self) -> None:
        if self._fd >= 0:
            self._set(_DISARM)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self._loop.remove_reader(fd)
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def _set(self, spec: object) -> None:
        if _settime(self._fd, 0, spec, None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiry count; reading it clears readiness
        except BlockingIOError:
            return  # cancelled or re-armed after the loop saw it ready
        self._callback()
