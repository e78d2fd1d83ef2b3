"""How deeply a JSON text nests, measured without decoding it.

msgspec decodes nested arrays and objects recursively: a few KiB of ``[[[[...`` raise
``RecursionError`` (not a ``DecodeError``) at a depth that depends on the caller's own stack. Input
from a peer is refused as malformed past a fixed, documented depth instead: the frame codec and the
HTTP server ask ``too_deep`` before decoding; the agent parsers catch ``RecursionError`` and ask it
after decoding, for the lines that hold free-form JSON (``parsers.base.JsonLinesParser``).

The common case costs two ``bytes.count`` calls: a text with at most ``limit`` opening brackets
cannot nest deeper. Otherwise strings are blanked out (escapes first, so ``\\"`` ends no string) and
the brackets left are summed in C (``itertools.accumulate``); the scan is linear in the input.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Final

__all__ = ["MAX_AGENT_LINE_DEPTH", "MAX_JSON_DEPTH", "too_deep"]

# Arrays and objects inside one another, the envelope's own levels included. Real frames and agent
# lines nest a few levels; a JSON schema or a tool input a few dozen at most.
MAX_JSON_DEPTH: Final = 128  # a frame, an HTTP request body
# An agent line: half as deep, so the frame that carries what it held (a tool input inside
# envelope and payload) stays within MAX_JSON_DEPTH for any master.
MAX_AGENT_LINE_DEPTH: Final = MAX_JSON_DEPTH // 2

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_NOT_BRACKET = bytes(b for b in range(256) if _STEP[b] == 0)


def too_deep(data: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``data`` (JSON text, valid or not) opens more than ``limit`` nested levels."""
    if isinstance(data, str):
        if data.count("[") + data.count("{") <= limit:
            return False
        data = data.encode("utf-8", "surrogatepass")
    elif data.count(b"[") + data.count(b"{") <= limit:
        return False
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", data)).translate(None, _NOT_BRACKET)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit
