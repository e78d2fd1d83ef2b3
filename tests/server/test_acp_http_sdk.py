"""``/acp`` driven by a client no one here wrote: the official ACP TypeScript SDK (pinned in
scripts/install-agents.sh) over both transports of the remote-transport RFD, its Streamable HTTP
client ``createHttpStream`` (docs/acp-masters.md#streamable-http) and its WebSocket client
``createWebSocketStream`` (given the pinned ``ws`` package's WebSocket), against the real gateway on
127.0.0.1 with the demo agent behind it. The Python SDK's tests (test_acp_master_sdk.py) played
with this client: a turn with a permission, a cancel, the load of a session a DPS master started, a
viewer refused, and the audit log of it all."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config.auth import AuthSettings
from gateway.server.acp import ACP_OPEN
from gateway.server.acp_http import ACP_HTTP
from tests.server.test_acp_master_sdk import ROLES, TOKENS, audit_lines
from tests.support.acp_editors import (
    TsEditor,
    a_dps_masters_session,
    a_turn_with_a_permission_then_a_cancel,
    a_viewer_loads_but_may_not_prompt,
    load_it_and_prompt_across,
    node_ready,
    shared_with_a_viewer,
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


TRANSPORTS = ["http", "ws"]


@contextlib.asynccontextmanager
async def sdk_editor(
    gw, tmp_path: Path, transport: str = "http", user: str = "alice"
) -> AsyncIterator[TsEditor]:
    """The TypeScript SDK's editor on ``/acp`` over ``transport`` as ``user``, initialized."""
    env = {**os.environ, "ACP_HEADERS": json.dumps(bearer(TOKENS[user]))}
    url = base_url(gw) + "/acp"
    if transport == "ws":
        url = url.replace("http", "ws", 1)
    async with ts_editor([f"--{transport}", url], env, tmp_path) as ed:
        init = await ed.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert init["protocolVersion"] == 1
        assert init["agentCapabilities"]["loadSession"] is True
        yield ed


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_turn_with_a_permission_then_a_cancel(gw, tmp_path, transport):
    async with sdk_editor(gw, tmp_path, transport) as ed:
        if transport == "http":
            # The connection the SDK opened, by its initialize: one, with its event stream open.
            conns = list(gw.app[ACP_HTTP].values())
            assert len(conns) == 1
            await eventually(lambda: conns[0].streaming, "the connection's event stream")
        else:
            # One WebSocket connection, none over HTTP.
            assert len(gw.app[ACP_OPEN]) == 1 and not gw.app[ACP_HTTP]
        sid = await a_turn_with_a_permission_then_a_cancel(ed, tmp_path)
        if transport == "http":
            # The SDK opened the session's own stream, and what it got of the session came on it
            # (test_acp_http_streams.py shows which stream carries what).
            assert list(conns[0].writer.session_streams) == [sid]
        await eventually(
            lambda: (
                {("prompt", "alice"), ("permission", "alice")}
                <= {(r["action"], r.get("user")) for r in audit_lines(tmp_path)}
            ),
            "the prompt and the answer in the audit log",
        )
    # The SDK closes its stream (over HTTP with DELETE): the connection is gone.
    await eventually(lambda: not gw.app[ACP_OPEN], "the connection closed")
    assert not gw.app[ACP_HTTP]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_sdk_loads_a_session_a_dps_master_started(gw, tmp_path, transport):
    sid, master = await a_dps_masters_session(gw, TOKENS["alice"])
    async with sdk_editor(gw, tmp_path, transport) as ed:
        await load_it_and_prompt_across(ed, sid, master, tmp_path)
    await master.ws.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_viewer_may_load_but_not_prompt(gw, tmp_path, transport):
    sid = await shared_with_a_viewer(gw, TOKENS["alice"], "bob")
    async with sdk_editor(gw, tmp_path, transport, user="bob") as ed:
        await a_viewer_loads_but_may_not_prompt(ed, sid, tmp_path)
    await eventually(
        lambda: any(
            r["action"] == "prompt" and r["result"] == "refused" and r.get("user") == "bob"
            for r in audit_lines(tmp_path)
        ),
        "the refused prompt in the audit log",
    )
