"""A gateway as one of a fleet (docs/fleet.md), in-process and as a real ``serve`` process: the
fleet settings, every URL under ``route_prefix`` and every path answered with and without it,
forwarded headers believed from ``trusted_proxies`` only, the fleet-wide session list with
``unreachable``, ``/readyz`` turning 503 on SIGTERM, and an operator's drain (SIGUSR1 until
SIGUSR2). The router in front (nginx) is in
tests/team/test_fleet_router.py."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import ConfigError, FleetSettings, load_config
from gateway.server import create_app
from gateway.team import fleet
from tests.support import serve_process
from tests.support.fleet_rig import START_TIMEOUT_SEC
from tests.support.gateway_peer import (
    Master,
    fast_demo,
    make_config,
    prompt_and_wait,
    start_gateway,
)
from tests.support.procs import session_processes
from tests.support.servers import CLI, free_port, wait_http
from tests.support.waiting import eventually

TOKEN = "fleet-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFIX = "/pods/rawp-gateway-1"


def fleet_config(tmp_path, **kw):
    return make_config(
        tmp_path,
        token=TOKEN,
        pod_name="rawp-gateway-1",
        route_prefix=PREFIX,
        agents={"demo": fast_demo()},
        **kw,
    )


# --- configuration --------------------------------------------------------------------------------


def load(tmp_path, text: str, environ: dict[str, str] | None = None):
    path = tmp_path / "gateway.toml"
    path.write_text(f'[server]\nworkspace_root = "{tmp_path}"\n{text}')
    return load_config(path, environ=environ or {})


def test_pod_name_defaults_to_the_downward_api_variable_then_the_host_name(tmp_path):
    assert load(tmp_path, "").server.pod_name == socket.gethostname()
    named = load(tmp_path, "", {"RAWP_GATEWAY_POD_NAME": "rawp-gateway-2"})
    assert named.server.pod_name == "rawp-gateway-2"
    # The file's pod_name wins over the variable (which is a default).
    config = load(tmp_path, 'pod_name = "gw-a"\n', {"RAWP_GATEWAY_POD_NAME": "rawp-gateway-2"})
    assert config.server.pod_name == "gw-a"


def test_route_prefix_fills_in_the_pod_name(tmp_path):
    config = load(tmp_path, 'route_prefix = "/pods/{pod}"\n', {"RAWP_GATEWAY_POD_NAME": "gw-3"})
    assert config.server.route_prefix == "/pods/gw-3"
    assert load(tmp_path, "").server.route_prefix == ""


@pytest.mark.parametrize(
    "line",
    [
        'route_prefix = "pods/x"',
        'route_prefix = "/pods/x/"',
        'route_prefix = "/pods/../x"',
        'route_prefix = "/pods/a b"',
        f'route_prefix = "/{"x" * 300}"',
        'pod_name = "bad name"',
        'pod_name = "-x"',
        'trusted_proxies = ["10.0.0.0/33"]',
        'trusted_proxies = ["example.com"]',
        "trusted_proxies = [1]",
    ],
)
def test_bad_fleet_settings_are_refused(tmp_path, line):
    with pytest.raises(ConfigError):
        load(tmp_path, line + "\n")


def test_trusted_proxies_are_networks(tmp_path):
    config = load(tmp_path, 'trusted_proxies = ["10.0.0.0/8", "127.0.0.1", "fd00::/8"]\n')
    assert [str(n) for n in config.server.trusted_proxies] == [
        "10.0.0.0/8",
        "127.0.0.1/32",
        "fd00::/8",
    ]


def test_fleet_peers_are_base_urls_or_one_dns_name(tmp_path):
    listed = load(tmp_path, '[fleet]\npeers = ["http://10.1.2.3:8765/", "https://gw.example"]\n')
    assert listed.fleet.peers == ("http://10.1.2.3:8765", "https://gw.example")
    dns = load(tmp_path, '[fleet]\npeers = "dns:rawp-gateway-headless:8765"\n')
    assert dns.fleet.peers == ("dns:rawp-gateway-headless:8765",)
    for bad in ('"rawp-gateway-headless:8765"', '"dns:name"', '"dns:n:99999"', '["10.1.2.3"]'):
        with pytest.raises(ConfigError):
            load(tmp_path, f"[fleet]\npeers = {bad}\n")
    with pytest.raises(ConfigError):
        load(tmp_path, "[fleet]\npeers = [" + ", ".join(['"http://a:1"'] * 65) + "]\n")


async def create_session(gw: TestClient) -> dict:
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=AUTH)
    assert resp.status == 201, await resp.text()
    return await resp.json()


# --- routed paths ---------------------------------------------------------------------------------


async def test_every_url_handed_out_starts_with_the_route_prefix(tmp_path):
    gw = await start_gateway(fleet_config(tmp_path))
    try:
        session = await create_session(gw)
        sid = session["session_id"]
        assert session["ws_path"] == f"{PREFIX}/v1/session/{sid}/ws"
        assert session["pod"] == "rawp-gateway-1"
        resp = await gw.put(
            f"{PREFIX}/v1/session/{sid}/files", params={"name": "a.txt"}, data=b"x", headers=AUTH
        )
        assert resp.status == 201, await resp.text()
        stored = await resp.json()
        assert stored["file_url"] == f"{PREFIX}/v1/session/{sid}/files/{stored['transfer_id']}"
        for url in (stored["file_url"], stored["file_url"].removeprefix(PREFIX)):
            got = await gw.get(url, headers=AUTH)
            assert got.status == 200 and await got.read() == b"x", url
            head = await gw.head(url, headers=AUTH)
            assert head.status == 200 and head.headers["Content-Length"] == "1", url
        # The list and the one session say the same, with and without the prefix.
        for path in ("/v1/sessions", f"{PREFIX}/v1/sessions"):
            listed = await (await gw.get(path, headers=AUTH)).json()
            one = await (await gw.get(session["ws_path"][:-3], headers=AUTH)).json()
            assert listed == {"sessions": [one]}
    finally:
        await gw.close()


async def test_the_prefixed_paths_are_the_same_api(tmp_path):
    """Paths pass through a router unchanged: the gateway answers them under its prefix,
    authentication and the console's public pages included, and the plain ones still."""
    gw = await start_gateway(fleet_config(tmp_path))
    try:
        for path in ("/healthz", "/readyz", "/ui", "/ui/app.js"):
            for full in (path, PREFIX + path):
                assert (await gw.get(full)).status == 200, full
        assert (await gw.get(f"{PREFIX}/v1/agents")).status == 401
        assert (await gw.get(f"{PREFIX}/v1/agents", headers=AUTH)).status == 200
        resp = await gw.get(f"{PREFIX}/", allow_redirects=False)
        assert resp.status == 302 and resp.headers["Location"] == f"{PREFIX}/ui"
        resp = await gw.get("/", allow_redirects=False)
        assert resp.headers["Location"] == "/ui"
        assert (await gw.get("/pods/another-pod/healthz", headers=AUTH)).status == 404
        # A session created under the prefix, attached under it with a one-time ticket.
        resp = await gw.post(f"{PREFIX}/v1/session", json={"agent": "demo"}, headers=AUTH)
        session = await resp.json()
        ticket = await (await gw.post(f"{session['ws_path'][:-3]}/ws-ticket", headers=AUTH)).json()
        ws = await gw.ws_connect(
            session["ws_path"], protocols=("rawp-dps-1.0",), params={"ticket": ticket["ticket"]}
        )
        master = Master(ws, session["session_id"])
        assert (await master.next())["type"] == "session.capabilities"
        await ws.close()
    finally:
        await gw.close()


