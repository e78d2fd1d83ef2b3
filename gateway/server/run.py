"""Running the gateway: ``serve(config)`` runs the application on uvloop until SIGTERM or SIGINT,
then shuts it down gracefully; SIGHUP reloads the permission rules and the users file, and SIGUSR1/SIGUSR2 begin and end a
drain (docs/fleet.md). ``check_bind`` refuses to serve beyond loopback without a token; given none,
the gateway makes one and keeps it where its user's clients find it (gateway/local_token.py)."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from gateway import local_token
from gateway.agent import sandbox
from gateway.config import Config, with_made_token
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
    if config.loopback_only and not loopback:
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
    made_dir: Path | None = None
    if config.fleet.peers and not config.authenticated:
        # Each pod would make a token of its own, and a master's token (which a pod passes on
        # to its peers) would be refused by every other pod: a fleet shares a configured one.
        raise StartError(
            "[fleet] peers needs a configured credential shared by every pod (token_file, "
            "RAWP_GATEWAY_TOKEN or [auth] users_file): each would otherwise make its own"
        )
    if not config.authenticated:
        made_dir = local_token.token_dir()
        try:  # before any agent runs: the sandbox masks it, so it must be there
            local_token.ensure_dir(made_dir)
        except (OSError, local_token.LocalTokenError) as err:
            raise StartError(f"cannot keep the token this gateway makes: {err}") from None
        config = with_made_token(config, made_dir)
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
    try:
        token_file = _keep_made_token(config, made_dir, port)
    except StartError:
        await runner.cleanup()
        raise
    log.info(
        "listening",
        extra={
            "host": config.server.host,
            "port": port,
            "workspace_root": str(config.server.workspace_root),
            **({"token_file": str(token_file)} if token_file else {}),
        },
    )
    if token_file is not None and sys.stderr.isatty():
        # For the person who started it: the console opens signed in (the page takes the token
        # out of its address at once). Never into a log a collector keeps: only to a terminal.
        host = "[::1]" if config.server.host == "::1" else config.server.host
        print(f"browser console: http://{host}:{port}/ui#token={config.token}", file=sys.stderr)
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
        if token_file is not None and config.token is not None:
            local_token.forget_token(token_file, config.token)


def _keep_made_token(config: Config, made_dir: Path | None, port: int) -> Path | None:
    """Write the token the gateway made to its port's file; the file, or None (none made)."""
    if made_dir is None or config.token is None:
        return None
    path = made_dir / local_token.token_path(port).name
    try:
        local_token.write_token(path, config.token)
    except (OSError, local_token.LocalTokenError) as err:
        raise StartError(f"cannot keep the token this gateway makes in {path}: {err}") from None
    return path


def serve(config: Config, *, ready: Callable[[int], None] | None = None) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        asyncio.run(run(config, ready=ready))
    else:
        uvloop.run(run(config, ready=ready))


def _set_draining(app: web.Application, on: bool) -> None:
    fleet.set_draining(app, on, sessions_held(app))
