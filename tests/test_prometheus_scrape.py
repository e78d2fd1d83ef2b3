"""A real Prometheus scrapes the gateway's /metrics, and PromQL returns what a session produced.

Theory of operation
-------------------
`start_gateway_target()` starts something that serves the gateway's `/metrics` on 127.0.0.1 behind
the bearer token, runs a session through it, and says how many frames that session produced, by
type. A Prometheus from Debian's package (scripts/install-prometheus.sh) is started on a free
loopback port with a temporary config that scrapes that target every second with the token, and
a temporary data dir. The test polls Prometheus' HTTP API until the query for the session's frame
count returns it (a scrape or two, a few seconds), then checks the per-type counts and `up`.

Until the server exists, the target is a stand-in: a tiny aiohttp app that renders a
`GatewayMetrics` after making the calls the server makes for a short turn. When `gateway/server.py`
can be started in-process, replace `start_gateway_target()` (and only it) with the real server and
a real session (the demo agent), keeping its return value.

Without `prometheus` on PATH the test is skipped on a developer machine and fails in CI (CI=true).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.metrics import GatewayMetrics

TOKEN = "scrape-test-token"
SCRAPE_DEADLINE_S = 12.0


@dataclass
class GatewayTarget:
    """What the test needs to know of a running gateway."""

    address: str  # host:port serving /metrics
    token: str  # the bearer token /metrics requires
    frames_by_type: Counter[str]  # frames to masters the session produced, by DPS type


# ----------------------------------------------------------------------------------------------
# STAND-IN: replace this function with the real gateway and a real session once gateway/server.py
# can be started in-process (create a session with the demo agent over the HTTP API, attach a
# WebSocket, send a prompt, count the frames received until session.turn.end). Keep the signature:
# an async context manager yielding a GatewayTarget.
# ----------------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def start_gateway_target() -> AsyncIterator[GatewayTarget]:
    metrics = GatewayMetrics()
    session = [
        "session.capabilities",
        "tool.catalog.publish",
        "agent.commands.publish",
        "session.turn.start",
        "agent.state.changed",
        *["agent.text.delta"] * 5,
        "agent.text.done",
        "tool.invoke.request",
        "tool.invoke.result",
        "session.turn.end",
        "session.usage",
    ]
    metrics.session_state(None, "IDLE", agent="claude-code")
    metrics.ws_connected()
    metrics.frame_in("control.prompt.request", 120)
    metrics.session_state("IDLE", "RUNNING")
    lines = metrics.agent_lines("claude-code")
    for type_ in session:
        t0 = metrics.clock_ns()
        lines.line("stream_event", metrics.clock_ns() - t0)
        metrics.frame_out(type_, 200)
        metrics.history_appended(200)
        metrics.observe_latency_ns(metrics.clock_ns() - t0)
    metrics.tool_result("Read", "success")
    metrics.turn_ended("end_turn", 1.5)
    metrics.session_state("RUNNING", "IDLE")

    async def handle_metrics(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(
                {"error_code": "UNAUTHORIZED", "message": "bearer token required"}, status=401
            )
        body, content_type = metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", handle_metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield GatewayTarget(f"127.0.0.1:{port}", TOKEN, Counter(session))
    finally:
        await runner.cleanup()


# ----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is not installed: CI must run scripts/install-prometheus.sh")
        pytest.skip("prometheus not installed (scripts/install-prometheus.sh)")
    return path


@contextlib.asynccontextmanager
async def run_prometheus(target: GatewayTarget, workdir: Path) -> AsyncIterator[str]:
    """A Prometheus on a free loopback port scraping `target` every second; yields its base URL."""
    token_file = workdir / "token"
    token_file.write_text(target.token)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "rawp-gateway",
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "static_configs": [{"targets": [target.address]}],
            }
        ],
    }
    config_file = workdir / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        prometheus_binary(),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        stdout=log,
        stderr=log,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


async def query(http: aiohttp.ClientSession, base: str, promql: str) -> list[dict]:
    async with http.get(f"{base}/api/v1/query", params={"query": promql}) as resp:
        body = await resp.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


async def wait_for_value(
    http: aiohttp.ClientSession, base: str, promql: str, expected: float, deadline: float
) -> list[dict]:
    """Poll `promql` until its single result equals `expected`, or fail at `deadline`."""
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = await query(http, base, promql)
        except aiohttp.ClientConnectionError as e:  # Prometheus still starting
            last = e
        else:
            last = result
            if len(result) == 1 and float(result[0]["value"][1]) == expected:
                return result
        await asyncio.sleep(0.25)
    pytest.fail(f"{promql} did not reach {expected} in time; last answer: {last}")


async def test_prometheus_scrapes_the_frame_count_a_session_produced(tmp_path):
    prometheus_binary()
    deadline = time.monotonic() + SCRAPE_DEADLINE_S
    async with (
        start_gateway_target() as target,
        run_prometheus(target, tmp_path) as base,
        aiohttp.ClientSession() as http,
    ):
        produced = sum(target.frames_by_type.values())
        assert produced > 0
        total = 'sum(rawp_gateway_frames_total{job="rawp-gateway", direction="to_master"})'
        await wait_for_value(http, base, total, produced, deadline)

        # The scrape went through the token, and per-type counts match too.
        up = await query(http, base, 'up{job="rawp-gateway"}')
        assert [float(r["value"][1]) for r in up] == [1.0]
        by_type = await query(
            http, base, 'sum by (type) (rawp_gateway_frames_total{direction="to_master"}) > 0'
        )
        got = {r["metric"]["type"]: float(r["value"][1]) for r in by_type}
        assert got == {t: float(n) for t, n in target.frames_by_type.items()}

        # A histogram query the dashboard uses answers with a number.
        p99 = await query(
            http,
            base,
            "histogram_quantile(0.99, sum by (le) (rawp_gateway_frame_latency_seconds_bucket))",
        )
        assert len(p99) == 1 and float(p99[0]["value"][1]) >= 0
