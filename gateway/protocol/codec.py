"""Frame codec: one encoder, one decoder, and the §2 receiving rules as pure functions.

Theory of operation
-------------------
``encode(frame)`` writes a frame as JSON bytes; the shell encodes each frame once and sends the same
bytes to every connection.

``decode(data)`` never raises. A well-formed frame of a known type decodes in one pass through a
decoder over the union of every frame class (tagged by ``type``). Anything else goes down a slow path
that says exactly what is wrong, in the order a receiver must check it:

0. nested deeper than ``MAX_JSON_DEPTH`` (``parsers/json_depth.py``) → ``Rejected`` ``INVALID_FRAME``
   before any decoding (msgspec would raise ``RecursionError``, a socket-killer);
1. not JSON, or not an object, or a required envelope field missing or mistyped → ``Rejected``
   (answer with ``session.error`` ``INVALID_FRAME``, non-fatal, naming the field);
2. ``v`` other than 1 → ``Rejected`` ``UNSUPPORTED_VERSION`` (DPS-2.1-v: ignored and answered);
3. an unknown ``type``, ``x-*`` included → ``Ignored`` (DPS-2.2-unknown-type: logged, never an error);
4. a payload field missing or mistyped → ``Rejected`` ``INVALID_FRAME`` naming ``payload.<field>``.

Unknown keys in a payload are ignored (DPS-2.2-unknown-field). ``SeenWindow`` remembers a bounded
number of recent ``message_id`` s so a frame received twice is acted on once (DPS-2.1-idempotent).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final, Union

import msgspec

from gateway.protocol.frames import ENVELOPE_VERSION, FRAME_CLASSES, Frame, SessionError
from parsers.json_depth import MAX_JSON_DEPTH, too_deep

__all__ = [
    "Accepted",
    "Ignored",
    "Rejected",
    "SeenWindow",
    "decode",
    "encode",
]

INVALID_FRAME: Final = "INVALID_FRAME"
UNSUPPORTED_VERSION: Final = "UNSUPPORTED_VERSION"

_encoder = msgspec.json.Encoder()
encode = _encoder.encode

_frame_decoder = msgspec.json.Decoder(Union[tuple(FRAME_CLASSES.values())])  # noqa: UP007


class _Envelope(msgspec.Struct):
    """The envelope alone, payload untouched: for diagnosing frames the fast path refused."""

    v: Any
    type: str
    message_id: str
    timestamp: str
    session_id: str
    payload: msgspec.Raw
    turn_id: str | None = None
    parent_id: str | None = None
    metadata: dict[str, Any] | None = None


_envelope_decoder = msgspec.json.Decoder(_Envelope)
_any_decoder = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class Accepted:
    frame: Frame


@dataclass(frozen=True, slots=True)
class Rejected:
    """Answer with a non-fatal ``session.error``; ``message_id`` is the bad frame's, if it had one."""

    error: SessionError
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class Ignored:
    """Known to be well-formed but not for us (unknown type): log it, do nothing else."""

    frame_type: str
    message_id: str


Decoded = Accepted | Rejected | Ignored


def _reject(message: str, code: str = INVALID_FRAME, message_id: str | None = None) -> Rejected:
    return Rejected(SessionError(error_code=code, message=message, fatal=False), message_id)


_MISSING = re.compile(r"^Object missing required field `([^`]+)`(?: - at `\$\.?([^`]*)`)?$")


def _field_message(err: Exception) -> str:
    """msgspec's message with the path written as the frame's own field name.

    "Expected `str`, got `int` - at `$.payload.prompt_text`" → "... - at `payload.prompt_text`";
    "Object missing required field `x` - at `$.payload`" → "missing required field `payload.x`".
    """
    text = str(err)
    missing = _MISSING.match(text)
    if missing:
        field, where = missing.groups()
        return f"missing required field `{where + '.' if where else ''}{field}`"
    return text.replace("`$.", "`").replace(" - at `$`", "")


def decode(data: bytes | str) -> Decoded:
    """Decode one received frame; never raises (see the module docstring for the order of checks)."""
    if too_deep(data):
        return _reject(f"frame nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        frame = _frame_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeEncodeError):
        return _diagnose(data)
    if frame.v != ENVELOPE_VERSION:
        return _version_rejected(frame.v, frame.message_id)
    return Accepted(frame)


def _version_rejected(v: Any, message_id: str | None) -> Rejected:
    return _reject(
        f"unsupported envelope version v={v!r}: this gateway speaks v={ENVELOPE_VERSION} only; "
        "frame ignored",
        UNSUPPORTED_VERSION,
        message_id,
    )


def _diagnose(data: bytes | str) -> Decoded:
    try:
        obj = _any_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeEncodeError) as err:  # a str may hold lone surrogates
        return _reject(f"frame is not valid JSON: {err}")
    if not isinstance(obj, dict):
        return _reject(f"frame must be a JSON object, got {type(obj).__name__}")
    message_id = obj.get("message_id") if isinstance(obj.get("message_id"), str) else None
    try:
        env = _envelope_decoder.decode(data)
    except msgspec.ValidationError as err:
        # A frame from another envelope version may lack what v1 requires: version first.
        if "v" in obj and obj["v"] != ENVELOPE_VERSION:
            return _version_rejected(obj["v"], message_id)
        return _reject(f"invalid frame: {_field_message(err)}", message_id=message_id)
    if env.v != ENVELOPE_VERSION or isinstance(env.v, bool):
        return _version_rejected(env.v, message_id)
    if env.type not in FRAME_CLASSES:
        return Ignored(env.type, env.message_id)
    try:
        msgspec.json.decode(data, type=FRAME_CLASSES[env.type])
    except msgspec.ValidationError as err:
        return _reject(f"invalid {env.type} frame: {_field_message(err)}", message_id=message_id)
    # The typed decode succeeded alone but not through the union: cannot happen with tagged
    # classes, but a peer must never make the core raise.
    return _reject(f"invalid {env.type} frame", message_id=message_id)  # pragma: no cover


class SeenWindow:
    """The last ``capacity`` message ids received, for at-most-once handling of duplicates."""

    __slots__ = ("_capacity", "_ids")

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def first_time(self, message_id: str) -> bool:
        """True the first time an id is seen within the window; False for a duplicate."""
        if message_id in self._ids:
            return False
        self._ids[message_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return True
