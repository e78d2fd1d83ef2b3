"""``rawp-gateway chat`` as a signed-in user (docs/identities.md), against a real gateway with a
users file and the demo agent."""

from __future__ import annotations

import asyncio
import io

import pytest

from gateway.chat import run_chat
from tests.support.auth import bearer, shared_with_viewer, users_config
from tests.support.chat import Pipe, piped_chat, shown
from tests.support.gateway_peer import Master, base_url, fast_demo, start_gateway

ALICE, BOB = "alice-chat-token", "bob-chat-token"


@pytest.fixture
async def gateway(tmp_path):
    users = {"alice": ("operator", ALICE), "bob": ("viewer", BOB)}
    config = users_config(tmp_path, users, agents={"demo": fast_demo()})
    client = await start_gateway(config)
    yield client
    await client.close()


async def chat(gateway, stdin: str, **kw) -> tuple[int, str]:
    return await piped_chat(base_url(gateway), stdin, **kw)


async def test_a_viewer_watches_and_sees_who_prompted_and_answered(gateway):
    sid = await shared_with_viewer(gateway, ALICE, "bob")
    alice = await Master.attach(gateway, sid, headers=bearer(ALICE))
    await alice.send("control.prompt.request", {"prompt_text": "write by-alice.txt"})
    ask = await alice.until("agent.interaction.request")
    await alice.send(
        "control.interaction.response",
        {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
    )
    await alice.until("session.usage")
    rc, out = await chat(gateway, "hello\n/plan\n/mcp\n", session_id=sid, token=BOB)
    assert rc == 0, out
    assert "signed in as bob · viewer (watching" in out
    assert "no MCP servers on this session\n" in out  # /mcp only shows: a viewer may
    assert "» alice: write by-alice.txt\n" in out
    assert "(allow by alice)\n" in out
    assert out.count("✗ a viewer cannot prompt") == 2
    got = await (await gateway.get(f"/v1/session/{sid}", headers=bearer(ALICE))).json()
    assert got["turn_index"] == 1 and got["mode"] == "default"


async def test_an_operator_is_told_who_they_are(gateway):
    rc, out = await chat(gateway, "hello\n", token=ALICE)
    assert rc == 0, out
    assert "signed in as alice · operator\n" in out
    assert "— end_turn · " in out


async def test_a_viewer_at_the_keyboard_is_shown_the_question_not_asked(gateway):
    """Live: the question appears for the viewer without a [y/N] to answer; the operator's answer
    then shows who gave it."""
    sid = await shared_with_viewer(gateway, ALICE, "bob")
    pipe, out = Pipe(), io.StringIO()
    url = str(gateway.make_url("")).rstrip("/")
    task = asyncio.create_task(
        run_chat(url, agent=None, session_id=sid, token=BOB, stdin=pipe.reader, stdout=out,
                 interactive=True, handle_sigint=False)
    )  # fmt: skip
    try:
        await shown(out, "Ctrl-D quits", task=task)
        alice = await Master.attach(gateway, sid, headers=bearer(ALICE))
        await alice.send("control.prompt.request", {"prompt_text": "write live.txt"})
        ask = await alice.until("agent.interaction.request")
        await shown(out, "(waiting for an operator)", task=task)
        assert "[y/N]" not in out.getvalue()
        await alice.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "deny"},
        )
        await shown(out, "(deny by alice)", task=task)
        await shown(out, "» alice: write live.txt", task=task)
    finally:
        pipe.close()
    assert await asyncio.wait_for(task, 20) == 0
    pipe.reader.close()


async def test_a_late_answer_of_another_master_is_shown_as_changing_nothing(gateway):
    """The chat allows (--yes); another master's deny comes after it. The gateway relays that
    answer too (DPS-2.4-relay) and refuses it (INTERACTION_NOT_FOUND): the chat says it changed
    nothing, not that the question was denied."""
    resp = await gateway.post("/v1/session", json={"agent": "demo"}, headers=bearer(ALICE))
    sid = (await resp.json())["session_id"]
    phone = await Master.attach(gateway, sid, headers=bearer(ALICE))
    pipe, out = Pipe(), io.StringIO()
    url = str(gateway.make_url("")).rstrip("/")
    task = asyncio.create_task(
        run_chat(url, agent=None, session_id=sid, token=ALICE, stdin=pipe.reader, stdout=out,
                 auto_answer="allow", interactive=True, handle_sigint=False)
    )  # fmt: skip
    try:
        await shown(out, "Ctrl-D quits", task=task)
        pipe.type("write late.txt")
        ask = await phone.until("agent.interaction.request")
        allowed = await phone.until("control.interaction.response")  # the chat's, relayed
        assert allowed["payload"]["selected_value"] == "allow"
        late = await phone.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "deny"},
        )
        error = await phone.until("session.error")
        assert error["parent_id"] == late["message_id"]
        assert error["payload"]["error_code"] == "INTERACTION_NOT_FOUND"
        await shown(out, "(deny by alice: too late, it changed nothing)", task=task)
        await shown(out, "— end_turn", task=task)
        assert "(deny by alice)" not in out.getvalue()
    finally:
        pipe.close()
    assert await asyncio.wait_for(task, 20) == 0
    pipe.reader.close()
