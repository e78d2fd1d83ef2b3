"""Picking up a real ACP agent's saved session (marked ``realcli``): claude-agent-acp and codex-acp
against the rig's scripted model servers. A conversation is had through one gateway session; the
session ends; the agent lists it (``session/list``, asked of a process of its own); a new gateway
session continues it (``session/load``): the model's next request carries the earlier messages,
and a master that attaches gets the earlier turn as frames marked ``metadata.rawp_replayed``
before the live one. Gemini CLI declares no ``sessionCapabilities.list``: its listing is 501.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from gateway.agent.profiles import builtin_profiles
from tests.support.gateway_peer import Master, create_session, make_config, start_gateway
from tests.support.rig.env import require_cli
from tests.support.rig.run import scripted_cli
from tests.support.rig.scenario import parse_scenario

pytestmark = pytest.mark.realcli

STARTUP = 120.0  # an agent's start under load
FIRST = "Remember the number 42."
SECOND = "Which number did I ask you to remember?"
CALLS = {
    "claude-acp": [
        {"content": [{"type": "text", "text": "I will remember 42."}]},
        {"content": [{"type": "text", "text": "It was 42."}]},
    ],
    "codex-acp": [
        {"output": [{"type": "message", "text": "I will remember 42."}]},
        {"output": [{"type": "message", "text": "It was 42."}]},
    ],
}
GEMINI_MODEL = "gemini-2.5-flash"  # without -m the CLI first makes a routing call


@contextlib.asynccontextmanager
async def acp_gateway(agent: str, calls: list[dict[str, Any]]) -> AsyncIterator[Any]:
    binary = require_cli(agent)
    scenario = parse_scenario({"run": {}, "calls": calls}, name=f"conv-{agent}", agent=agent)
    async with scripted_cli(scenario) as cli:
        kw = (
            {"gemini": str(binary)} if agent == "gemini" else {agent.replace("-", "_"): str(binary)}
        )
        profiles = builtin_profiles(**kw)
        name = "gemini-acp" if agent == "gemini" else agent
        profile = replace(profiles[name], env=cli.env)
        if agent == "gemini":
            command = (str(binary), "-m", GEMINI_MODEL, *profile.command[1:])
            profile = replace(profile, command=command)
        client = await start_gateway(make_config(cli.cwd, agents={name: profile}))
        try:
            yield cli, client
        finally:
            await client.close()


def replayed(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if (f.get("metadata") or {}).get("rawp_replayed") is True]


def texts(frames: list[dict[str, Any]]) -> str:
    return "".join(f["payload"]["text"] for f in frames if f["type"] == "agent.text.delta")


@pytest.mark.parametrize("agent", ["claude-acp", "codex-acp"])
async def test_an_acp_conversation_is_listed_and_continued_with_its_history(agent) -> None:
    async with acp_gateway(agent, CALLS[agent]) as (cli, gw):
        # The conversation, had through a first gateway session that then ends.
        first = await create_session(gw, agent)
        master = await Master.attach(gw, first["session_id"])
        await master.send("control.prompt.request", {"prompt_text": FIRST})
        await master.until("session.turn.end", timeout=STARTUP)
        await master.ws.close()
        ended = await (await gw.delete(f"/v1/session/{first['session_id']}")).json()
        conversation = ended["agent_session_id"]
        assert conversation

        # Listed by the agent itself.
        resp = await gw.get(f"/v1/agents/{agent}/conversations", params={"workspace": str(cli.cwd)})
        body = await resp.json()
        assert resp.status == 200, body
        assert body["complete"] is True
        (listed,) = [c for c in body["conversations"] if c["id"] == conversation]
        assert listed["title"] == FIRST
        assert listed["updated_at"].endswith("Z") and listed["turns"] is None

        # Continued in a new session: the earlier turn first, marked replayed.
        resp = await gw.post(
            "/v1/session", json={"agent": agent, "resume_conversation": conversation}
        )
        session = await resp.json()
        assert resp.status == 201, session
        assert session["agent_session_id"] == conversation
        sid = session["session_id"]
        master = await Master.attach(gw, sid)
        await master.send("control.prompt.request", {"prompt_text": SECOND})
        await master.until("session.turn.end", timeout=STARTUP)
        assert texts(master.frames) == "It was 42."

        # The model saw the earlier conversation.
        last = str(cli.server.requests[-1].body)
        assert FIRST in last and "I will remember 42." in last and SECOND in last
        assert [r for r in cli.server.unexpected if r.method != "HEAD"] == []  # HEAD: a probe

        # A master that attaches now: the earlier turn, then the new one.
        late = await Master.attach(gw, sid, history="all")
        await late.next()
        frames = (await late.until("session.history"))["payload"]["frames"]
        old = replayed(frames)
        assert old == frames[: len(old)]
        types = [f["type"] for f in old]
        assert types[:2] == ["control.prompt.request", "session.turn.start"]
        assert old[0]["payload"]["prompt_text"] == FIRST
        assert "session.turn.end" in types
        assert texts(old) == "I will remember 42."
        live = frames[len(old) :]
        prompts = [f for f in live if f["type"] == "control.prompt.request"]
        assert [p["payload"]["prompt_text"] for p in prompts] == [SECOND]
        assert texts(live) == "It was 42."
        codes = [f["payload"]["error_code"] for f in frames if f["type"] == "agent.error"]
        assert "ACP_SESSION_NOT_RESUMED" not in codes

        # A session the agent does not know.
        resp = await gw.post(
            "/v1/session",
            json={"agent": agent, "resume_conversation": "0b5e0a3c-1111-4222-8333-444455556666"},
        )
        body = await resp.json()
        assert (resp.status, body["error_code"]) == (404, "CONVERSATION_NOT_FOUND"), body


async def test_gemini_acp_declares_no_session_list() -> None:
    """Gemini CLI 0.61.0 over ACP declares ``loadSession`` but no ``sessionCapabilities.list``
    (and answers ``session/list`` with -32601): its listing is a 501 that says so."""
    async with acp_gateway("gemini", []) as (cli, gw):
        resp = await gw.get(
            "/v1/agents/gemini-acp/conversations", params={"workspace": str(cli.cwd)}
        )
        body = await resp.json()
        assert (resp.status, body["error_code"]) == (501, "CONVERSATIONS_NOT_SUPPORTED")
        assert "sessionCapabilities.list" in body["message"]
