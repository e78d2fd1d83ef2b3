"""The fleet behind its router, with real parts (tests/support/fleet_rig.py): Debian's nginx running the
router configuration of deploy/k8s (the same template, only the listen address, resolver,
gateway domain and port filled in for loopback), three ``rawp-gateway serve`` processes on
127.0.0.2, .3 and .4 with their own state directories and route prefixes, and real WebSocket
masters, Chromium and ACP editors going through the router only."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from typing import Any

import aiohttp
import pytest

from gateway.client import GatewayClient
from gateway.client.view import payload_of
from gateway.protocol import frames as F
from tests.support.acp_editors import CutProxy, python_editor, relay_argv, relay_env
from tests.support.console import open_page, prompt, sign_in
from tests.support.dashboard import all_panels, load_dashboard, substitute
from tests.support.fleet_rig import AUTH, TOKEN, Fleet, nginx_path
from tests.support.prometheus import query, run_prometheus
from tests.support.waiting import eventually

pytestmark = pytest.mark.nginx
SUBPROTOCOL = "rawp-dps-1.0"


@pytest.fixture(autouse=True)
def _nginx_installed():
    if nginx_path() is None:
        pytest.fail("nginx is not installed (scripts/install-nginx.sh)")


@pytest.fixture
async def fleet(tmp_path):
    f = Fleet(tmp_path)
    try:
        await f.start()
        yield f
    finally:
        f.close()


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def post_session(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json={"agent": "demo"}, headers=AUTH) as resp:
        return resp.status, await resp.json()


async def list_sessions(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/v1/sessions", headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


def frame(session_id: str, type_: str, payload: dict[str, Any]) -> str:
    return json.dumps(
        {
            "v": 1,
            "type": type_,
            "message_id": str(uuid.uuid4()),
            "timestamp": "2026-12-01T00:00:00.000Z",
            "session_id": session_id,
            "payload": payload,
        }
    )


async def attach(http, url: str, session: dict[str, Any], **params: str):
    ws = await http.ws_connect(
        url + session["ws_path"], protocols=(SUBPROTOCOL,), params=params, headers=AUTH
    )
    caps = {
        "protocol_version": SUBPROTOCOL,
        "supported_namespaces": ["agent", "tool", "control", "session"],
        "features": {},
    }
    await ws.send_str(frame(session["session_id"], "session.capabilities", caps))
    return ws


async def until(ws, type_: str, seen: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    async with asyncio.timeout(30):
        while True:
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data)
            got = json.loads(msg.data)
            if seen is not None:
                seen.append(got)
            if got["type"] == type_:
                return got


async def one_turn(http, url: str, session: dict[str, Any], text: str) -> list[dict[str, Any]]:
    """Attach through ``url``, run one prompt to its end, detach; the frames seen."""
    ws = await attach(http, url, session)
    seen: list[dict[str, Any]] = []
    await ws.send_str(frame(session["session_id"], "control.prompt.request", {"prompt_text": text}))
    await until(ws, "session.usage", seen)
    await ws.close()
    return seen


async def test_router_runs_the_deploy_template(fleet):
    """nginx accepts the configuration rendered from deploy/k8s/router/default.conf.template, and
    a path outside every pod's name gets nowhere."""
    proc = fleet.router.check()
    assert proc.returncode == 0, proc.stderr
    async with aiohttp.ClientSession() as http:
        async with http.get(fleet.router.url + "/pods/no-such-pod/healthz") as resp:
            assert resp.status == 502  # NXDOMAIN for <name>.<domain>: no pod of that name
        async with http.get(fleet.router.url + "/pods/rawp-gateway-1/readyz") as resp:
            assert resp.status == 200


