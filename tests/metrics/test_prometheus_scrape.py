"""A real Prometheus scrapes a running gateway through a real session, and PromQL returns the
number of frames that session produced.

Theory of operation
-------------------
`start_gateway_target()` runs the real server (`gateway.server.create_app`) in-process on a free
loopback port, with a bearer token and the embedded demo agent, and attaches a real WebSocket
master to a new session. A Prometheus from Debian's package (scripts/install-prometheus.sh) starts
on another free loopback port with a temporary config that scrapes the gateway's `/metrics` every
second with the token, and a temporary data dir.

The test waits until Prometheus has scraped the session as it stands after the attach, runs one
prompt through the demo agent, and reads every frame the master receives for that turn. Then
`sum(rawp_gateway_frames_total{direction="to_master"})` must grow by exactly the number of frames
the session produced in that turn, type by type: the frames the master received, plus its own
prompt relayed to the session's other masters. Polling stops at the first answer that
matches, so the test takes a few scrapes (well under 15 s).

Without `prometheus` on PATH the test is skipped on a developer machine and fails in CI (CI=true).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.server import METRICS
from tests.support.gateway_peer import (
    Master,
    create_session,
    demo_config,
    prompt_and_wait,
    start_gateway,
)
from tests.support.prometheus import prometheus_binary, query, run_prometheus, wait_for_value

TOKEN = "scrape-test-token"
SCRAPE_DEADLINE_SEC = 25.0  # an upper bound for a busy machine; typically done in 5-8 s
TOTAL = 'sum(rawp_gateway_frames_total{job="rawp-gateway", direction="to_master"})'
BY_TYPE = 'sum by (type) (rawp_gateway_frames_total{job="rawp-gateway", direction="to_master"})'


@dataclass
class GatewayTarget:
    """A running gateway with one session and one master attached to it."""

    client: TestClient  # the gateway's HTTP client (base URL, app)
    master: Master  # a WebSocket master on the session
    address: str  # host:port serving /metrics
    token: str  # the bearer token /metrics requires

    def frames_out(self) -> Counter[str]:
        """The gateway's own count of frames to masters by type, from its registry."""
        body, _ = self.client.server.app[METRICS].render()
        out: Counter[str] = Counter()
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                if s.name == "rawp_gateway_frames_total" and s.labels["direction"] == "to_master":
                    out[s.labels["type"]] += int(s.value)
        return +out


@contextlib.asynccontextmanager
async def start_gateway_target(workdir: Path) -> AsyncIterator[GatewayTarget]:
    """The real gateway (token required), a demo-agent session, and a master attached to it."""
    workspace = workdir / "workspace"
    workspace.mkdir()
    config = demo_config(workspace, token=TOKEN)
    client = await start_gateway(config)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        assert (await client.get("/metrics")).status == 401  # the token is really required
        client.session.headers.update(auth)
        session = await create_session(client)
        master = await Master.attach(client, session["session_id"], headers=auth)
        # Read the greeting (capabilities, catalog, commands, ...) so that what the master reads
        # after a prompt is that turn's frames only. The demo agent publishes its commands when it
        # has started, which on a loaded machine can come after the greeting: wait for them.
        await master.until("agent.commands.publish", timeout=30)
        with contextlib.suppress(TimeoutError):
            while True:
                await master.next(timeout=0.5)
        address = f"{client.server.host}:{client.server.port}"
        yield GatewayTarget(client, master, address, TOKEN)
    finally:
        await client.close()


async def prom_by_type(http: aiohttp.ClientSession, base: str) -> Counter[str]:
    result = await query(http, base, BY_TYPE)
    return +Counter({r["metric"]["type"]: int(float(r["value"][1])) for r in result})


@pytest.mark.prometheus
async def test_prometheus_scrapes_the_frame_count_a_session_produced(tmp_path):
    prometheus_binary()
    deadline = time.monotonic() + SCRAPE_DEADLINE_SEC
    async with (
        start_gateway_target(tmp_path) as target,
        run_prometheus(tmp_path, target.token, [{"targets": [target.address]}]) as base,
        aiohttp.ClientSession() as http,
    ):
        # 1. Prometheus has scraped the session as it is after the attach.
        before = target.frames_out()
        await wait_for_value(http, base, TOTAL, sum(before.values()), deadline)
        prom_before = await prom_by_type(http, base)
        assert prom_before == before

        # 2. One turn through the demo agent: what the session produced is what the gateway
        # counted, and the master received all of it except its own prompt, which the gateway
        # relays to the session's other masters only (DPS 2.4).
        turn = await prompt_and_wait(target.master, "hello from the scrape test", idle=True)
        await asyncio.sleep(0.2)  # nothing else may follow the turn's last frame
        produced = target.frames_out() - before
        received = Counter(f["type"] for f in turn)
        assert produced["agent.text.delta"] > 0 and produced["session.turn.end"] == 1
        assert produced - received == Counter({"control.prompt.request": 1})
        assert received - produced == Counter()

        # 3. Prometheus reports exactly that many more frames, type by type.
        total = sum(before.values()) + sum(produced.values())
        await wait_for_value(http, base, TOTAL, total, deadline)
        assert await prom_by_type(http, base) - prom_before == produced
        up = await query(http, base, 'up{job="rawp-gateway"}')
        assert [float(r["value"][1]) for r in up] == [1.0]

        # 4. The dashboard's latency query answers with a number now that frames flowed.
        p99 = await query(
            http,
            base,
            "histogram_quantile(0.99, sum by (le) (rawp_gateway_frame_latency_seconds_bucket))",
        )
        assert len(p99) == 1 and float(p99[0]["value"][1]) > 0
