"""Which event stream of a Streamable HTTP ``/acp`` connection a message of the gateway's goes on
(sans-IO): the session's, or the connection's (docs/acp-masters.md#streamable-http).

The remote-transport RFD has a connection-scoped stream and one stream per session: a session's
``session/update``\\ s, the gateway's requests about it (``session/request_permission``) and the
answers to the client's requests about it go on that session's stream; the rest (``initialize``,
``session/new``, ``session/list``) on the connection's. ``SessionRoutes`` names the session of each
message: the ``sessionId`` of a notification's or request's params, or, for an answer, the
``sessionId`` of the request it answers (``expect`` remembers it as the request comes in). A
``session/load``'s answer goes on the session's stream too, after the replay it ends: the RFD puts it
on the connection's, where a client could read it before the replay on the other stream.

Every answer or message with no session named, or one that cannot be read (the gateway's own
messages always can), goes on the connection's stream: a client reads both alike, so the worst a
wrong guess costs is the order of two streams. Requests remembered are bounded
(``MAX_EXPECTED``): past it an answer goes on the connection's stream.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = ["MAX_EXPECTED", "SessionRoutes"]

MAX_EXPECTED: Final = 4096  # client requests in flight whose answer's session is remembered
MAX_SESSION_ID_CHARS: Final = 256


class _Params(msgspec.Struct):
    sessionId: Any = None  # ACP's name


class _Routed(msgspec.Struct):
    id: Any = msgspec.UNSET
    method: Any = None
    params: _Params | None = None


_decode = msgspec.json.Decoder(_Routed).decode


def _read(data: str | bytes) -> _Routed | None:
    try:
        return _decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None


def _session(message: _Routed) -> str | None:
    sid = message.params.sessionId if message.params is not None else None
    if isinstance(sid, str) and 0 < len(sid) <= MAX_SESSION_ID_CHARS:
        return sid
    return None


def _key(rpc_id: Any) -> tuple[str, Any] | None:
    # 1 and "1" are two ids; a bool is not an id at all.
    if isinstance(rpc_id, bool) or not isinstance(rpc_id, int | str):
        return None
    return (type(rpc_id).__name__, rpc_id)


class SessionRoutes:
    """The session each outgoing message belongs to, for one connection."""

    def __init__(self) -> None:
        self._expected: dict[tuple[str, Any], str] = {}  # a client request's id -> its session

    def expect(self, data: str | bytes) -> None:
        """A message from the client: a request about a session has its answer go there."""
        message = _read(data)
        if message is None or not isinstance(message.method, str):
            return
        key, sid = _key(message.id), _session(message)
        if key is None or sid is None:
            return
        if key in self._expected or len(self._expected) < MAX_EXPECTED:
            self._expected[key] = sid

    def route(self, data: bytes) -> str | None:
        """The session whose stream ``data`` goes on; None: the connection's."""
        message = _read(data)
        if message is None:
            return None
        if message.method is None:  # an answer to the client
            key = _key(message.id)
            return self._expected.pop(key, None) if key is not None else None
        return _session(message)
