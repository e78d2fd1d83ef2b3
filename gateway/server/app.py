"""The application: ``create_app(config)`` builds it (its state, middlewares and route table),
``reload`` is what SIGHUP does (the permission rules, then the users file), and the start and
shutdown hooks.

On shutdown every live session is deleted the DPS way (SIGTERM, SIGKILL after the grace period,
cleanup frames, ``session.deleted``, close), so no agent process outlives the gateway. With a state
directory (``[server] state_dir``) sessions outlive the gateway instead: each is suspended (its agent
stopped, its files written as a clean stop, its WebSockets closed with 1012) and read back when the
gateway starts again (``gateway/storage/state_dir.py``). Either way every ``/acp`` connection is
closed then (``close_acp_clients``): nobody would answer on it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from aiohttp import WSCloseCode, web

from gateway.agent import descendants
from gateway.api_error import ApiError
from gateway.config import Config
from gateway.console.static import load_static
from gateway.console.tickets import TicketStore
from gateway.metrics import GatewayMetrics
from gateway.server.acp import ACP_OPEN, ACP_TICKETS, acp_ticket
from gateway.server.acp_http import ACP_HTTP, acp_endpoint, close_http_connections, ticket_holder
from gateway.server.keys import (
    AUDIT,
    AUTH,
    BUDGETS,
    CONFIG,
    GUARD,
    HEARTBEAT,
    HEARTBEAT_SEC,
    METRICS,
    NOTIFIER,
    POLICY,
    SESSIONS,
    STATE_DIR,
    STATIC,
    TICKETS,
    WS_ROUTE,
    PolicyRules,
)
from gateway.server.limits import ConnectionGuard, handler_args
from gateway.server.middleware import auth_middleware, browser_guard_middleware, errors_middleware
from gateway.server.routes.agents import list_agents, list_conversations
from gateway.server.routes.console import console_file, console_page, console_redirect, ws_ticket
from gateway.server.routes.files import get_file, put_file
from gateway.server.routes.ops import healthz, metrics_handler
from gateway.server.routes.policy import decide_policy, reload_policy
from gateway.server.routes.sessions import (
    create_session,
    delete_session,
    get_session,
    list_sessions,
    patch_session,
    resolve_workspace,
    session_ended,
    whoami,
    wire_session,
)
from gateway.server.websocket import websocket
from gateway.session import LiveSession
from gateway.session.fanout import CLOSE_TIMEOUT_SEC
from gateway.storage.state_dir import Loaded, LoadError, StateDir
from gateway.team import auth, fleet
from gateway.team.audit import AuditLog
from gateway.team.budgets import Budgets
from gateway.team.notify import Notifier

log = logging.getLogger("rawp_gateway.server")

# What an /acp client hears when the gateway stops: with a state dir its sessions live on (1012,
# as a DPS master hears it: load them again once the gateway is back); without one they ended
# with the gateway (1001, going away), and a client that loads them again would find nothing.
ACP_RESTARTING: Final = (
    WSCloseCode.SERVICE_RESTART,
    "the gateway is restarting; load your sessions again",
)
ACP_STOPPED: Final = (WSCloseCode.GOING_AWAY, "the gateway stopped; its sessions ended with it")


def create_app(
    config: Config, *, metrics: GatewayMetrics | None = None, heartbeat_sec: float = HEARTBEAT_SEC
) -> web.Application:
    app = web.Application(
        middlewares=[
            errors_middleware,
            fleet.forwarded_middleware(config.server.trusted_proxies),
            browser_guard_middleware(config),
            auth_middleware(websocket, (acp_endpoint, ACP_TICKETS, ticket_holder)),
        ],
        client_max_size=config.server.max_request_bytes,
        handler_args=handler_args(config.server.header_timeout_sec),
    )
    app[CONFIG] = config
    app[HEARTBEAT] = heartbeat_sec
    app[METRICS] = metrics or GatewayMetrics(agents=config.agents.keys())
    app[SESSIONS] = {}
    app[POLICY] = PolicyRules(config.policy.rules)
    if config.server.state_dir is not None:
        app[STATE_DIR] = StateDir(config.server.state_dir, metrics=app[METRICS])
        app.on_startup.append(_restore_sessions)
        app.on_cleanup.append(_release_state_dir)
    # A users file that cannot be read stops the start (ValueError); later, SIGHUP reloads it.
    app[AUTH] = auth.Authenticator(config.token, config.auth)
    app[AUDIT] = AuditLog(
        config.auth.audit_log, max_bytes=config.auth.audit_max_bytes, keep=config.auth.audit_keep
    )
    app[NOTIFIER] = Notifier(
        config.notify.webhooks, app[METRICS], public_url=config.server.public_url
    )
    state_dir = app.get(STATE_DIR)
    app[BUDGETS] = Budgets(config.budgets, app[METRICS], state_dir.ledger() if state_dir else None)
    if app[NOTIFIER].enabled:
        app[BUDGETS].notifier = app[NOTIFIER]
    _say_unbudgeted(config)
    app.on_startup.append(_start_reporting)
    app.on_cleanup.append(_stop_reporting)
    app[TICKETS] = TicketStore()
    app[ACP_OPEN] = set()
    app[ACP_HTTP] = {}
    app[GUARD] = ConnectionGuard(config.server.max_pending_connections)
    app[STATIC] = load_static()
    fleet.setup(app, config, on_drain=app[METRICS].draining)
    if STATE_DIR in app:
        app[fleet.READINESS].storage_problem = app[STATE_DIR].health.problem
    app.router.add_get("/", console_redirect)
    app.router.add_get("/ui", console_page)
    app.router.add_get("/ui/{name}", console_file)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", fleet.readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/v1/agents", list_agents)
    app.router.add_get("/v1/agents/{agent}/conversations", list_conversations)
    app.router.add_post("/v1/session", create_session)
    app.router.add_get("/v1/sessions", list_sessions)
    app.router.add_get("/v1/whoami", whoami)
    app.router.add_get("/v1/policy/decide", decide_policy)
    app.router.add_get("/v1/session/{session_id}", get_session)
    app.router.add_patch("/v1/session/{session_id}", patch_session)
    app.router.add_delete("/v1/session/{session_id}", delete_session)
    app.router.add_post("/v1/session/{session_id}/ws-ticket", ws_ticket)
    app.router.add_get("/v1/session/{session_id}/ws", websocket, name=WS_ROUTE)
    app.router.add_put("/v1/session/{session_id}/files", put_file)
    # ACP clients (docs/acp-masters.md): a WebSocket upgrade, or Streamable HTTP
    app.router.add_get("/acp", acp_endpoint)
    app.router.add_post("/acp", acp_endpoint)
    app.router.add_delete("/acp", acp_endpoint)
    app.router.add_post("/v1/acp/ws-ticket", acp_ticket)
    app.router.add_get("/v1/session/{session_id}/files/{transfer_id}", get_file)
    fleet.add_prefixed_routes(
        app, config.server.route_prefix
    )  # after every route: it copies them all
    app.on_shutdown.append(shutdown_sessions)
    app.on_shutdown.append(close_http_connections)
    return app


def _say_unbudgeted(config: Config) -> None:
    """With budgets configured, the agents they cannot stop (they report no cost) are named, not
    silently exempt."""
    limits = config.budgets
    if not (limits.session_usd > 0 or limits.user_daily_usd > 0):
        return
    unbudgeted = sorted(name for name, p in config.agents.items() if not p.reports_cost)
    if unbudgeted:
        log.warning(
            "budgets count the cost agents report; these agents report none and are unbudgeted: %s",
            ", ".join(unbudgeted),
            extra={"unbudgeted": unbudgeted},
        )


def reload(app: web.Application) -> None:
    """SIGHUP: the permission rules of the config file, then the users file, read again; either
    one that cannot be used keeps what is in force."""
    reload_policy(app)
    reload_users(app)


def reload_users(app: web.Application) -> None:
    """SIGHUP: read the users file again. A WebSocket of a user the new file removed or gave
    another role is closed (1008), ``/acp`` ones too: it was opened under the old one, and
    reconnecting takes the new one."""
    authenticator = app[AUTH]
    before = authenticator.users()
    if not authenticator.reload_users():
        return
    after = authenticator.users()
    changed = {name for name, identity in before.items() if after.get(name) != identity}
    if not changed:
        return
    for session in app[SESSIONS].values():
        if isinstance(session, LiveSession):
            session.close_users(changed, "your access to this gateway changed; reconnect")
    for client in app[ACP_OPEN]:
        if client.sender.identity.user in changed:
            client.out.close_after_flush(1008, "your access to this gateway changed; reconnect")


async def _start_reporting(app: web.Application) -> None:
    app[AUDIT].start()
    await app[NOTIFIER].start()


async def _stop_reporting(app: web.Application) -> None:
    await app[NOTIFIER].close()
    await app[AUDIT].close()


async def _restore_sessions(app: web.Application) -> None:
    """Read back the sessions of the state directory; one that cannot be used is skipped with a
    log line and a metric, never a failed start."""
    config, metrics = app[CONFIG], app[METRICS]
    crashed: list[str] = []
    # One session at a time: only the one being restored has its log in memory.
    for got in app[STATE_DIR].load(max_buffer_bytes=config.server.max_buffer_bytes):
        if isinstance(got, LoadError):
            _restore_failed(metrics, got.session_id, got.reason, got.message)
            continue
        record = got.record
        if not record["clean"]:
            crashed.append(record["session_id"])
        if got.torn:
            _torn(metrics, got)
        profile = config.agents.get(record["agent"])
        if profile is None:
            got.saved.release()
            _restore_failed(
                metrics, record["session_id"], "agent", f"no agent profile {record['agent']!r}"
            )
            continue
        try:
            # The record is input like a request body (the agent can write the state directory):
            # the very check of POST /v1/session, symlinks followed.
            workspace = resolve_workspace(config, record["workspace_path"])
        except ApiError as err:
            got.saved.release()
            _restore_failed(metrics, record["session_id"], "workspace", err.message)
            continue
        try:
            session = LiveSession.restore(
                got,
                profile,
                workspace,
                config=config,
                metrics=metrics,
                on_terminated=lambda s: session_ended(app, s),
            )
        except (KeyError, TypeError, ValueError) as err:
            got.saved.release()
            _restore_failed(metrics, record["session_id"], "corrupt", f"unusable record: {err}")
            continue
        wire_session(app, session)
        app[SESSIONS][session.id] = session
        await session.start()
        metrics.session_restored()
        log.info(
            "session restored",
            extra={
                "session": session.id,
                "agent": profile.name,
                "turn_index": record["turn_index"],
            },
        )
    # A session the ledger counted that was not read back ends its count there.
    app[BUDGETS].restored({s.id for s in app[SESSIONS].values()})
    # The gateway before this one was killed: what its agents left running would go on beside
    # the agents the next prompts start, in the same workspaces.
    killed = descendants.kill_left_behind(crashed)
    if killed:
        log.warning("agent processes left by the previous gateway killed", extra={"count": killed})


def _torn(metrics: GatewayMetrics, got: Loaded) -> None:
    """A log with a torn line is read up to it: say so (its reattach is told frames may be
    missing: the buffer is loaded as after a crash)."""
    metrics.saved_log_torn()
    log.error(
        "saved frame log torn at byte %d of %d: read up to it, the rest dropped; a reattach from "
        "before the restart is told frames may be missing (truncated)",
        got.torn_at or 0,
        got.log_size,
        extra={"session": got.record["session_id"], "frames": len(got.entries)},
    )


async def _release_state_dir(app: web.Application) -> None:
    app[STATE_DIR].close()


def _restore_failed(metrics: GatewayMetrics, session_id: str, reason: str, message: str) -> None:
    metrics.session_restore_failed(reason)
    log.error(
        "saved session skipped: %s",
        message,
        extra={"session": session_id, "reason": reason},
    )


async def shutdown_sessions(app: web.Application) -> None:
    live = [s for s in app[SESSIONS].values() if s.state != "TERMINATED"]
    kept = STATE_DIR in app
    if live:
        log.info("shutting down", extra={"sessions": len(live)})
        if kept:  # they live on: suspended, read back at the next start
            ending = (s.suspend() for s in live)
        else:
            ending = (s.delete("error", "client", shutdown=True) for s in live)
        await asyncio.gather(*ending, return_exceptions=True)
    await close_acp_clients(app, *(ACP_RESTARTING if kept else ACP_STOPPED))
    await descendants.terminate_all()


async def close_acp_clients(app: web.Application, code: int, reason: str) -> None:
    """Every ``/acp`` connection closes once its sessions are gone (their views have written
    their last answers): nobody would answer on it. A client that does not take its last messages
    within ``CLOSE_TIMEOUT_SEC`` loses its socket, as a DPS master does (docs/limits.md)."""
    open_clients = app[ACP_OPEN]
    clients = list(open_clients)
    if not clients:
        return
    for client in clients:
        client.out.close_after_flush(code, reason)
    await asyncio.wait(
        [asyncio.ensure_future(c.out.closed.wait()) for c in clients], timeout=CLOSE_TIMEOUT_SEC
    )
    for client in clients:
        if not client.out.closed.is_set():
            client.out.abort()
