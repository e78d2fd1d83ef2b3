"""JSON-RPC 2.0 as an ACP client sends it to ``/acp``: one message read, checked and told apart
(request, notification, response), or the error that answers it (sans-IO).

``read(data)`` never raises. What it refuses is answered, never dropped in silence and never a
traceback: nested deeper than ``MAX_JSON_DEPTH`` or not JSON (-32700, parse error), a batch, not an
object, no ``"jsonrpc": "2.0"`` or an id that is neither a number nor a string (-32600, invalid
request). The size is bounded before this (the WebSocket's ``max_frame_size``). ``params(...)``
decodes a request's params into the schema's struct (parsers/acp/schema.py) or says why not (-32602).

``RateLimit`` bounds how fast one connection may ask: a token bucket of ``RATE_BURST`` requests
refilled at ``RATE_PER_SEC`` a second; a request past it is refused (``RATE_LIMITED``), and a
client refused ``MAX_REFUSED_IN_A_ROW`` times before its bucket was ever full again is closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec

from gateway.protocol.acp_master import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    RpcId,
    error_response,
)
from parsers.json_depth import MAX_JSON_DEPTH, too_deep

__all__ = [
    "MAX_REFUSED_IN_A_ROW",
    "RATE_BURST",
    "RATE_PER_SEC",
    "Message",
    "RateLimit",
    "Refused",
    "params",
    "read",
]

RATE_PER_SEC: Final = 50.0
RATE_BURST: Final = 200
MAX_REFUSED_IN_A_ROW: Final = 1000
MAX_METHOD_CHARS: Final = 128

T = TypeVar("T")


class _Wire(msgspec.Struct):
    jsonrpc: Any = None
    id: Any = msgspec.UNSET
    method: Any = None
    params: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    result: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    error: Any = None


_wire = msgspec.json.Decoder(_Wire)


@dataclass(slots=True)
class Message:
    """A request (``id`` and ``method``), a notification (``method``, no ``id``) or a response
    (``id``, ``result`` or ``error``)."""

    id: RpcId | None
    method: str | None
    params: bytes  # raw JSON, b"" when absent
    result: bytes | None  # a response's (None: an error response)
    is_request: bool


@dataclass(slots=True)
class Refused:
    """What answers a message that cannot be taken."""

    response: bytes


def read(data: str | bytes) -> Message | Refused:
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if too_deep(raw):
        return Refused(
            error_response(None, PARSE_ERROR, f"the message nests deeper than {MAX_JSON_DEPTH}")
        )
    try:
        wire = _wire.decode(raw)
    except msgspec.ValidationError as err:  # JSON, but not an object
        if raw.lstrip().startswith(b"["):
            return Refused(error_response(None, INVALID_REQUEST, "batches are not accepted"))
        return Refused(error_response(None, INVALID_REQUEST, f"not a JSON-RPC message: {err}"))
    except (msgspec.DecodeError, UnicodeError, RecursionError) as err:
        return Refused(error_response(None, PARSE_ERROR, f"not JSON: {err}"))
    rpc_id = wire.id
    has_id = rpc_id is not msgspec.UNSET
    if has_id and (isinstance(rpc_id, bool) or not isinstance(rpc_id, int | str | None)):
        return Refused(error_response(None, INVALID_REQUEST, "id must be a number or a string"))
    if isinstance(rpc_id, str) and len(rpc_id) > MAX_METHOD_CHARS:
        return Refused(error_response(None, INVALID_REQUEST, "id is too long"))
    the_id: RpcId | None = None if not has_id else rpc_id  # type: ignore[assignment]
    if wire.jsonrpc != "2.0":
        return Refused(error_response(the_id, INVALID_REQUEST, 'jsonrpc must be "2.0"'))
    params = bytes(wire.params)
    if wire.method is None:
        if not has_id:
            return Refused(
                error_response(None, INVALID_REQUEST, "neither a request nor a response")
            )
        result = bytes(wire.result) if wire.result else None
        return Message(the_id, None, params, result if wire.error is None else None, False)
    if not isinstance(wire.method, str) or len(wire.method) > MAX_METHOD_CHARS:
        return Refused(error_response(the_id, INVALID_REQUEST, "method must be a short string"))
    return Message(the_id, wire.method, params, None, has_id)


def params(message: Message, kind: type[T]) -> T | Refused:
    """A request's params as ``kind`` (absent params: its defaults)."""
    try:
        return msgspec.json.decode(message.params or b"{}", type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as err:
        return Refused(error_response(message.id, INVALID_PARAMS, f"invalid params: {err}"))


class RateLimit:
    """A token bucket per connection (module docstring); the caller passes the clock."""

    __slots__ = ("_at", "_tokens", "refused_in_a_row")

    def __init__(self, now: float) -> None:
        self._tokens = float(RATE_BURST)
        self._at = now
        self.refused_in_a_row = 0

    def take(self, now: float) -> bool:
        self._tokens = min(float(RATE_BURST), self._tokens + (now - self._at) * RATE_PER_SEC)
        self._at = now
        if self._tokens >= RATE_BURST:
            self.refused_in_a_row = 0  # the client slowed down until the bucket was full again
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.refused_in_a_row += 1
        return False

    @property
    def hopeless(self) -> bool:
        return self.refused_in_a_row >= MAX_REFUSED_IN_A_ROW