async def test_scope_must_be_local(tmp_path):
    gw = await start_gateway(fleet_config(tmp_path))
    try:
        resp = await gw.get("/v1/sessions", params={"scope": "fleet"}, headers=AUTH)
        assert resp.status == 400 and (await resp.json())["error_code"] == "INVALID_REQUEST"
        resp = await gw.get("/v1/sessions", params={"scope": "local"}, headers=AUTH)
        assert await resp.json() == {"sessions": []}
    finally:
        await gw.close()


# --- forwarded headers ----------------------------------------------------------------------------

BEHIND = {
    "X-Forwarded-Host": "gateways.example.com",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-For": "203.0.113.7",
    "Origin": "https://gateways.example.com",
}


async def test_forwarded_host_and_scheme_count_only_from_trusted_proxies(tmp_path):
    """The Origin check compares the page's origin with the gateway's own: behind a router that
    is the forwarded host and scheme, believed from ``trusted_proxies`` only."""
    for trusted, status in (((), 403), (("127.0.0.1/32",), 201)):
        networks = tuple(ipaddress.ip_network(n) for n in trusted)
        config = fleet_config(tmp_path, trusted_proxies=networks)
        gw = await start_gateway(config)
        try:
            resp = await gw.post("/v1/session", json={"agent": "demo"}, headers={**AUTH, **BEHIND})
            assert resp.status == status, (trusted, await resp.text())
        finally:
            await gw.close()


