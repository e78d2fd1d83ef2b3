"""What operators and their tools ask: ``GET /healthz`` (liveness, without the token) and
``GET /metrics`` (Prometheus, docs/http-api.md). Readiness, ``GET /readyz``, is the fleet's
(gateway/team/fleet.py)."""

from __future__ import annotations

from aiohttp import web

from gateway.server.keys import METRICS


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics_handler(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response
