"""``/acp`` driven by a client no one here wrote: the official ACP Python SDK
(``agent-client-protocol``, pinned), its WebSocket transport, against the real gateway on 127.0.0.1
with the demo agent behind it (docs/acp-masters.md). A turn with a permission, a cancel, the load of
a session a DPS master started (with that master's prompt and the ACP client's reaching each other),
a viewer refused, and the audit log of it all."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, connect_to_agent, text_block
from acp.schema import (
    AgentMessageChunk,
    AllowedOutcome,
    ClientCapabilities,
    CurrentModeUpdate,
    DeniedOutcome,
    RequestPermissionResponse,
    SessionInfoUpdate,
    ToolCallProgress,
    ToolCallStart,
    UsageUpdate,
    UserMessageChunk,
)
from acp.ws.client import create_websocket_stream

from gateway.config.auth import AuthSettings
from gateway.server import CONFIG, SESSIONS, reload_users
from tests.support.auth import bearer, users_toml
from tests.support.gateway_peer import Master, base_url, fast_demo, make_config, start_gateway
from tests.support.hostile.acp_client import RawAcp
from tests.support.waiting import eventually

TOKENS = {"alice": "alice-token-aaaa", "bob": "bob-token-bbbb"}
ROLES = {"alice": "operator", "bob": "viewer"}


class Recorder:
    """The client side the SDK calls: every session/update kept, permission questions answered
    by ``choose`` (an option id, or None: wait until told, then cancelled)."""

    def __init__(self, choose: str | None = "allow") -> None:
        self.updates: list[tuple[str, Any]] = []
        self.asked: list[Any] = []
        self.asked_meta: list[dict[str, Any]] = []  # each question's _meta
        self.choose = choose
        self.late: str | None = None  # with choose None: the answer given once released
        self.asked_event = asyncio.Event()
        self.release = asyncio.Event()

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.asked.append((session_id, tool_call, options))
        self.asked_meta.append(kwargs)
        self.asked_event.set()
        if self.choose is None:
            await self.release.wait()
            if self.late is not None:
                return RequestPermissionResponse(
                    outcome=AllowedOutcome(outcome="selected", option_id=self.late)
                )
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=self.choose)
        )

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append((session_id, update))

    def text(self, kind: type = AgentMessageChunk) -> str:
        return "".join(u.content.text for _, u in self.updates if isinstance(u, kind))


@pytest.fixture
async def gw(tmp_path):
    users = tmp_path / "users.toml"
    users.write_text(users_toml({n: (ROLES[n], TOKENS[n]) for n in TOKENS}))
    audit = tmp_path / "audit.jsonl"
    config = make_config(
        tmp_path,
        agents={"demo": fast_demo(5)},
        auth=AuthSettings(users_file=users, audit_log=audit),
        acp_default_agent="demo",
    )
    client = await start_gateway(config)
    yield client
    await client.close()


async def connect(gw, user: str = "alice", recorder: Recorder | None = None, query: str = ""):
    url = base_url(gw).replace("http", "ws", 1) + "/acp" + query
    transport = await create_websocket_stream(url, headers=bearer(TOKENS[user]))
    recorder = recorder or Recorder()
    conn = connect_to_agent(recorder, transport)
    init = await conn.initialize(
        protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
    )
    assert init.protocol_version == 1
    assert init.agent_capabilities.load_session is True
    return conn, recorder


def audit_lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_turn_with_a_permission_through_the_official_sdk(gw, tmp_path):
    conn, rec = await connect(gw)
    try:
        new = await conn.new_session(cwd=str(tmp_path))
        done = await conn.prompt(
            session_id=new.session_id, prompt=[text_block("write acp.txt with hello")]
        )
        assert done.stop_reason == "end_turn"
        assert (tmp_path / "acp.txt").exists()
        (sid, tool_call, options) = rec.asked[0]
        assert sid == new.session_id
        assert {o.option_id for o in options} >= {"allow", "deny"}
        assert {o.kind for o in options} >= {"allow_once", "reject_once"}
        starts = [u for _, u in rec.updates if isinstance(u, ToolCallStart)]
        assert (
            starts and starts[0].kind == "edit" and tool_call.tool_call_id == starts[0].tool_call_id
        )
        # The question does not rename the call: its toolCall keeps the call's own title, and
        # the question's words come in _meta.rawp.question.
        assert tool_call.title == starts[0].title
        assert tool_call.title.endswith("acp.txt") and "?" not in tool_call.title
        question = rec.asked_meta[0]["rawp"]["question"]
        assert question.startswith("Allow ") and question.endswith("acp.txt?")
        ends = [u for _, u in rec.updates if isinstance(u, ToolCallProgress) and u.status]
        assert ends[-1].status == "completed"
        assert any(c.type == "diff" and c.path.endswith("acp.txt") for c in ends[-1].content or [])
        assert rec.text()
        # Every control in the audit log, by the ACP client's user.
        await eventually(
            lambda: (
                {("prompt", "alice"), ("permission", "alice")}
                <= {(r["action"], r.get("user")) for r in audit_lines(tmp_path)}
            ),
            "the prompt and the answer in the audit log",
        )
    finally:
        await conn.close()


async def test_a_turns_usage_update_comes_before_its_answer(gw, tmp_path):
    """DPS sends a turn's session.usage right after its session.turn.end (DPS-7.5.2-usage); to
    an ACP client the answer to session/prompt ends the turn, so its usage_update comes first."""
    conn, rec = await connect(gw)
    try:
        new = await conn.new_session(cwd=str(tmp_path))
        for turns, text in enumerate(("hello", "hello again"), start=1):
            done = await conn.prompt(session_id=new.session_id, prompt=[text_block(text)])
            assert done.stop_reason == "end_turn"
            usage = [u for _, u in rec.updates if isinstance(u, UsageUpdate)]
            assert len(usage) == turns, "the turn's usage_update came after its answer"
            assert usage[-1].size > 0
    finally:
        await conn.close()


async def test_a_cancel_ends_the_turn_cancelled_and_the_session_goes_on(gw, tmp_path):
    rec = Recorder(choose=None)
    conn, rec = await connect(gw, recorder=rec)
    try:
        new = await conn.new_session(cwd=str(tmp_path))
        turn = asyncio.ensure_future(
            conn.prompt(session_id=new.session_id, prompt=[text_block("write never.txt")])
        )
        await asyncio.wait_for(rec.asked_event.wait(), 30)
        await conn.cancel(session_id=new.session_id)
        rec.release.set()
        done = await asyncio.wait_for(turn, 30)
        assert done.stop_reason == "cancelled"
        assert not (tmp_path / "never.txt").exists()
        again = await conn.prompt(session_id=new.session_id, prompt=[text_block("hello again")])
        assert again.stop_reason == "end_turn"
    finally:
        await conn.close()


async def alices_session(gw) -> str:
    """A demo session of alice's (made over HTTP, as a DPS master makes one): its id."""
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer(TOKENS["alice"]))
    return (await resp.json())["session_id"]