async def test_a_client_behind_the_proxy_is_not_a_local_ui(tmp_path):
    """``?role=local-ui`` is for the gateway's own machine: a request that came through a trusted
    proxy carries the client's address, which is not loopback."""
    config = fleet_config(tmp_path, trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),))
    gw = await start_gateway(config)
    try:
        session = await create_session(gw)
        cases = (
            ({"X-Forwarded-For": "203.0.113.7"}, 403),
            # Each proxy appends where it was reached from: the right-most untrusted hop counts.
            ({"X-Forwarded-For": "127.0.0.1, 203.0.113.7, 127.0.0.1"}, 403),
            ({}, 101),
        )
        for headers, status in cases:
            try:
                ws = await gw.ws_connect(
                    session["ws_path"],
                    protocols=("rawp-dps-1.0",),
                    params={"role": "local-ui"},
                    headers={**AUTH, **headers},
                )
            except aiohttp.WSServerHandshakeError as err:
                assert err.status == status
            else:
                assert status == 101
                await ws.close()
    finally:
        await gw.close()


# --- the fleet's list -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def peered_gateways(tmp_path: Path, *more_peers: str) -> AsyncIterator[list[TestClient]]:
    """Two in-process gateways of a fleet, ``rawp-gateway-0`` and ``-1`` (each under its own
    route prefix, workspace ``tmp_path``/0 and /1), peers of each other and of ``more_peers``."""
    ports = [free_port(), free_port()]
    peers = tuple(f"http://127.0.0.1:{p}" for p in ports) + more_peers
    clients: list[TestClient] = []
    try:
        for i, port in enumerate(ports):
            (tmp_path / str(i)).mkdir()
            base = fleet_config(tmp_path / str(i))
            server = replace(
                base.server,
                pod_name=f"rawp-gateway-{i}",
                route_prefix=f"/pods/rawp-gateway-{i}",
                port=port,
            )
            config = replace(base, server=server, fleet=FleetSettings(peers))
            client = TestClient(TestServer(create_app(config), port=port))
            await client.start_server()
            clients.append(client)
        yield clients
    finally:
        for c in clients:
            await c.close()


async def test_the_list_holds_every_peers_sessions_and_names_the_silent_ones(tmp_path):
    """Two gateways peers of each other (plus an address nobody answers on): each lists both
    gateways' sessions with their own ws_path and pod, asked with the caller's token."""
    dead = f"http://127.0.0.1:{free_port()}"
    async with peered_gateways(tmp_path, dead) as clients:
        made = [await create_session(c) for c in clients]
        resp = await clients[0].get("/v1/sessions", headers=AUTH)
        body = await resp.json()
        assert body["unreachable"] == [dead]
        assert sorted(s["session_id"] for s in body["sessions"]) == sorted(
            s["session_id"] for s in made
        )
        for s in body["sessions"]:
            assert s["ws_path"].startswith(f"/pods/{s['pod']}/v1/session/{s['session_id']}/")
        # The peers were asked with the caller's own Authorization: without it, this gateway
        # refuses, and with a wrong one the peer does (and is named unreachable).
        assert (await clients[1].get("/v1/sessions")).status == 401
        local = await (await clients[1].get("/v1/sessions?scope=local", headers=AUTH)).json()
        assert [s["pod"] for s in local["sessions"]] == ["rawp-gateway-1"]


