"""A session never waits on what an agent left behind: real server, real hostile agents
(``tests/support/hostile/leaves_descendant.py``), real WebSocket masters.

Single-turn: the agent prints, leaves a descendant that ignores SIGTERM, and exits 0: the turn
ends, the next prompt is taken (not PROMPT_IN_PROGRESS), the descendant is gone. Long-lived: the
demo agent starts after leaving such a descendant; DELETE and the gateway's shutdown finish within
the grace, and the descendant is gone.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.agent.profiles import AgentProfile
from tests.support.gateway_peer import Master, create_session, fast_demo, make_config, start_gateway
from tests.support.loops import HOSTILE, HOWS
from tests.support.procs import gone
from tests.support.waiting import eventually

GRACE = 1.0
# What "within the grace" allows beyond it: stopping the agent and reaping, a few hundred ms even
# on a loaded machine. Far below the 120 s the descendant would live: waiting for it cannot pass.
WITHIN_GRACE = GRACE * 5


def single_turn(how: str) -> AgentProfile:
    return AgentProfile(
        name="hostile",
        parser="plain",
        command=(sys.executable, HOSTILE, how, "--ignore-term", "{prompt}"),
        single_turn_process=True,
    )


def long_lived(how: str) -> AgentProfile:
    demo = fast_demo()
    return replace(
        demo,
        name="hostile",
        command=(sys.executable, HOSTILE, how, "--ignore-term", "--exec", *demo.command),
    )


def descendant_of(tmp_path: Path) -> int:
    return int((tmp_path / "descendant.pid").read_text())


@pytest.mark.parametrize("how", HOWS)
async def test_single_turn_agent_exit_ends_the_turn_and_the_next_prompt_runs(how, tmp_path):
    """DPS-18-respawn, DPS-17.3.2-one-prompt: the exit of the agent ends its turn although a
    descendant holds stdout; the next prompt starts a new process (not PROMPT_IN_PROGRESS); the descendant is killed by the end of the grace."""
    config = make_config(tmp_path, agents={"hostile": single_turn(how)}, shutdown_grace_sec=GRACE)
    client = await start_gateway(config)
    try:
        session = await create_session(client, "hostile")
        master = await Master.attach(client, session["session_id"])
        for prompt in ("first", "second"):
            start = len(master.frames)
            await master.send("control.prompt.request", {"prompt_text": prompt})
            end = await master.until("session.turn.end", timeout=15)
            assert end["payload"]["stop_reason"] == "end_turn"
            frames = master.frames[start:]
            assert not [f for f in frames if f["type"] in ("session.error", "agent.error")]
            text = "".join(
                f["payload"]["full_text"] for f in frames if f["type"] == "agent.text.done"
            )
            assert "working" in text and "done" in text
            descendant = descendant_of(tmp_path)
            await eventually(
                lambda d=descendant: gone(d), "the descendant to be reaped", timeout=10
            )
        info = await (await client.get(f"/v1/session/{session['session_id']}")).json()
        assert info["state"] == "IDLE"
    finally:
        await client.close()


@pytest.mark.parametrize("how", HOWS)
async def test_delete_finishes_within_the_grace_whatever_descendants_do(how, tmp_path):
    """DPS-17.2.3-signals, DPS-7.7-deleted: DELETE of a long-lived agent whose descendant ignores SIGTERM
    (and may hold stdout) answers once the agent is stopped and the grace is over, not when the
    descendant would end (120 s); the descendant is gone."""
    config = make_config(tmp_path, agents={"hostile": long_lived(how)}, shutdown_grace_sec=GRACE)
    client = await start_gateway(config)
    try:
        session = await create_session(client, "hostile")
        master = await Master.attach(client, session["session_id"])
        await master.send("control.prompt.request", {"prompt_text": "hello"})
        await master.until("session.turn.end", timeout=15)
        descendant = descendant_of(tmp_path)
        resp = await asyncio.wait_for(
            client.delete(f"/v1/session/{session['session_id']}"), WITHIN_GRACE
        )
        assert resp.status == 200
        await master.until("session.deleted", timeout=5)
        await eventually(lambda: gone(descendant), "the descendant to be reaped", timeout=10)
    finally:
        await client.close()


async def test_shutdown_finishes_within_the_grace_whatever_descendants_do(tmp_path):
    """The gateway's own shutdown deletes every session; a descendant in a session of its own
    holding the agent's stdout does not delay it, and does not outlive it."""
    config = make_config(
        tmp_path, agents={"hostile": long_lived("setsid")}, shutdown_grace_sec=GRACE
    )
    client = await start_gateway(config)
    session = await create_session(client, "hostile")
    master = await Master.attach(client, session["session_id"])
    await master.send("control.prompt.request", {"prompt_text": "hello"})
    await master.until("session.turn.end", timeout=15)
    descendant = descendant_of(tmp_path)
    assert os.path.exists(f"/proc/{descendant}")
    await asyncio.wait_for(client.close(), WITHIN_GRACE)
    await eventually(lambda: gone(descendant), "the descendant to be reaped", timeout=10)
