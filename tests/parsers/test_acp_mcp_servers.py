"""An ACP agent's MCP servers (parsers/acp/adapter.py): the session's servers go in ``session/new``
and again in every ``session/load`` (ACP keeps none across a load), only of the kinds the agent
declared in ``mcpCapabilities``; each other one is reported failed, with the reason, in the tool
catalog masters get, and the session goes on."""

from __future__ import annotations

from typing import Any

from tests.support.acp_rig import SID, Rig, rpc, update

STDIO = {"name": "docs", "command": "python3", "args": ["-m", "docs"], "env": []}
HTTP = {
    "type": "http",
    "name": "tracker",
    "url": "https://mcp.example.com/mcp",
    "headers": [{"name": "Authorization", "value": "Bearer t0k"}],
}


def started(caps: dict[str, Any], servers: list[dict[str, Any]], *, can_load: bool = False):
    """A rig whose adapter has ``servers`` and whose agent declares ``caps``; the session/new it
    was sent, answered."""
    rig = Rig(can_load=can_load)
    rig.adapter.set_mcp_servers(servers)
    rig.take(rig.machine.start())
    init = rig.last_write()
    caps = {"loadSession": can_load, **caps}
    rig.agent(rpc(id=init["id"], result={"protocolVersion": 1, "agentCapabilities": caps}))
    new = rig.last_write()
    assert new["method"] == "session/new"
    rig.agent(rpc(id=new["id"], result={"sessionId": SID}))
    return rig, new


def catalog(rig: Rig) -> dict[str, Any]:
    return rig.of("tool.catalog.publish")[-1]["payload"]


def test_DPS_5_4_catalog_servers_of_the_kinds_declared_go_in_session_new():
    rig, new = started({"mcpCapabilities": {"http": True, "sse": True}}, [STDIO, HTTP])
    assert new["params"] == {"cwd": "/srv/project", "mcpServers": [STDIO, HTTP]}
    # Nothing more is known of them than that they were given: the agents say nothing.
    tools = {t["name"]: t["status"] for t in catalog(rig)["tools"]}
    assert tools == {"mcp__docs": "degraded", "mcp__tracker": "degraded"}
    assert rig.of("agent.error") == []


def test_DPS_5_4_catalog_a_kind_the_agent_does_not_take_is_reported_failed_and_left_out():
    rig, new = started({}, [STDIO, HTTP])  # no mcpCapabilities: stdio only (ACP's minimum)
    assert new["params"]["mcpServers"] == [STDIO]
    (tracker,) = [t for t in catalog(rig)["tools"] if t["name"] == "mcp__tracker"]
    assert tracker["status"] == "unavailable"
    assert tracker["status_description"] == (
        "MCP server tracker is failed: the agent does not take http servers"
    )
    (diagnostic,) = [d for d in catalog(rig)["diagnostics"] if d["tool_name"] == "mcp__tracker"]
    assert diagnostic["code"] == "MCP_SERVER_FAILED"
    pid = rig.prompt()  # the session goes on
    rig.end(pid)
    assert rig.of("session.turn.end")[-1]["payload"]["stop_reason"] == "end_turn"


def test_DPS_18_respawn_a_load_carries_the_same_servers():
    """An agent started again (a restored session, the stall watchdog) loads its session with
    the servers session/new had: ACP keeps no MCP server across a load."""
    rig, _ = started({"mcpCapabilities": {"http": True}}, [STDIO, HTTP], can_load=True)
    rig.adapter.opening(SID)
    caps = {"loadSession": True, "mcpCapabilities": {"http": True}}
    rig.agent(rpc(id=0, result={"protocolVersion": 1, "agentCapabilities": caps}))
    load = rig.last_write()
    assert load["method"] == "session/load"
    assert load["params"] == {"sessionId": SID, "cwd": "/srv/project", "mcpServers": [STDIO, HTTP]}


def test_without_servers_session_new_has_none_and_the_catalog_no_server():
    rig, new = started({"mcpCapabilities": {"http": True}}, [])
    assert new["params"]["mcpServers"] == []
    assert not [t for t in catalog(rig)["tools"] if t["name"].startswith("mcp__")]


def named(rig: Rig, **call: Any) -> str:
    """The tool name masters (and permission rules) get for the agent's ``tool_call``."""
    pid = rig.prompt()
    call_id = f"c{len(rig.frames)}"
    rig.agent(update("tool_call", toolCallId=call_id, status="in_progress", **call))
    rig.end(pid)
    return rig.of("tool.invoke.request")[-1]["payload"]["tool_name"]


def test_DPS_5_3_tool_a_call_to_a_sessions_mcp_tool_has_its_mcp_name():
    """As Claude Code's own (``mcp__<server>__<tool>``), whatever the agent shows: codex-acp's
    ``rawInput`` names server and tool, Gemini's title ``"<tool> (<server> MCP Server)"``. A
    server the session did not give keeps the call ACP's kind."""
    rig, _ = started({"mcpCapabilities": {"http": True}}, [STDIO, HTTP])
    codex = {"server": "docs", "tool": "search", "arguments": {"q": "x"}}
    assert named(rig, title="Tool: docs/search", rawInput=codex) == "mcp__docs__search"
    assert named(rig, title="add (tracker MCP Server)", kind="other") == "mcp__tracker__add"
    assert named(rig, title="add (elsewhere MCP Server)", kind="other") == "other"
    other = {"server": "elsewhere", "tool": "x", "arguments": {}}
    assert named(rig, title="Tool: elsewhere/x", rawInput=other) == "other"