async def test_load_a_session_a_dps_master_started_and_prompts_cross(gw, tmp_path):
    headers = bearer(TOKENS["alice"])
    sid = await alices_session(gw)
    master = await Master.attach(gw, sid, headers=headers)
    await master.send("control.prompt.request", {"prompt_text": "hello from the phone"})
    await master.until("session.turn.end", timeout=30)
    conn, rec = await connect(gw)
    try:
        listed = await conn.list_sessions()
        assert sid in {s.session_id for s in listed.sessions}
        await conn.load_session(cwd=str(tmp_path), session_id=sid)
        # The history came before the answer: the phone's prompt and the agent's reply.
        assert "hello from the phone" in rec.text(UserMessageChunk)
        replied = rec.text()
        assert replied
        # The editor's prompt reaches the DPS master with who sent it.
        done = await conn.prompt(session_id=sid, prompt=[text_block("hello from the editor")])
        assert done.stop_reason == "end_turn"
        relayed = await master.until("control.prompt.request", timeout=30)
        assert relayed["payload"]["prompt_text"] == "hello from the editor"
        assert relayed["metadata"]["rawp_user"] == "alice"
        # And a prompt of the DPS master reaches the editor as a user message, then live text.
        before = len(rec.updates)
        await master.send("control.prompt.request", {"prompt_text": "and the phone again"})
        await eventually(
            lambda: "and the phone again" in rec.text(UserMessageChunk), "the phone's prompt"
        )
        await eventually(lambda: len(rec.updates) > before + 2, "the live reply")
    finally:
        await conn.close()