# --- readiness ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, toml: str) -> AsyncIterator[tuple[subprocess.Popen, str]]:
    """``rawp-gateway serve`` with the token, on a free port, workspace root ``tmp_path``, and
    ``toml`` after those ``[server]`` keys (more keys, agents); the process and its URL once
    ready. Killed after the test unless it stopped it."""
    config = tmp_path / "gateway.toml"
    config.write_text(f"[server]\nworkspace_root = {json.dumps(str(tmp_path))}\n" + toml)
    env = dict(os.environ, RAWP_GATEWAY_TOKEN=TOKEN)
    args = ("--config", str(config))
    async with serve_process.serve(*args, stdin=subprocess.DEVNULL, env=env) as (proc, url):
        await wait_http(url, proc, START_TIMEOUT_SEC)
        yield proc, url


def test_serve_with_peers_and_no_configured_credential_refuses_to_start(tmp_path):
    """Each pod would make a token of its own, which no other pod accepts: ``serve`` says so in
    one line and exits 2 before it listens (docs/fleet.md, "Settings")."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"[server]\nworkspace_root = {json.dumps(str(tmp_path))}\n"
        '[fleet]\npeers = ["http://127.0.0.1:1"]\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "RAWP_GATEWAY_TOKEN"}
    argv = [*CLI, "serve", "--config", str(config), "--port", str(free_port())]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "rawp-gateway: [fleet] peers needs a configured credential shared by every pod "
        "(token_file, RAWP_GATEWAY_TOKEN or [auth] users_file): each would otherwise make its own"
    ]


async def test_readyz_is_503_from_sigterm_while_the_sessions_are_suspended(tmp_path):
    """Kubernetes' readiness: a gateway that got SIGTERM takes no new session. Its agent here
    ignores SIGTERM, so suspending takes ``shutdown_grace_sec``: meanwhile /readyz and a new
    session are 503 SHUTTING_DOWN, /healthz still 200."""
    toml = (
        f"state_dir = {json.dumps(str(tmp_path / 'state'))}\n"
        "shutdown_grace_sec = 3\n"
        "[agents.stubborn]\n"
        'parser = "plain"\n'
        'command = ["sh", "-c", "trap \'\' TERM; while :; do sleep 0.1; done"]\n'
    )
    async with serve(tmp_path, toml) as (proc, url):
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/readyz") as resp:
                assert resp.status == 200
            async with http.post(
                url + "/v1/session", json={"agent": "stubborn"}, headers=AUTH
            ) as resp:
                assert resp.status == 201, await resp.text()
                sid = (await resp.json())["session_id"]
            # The agent starts after the answer; a SIGTERM before its trap is set would end it at
            # once, and the gateway with it. Its sleep runs only after the trap.
            await eventually(
                lambda: session_processes(sid, "sleep"), "the agent to run with its TERM trap set"
            )
            proc.send_signal(signal.SIGTERM)
            seen = None
            while proc.poll() is None and seen is None:
                try:
                    async with http.get(url + "/readyz") as resp:
                        if resp.status == 503:
                            seen = await resp.json()
                except aiohttp.ClientError:
                    break
                await asyncio.sleep(0.02)
            assert seen is not None and seen["error_code"] == "SHUTTING_DOWN"
            async with http.post(
                url + "/v1/session", json={"agent": "stubborn"}, headers=AUTH
            ) as resp:
                assert resp.status == 503
                assert (await resp.json())["error_code"] == "SHUTTING_DOWN"
            async with http.get(url + "/healthz") as resp:
                assert resp.status == 200
        assert proc.wait(timeout=30) == 0


class At:
    """What ``Master.attach`` needs of a client, for a gateway at ``url`` (a ``serve`` process)."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    def ws_connect(self, path: str, **kw):
        return self.http.ws_connect(self.url + path, **kw)


