"""A master-side client for rawp-gateway: the control plane, the WebSocket, and a sans-IO view.

Three layers, each usable alone, each in a module of its own:

* ``GatewayClient`` (``http.py``) speaks the HTTP control plane of ``docs/http-api.md`` and opens
  a session's WebSocket; the gateway's refusals raise ``GatewayError``.
* ``Connection`` (``websocket.py``) is one attached WebSocket: typed frames in and out, and the
  ``last_message_id`` a reattach continues from.
* ``MasterView`` (``view.py``) is the master's picture of a session and the master-side rules of
  §7.8 (finalise on a lost connection, unfinalise on the reattach's ``session.history``), with no
  I/O at all.

Every name here is the library's public API; import them from ``gateway.client``.
"""

from __future__ import annotations

from gateway.client.http import (
    DEFAULT_HTTP_TIMEOUT_SEC,
    MAX_SESSION_PATHS,
    GatewayClient,
    GatewayError,
    master_capabilities,
    read_token,
)
from gateway.client.view import (
    DISCONNECTED,
    SYNTHETIC_OUTPUT,
    HistoryOutcome,
    MasterView,
    decode_history,
    history_order,
    is_synthetic,
    payload_of,
)
from gateway.client.websocket import (
    DEFAULT_MAX_MESSAGE,
    SUBPROTOCOL,
    CancelReason,
    Connection,
    InputType,
)

__all__ = [
    "DEFAULT_HTTP_TIMEOUT_SEC",
    "DEFAULT_MAX_MESSAGE",
    "DISCONNECTED",
    "MAX_SESSION_PATHS",
    "SUBPROTOCOL",
    "SYNTHETIC_OUTPUT",
    "CancelReason",
    "Connection",
    "GatewayClient",
    "GatewayError",
    "HistoryOutcome",
    "InputType",
    "MasterView",
    "decode_history",
    "history_order",
    "is_synthetic",
    "master_capabilities",
    "payload_of",
    "read_token",
]