async def test_create_through_the_router_then_attach_and_reattach_by_the_routed_path(fleet, http):
    router = fleet.router.url
    status, session = await post_session(http, router + "/v1/session")
    assert status == 201, session
    pod = fleet.pod(session["pod"])
    assert session["ws_path"] == f"{pod.prefix}/v1/session/{session['session_id']}/ws"
    first = await one_turn(http, router, session, "hello")
    assert any(f["type"] == "agent.message.chunk" for f in first) or first
    mark = first[len(first) // 2]["message_id"]
    after = [f["message_id"] for f in first[len(first) // 2 + 1 :]]
    # Reattach through the router with the last message id: exactly the frames after it.
    ws = await attach(http, router, session, last_message_id=mark)
    history = await until(ws, "session.history")
    got = [f["message_id"] for f in history["payload"]["frames"]]
    assert got[: len(after)] == after
    await ws.close()
    # The session's own URL and a file's, through the router.
    base = router + session["ws_path"][: -len("/ws")]
    async with http.get(base, headers=AUTH) as resp:
        assert (await resp.json())["session_id"] == session["session_id"]
    async with http.put(base + "/files", params={"name": "n.txt"}, data=b"abc", headers=AUTH) as r:
        stored = await r.json()
    assert stored["file_url"].startswith(pod.prefix + "/")
    async with http.get(router + stored["file_url"], headers=AUTH) as resp:
        assert resp.status == 200 and await resp.read() == b"abc"


async def test_the_fleet_list_through_the_router_has_every_pods_sessions(fleet, http):
    router = fleet.router.url
    made = {}
    for pod in fleet.pods:
        # A POST under a pod's prefix lands on that pod.
        status, session = await post_session(http, f"{router}{pod.prefix}/v1/session")
        assert status == 201 and session["pod"] == pod.name
        made[session["session_id"]] = pod.name
    for _ in range(3):  # whichever gateway answers, the same fleet
        body = await list_sessions(http, router)
        assert body["unreachable"] == []
        assert {s["session_id"]: s["pod"] for s in body["sessions"]} == made
        for s in body["sessions"]:
            assert s["ws_path"] == f"/pods/{s['pod']}/v1/session/{s['session_id']}/ws"
    for pod in fleet.pods:
        async with http.get(pod.url + "/v1/sessions?scope=local", headers=AUTH) as resp:
            local = await resp.json()
        assert [s["pod"] for s in local["sessions"]] == [pod.name]
        assert "unreachable" not in local


async def test_a_gateway_that_does_not_answer_is_listed_unreachable(fleet, http):
    victim = fleet.pods[2]
    status, _ = await post_session(http, f"{fleet.router.url}{victim.prefix}/v1/session")
    assert status == 201
    victim.kill()
    body = await list_sessions(http, fleet.pods[0].url)
    assert body["unreachable"] == [victim.url]
    assert body["sessions"] == []


@pytest.fixture
async def full_fleet(tmp_path):
    """Every gateway takes one session at most."""
    f = Fleet(tmp_path, extras=("max_sessions = 1\n",) * 3)
    try:
        await f.start()
        yield f
    finally:
        f.close()


async def test_a_full_gateway_answers_503_and_the_router_tries_the_next(full_fleet, http):
    """503 TOO_MANY_SESSIONS creates nothing, so nginx retries the POST on the next gateway
    (proxy_next_upstream http_503 non_idempotent): three POSTs fill the three gateways, whatever
    order the router tries them in; the fourth finds every one full."""
    router = full_fleet.router.url
    pods = []
    for _ in range(3):
        status, session = await post_session(http, router + "/v1/session")
        assert status == 201, session
        pods.append(session["pod"])
    assert sorted(pods) == sorted(p.name for p in full_fleet.pods)
    status, body = await post_session(http, router + "/v1/session")
    assert status == 503 and body["error_code"] == "TOO_MANY_SESSIONS"
    assert len((await list_sessions(http, router))["sessions"]) == 3


async def test_a_drained_gateway_gets_no_new_sessions_but_keeps_its_own(fleet, http):
    """SIGUSR1 drains rawp-gateway-0 before a scale-down (docs/fleet.md): its /readyz is 503, and
    before Kubernetes has seen that (here the router's "ready" name keeps all three) the router
    may still try it: its 503 SHUTTING_DOWN sends the new session to another gateway (which pod
    nginx tries first is its own choice, so the test checks what any try of it answered). Its own
    session stays reachable by its routed path, listed, and runs a turn; after SIGUSR2 it takes
    new sessions again."""
    router = fleet.router.url
    drained = fleet.pods[0]
    status, held = await post_session(http, f"{router}{drained.prefix}/v1/session")
    assert status == 201 and held["pod"] == drained.name
    drained.proc.send_signal(signal.SIGUSR1)
    async with asyncio.timeout(15):  # the signal is handled when the gateway's loop gets to it
        while True:
            async with http.get(f"{router}{drained.prefix}/readyz") as resp:
                if resp.status == 503:
                    assert (await resp.json())["error_code"] == "SHUTTING_DOWN"
                    break
            await asyncio.sleep(0.02)
    landed = []
    for _ in range(6):
        status, session = await post_session(http, router + "/v1/session")
        assert status == 201, session
        landed.append(session["pod"])
    assert drained.name not in landed
    tried = [t for ts in fleet.router.tries("POST", "/v1/session") for t in ts]
    address = f"{drained.address}:{drained.port}"
    assert all(status == "503" for addr, status in tried if addr == address)  # it took none
    assert all(addr == address for addr, status in tried if status == "503")  # only it refused
    async with http.get(f"{router}{drained.prefix}/v1/sessions?scope=local", headers=AUTH) as r:
        assert [s["session_id"] for s in (await r.json())["sessions"]] == [held["session_id"]]
    listed = {s["session_id"]: s for s in (await list_sessions(http, router))["sessions"]}
    assert listed[held["session_id"]]["ws_path"] == held["ws_path"]
    seen = await one_turn(http, router, held, "still here?")
    assert seen[-1]["type"] == "session.usage" and seen[-1]["session_id"] == held["session_id"]
    drained.proc.send_signal(signal.SIGUSR2)
    async with asyncio.timeout(15):
        while True:
            async with http.get(f"{router}{drained.prefix}/readyz") as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.02)
    status, again = await post_session(http, f"{router}{drained.prefix}/v1/session")
    assert status == 201 and again["pod"] == drained.name


async def test_a_killed_gateway_comes_back_with_its_sessions(fleet, http):
    """SIGKILL (an OOM kill, a node lost) and a start on the same state directory, as a
    StatefulSet pod comes back with its name and volume: the session is listed once, by the same
    routed path, and a master reattaches there with its last message id and goes on."""
    router = fleet.router.url
    pod = fleet.pods[1]
    status, session = await post_session(http, f"{router}{pod.prefix}/v1/session")
    assert status == 201
    first = await one_turn(http, router, session, "before")
    last = first[-1]["message_id"]
    pod.kill()
    async with http.get(router + session["ws_path"][:-3], headers=AUTH) as resp:
        assert resp.status == 502  # nobody behind that name now
    await pod.start(fleet.workspace)
    body = await list_sessions(http, router)
    assert body["unreachable"] == []
    assert [s["session_id"] for s in body["sessions"]] == [session["session_id"]]
    (back,) = body["sessions"]
    assert back["ws_path"] == session["ws_path"] and back["pod"] == pod.name
    ws = await attach(http, router, session, last_message_id=last)
    history = (await until(ws, "session.history"))["payload"]
    # What was written down before the kill, each frame once (a SIGKILL may lose the newest
    # frames: the history then says truncated, docs/persistence.md).
    ids = [f["message_id"] for f in history["frames"]]
    assert len(ids) == len(set(ids))
    await ws.send_str(
        frame(session["session_id"], "control.prompt.request", {"prompt_text": "after"})
    )
    usage = await until(ws, "session.usage")
    assert usage["session_id"] == session["session_id"]
    await ws.close()


@pytest.mark.browser
async def test_the_browser_console_works_through_the_router(fleet, http):
    """Chromium opens the console at the router's /ui (served by any gateway), logs in, sees the
    whole fleet's sessions, creates one and runs a turn over the WebSocket of its routed path."""
    router = fleet.router.url
    for pod in fleet.pods:
        status, _ = await post_session(http, f"{router}{pod.prefix}/v1/session")
        assert status == 201
    async with open_page() as page:
        await page.goto(router + "/")
        assert await page.js("location.pathname") == "/ui"
        await sign_in(page, TOKEN)
        await page.wait("document.querySelectorAll('#sessions li').length === 3")
        await page.wait("document.querySelectorAll('#new-agent option').length > 0")
        await page.click("#new-session button[type=submit]")
        await page.wait("document.body.dataset.connection === 'open'", 20)
        sid = await page.js("location.hash.slice('#session='.length)")
        await prompt(page, "hello")
        await page.wait("document.querySelectorAll('.turn[data-state=ended]').length >= 1", 20)
        body = await list_sessions(http, router)
        (made,) = [s for s in body["sessions"] if s["session_id"] == sid]
        host = router.removeprefix("http://")
        assert f"ws://{host}{made['ws_path']}" in [u.split("?")[0] for u in page.websocket_urls()]
        await page.wait("document.querySelectorAll('#sessions li').length === 4", 15)
        assert page.errors() == []


@pytest.mark.prometheus
async def test_prometheus_scrapes_every_pod_and_the_dashboards_fleet_row_adds_them_up(
    fleet, http, tmp_path
):
    """A real Prometheus scrapes each gateway of the fleet, labelled with its pod as the
    Kubernetes job labels it; the dashboard's own "Live sessions per pod" queries then give each
    pod's sessions and the fleet's total."""
    router = fleet.router.url
    made = {"rawp-gateway-0": 1, "rawp-gateway-1": 0, "rawp-gateway-2": 2}
    for name, count in made.items():
        for _ in range(count):
            status, _ = await post_session(http, f"{router}/pods/{name}/v1/session")
            assert status == 201
    pods = [
        {"targets": [p.url.removeprefix("http://")], "labels": {"pod": p.name}} for p in fleet.pods
    ]
    (panel,) = [p for p in all_panels(load_dashboard()) if p["title"] == "Live sessions per pod"]
    per_pod, total = (substitute(t["expr"]) for t in panel["targets"])
    async with run_prometheus(tmp_path, TOKEN, pods) as base:
        async with asyncio.timeout(30):
            while True:
                by_pod = {
                    r["metric"].get("pod"): float(r["value"][1])
                    for r in await query(http, base, per_pod)
                }
                if by_pod == {k: float(v) for k, v in made.items()}:
                    break
                await asyncio.sleep(0.25)
        (fleet_total,) = await query(http, base, total)
        assert float(fleet_total["value"][1]) == sum(made.values())


async def test_the_client_library_follows_each_session_to_its_pod(fleet):
    """``GatewayClient`` pointed at the router: a session's own calls (get, upload, attach,
    delete) go to the routed path its ``ws_path`` gave, whichever pod holds it; the plain path
    would reach a random pod."""
    from gateway.client import GatewayClient

    async with GatewayClient(fleet.router.url, token=TOKEN) as client:
        sessions = [await client.create_session("demo") for _ in range(3)]
        for s in sessions:
            sid = s["session_id"]
            assert client.session_path(sid) == f"/pods/{s['pod']}/v1/session/{sid}"
            assert (await client.get_session(sid))["pod"] == s["pod"]
            stored = await client.upload_file(sid, "a.txt", b"abc", "text/plain")
            assert await client.download_file(stored["file_url"]) == b"abc"
            conn = await client.attach(sid)
            await conn.close()
            assert (await client.delete_session(sid))["state"] == "TERMINATED"


ACP_TURN = 60.0  # a bound on a hang, not a measure


async def dps_turn(client: GatewayClient, session_id: str, text: str) -> None:
    """A DPS master's prompt, through the router, to its turn's end."""
    conn = await client.attach(session_id)
    try:
        await conn.prompt(text)
        async with asyncio.timeout(ACP_TURN):
            while not isinstance(payload_of(await conn.receive()), F.TurnEnd):
                pass
    finally:
        await conn.close()


async def test_an_editor_through_the_router_reaches_every_pods_sessions_and_survives_a_drop(
    fleet, tmp_path
):
    """``/acp`` through the router: an editor (the official ACP Python SDK) launching
    ``rawp-gateway acp --url <router>`` loads a session on each pod (the gateway the router chose
    relaying the others' to the pod that holds each), lists every pod's sessions, prompts each, and
    after the connection drops (a loopback hop before the router, cut) finds every one of them
    again, wherever the router put its new socket; then after one pod restarts."""
    # One session on each pod, each with a DPS master's turn in its history.
    sessions: dict[str, str] = {}  # pod -> session
    for pod in fleet.pods:
        async with GatewayClient(pod.url, token=TOKEN) as client:  # a master inside the cluster
            created = await client.create_session("demo")
            assert created["pod"] == pod.name
            sessions[pod.name] = created["session_id"]
            await dps_turn(client, created["session_id"], f"hello {pod.name}")
    hop = CutProxy(fleet.router.port)
    await hop.start()
    argv = relay_argv(f"http://127.0.0.1:{hop.port}", agent="demo")
    try:
        async with python_editor(argv, relay_env(TOKEN), tmp_path) as ed:
            await ed.request("initialize", {})
            # A load before any list: whichever gateway the router chose either holds it or
            # relays it to the gateway that does.
            for pod, sid in sessions.items():
                await ed.request("session/load", {"sessionId": sid, "cwd": str(fleet.workspace)})
                assert f"hello {pod}" in ed.text(sid, "user_message_chunk")
            listed = await ed.request("session/list", {})
            pods = {s["sessionId"]: s["_meta"]["rawp"]["pod"] for s in listed["sessions"]}
            assert {pods[sid] for sid in sessions.values()} == set(sessions)
            for pod, sid in sessions.items():
                done = await ed.request("session/prompt", acp_prompt(sid, f"and again {pod}"))
                assert done["stopReason"] == "end_turn"
            # And one the editor makes: on whichever gateway the router chose.
            made = (await ed.request("session/new", {"cwd": str(fleet.workspace)}))["sessionId"]
            sessions["made by the editor"] = made
            # The network drops; the relay comes back through the router and finds them all.
            back = ed.stderr().count("sessions loaded again") + len(fleet.pods) + 1
            hop.cut()  # the socket at --url and each pod's: all come back, each says so once
            await eventually(
                lambda: ed.stderr().count("sessions loaded again") >= back,
                "every socket back",
                ACP_TURN,
            )
            for pod, sid in sessions.items():
                done = await ed.request("session/prompt", acp_prompt(sid, f"after the drop {pod}"))
                assert done["stopReason"] == "end_turn"
                ids = ed.ids(sid)
                assert len(ids) == len(set(ids)), f"an update of {pod} was repeated"
            # A pod restarts (SIGTERM, then the same name and state directory, as a StatefulSet
            # rolls it): its socket closes, the relay retries through the router until the pod is
            # back, and loads its session there again.
            restarted = fleet.pods[1]
            reloads = ed.stderr().count(f"pod {restarted.name}: sessions loaded again")
            assert restarted.stop() == 0
            await restarted.start(fleet.workspace)
            await eventually(
                lambda: ed.stderr().count(f"pod {restarted.name}: sessions loaded again") > reloads,
                "the restarted pod's socket back",
                ACP_TURN,
            )
            sid = sessions[restarted.name]
            done = await ed.request("session/prompt", acp_prompt(sid, "after the restart"))
            assert done["stopReason"] == "end_turn"
            ids = ed.ids(sid)
            assert len(ids) == len(set(ids)), "an update was repeated after the restart"
    finally:
        await hop.close()
    # The router's /acp and every pod's own went through nginx as WebSockets (logged at their end).
    assert [status for (_, status), *_ in fleet.router.tries("GET", "/acp")][:1] == ["101"]
    for pod in fleet.pods:
        assert fleet.router.tries("GET", f"{pod.prefix}/acp")[0] == [(pod.url[7:], "101")]


def acp_prompt(session_id: str, text: str) -> dict[str, object]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
