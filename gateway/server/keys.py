"""What the server's modules share: the application's and the request's keys, the WebSocket
subprotocol and heartbeat, and the bounds of what a request may ask for (docs/limits.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiohttp import web

from gateway.config import Config
from gateway.console.tickets import TicketStore
from gateway.metrics import GatewayMetrics
from gateway.protocol.policy import Rule
from gateway.server.limits import ConnectionGuard
from gateway.storage.state_dir import StateDir
from gateway.team import auth, roles
from gateway.team.audit import AuditLog
from gateway.team.budgets import Budgets
from gateway.team.notify import Notifier


@dataclass(slots=True)
class PolicyRules:
    """The permission rules in force (docs/policies.md): the config's, until SIGHUP reads others."""

    rules: tuple[Rule, ...]


SUBPROTOCOL: Final = "rawp-dps-1.0"
CONFIG: Final = web.AppKey("config", Config)
METRICS: Final = web.AppKey("metrics", GatewayMetrics)
SESSIONS: Final = web.AppKey("sessions", dict)
STATE_DIR: Final = web.AppKey("state", StateDir)
TICKETS: Final = web.AppKey("tickets", TicketStore)
GUARD: Final = web.AppKey("guard", ConnectionGuard)
STATIC: Final = web.AppKey("static", dict)
AUTH: Final = web.AppKey("auth", auth.Authenticator)
AUDIT: Final = web.AppKey("audit", AuditLog)
NOTIFIER: Final = web.AppKey("notifier", Notifier)
POLICY: Final = web.AppKey("policy", PolicyRules)
BUDGETS: Final = web.AppKey("budgets", Budgets)
# Who made the request (auth_middleware): an Identity, for every request but the public ones.
IDENTITY: Final = web.RequestKey("identity", roles.Identity)
HEARTBEAT: Final = web.AppKey("heartbeat", float)
HEARTBEAT_SEC: Final = 30.0  # docs/http-api.md: pings, and a peer that stops answering is closed
WS_ROUTE: Final = "session-ws"
# A handler that has sent its response head (a WebSocket after prepare) stores the response here:
# from then on an error must never be answered with an HTTP error response (errors_middleware).
STREAMING: Final = web.RequestKey("streaming", web.StreamResponse)
# The ticket a WebSocket upgrade was authenticated with (auth_middleware): spent when it succeeds.
TICKET: Final = web.RequestKey("ticket", str)
# Limits of POST /v1/session and PATCH fields (docs/limits.md).
MAX_NAME_CHARS: Final = 256
MAX_REATTACH_WINDOW_SEC: Final = 7 * 24 * 3600
MAX_WORKSPACE_PATH_CHARS: Final = 1024
MAX_WORKSPACE_DEPTH: Final = 32  # directory levels in workspace_path
MAX_PATH_COMPONENT_BYTES: Final = 255  # NAME_MAX of common filesystems
MAX_MESSAGE_ID_CHARS: Final = 256  # ?last_message_id= (the gateway's own ids are 36)
