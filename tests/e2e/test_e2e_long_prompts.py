"""Long prompts with the real CLIs (pinned, against the rig's scripted model servers): on each
single-turn built-in profile a prompt too long for argv goes to the CLI's stdin (Claude Code ``-p``
with no prompt argument, ``codex exec -`` and ``codex exec resume <id> -``, Gemini with no
``--prompt``), the model receives all of it, and the next long prompt resumes the agent's session
the same way."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.agent.profiles import MAX_ARGV_PROMPT_BYTES
from tests.support import realcli
from tests.support.gateway_peer import of, prompt_and_wait

pytestmark = pytest.mark.realcli

FILLER = "All work and no play makes a long prompt. " * 3500  # ~150 KB


def answer(agent: str, text: str, match: str) -> dict[str, Any]:
    if agent == "codex":
        return {"match": {"input_contains": match}, "output": [{"type": "message", "text": text}]}
    if agent == "gemini":
        return {"match": {"contents_contain": match}, "parts": [{"text": text}]}
    return {"match": {"any_user_contains": match}, "content": [{"type": "text", "text": text}]}


@pytest.mark.parametrize("profile", ["claude-code-oneshot", "codex", "gemini"])
async def test_long_prompts_reach_the_model_through_stdin_and_resume(profile: str):
    agent = realcli.agent_of(profile)
    first = FILLER + "FIRST-MARKER remember 42."
    second = FILLER + "SECOND-MARKER which number?"
    assert len(first.encode()) > MAX_ARGV_PROMPT_BYTES
    calls = [
        answer(agent, "I will remember 42.", "FIRST-MARKER"),
        answer(agent, "It was 42.", "SECOND-MARKER"),
    ]
    async with realcli.gateway(realcli.scenario(agent, calls), profile) as rig:
        session_id, master = await rig.master()
        texts = []
        for prompt in (first, second):
            frames = await prompt_and_wait(master, prompt, timeout=90)
            (end,) = of(frames, "session.turn.end")
            assert end["payload"]["stop_reason"] == "end_turn", frames
            assert not [f for f in frames if f["type"] in ("agent.error", "session.error")]
            texts.append(
                "".join(f["payload"]["full_text"] for f in frames if f["type"] == "agent.text.done")
            )
            if prompt is first:
                agent_session = (await rig.info(session_id))["agent_session_id"]
        assert texts == ["I will remember 42.", "It was 42."]
        info = await rig.info(session_id)
        assert info["state"] == "IDLE" and info["agent_session_id"] == agent_session
        model = [r for r in rig.cli.server.requests if r.answer.startswith("call")]
        assert [r.answer for r in model] == ["call 1", "call 2"], [r.answer for r in model]
        last = json.dumps(model[-1].body)
        # The whole prompt arrived (its end too), and the resumed request holds the first one.
        assert "SECOND-MARKER which number?" in last and "FIRST-MARKER remember 42." in last
        assert not rig.cli.server.unexpected
