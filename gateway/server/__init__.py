"""The HTTP and WebSocket server of docs/http-api.md (aiohttp), and graceful shutdown.

Theory of operation
-------------------
``create_app(config)`` (``app.py``) builds the aiohttp application; ``serve(config)`` (``run.py``)
runs it on uvloop until SIGTERM or SIGINT. Sessions live in ``app[SESSIONS]`` as ``LiveSession``
objects; the handlers only translate HTTP into calls on them. Every request passes the
middlewares first (``middleware.py``): errors become ``{"error_code", "message"}`` JSON, and, when
credentials are configured, every request but ``/healthz`` and the browser console's page needs
``Authorization: Bearer <token>`` (or, on a WebSocket upgrade, a one-time ``?ticket=``), which
becomes an identity (user, role) on the request.

One module per resource, as the API names them: ``routes/sessions.py`` (create, list, get,
rename/share, delete; ``whoami``), ``routes/agents.py`` (profiles and saved conversations),
``routes/files.py`` (uploads and downloads), ``routes/console.py`` (the browser console's page and
its WebSocket tickets), ``routes/ops.py`` (health and metrics), ``routes/policy.py`` (the permission rules: the decide
endpoint and their reload), and ``websocket.py``, a session's
WebSocket. What they share (the application's keys, the request bounds) is in ``keys.py``; the
limits before a request is trusted are in ``limits.py`` and ``refusals.py``.
"""

from gateway.server.app import create_app, reload, reload_users
from gateway.server.keys import AUDIT, AUTH, CONFIG, METRICS, SESSIONS, TICKETS
from gateway.server.middleware import is_loopback
from gateway.server.routes.sessions import TerminatedSession
from gateway.server.run import StartError, run, serve

__all__ = [
    "AUDIT",
    "AUTH",
    "CONFIG",
    "METRICS",
    "SESSIONS",
    "TICKETS",
    "StartError",
    "TerminatedSession",
    "create_app",
    "is_loopback",
    "reload",
    "reload_users",
    "run",
    "serve",
]
