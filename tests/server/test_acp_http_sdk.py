"""``/acp`` over Streamable HTTP driven by a client no one here wrote: the official ACP TypeScript
SDK's ``createHttpStream`` (pinned in scripts/install-agents.sh), against the real gateway on
127.0.0.1 with the demo agent behind it (docs/acp-masters.md#streamable-http). The WebSocket's
tests (test_acp_master_sdk.py) played over the other transport: a turn with a permission, a cancel,
the load of a session a DPS master started, a viewer refused, and the audit log of it all."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.auth import AuthSettings
from gateway.server.acp_http import ACP_HTTP
from tests.support.acp_editors import EditorError, TsEditor, node_ready, ts_editor
from tests.support.auth import bearer, users_toml
from tests.support.gateway_peer import Master, base_url, fast_demo, make_config, start_gateway
from tests.support.waiting import eventually

pytestmark = pytest.mark.realcli

TOKENS = {"alice": "alice-token-aaaa", "bob": "bob-token-bbbb"}
ROLES = {"alice": "operator", "bob": "viewer"}
TURN = 60.0  # a bound on a hang, not a measure


@pytest.fixture
async def gw(tmp_path):
    if why := node_ready():
        pytest.fail(why)
    users = tmp_path / "users.toml"
    users.write_text(users_toml({n: (ROLES[n], TOKENS[n]) for n in TOKENS}))
    config = make_config(
        tmp_path,
        agents={"demo": fast_demo(5)},
        auth=AuthSettings(users_file=users, audit_log=tmp_path / "audit.jsonl"),
        acp_default_agent="demo",
    )
    client = await start_gateway(config)
    yield client
    await client.close()


@contextlib.asynccontextmanager
async def http_editor(gw, tmp_path: Path, user: str = "alice") -> AsyncIterator[TsEditor]:
    """The TypeScript SDK's editor on ``/acp`` over Streamable HTTP as ``user``, initialized."""
    env = {**os.environ, "ACP_HTTP_HEADERS": json.dumps(bearer(TOKENS[user]))}
    async with ts_editor(["--http", base_url(gw) + "/acp"], env, tmp_path) as ed:
        init = await ed.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert init["protocolVersion"] == 1
        assert init["agentCapabilities"]["loadSession"] is True
        yield ed


def prompt(session_id: str, text: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}


async def asked(ed: TsEditor, n: int) -> dict[str, Any]:
    await eventually(lambda: len(ed.questions) > n, f"permission question {n}", TURN)
    return ed.questions[n]


def audit_lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_a_turn_with_a_permission_then_a_cancel_over_http(gw, tmp_path):
    async with http_editor(gw, tmp_path) as ed:
        # The connection the SDK opened, by its initialize: one, with its event stream open.
        conns = list(gw.app[ACP_HTTP].values())
        assert len(conns) == 1
        await eventually(lambda: conns[0].streaming, "the connection's event stream")
        sid = (await ed.request("session/new", {"cwd": str(tmp_path)}))["sessionId"]
        turn = asyncio.ensure_future(ed.request("session/prompt", prompt(sid, "write http.txt")))
        question = await asked(ed, 0)
        assert question["sessionId"] == sid
        assert {o["optionId"] for o in question["options"]} >= {"allow", "deny"}
        await ed.answer(0, "allow")
        done = await asyncio.wait_for(turn, TURN)
        assert done["stopReason"] == "end_turn"
        assert (tmp_path / "http.txt").exists()
        assert ed.text(sid)
        kinds = [u["update"]["sessionUpdate"] for u in ed.updates if u["sessionId"] == sid]
        assert "tool_call" in kinds and "tool_call_update" in kinds
        # A second turn, cancelled while it waits for its permission.
        turn = asyncio.ensure_future(ed.request("session/prompt", prompt(sid, "write never.txt")))
        await asked(ed, 1)
        await ed.notify("session/cancel", {"sessionId": sid})
        await ed.answer(1, None)
        done = await asyncio.wait_for(turn, TURN)
        assert done["stopReason"] == "cancelled"
        assert not (tmp_path / "never.txt").exists()
        await eventually(
            lambda: (
                {("prompt", "alice"), ("permission", "alice")}
                <= {(r["action"], r.get("user")) for r in audit_lines(tmp_path)}
            ),
            "the prompt and the answer in the audit log",
        )
    # The SDK closes with DELETE: the connection is gone, its session goes on.
    await eventually(lambda: not gw.app[ACP_HTTP], "the connection closed")


async def test_an_http_editor_loads_a_session_a_dps_master_started(gw, tmp_path):
    headers = bearer(TOKENS["alice"])
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=headers)
    sid = (await resp.json())["session_id"]
    master = await Master.attach(gw, sid, headers=headers)
    await master.send("control.prompt.request", {"prompt_text": "hello from the phone"})
    await master.until("session.turn.end", timeout=TURN)
    async with http_editor(gw, tmp_path) as ed:
        listed = await ed.request("session/list", {})
        assert sid in {s["sessionId"] for s in listed["sessions"]}
        await ed.request("session/load", {"sessionId": sid, "cwd": str(tmp_path)})
        assert "hello from the phone" in ed.text(sid, "user_message_chunk")
        assert ed.text(sid)  # the demo agent's answer, replayed
        turn = asyncio.ensure_future(ed.request("session/prompt", prompt(sid, "hello again")))
        relayed = await master.until("control.prompt.request", timeout=TURN)
        assert relayed["payload"]["prompt_text"] == "hello again"
        assert relayed["metadata"]["rawp_user"] == "alice"
        assert (await asyncio.wait_for(turn, TURN))["stopReason"] == "end_turn"
    await master.ws.close()


async def test_a_viewer_over_http_may_load_but_not_prompt(gw, tmp_path):
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer(TOKENS["alice"]))
    sid = (await resp.json())["session_id"]
    members = {"members": {"bob": "viewer"}}
    await gw.patch(f"/v1/session/{sid}", json=members, headers=bearer(TOKENS["alice"]))
    async with http_editor(gw, tmp_path, user="bob") as ed:
        with pytest.raises(EditorError) as refused:
            await ed.request("session/new", {"cwd": str(tmp_path)})
        assert refused.value.data["error_code"] == "FORBIDDEN"
        await ed.request("session/load", {"sessionId": sid, "cwd": str(tmp_path)})
        with pytest.raises(EditorError) as refused:
            await ed.request("session/prompt", prompt(sid, "may I?"))
        assert refused.value.data["error_code"] == "FORBIDDEN"
    await eventually(
        lambda: any(
            r["action"] == "prompt" and r["result"] == "refused" and r.get("user") == "bob"
            for r in audit_lines(tmp_path)
        ),
        "the refused prompt in the audit log",
    )
