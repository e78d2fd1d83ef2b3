"""``/acp`` over Streamable HTTP driven by a client no one here wrote: the official ACP TypeScript
SDK's ``createHttpStream`` (pinned in scripts/install-agents.sh), against the real gateway on
127.0.0.1 with the demo agent behind it (docs/acp-masters.md#streamable-http). The WebSocket's
tests (test_acp_master_sdk.py) played over the other transport: a turn with a permission, a cancel,
the load of a session a DPS master started, a viewer refused, and the audit log of it all."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config.auth import AuthSettings
from gateway.server.acp_http import ACP_HTTP
from tests.server.test_acp_master_sdk import ROLES, TOKENS, audit_lines
from tests.support.acp_editors import (
    TsEditor,
    a_dps_masters_session,
    a_turn_with_a_permission_then_a_cancel,
    a_viewer_loads_but_may_not_prompt,
    load_it_and_prompt_across,
    node_ready,
    ts_editor,
)
from tests.support.auth import bearer, users_toml
from tests.support.gateway_peer import base_url, fast_demo, make_config, start_gateway
from tests.support.waiting import eventually

pytestmark = pytest.mark.realcli


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


async def test_a_turn_with_a_permission_then_a_cancel_over_http(gw, tmp_path):
    async with http_editor(gw, tmp_path) as ed:
        # The connection the SDK opened, by its initialize: one, with its event stream open.
        conns = list(gw.app[ACP_HTTP].values())
        assert len(conns) == 1
        await eventually(lambda: conns[0].streaming, "the connection's event stream")
        await a_turn_with_a_permission_then_a_cancel(ed, tmp_path)
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
    sid, master = await a_dps_masters_session(gw, TOKENS["alice"])
    async with http_editor(gw, tmp_path) as ed:
        await load_it_and_prompt_across(ed, sid, master, tmp_path)
    await master.ws.close()


async def test_a_viewer_over_http_may_load_but_not_prompt(gw, tmp_path):
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer(TOKENS["alice"]))
    sid = (await resp.json())["session_id"]
    members = {"members": {"bob": "viewer"}}
    await gw.patch(f"/v1/session/{sid}", json=members, headers=bearer(TOKENS["alice"]))
    async with http_editor(gw, tmp_path, user="bob") as ed:
        await a_viewer_loads_but_may_not_prompt(ed, sid, tmp_path)
    await eventually(
        lambda: any(
            r["action"] == "prompt" and r["result"] == "refused" and r.get("user") == "bob"
            for r in audit_lines(tmp_path)
        ),
        "the refused prompt in the audit log",
    )