async def test_what_became_of_the_mcp_servers_reaches_the_editor(gw, tmp_path):
    """docs/acp-masters.md: a session's MCP servers (here a master's, given to the demo agent,
    which takes none) reach an editor on load as a ``session_info_update`` whose
    ``_meta.rawp.mcpServers`` says each one's name, kind and status, and why it failed; the
    official SDK takes it as such. Never a secret; a session without servers says nothing."""
    secret = "mcp-secret-7f3a"
    servers = [{"name": "docs", "command": ["docs-mcp", "--key", secret], "env": {"KEY": secret}}]
    resp = await gw.post(
        "/v1/session",
        json={"agent": "demo", "mcp_servers": servers},
        headers=bearer(TOKENS["alice"]),
    )
    assert resp.status == 201, await resp.text()
    sid = (await resp.json())["session_id"]
    conn, rec = await connect(gw)
    try:
        await conn.load_session(cwd=str(tmp_path), session_id=sid)
        infos = [u for s, u in rec.updates if s == sid and isinstance(u, SessionInfoUpdate)]
        assert infos, rec.updates
        assert infos[-1].field_meta == {
            "rawp": {
                "mcpServers": [
                    {
                        "name": "docs",
                        "kind": "stdio",
                        "origin": "request",
                        "command": ["docs-mcp"],
                        "env": ["KEY"],
                        "status": "failed",
                        "reason": "the agent does not take stdio servers",
                    }
                ]
            }
        }
        assert secret not in repr(rec.updates)
        new = await conn.new_session(cwd=str(tmp_path))
        done = await conn.prompt(session_id=new.session_id, prompt=[text_block("hello")])
        assert done.stop_reason == "end_turn"
        assert not [
            u for s, u in rec.updates if s == new.session_id and isinstance(u, SessionInfoUpdate)
        ]
    finally:
        await conn.close()


async def test_a_viewer_may_list_and_load_but_not_prompt(gw, tmp_path):
    sid = await alices_session(gw)
    members = {"members": {"bob": "viewer"}}
    await gw.patch(f"/v1/session/{sid}", json=members, headers=bearer(TOKENS["alice"]))
    conn, _ = await connect(gw, user="bob")
    try:
        listed = await conn.list_sessions()
        assert [s.session_id for s in listed.sessions] == [sid]
        await conn.load_session(cwd=str(tmp_path), session_id=sid)
        with pytest.raises(RequestError) as refused:
            await conn.prompt(session_id=sid, prompt=[text_block("let me in")])
        assert refused.value.data["error_code"] == "FORBIDDEN"
        with pytest.raises(RequestError) as refused:
            await conn.new_session(cwd=str(tmp_path))
        assert refused.value.data["error_code"] == "FORBIDDEN"
        await eventually(
            lambda: any(
                r["action"] == "prompt" and r["result"] == "refused" and r.get("user") == "bob"
                for r in audit_lines(tmp_path)
            ),
            "the refused prompt in the audit log",
        )
    finally:
        await conn.close()


