"""The seam between a session and a master protocol: ``MasterConnection``, fed ``Outgoing`` frames.

Theory of operation
-------------------
A session (``LiveSession``) knows its masters only as ``MasterConnection``: it attaches one
(``Masters.attach_connection``), hands it every frame it admits (``send``), and closes it
(``close_after_flush``). Whatever protocol the master speaks lives behind that one class:

* the DPS WebSocket, ``WebSocketConnection`` (``gateway/session/fanout.py``): writes
  ``Outgoing.framed``, the same bytes for every DPS connection of the session;
* an ACP client's view, ``AcpAttachment`` (``gateway/session/acp_client.py``): turns
  ``Outgoing.frame`` into ACP messages.

A third protocol is a third class with these members; nothing in the session changes.

Each frame is encoded once and framed once, however many connections take it: ``Outgoing`` carries
the typed frame, its JSON (``data``, as the history keeps it) and that JSON as one WebSocket text
message (``framed``, ``text_frame``), so a protocol reads what it needs and makes nothing again.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Final, Protocol

import msgspec

from gateway.protocol import frames as F
from gateway.protocol.capabilities import ConnectionFilter

__all__ = ["MasterConnection", "Outgoing", "text_frame"]

_LEN7: Final = struct.Struct("!BB").pack
_LEN16: Final = struct.Struct("!BBH").pack
_LEN64: Final = struct.Struct("!BBQ").pack
_FIN_TEXT: Final = 0x81


def text_frame(data: bytes) -> bytes:
    """``data`` as one final, unmasked WebSocket text frame (a server's frame, RFC 6455 §5.2)."""
    n = len(data)
    if n < 126:
        return _LEN7(_FIN_TEXT, n) + data
    if n < 65536:
        return _LEN16(_FIN_TEXT, 126, n) + data
    return _LEN64(_FIN_TEXT, 127, n) + data


# Not tracked by the garbage collector (it refers to no container that could refer back): one is
# made per frame on the per-line path, and tracked objects made per line fill the youngest
# generation.
class Outgoing(msgspec.Struct, gc=False):
    """One frame as a session sends it to its connections (see the module docstring)."""

    frame: F.Frame
    data: bytes  # the frame's JSON, encoded once (``codec.encode``)
    framed: bytes  # ``data`` as one WebSocket text message (``text_frame``)
    t_ns: int = 0  # ``perf_counter_ns`` when the agent line it came from was read; 0: no line

    @classmethod
    def of(cls, frame: F.Frame, data: bytes, t_ns: int = 0) -> Outgoing:
        return cls(frame, data, text_frame(data), t_ns)


class MasterConnection(Protocol):
    """What a session needs of one master's connection, whatever protocol it speaks.

    ``send`` and ``close_after_flush`` are called inside the session's own calls: they must not
    block or await, and must not call back into the session (leave it with ``call_soon``)."""

    id: str  # unique among the session's connections
    filter: ConnectionFilter  # the frame types it takes; the session replaces it (SetFeatures)

    @property
    def role(self) -> str:
        """Its role in the metrics (``master``, ``local_ui``)."""
        ...

    @property
    def max_queue_bytes(self) -> int:
        """What it may hold unwritten: a reattach's history is cut to fit."""
        ...

    @property
    def queued_bytes(self) -> int:
        """What it holds unwritten now."""
        ...

    @property
    def closed(self) -> asyncio.Event:
        """Set once it writes no more: a session ending waits for it (for a while)."""
        ...

    def send(self, out: Outgoing) -> None:
        """One frame, in the order the session sends them."""
        ...

    def close_after_flush(self, code: int = 1000, reason: str = "") -> None:
        """Write what it holds, then close (WebSocket close ``code`` and ``reason``)."""
        ...
