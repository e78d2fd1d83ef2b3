"""Running the gateway: ``serve(config)`` runs the application on uvloop until SIGTERM or SIGINT,
then shuts it down gracefully; SIGHUP reloads the permission rules and the users file, and SIGUSR1/SIGUSR2 begin and end a
drain (docs/fleet.md). ``check_bind`` refuses to serve beyond loopback without a token."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
from collections.abc import Callable

from aiohttp import web

from gateway.agent import sandbox
from gateway.config import Config
from gateway.server.app import create_app, reload, shutdown_sessions
from gateway.server.keys import GUARD
from gateway.server.limits import GatewayRunner
from gateway.server.routes.sessions import sessions_held
from gateway.team import fleet

log = logging.getLogger("rawp_gateway.server")


class StartError(Exception):
    """The gateway cannot start as configured: one line for ``rawp-gateway serve`` to print."""


def check_bind(config: Config) -> None:
    """With no token the gateway serves loopback only (docs/http-api.md, Security)."""
    loopback = config.server.host in (
        "127.0.0.1",
        "localhost",
        "::1",
    ) or config.server.host.startswith("127.")
    if not config.authenticated and not loopback:
        raise StartError(
            f"refusing to listen on {config.server.host} without a token: give --token-file FILE (or "
            "set RAWP_GATEWAY_TOKEN, or [auth] users_file, [auth.oidc]) with --workspace-root "
            "DIR, which a token needs, or listen on 127.0.0.1"
        )


async def check_isolation(config: Config) -> None:
    """``[isolation]`` as configured, or no start (docs/isolation.md): with ``sandbox``, bubblewrap
    must really make one here (a probe runs it once); a team without it is warned."""
    isolation = config.isolation
    if not isolation.sandboxed:
        if config.auth.configured:
            log.warning(
                'several users and [isolation] mode = "none": every agent can read every '
                "session's files and the gateway's secrets (docs/isolation.md)"
            )
        return
    problem = await sandbox.probe(isolation)
    if problem is not None:
        raise StartError(f'[isolation] mode = "sandbox": {problem}')
    if os.geteuid() == 0:
        log.warning(
            "running as root: sandboxed agents read what root may read of the system, and the "
            "kernel does not apply max_processes (RLIMIT_NPROC) to uid 0; run the gateway as an "
            "unprivileged user (docs/isolation.md)"
        )


async def run(config: Config, *, ready: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then shut down gracefully; SIGHUP reloads the permission rules
    and the users file,
    SIGUSR1/SIGUSR2 begin/end a drain."""
    check_bind(config)
    await check_isolation(config)
    # What the imports made lives as long as the process: out of the collector's sight, a full
    # collection no longer walks its ~40,000 objects (10 ms of the event loop each time). Done
    # before any session exists, whose cycles must stay collectable.
    gc.collect()
    gc.freeze()
    try:
        app = create_app(config)
    except ValueError as err:  # the users file
        raise SystemExit(f"rawp-gateway: {err}") from None
    runner = GatewayRunner(app, app[GUARD], handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.server.host, config.server.port)
    try:
        await site.start()
    except OSError as err:  # a name that does not resolve, a port in use: one line, no traceback
        await runner.cleanup()
        # aiohttp's strerror repeats the address; the errno's own words do not.
        why = os.strerror(err.errno) if err.errno else str(err)
        if err.errno == errno.EADDRINUSE:
            why = (
                f"port {config.server.port} is in use (another gateway? --port 0 picks a free one)"
            )
        raise StartError(
            f"cannot listen on {config.server.host}:{config.server.port}: {why}"
        ) from None
    port = runner.addresses[0][1] if runner.addresses else config.server.port
    log.info(
        "listening",
        extra={
            "host": config.server.host,
            "port": port,
            "workspace_root": str(config.server.workspace_root),
        },
    )
    if ready is not None:
        ready(port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload, app)
    # An operator drains the gateway before it is removed (docs/fleet.md): SIGUSR1 on, SIGUSR2 off.
    loop.add_signal_handler(signal.SIGUSR1, _set_draining, app, True)
    loop.add_signal_handler(signal.SIGUSR2, _set_draining, app, False)
    try:
        await stop.wait()
        # Not ready from now on (docs/fleet.md): the sessions are suspended while the gateway
        # still answers, so readiness, new sessions and reattaches get 503 SHUTTING_DOWN.
        fleet.begin_stopping(app)
        log.info("stopping")
        await shutdown_sessions(app)
    finally:
        await runner.cleanup()


def serve(config: Config, *, ready: Callable[[int], None] | None = None) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        asyncio.run(run(config, ready=ready))
    else:
        uvloop.run(run(config, ready=ready))


def _set_draining(app: web.Application, on: bool) -> None:
    fleet.set_draining(app, on, sessions_held(app))