async def readyz_until(http: aiohttp.ClientSession, url: str, status: int) -> dict:
    """/readyz polled until it answers ``status`` (a signal is handled when the loop gets to it)."""
    async with asyncio.timeout(15):
        while True:
            async with http.get(url + "/readyz") as resp:
                if resp.status == status:
                    return await resp.json()
            await asyncio.sleep(0.02)


async def draining_gauge(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics", headers=AUTH) as resp:
        text = await resp.text()
    (line,) = [x for x in text.splitlines() if x.startswith("rawp_gateway_draining ")]
    return float(line.split()[1])


async def test_sigusr1_drains_the_gateway_until_sigusr2_and_its_sessions_go_on(tmp_path):
    """An operator drains a gateway before removing it (docs/fleet.md): from SIGUSR1 on /readyz
    and a new session are 503 SHUTTING_DOWN (a router tries the next gateway), while the session
    it holds goes on: its attached master runs a turn, and another master attaches and runs one.
    SIGUSR2 makes it ready again. ``rawp_gateway_draining`` and one log line each say so."""
    toml = '[agents.demo]\nenv = { RAWP_DEMO_DELAY_MS = "1" }\n'
    async with serve(tmp_path, toml) as (proc, url):
        async with aiohttp.ClientSession() as http:
            gateway = At(http, url)
            async with http.post(url + "/v1/session", json={"agent": "demo"}, headers=AUTH) as r:
                assert r.status == 201, await r.text()
                session_id = (await r.json())["session_id"]
            master = await Master.attach(gateway, session_id, headers=AUTH)
            assert await draining_gauge(http, url) == 0

            proc.send_signal(signal.SIGUSR1)
            refused = await readyz_until(http, url, 503)
            assert refused["error_code"] == "SHUTTING_DOWN"
            async with http.post(url + "/v1/session", json={"agent": "demo"}, headers=AUTH) as r:
                assert r.status == 503
                assert (await r.json())["error_code"] == "SHUTTING_DOWN"
            assert await draining_gauge(http, url) == 1
            turn = await prompt_and_wait(master, "still here?")
            assert any(f["type"] == "agent.text.delta" for f in turn)
            await master.ws.close()
            other = await Master.attach(gateway, session_id, headers=AUTH)
            await prompt_and_wait(other, "and another master?")
            await other.ws.close()
            async with http.get(url + "/healthz") as r:
                assert r.status == 200

            proc.send_signal(signal.SIGUSR2)
            assert await readyz_until(http, url, 200) == {"status": "ready"}
            async with http.post(url + "/v1/session", json={"agent": "demo"}, headers=AUTH) as r:
                assert r.status == 201, await r.text()
            assert await draining_gauge(http, url) == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log_text = proc.stderr.read().decode()
        assert log_text.count("draining: not ready, no new sessions") == 1, log_text
        assert log_text.count("drain ended: ready, taking new sessions") == 1, log_text


async def test_dns_peers_are_every_address_of_the_name_but_this_gateways_own():
    """``dns:NAME:PORT`` is resolved at each use (here ``localhost``, 127.0.0.1): the gateway
    listening on that address and port leaves itself out; another port is a peer."""
    addresses = {i[4][0] for i in socket.getaddrinfo("localhost", 8765, type=socket.SOCK_STREAM)}
    urls = sorted(f"http://{f'[{a}]' if ':' in a else a}:8765" for a in addresses)
    assert "http://127.0.0.1:8765" in urls
    others = [u for u in urls if u != "http://127.0.0.1:8765"]
    assert await fleet.peer_urls(("dns:localhost:8765",), "127.0.0.1", 8765) == others
    assert await fleet.peer_urls(("dns:localhost:8765",), "127.0.0.1", 9000) == urls
    assert await fleet.peer_urls(("dns:no-such-name.invalid:8765",), "127.0.0.1", 8765) == []
    listed = ("http://127.0.0.1:8765", "http://[::1]:8765", "http://10.0.0.9:8765")
    assert await fleet.peer_urls(listed, "127.0.0.1", 8765) == list(listed[1:])
