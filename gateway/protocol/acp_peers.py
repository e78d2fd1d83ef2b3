"""Sessions of one ``/acp`` connection that another gateway of the fleet holds (sans-IO).

An ACP client's connection reaches one gateway (the router sends ``/acp`` to any). A session of
the fleet lives on one gateway; when the client loads one that another gateway holds, this
gateway relays that session's messages to the owner's ``/acp`` over a connection of its own, one
per relayed session, opened with the client's own credentials, so the owner applies the client's
identity and role (docs/acp-masters.md, "In a fleet"). Messages pass through as they are: the
client's JSON-RPC ids, the owner's ids (``rawp-ask-<interaction_id>``) and each update's
``_meta.rawp.messageId`` are never changed, so a client that loads again after the last
``messageId`` it saw neither loses nor repeats an update, as on the owner itself.

``PeerRoutes`` decides, with messages in and decisions out, which of the client's messages go to
which relayed session (a request or notification naming its ``sessionId``; an answer to a question
that session's gateway asked) and what the owner's messages mean on the way back (the answer to
the load that opened the relay: an error ends the relay). What it keeps is bounded: the relayed
sessions (counted by the caller with the connection's own, ``MAX_ATTACHED``), the client's
requests waiting for the owner's answer (``MAX_PENDING``, refused past it), the owner's questions
waiting for the client's answer (``MAX_ASKED`` a session, the oldest forgotten).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

import msgspec

from gateway.protocol.acp_master import (
    MAX_ASKED,
    REFUSED,
    RESOURCE_NOT_FOUND,
    RpcId,
    encode,
    error_response,
)

__all__ = [
    "MAX_PENDING",
    "PEER_INIT_ID",
    "FromPeer",
    "PeerRoutes",
    "initialize_request",
    "initialized",
    "session_of",
]

MAX_PENDING: Final = 256  # the client's requests to relayed sessions not yet answered
PEER_INIT_ID: Final = "rawp-peer-initialize"  # the relay's own initialize on the owner's /acp


class FromPeer(Enum):
    PASS = "pass"  # give it to the client as it is
    END = "end"  # give it to the client, then end the relay (the load that opened it failed)
    OWN = "own"  # the answer to the relay's own initialize: nothing for the client


class _Peek(msgspec.Struct):
    id: Any = msgspec.UNSET
    method: Any = None
    error: Any = None


class _SessionParams(msgspec.Struct):
    sessionId: Any = None


_peek = msgspec.json.Decoder(_Peek)
_session_params = msgspec.json.Decoder(_SessionParams)


@dataclass
class _Relayed:
    opening: RpcId | None  # the client's session/load that opened the relay, until answered
    pending: set[RpcId] = field(default_factory=set)
    asked: OrderedDict[RpcId, None] = field(default_factory=OrderedDict)


def initialize_request(params: bytes) -> bytes:
    """The relay's ``initialize`` on the owner's ``/acp``: the client's own params (its
    capabilities, ``turnEvents`` among them), under the relay's id."""
    raw = msgspec.Raw(params or b'{"protocolVersion": 1}')
    return encode({"jsonrpc": "2.0", "id": PEER_INIT_ID, "method": "initialize", "params": raw})


def initialized(data: bytes | str) -> bool:
    """Whether ``data`` is the owner's successful answer to the relay's ``initialize``."""
    try:
        peek = _peek.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return peek.id == PEER_INIT_ID and peek.method is None and peek.error is None


def session_of(params: bytes) -> str | None:
    """The ``sessionId`` a message's params name, if any."""
    if not params:
        return None
    try:
        sid = _session_params.decode(params).sessionId
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return sid if isinstance(sid, str) else None


class PeerRoutes:
    """Which sessions of a connection are relayed, and where each message goes (module doc)."""

    def __init__(self, max_pending: int = MAX_PENDING, max_asked: int = MAX_ASKED) -> None:
        self.max_pending = max_pending
        self.max_asked = max_asked
        self._relayed: dict[str, _Relayed] = {}
        self._pending = 0

    def __len__(self) -> int:
        return len(self._relayed)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._relayed

    def add(self, session_id: str, load_id: RpcId | None) -> None:
        """``session_id`` is relayed from now on; ``load_id`` is the client's load that opens it."""
        relayed = _Relayed(opening=load_id)
        if load_id is not None:
            relayed.pending.add(load_id)
            self._pending += 1
        self._relayed[session_id] = relayed

    def client_message(
        self, rpc_id: RpcId | None, method: str | None, params: bytes
    ) -> str | bytes | None:
        """A message of the client's: the relayed session it goes to, an error that answers it
        here (too many requests waiting), or None (not a relayed session's: handled here)."""
        if method is None:  # an answer: to a question of a relayed session's gateway?
            if rpc_id is None:
                return None
            for asker, asked in self._relayed.items():
                if rpc_id in asked.asked:
                    del asked.asked[rpc_id]
                    return asker
            return None
        session_id = session_of(params)
        relayed = self._relayed.get(session_id) if session_id is not None else None
        if session_id is None or relayed is None:
            return None
        if rpc_id is not None and rpc_id not in relayed.pending:
            if self._pending >= self.max_pending:
                why = f"at most {self.max_pending} requests to sessions of other gateways wait"
                return error_response(rpc_id, REFUSED, why, "TOO_MANY_REQUESTS")
            relayed.pending.add(rpc_id)
            self._pending += 1
        return session_id

    def peer_message(self, session_id: str, data: bytes | str) -> FromPeer:
        """A message from the gateway that holds ``session_id``."""
        try:
            peek = _peek.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return FromPeer.PASS  # the owner's own business; the client judges it
        rpc_id = peek.id
        relayed = self._relayed.get(session_id)
        if relayed is None or rpc_id is msgspec.UNSET or isinstance(rpc_id, bool):
            return FromPeer.PASS
        if not isinstance(rpc_id, int | str):
            return FromPeer.PASS
        if peek.method is not None:  # a question of the owner's: the client's answer goes back
            relayed.asked[rpc_id] = None
            if len(relayed.asked) > self.max_asked:
                relayed.asked.popitem(last=False)
            return FromPeer.PASS
        if rpc_id == PEER_INIT_ID:
            return FromPeer.OWN
        if rpc_id in relayed.pending:
            relayed.pending.discard(rpc_id)
            self._pending -= 1
        if rpc_id == relayed.opening:
            relayed.opening = None
            if peek.error is not None:
                return FromPeer.END
        return FromPeer.PASS

    def drop(self, session_id: str, why: str = "") -> list[bytes]:
        """The relay of ``session_id`` ended: the errors that answer the client's requests that
        still wait for its gateway (``SESSION_NOT_FOUND``: load the session again)."""
        relayed = self._relayed.pop(session_id, None)
        if relayed is None:
            return []
        self._pending -= len(relayed.pending)
        why = why or f"session {session_id[:64]!r} is not open on this connection: session/load it"
        return [
            error_response(rpc_id, RESOURCE_NOT_FOUND, why, "SESSION_NOT_FOUND")
            for rpc_id in relayed.pending
        ]

    def sessions(self) -> list[str]:
        return list(self._relayed)
