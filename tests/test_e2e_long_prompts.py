"""Long prompts with the real CLIs (pinned, against the rig's scripted model servers): on each
single-turn built-in profile a prompt too long for argv goes to the CLI's stdin (Claude Code ``-p``
with no prompt argument, ``codex exec -`` and ``codex exec resume <id> -``, Gemini with no
``--prompt``), the model receives all of it, and the next long prompt resumes the agent's session
the same way."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.config import MAX_ARGV_PROMPT_BYTES, builtin_profiles
from tests.gateway_peer import Master, create_session, make_config, start_gateway
from tests.rig.env import require_cli
from tests.rig.run import CliSetup, scripted_cli
from tests.rig.scenario import parse_scenario

pytestmark = pytest.mark.realcli

GEMINI_MODEL = "gemini-2.5-flash"  # without -m the CLI first makes a routing call ("auto")
FILLER = "All work and no play makes a long prompt. " * 3500  # ~150 KB


def answer(agent: str, text: str, match: str) -> dict[str, Any]:
    if agent == "codex":
        return {"match": {"input_contains": match}, "output": [{"type": "message", "text": text}]}
    if agent == "gemini":
        return {"match": {"contents_contain": match}, "parts": [{"text": text}]}
    return {"match": {"any_user_contains": match}, "content": [{"type": "text", "text": text}]}


@contextlib.asynccontextmanager
async def gateway(
    profile: str, calls: list[dict[str, Any]]
) -> AsyncIterator[tuple[CliSetup, TestClient]]:
    agent = "claude-code" if profile.startswith("claude") else profile
    binary = require_cli(agent)
    scenario = parse_scenario({"run": {}, "calls": calls}, name=f"long-{agent}", agent=agent)
    async with scripted_cli(scenario) as cli:
        profiles = builtin_profiles(claude=str(binary), codex=str(binary), gemini=str(binary))
        base = profiles[profile]
        prof = replace(base, env=cli.env)
        if agent == "gemini":
            prof = replace(prof, command=(str(binary), "-m", GEMINI_MODEL, *base.command[1:]))
        client = await start_gateway(make_config(cli.cwd, agents={profile: prof}))
        try:
            yield cli, client
        finally:
            await client.close()


@pytest.mark.parametrize("profile", ["claude-code-oneshot", "codex", "gemini"])
async def test_long_prompts_reach_the_model_through_stdin_and_resume(profile: str):
    agent = "claude-code" if profile.startswith("claude") else profile
    first = FILLER + "FIRST-MARKER remember 42."
    second = FILLER + "SECOND-MARKER which number?"
    assert len(first.encode()) > MAX_ARGV_PROMPT_BYTES
    calls = [
        answer(agent, "I will remember 42.", "FIRST-MARKER"),
        answer(agent, "It was 42.", "SECOND-MARKER"),
    ]
    async with gateway(profile, calls) as (cli, client):
        session = await create_session(client, profile)
        master = await Master.attach(client, session["session_id"])
        texts = []
        for prompt in (first, second):
            start = len(master.frames)
            await master.send("control.prompt.request", {"prompt_text": prompt})
            end = await master.until("session.turn.end", timeout=90)
            frames = master.frames[start:]
            assert end["payload"]["stop_reason"] == "end_turn", frames
            assert not [f for f in frames if f["type"] in ("agent.error", "session.error")]
            texts.append(
                "".join(f["payload"]["full_text"] for f in frames if f["type"] == "agent.text.done")
            )
            if prompt is first:
                agent_session = (
                    await (await client.get(f"/v1/session/{session['session_id']}")).json()
                )["agent_session_id"]
        assert texts == ["I will remember 42.", "It was 42."]
        info = await (await client.get(f"/v1/session/{session['session_id']}")).json()
        assert info["state"] == "IDLE" and info["agent_session_id"] == agent_session
        model = [r for r in cli.server.requests if r.answer.startswith("call")]
        assert [r.answer for r in model] == ["call 1", "call 2"], [r.answer for r in model]
        last = json.dumps(model[-1].body)
        # The whole prompt arrived (its end too), and the resumed request holds the first one.
        assert "SECOND-MARKER which number?" in last and "FIRST-MARKER remember 42." in last
        assert not cli.server.unexpected
