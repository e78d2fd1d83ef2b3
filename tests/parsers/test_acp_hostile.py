"""Hostile ACP agents behind the real gateway (``tests/support/hostile/acp_agent.py``, a profile with
``parser = "acp"`` and its command alone): a response to an id never sent, requests of unknown
methods, a notification flood, lines that are not JSON, a huge message, a prompt never answered.
Each is a clear ``agent.error``, and the same session takes the next prompt."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gateway.agent.profiles import AgentProfile, parser_features
from tests.support.gateway_peer import Master, create_session, make_config, start_gateway
from tests.support.paths import HOSTILE

AGENT = str(HOSTILE / "acp_agent.py")


def profile() -> AgentProfile:
    return AgentProfile(
        name="hostile-acp",
        parser="acp",
        command=(sys.executable, AGENT),
        features=parser_features("acp"),
        stall_warning_sec=0,
        stall_timeout_sec=2.0,
    )


async def turn(master: Master, text: str, timeout: float = 30) -> list[dict[str, Any]]:
    start = len(master.frames)
    await master.send("control.prompt.request", {"prompt_text": text})
    await master.until("session.turn.end", timeout=timeout)
    assert (await master.next())["type"] == "session.usage"  # DPS-7.5.2-usage
    return master.frames[start:]


def codes(frames: list[dict[str, Any]]) -> list[str]:
    return [f["payload"]["error_code"] for f in frames if f["type"] == "agent.error"]


def text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["payload"]["text"] for f in frames if f["type"] == "agent.text.delta")


async def test_hostile_acp_agent_faults_are_errors_and_the_session_goes_on(tmp_path):
    gw = await start_gateway(make_config(tmp_path, agents={"hostile-acp": profile()}))
    try:
        session = await create_session(gw, "hostile-acp")
        sid = session["session_id"]
        master = await Master.attach(gw, sid)

        frames = await turn(master, "stray")
        assert "ACP_UNEXPECTED_RESPONSE" in codes(master.frames)
        assert frames[-2]["payload"]["stop_reason"] == "end_turn"

        frames = await turn(master, "unknown")
        assert text(frames) == "answers: [-32601, -32601]"  # JSON-RPC method not found, each
        assert codes(frames).count("ACP_UNKNOWN_METHOD") == 2

        frames = await turn(master, "flood", timeout=120)
        assert text(frames) == "x" * 20000

        frames = await turn(master, "garbage")
        assert "ACP_INVALID_MESSAGE" in codes(frames)
        assert frames[-2]["payload"]["stop_reason"] == "end_turn"

        frames = await turn(master, "huge", timeout=60)
        assert "OUTPUT_TRUNCATED" in codes(frames)
        assert frames[-2]["payload"]["stop_reason"] == "end_turn"

        # Never answered: the stall watchdog ends the turn and starts the agent again, which
        # loads the same ACP session.
        frames = await turn(master, "hang", timeout=60)
        assert "AGENT_STALLED" in codes(frames)
        assert frames[-2]["payload"]["stop_reason"] == "error"
        frames = await turn(master, "after")
        assert text(frames) == "ok: after"
        info = await (await gw.get(f"/v1/session/{sid}")).json()
        assert info["state"] == "IDLE" and info["agent_session_id"] == "hostile-1"
        log = Path(info["workspace_path"]).joinpath("acp-starts.log").read_text().splitlines()
        assert log == ["start", "new", "start", "load hostile-1"]
        assert (await gw.get("/healthz")).status == 200
    finally:
        await gw.close()


async def test_get_agents_shows_what_the_acp_agent_declared(tmp_path):
    """The hostile agent lists no modes: once a session started it, GET /v1/agents shows the
    profile without plan_mode (DPS-12.2-caps)."""
    gw = await start_gateway(make_config(tmp_path, agents={"hostile-acp": profile()}))
    try:
        shown = await (await gw.get("/v1/agents")).json()
        (before,) = [a for a in shown["agents"] if a["name"] == "hostile-acp"]
        assert before["features"]["plan_mode"] is True
        session = await create_session(gw, "hostile-acp")
        master = await Master.attach(gw, session["session_id"])
        await turn(master, "hello")
        shown = await (await gw.get("/v1/agents")).json()
        (after,) = [a for a in shown["agents"] if a["name"] == "hostile-acp"]
        assert "plan_mode" not in after["features"]
    finally:
        await gw.close()


async def test_a_restored_acp_session_loads_the_agents_session_without_its_replay(tmp_path):
    """After a gateway restart (state_dir), the next prompt starts the agent again, which loads
    its ACP session (session/load) instead of starting a new one; the conversation it replays is
    not sent again (masters have it)."""
    state = tmp_path / "state"
    config = make_config(tmp_path, agents={"hostile-acp": profile()}, state_dir=state)
    gw = await start_gateway(config)
    session = await create_session(gw, "hostile-acp")
    sid = session["session_id"]
    master = await Master.attach(gw, sid)
    await turn(master, "first")
    await gw.close()  # the gateway stops: the session is suspended, not deleted
    gw = await start_gateway(config)
    try:
        master = await Master.attach(gw, sid)
        frames = await turn(master, "second")
        assert text(frames) == "ok: second"  # not "replayed"
        workspace = Path(session["workspace_path"])
        log = workspace.joinpath("acp-starts.log").read_text().splitlines()
        assert log == ["start", "new", "start", "load hostile-1"]
        assert "ACP_SESSION_NOT_RESUMED" not in codes(master.frames)
    finally:
        await gw.close()
