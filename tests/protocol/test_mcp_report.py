"""What masters are told of a session's MCP servers (docs/mcp.md#what-masters-see), as scenarios:
the agent's own report in ``tool.catalog.publish`` (``metadata.rawp_mcp_servers``, a gateway
extension) and ``session.capabilities`` (``extensions.mcp_servers``), a failure without a reason
looked up by the shell, and a kind the agent does not take."""

from __future__ import annotations

from gateway.protocol import actions as act
from gateway.protocol import mcp_servers as M
from parsers import events as ev
from tests.support.scenario import CLAUDE, Scenario, emit, events, mcp_reasons

LOCAL = M.server_from_table({"name": "local", "command": ["srv"], "env": {"T": "s3"}}, "request")
REMOTE = M.server_from_table({"name": "remote", "url": "http://h/mcp"}, "request")
BROKEN = M.server_from_table({"name": "broken", "command": ["nope"]}, "request")
SHOWN = tuple(M.redacted(s) for s in (LOCAL, REMOTE, BROKEN))
TOOLS = ["Read", "mcp__local__echo", "mcp__remote__add"]
INIT = ev.SessionStarted(
    agent_session_id="a1",
    tools=TOOLS,
    mcp_servers=[
        ev.McpServer(name="local", status="connected", tools=["mcp__local__echo"]),
        ev.McpServer(name="remote", status="connected", tools=["mcp__remote__add"]),
        ev.McpServer(name="broken", status="failed"),
    ],
)


def said(**status: dict[str, object]) -> dict[str, object]:
    """The catalog's metadata: each server's redacted view and what became of it."""
    views = {s["name"]: s for s in SHOWN}
    return {"rawp_mcp_servers": [{**views[name], **more} for name, more in status.items()]}


CONNECTED = {
    "local": {"status": "connected", "tools": ["mcp__local__echo"]},
    "remote": {"status": "connected", "tools": ["mcp__remote__add"]},
}


def test_the_agents_report_is_in_the_catalog_and_capabilities_and_a_failure_is_looked_up():
    """The agent's init: masters get session.capabilities with the servers (the agent named its
    session), the catalog with them; the shell is asked why ``broken`` failed, and the catalog
    is published again with the reason it found, once."""
    first = said(**CONNECTED, broken={"status": "failed"})
    scenario = (
        Scenario(mcp_servers=SHOWN, mcp_kinds=("stdio", "http"))
        >> CLAUDE.started()
        >> events(INIT)
        << act.ReadMcpReasons(("broken",))
        << emit(
            "session.capabilities",
            extensions={"agent_session_id": "a1", "mcp_servers": first["rawp_mcp_servers"]},
        )
        << emit("tool.catalog.publish", metadata=first)
        << emit("agent.commands.publish")
        >> mcp_reasons({"broken": "ENOENT: no such file"})
        << emit(
            "tool.catalog.publish",
            metadata=said(
                **CONNECTED, broken={"status": "failed", "reason": "ENOENT: no such file"}
            ),
        )
        >> mcp_reasons({"broken": "ENOENT: no such file"})  # nothing new: nothing sent
    )
    assert scenario


def test_before_the_agent_reports_a_server_is_pending_and_a_kind_it_does_not_take_failed():
    pending = M.report(SHOWN, ("stdio",), None)
    assert [(s["name"], s["status"], s.get("reason")) for s in pending] == [
        ("local", "pending", None),
        ("remote", "failed", "the agent does not take http servers"),
        ("broken", "pending", None),
    ]
    own = M.report((), ("stdio",), [ev.McpServer(name="theirs", status="weird")])
    assert own == [
        {
            "name": "theirs",
            "origin": "agent",
            "status": "failed",
            "reason": "the agent says 'weird'",
        }
    ]


def test_a_record_keeps_a_configured_server_by_name_and_a_masters_whole():
    configured = M.finished(M.ServerSpec(command=("cfg",), env={"K": "from-env"}), "docs", "config")
    kept = M.to_record((configured, LOCAL))
    assert kept[0] == {"name": "docs", "origin": "config"}  # its value is read again
    assert kept[1]["env"] == {"T": "s3"} and kept[1]["origin"] == "request"
    changed = M.finished(M.ServerSpec(command=("cfg",), env={"K": "rotated"}), "docs", "config")
    back, dropped = M.from_record(kept, [changed])
    assert back == (changed, LOCAL) and dropped == []
    back, dropped = M.from_record(kept, [])
    assert back == (LOCAL,) and dropped == ["MCP server 'docs' is no longer configured"]
    assert M.from_record(None, []) == ((), [])