async def test_the_first_answer_wins_whichever_master_gives_it(gw, tmp_path):
    """A permission question reaches the DPS master and the ACP client; the phone allows first,
    the editor's later deny changes nothing; on the next one the editor answers first and the
    phone's answer is the one refused."""
    rec = Recorder(choose=None)
    rec.late = "deny"
    conn, rec = await connect(gw, recorder=rec)
    try:
        new = await conn.new_session(cwd=str(tmp_path))
        sid = new.session_id
        phone = await Master.attach(gw, sid, headers=bearer(TOKENS["alice"]))
        turn = asyncio.ensure_future(
            conn.prompt(session_id=sid, prompt=[text_block("write first.txt")])
        )
        ask = await phone.until("agent.interaction.request", timeout=30)
        await asyncio.wait_for(rec.asked_event.wait(), 30)
        [(_, tool_call, _)] = rec.asked
        assert tool_call.tool_call_id == ask["metadata"]["invocation_id"]
        await phone.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
        )
        assert (await asyncio.wait_for(turn, 30)).stop_reason == "end_turn"
        assert (tmp_path / "first.txt").exists()
        rec.release.set()  # the editor's deny, too late
        rec.choose = "allow"
        done = await conn.prompt(session_id=sid, prompt=[text_block("write second.txt")])
        assert done.stop_reason == "end_turn" and (tmp_path / "second.txt").exists()
        ask = await phone.until("agent.interaction.request", timeout=30)
        late = await phone.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "deny"},
        )
        error = await phone.until("session.error", timeout=30)
        assert error["parent_id"] == late["message_id"]
        assert error["payload"]["error_code"] == "INTERACTION_NOT_FOUND"
    finally:
        await conn.close()


async def test_modes_come_from_the_agents_features_and_set_mode_switches(gw, tmp_path):
    conn, rec = await connect(gw)
    try:
        new = await conn.new_session(cwd=str(tmp_path))
        assert new.modes is not None and new.modes.current_mode_id == "default"
        assert {m.id for m in new.modes.available_modes} == {"default", "plan", "review"}
        await conn.set_session_mode(session_id=new.session_id, mode_id="plan")
        await eventually(
            lambda: any(
                isinstance(u, CurrentModeUpdate) and u.current_mode_id == "plan"
                for _, u in rec.updates
            ),
            "the mode update",
        )
        # In plan mode the agent may not write: the gateway denies it, nobody is asked.
        done = await conn.prompt(session_id=new.session_id, prompt=[text_block("write plan.txt")])
        assert done.stop_reason == "end_turn"
        assert not (tmp_path / "plan.txt").exists() and not rec.asked
        with pytest.raises(RequestError) as refused:
            await conn.set_session_mode(session_id=new.session_id, mode_id="nonsense")
        assert refused.value.code == -32602
    finally:
        await conn.close()


async def test_unsharing_lets_go_of_that_session_and_a_users_file_reload_closes_the_socket(gw):
    """A user the session is no longer shared with loses that session's view, not the
    connection; a users file that removes them closes it (1008), as it does DPS WebSockets."""
    sid = await alices_session(gw)
    headers = bearer(TOKENS["alice"])
    await gw.patch(f"/v1/session/{sid}", json={"members": {"bob": "viewer"}}, headers=headers)
    bob = await RawAcp.connect(gw, headers=bearer(TOKENS["bob"]))
    assert "result" in await bob.call("session/load", {"sessionId": sid, "cwd": "/"})
    await gw.patch(f"/v1/session/{sid}", json={"members": {}}, headers=headers)
    live = gw.server.app[SESSIONS][sid]
    await eventually(lambda: len(live.connections) == 0, "bob's view to be let go")
    refused = await bob.call("session/prompt", {"sessionId": sid, "prompt": []})
    assert refused["error"]["data"]["error_code"] == "SESSION_NOT_FOUND"
    assert (await bob.call("session/list"))["result"]["sessions"] == []
    users = gw.server.app[CONFIG].auth.users_file
    users.write_text(users_toml({"alice": ("operator", TOKENS["alice"])}))
    reload_users(gw.server.app)
    await bob.closed()
    assert bob.ws.close_code == 1008
