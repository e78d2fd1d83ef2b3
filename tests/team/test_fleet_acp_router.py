"""``/acp`` through the fleet's router (tests/support/fleet_rig.py: Debian's nginx running
deploy/k8s's router in front of three ``rawp-gateway serve`` processes): an editor (the official ACP
Python SDK) launching ``rawp-gateway acp --url <router>`` loads a session on each pod (the relay
following SESSION_ON_OTHER_POD to the pod that holds it), lists every pod's sessions, prompts each, and after the connection drops (a loopback hop before the router,
cut) finds every one of them again, wherever the router put its new socket."""

from __future__ import annotations

import asyncio

import pytest

from gateway.client import GatewayClient
from gateway.client.view import payload_of
from gateway.protocol import frames as F
from tests.support.acp_editors import CutProxy, python_editor, relay_argv, relay_env
from tests.support.fleet_rig import TOKEN, Fleet, nginx_path
from tests.support.waiting import eventually

pytestmark = pytest.mark.nginx
TURN = 60.0  # a bound on a hang, not a measure


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


async def dps_turn(client: GatewayClient, session_id: str, text: str) -> None:
    """A DPS master's prompt, through the router, to its turn's end."""
    conn = await client.attach(session_id)
    try:
        await conn.prompt(text)
        async with asyncio.timeout(TURN):
            while not isinstance(payload_of(await conn.receive()), F.TurnEnd):
                pass
    finally:
        await conn.close()


async def test_an_editor_through_the_router_reaches_every_pods_sessions_and_survives_a_drop(
    fleet, tmp_path
):
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
            # refuses SESSION_ON_OTHER_POD, and the relay loads it on that pod instead.
            for pod, sid in sessions.items():
                await ed.request("session/load", {"sessionId": sid, "cwd": str(fleet.workspace)})
                assert f"hello {pod}" in ed.text(sid, "user_message_chunk")
            assert ed.stderr().count(": loading it there") >= 1  # the router chose one pod
            listed = await ed.request("session/list", {})
            pods = {s["sessionId"]: s["_meta"]["rawp"]["pod"] for s in listed["sessions"]}
            assert {pods[sid] for sid in sessions.values()} == set(sessions)
            for pod, sid in sessions.items():
                done = await ed.request("session/prompt", prompt(sid, f"and again {pod}"))
                assert done["stopReason"] == "end_turn"
            # The network drops; the relay comes back through the router and finds them all.
            back = ed.stderr().count("sessions loaded again") + len(sessions) + 1
            hop.cut()  # the socket at --url and each pod's: all come back, each says so once
            await eventually(
                lambda: ed.stderr().count("sessions loaded again") >= back,
                "every socket back",
                TURN,
            )
            for pod, sid in sessions.items():
                done = await ed.request("session/prompt", prompt(sid, f"after the drop {pod}"))
                assert done["stopReason"] == "end_turn"
                ids = ed.ids(sid)
                assert len(ids) == len(set(ids)), f"an update of {pod} was repeated"
    finally:
        await hop.close()
    # The router's /acp and every pod's own went through nginx as WebSockets (logged at their end).
    assert [status for (_, status), *_ in fleet.router.tries("GET", "/acp")][:1] == ["101"]
    for pod in sessions:
        assert fleet.router.tries("GET", f"/pods/{pod}/acp")[0] == [(fleet.pod(pod).url[7:], "101")]


def prompt(session_id: str, text: str) -> dict[str, object]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
