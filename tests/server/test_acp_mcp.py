"""An editor's MCP servers on ``/acp`` (docs/acp-masters.md, docs/mcp.md), through the official
ACP Python SDK: ``initialize`` says which kinds the agent of the connection takes, ``session/new``'s
``mcpServers`` are checked as a master's ``mcp_servers`` before anything is made, and an editor's
server reaches the session (what became of it is in its session object). The real agents taking
them: tests/e2e/test_e2e_mcp_agents.py."""

from __future__ import annotations

import pytest
from acp import PROTOCOL_VERSION, RequestError, connect_to_agent
from acp.schema import ClientCapabilities, EnvVariable, McpServerStdio, SseMcpServer
from acp.ws.client import create_websocket_stream

from gateway.agent.profiles import builtin_profiles
from gateway.server import SESSIONS
from tests.server.test_acp_master_sdk import Recorder
from tests.support.gateway_peer import base_url, fast_demo, make_config, start_gateway
from tests.support.servers import user_headers

SECRET = "editor-secret-value"


@pytest.fixture
async def gw(tmp_path):
    agents = {"demo": fast_demo(5), "codex-acp": builtin_profiles()["codex-acp"]}
    client = await start_gateway(make_config(tmp_path, agents=agents, acp_default_agent="demo"))
    yield client
    await client.close()


async def connect(gw, query: str = ""):
    url = base_url(gw).replace("http", "ws", 1) + "/acp" + query
    conn = connect_to_agent(
        Recorder(), await create_websocket_stream(url, headers=user_headers(base_url(gw)))
    )
    init = await conn.initialize(
        protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
    )
    return conn, init.agent_capabilities.mcp_capabilities


@pytest.mark.parametrize(("query", "http"), [("", False), ("?agent=codex-acp", True)])
async def test_initialize_says_the_kinds_the_connections_agent_takes(gw, query, http):
    """``?agent=`` names the agent, else ``[acp] default_agent``: the demo agent takes no MCP
    server, an ACP agent takes http ones (and stdio, as every ACP agent); sse none."""
    conn, caps = await connect(gw, query)
    try:
        assert (caps.http, caps.sse) == (http, False)
    finally:
        await conn.close()


@pytest.mark.parametrize(
    "server",
    [
        SseMcpServer(name="old", url="http://127.0.0.1:9/sse", headers=[], type="sse"),
        McpServerStdio(name="a__b", command="x", args=[], env=[]),
        McpServerStdio(name="s", command="x\0", args=[], env=[]),
    ],
    ids=["sse", "bad-name", "nul"],
)
async def test_an_editors_server_that_breaks_a_rule_is_refused_before_anything_starts(
    gw, tmp_path, server
):
    conn, _ = await connect(gw)
    try:
        with pytest.raises(RequestError) as err:
            await conn.new_session(cwd=str(tmp_path), mcp_servers=[server])
        assert err.value.data["error_code"] == "INVALID_MCP_SERVERS"
        assert gw.server.app[SESSIONS] == {}
    finally:
        await conn.close()


async def test_an_editors_server_reaches_the_session_and_its_secret_stays_there(gw, tmp_path):
    """The session has the editor's server (origin ``editor``); the demo agent takes no MCP
    server, so it is reported failed with the reason, and the session runs all the same. What
    the session object says names the variable, never its value."""
    conn, _ = await connect(gw)
    try:
        env = [EnvVariable(name="DOCS_TOKEN", value=SECRET)]
        docs = McpServerStdio(name="docs", command="docs-mcp", args=["--stdio"], env=env)
        new = await conn.new_session(cwd=str(tmp_path), mcp_servers=[docs])
        session = gw.server.app[SESSIONS][new.session_id]
        assert [(s.name, s.origin, s.env) for s in session.mcp_servers] == [
            ("docs", "editor", {"DOCS_TOKEN": SECRET})
        ]
        got = await (
            await gw.get(f"/v1/session/{new.session_id}", headers=user_headers(base_url(gw)))
        ).json()
        (shown,) = got["mcp_servers"]
        assert (shown["name"], shown["origin"], shown["status"]) == ("docs", "editor", "failed")
        assert shown["reason"] == "the agent does not take stdio servers"
        assert shown["env"] == ["DOCS_TOKEN"] and SECRET not in str(got)
    finally:
        await conn.close()
