"""§5.3.3 output_type decision and the built-in tool catalog (gateway/protocol/tools.py)."""

from __future__ import annotations

import pytest

from gateway.protocol.tools import (
    BUILTIN_TOOLS,
    build_catalog,
    catalog_entry,
    decide_output_type,
    lookup,
)
from parsers import events as ev


def decide_for(name: str, **kw) -> str:
    spec = lookup(name)
    return decide_output_type(
        declared=spec.output_type, category=spec.category, operation=spec.operation, **kw
    )


def test_DPS_5_3_3_output_type_declared_type_wins():
    """DPS-5.3.3-output-type, rule 1: the catalog's declared output_type comes first."""
    assert decide_output_type(declared="structured", category="shell") == "structured"
    assert (
        decide_output_type(declared="text", category="filesystem", operation="write", changed=True)
        == "text"
    )


@pytest.mark.parametrize(
    ("category", "operation", "kw", "expected"),
    [
        ("filesystem", "write", {"changed": True}, "diff"),
        ("filesystem", "write", {"changed": False}, "empty"),
        ("filesystem", "write", {}, "empty"),
        ("filesystem", "read", {}, "file_content"),
        ("filesystem", "list", {}, "file_list"),
        ("notebook", "read", {}, "file_content"),
        ("notebook", "write", {"changed": True}, "diff"),
        ("shell", "exec", {}, "text"),
        ("search", "search", {}, "text"),
        ("search", "search", {"listing": True}, "file_list"),
        ("web", "read", {}, "web_content"),
        ("task_management", "other", {}, "structured"),
        ("agent", "delegate", {}, "agent_result"),
    ],
)
def test_DPS_5_3_3_output_type_category_defaults(category, operation, kw, expected):
    """DPS-5.3.3-output-type, rule 2: the category default (the §5.3.3 table)."""
    assert (
        decide_output_type(declared=None, category=category, operation=operation, **kw) == expected
    )


@pytest.mark.parametrize("category", [None, "planning", "mcp", "custom", "filesystem", "no-such"])
def test_DPS_5_3_3_output_type_falls_back_to_text(category):
    """DPS-5.3.3-output-type, rule 3: undecidable → text."""
    assert decide_output_type(declared=None, category=category, operation="other") == "text"


@pytest.mark.parametrize(
    ("tool", "kw", "expected"),
    [
        ("Bash", {}, "text"),
        ("Read", {}, "file_content"),
        ("Write", {"changed": True}, "diff"),
        ("Write", {"changed": False}, "empty"),
        ("Edit", {"changed": True}, "diff"),
        ("MultiEdit", {"changed": True}, "diff"),
        ("Glob", {}, "file_list"),
        ("LS", {}, "file_list"),
        ("Grep", {}, "text"),
        ("Grep", {"listing": True}, "file_list"),
        ("WebFetch", {}, "web_content"),
        ("WebSearch", {}, "web_content"),
        ("NotebookRead", {}, "file_content"),
        ("NotebookEdit", {"changed": False}, "empty"),
        ("TodoWrite", {}, "structured"),
        ("TodoRead", {}, "structured"),
        ("Task", {}, "agent_result"),
        ("Agent", {}, "agent_result"),
        ("mcp__github__create_issue", {}, "text"),
        ("SomethingNew", {}, "text"),
    ],
)
def test_appendix_a_tools_get_their_output_types(tool, kw, expected):
    assert decide_for(tool, **kw) == expected


def test_catalog_knows_every_tool_claude_code_2_1_328_reports():
    # init.tools of the real CLI (default tool set), plus the ones --tools can add.
    reported = [
        "Task", "Bash", "CronCreate", "CronDelete", "CronList", "Edit", "EnterWorktree",
        "ExitWorktree", "ListAgents", "Monitor", "NotebookEdit", "Read", "ReportFindings",
        "ScheduleWakeup", "SendMessage", "Skill", "TaskStop", "ToolSearch", "WebFetch",
        "WebSearch", "Workflow", "Write", "Agent", "Glob", "Grep", "MultiEdit", "TodoWrite",
        "ExitPlanMode", "EnterPlanMode", "AskUserQuestion", "TaskCreate", "TaskGet",
        "TaskUpdate", "TaskList", "TaskOutput",
    ]  # fmt: skip
    missing = [name for name in reported if name not in BUILTIN_TOOLS]
    assert missing == []


def test_mcp_tools_are_category_mcp():
    spec = lookup("mcp__github__create_issue")
    assert spec.category == "mcp"
    assert "github" in spec.description


def test_unknown_tools_are_custom_with_a_description():
    spec = lookup("Frobnicate")
    assert (spec.category, spec.description) == ("custom", "Frobnicate")


def test_write_and_shell_tools_are_the_ones_plan_mode_blocks():
    blocked = {name for name, spec in BUILTIN_TOOLS.items() if spec.writes}
    assert {"Write", "Edit", "MultiEdit", "NotebookEdit", "Bash"} <= blocked
    assert not {"Read", "Glob", "Grep", "LS", "WebFetch", "WebSearch"} & blocked


def test_catalog_entry_has_name_description_category():
    entry = catalog_entry(BUILTIN_TOOLS["Bash"])
    assert (entry.name, entry.category, entry.output_type, entry.requires_approval) == (
        "Bash", "shell", "text", True,
    )  # fmt: skip
    assert entry.description


def test_DPS_5_4_catalog_mcp_servers_in_trouble():
    """DPS-5.4-catalog: a failed server's tools are unavailable, a pending one's degraded, each
    with a diagnostic; a failed server with no listed tools is still shown."""
    catalog = build_catalog(
        ["Read", "mcp__echo__ping", "mcp__slow__x"],
        [
            ev.McpServer(
                name="echo", status="failed", error="spawn ENOENT", tools=["mcp__echo__ping"]
            ),
            ev.McpServer(name="slow", status="pending", tools=["mcp__slow__x"]),
            ev.McpServer(name="gone", status="needs-auth"),
            ev.McpServer(name="ok", status="connected"),
        ],
    )
    by_name = {t.name: t for t in catalog.tools}
    assert by_name["Read"].status is None and by_name["Read"].category == "filesystem"
    assert by_name["mcp__echo__ping"].status == "unavailable"
    assert "spawn ENOENT" in by_name["mcp__echo__ping"].status_description
    assert by_name["mcp__slow__x"].status == "degraded"
    assert by_name["mcp__gone"].status == "unavailable"
    codes = {(d.tool_name, d.code, d.severity) for d in catalog.diagnostics or ()}
    assert ("mcp__echo__ping", "MCP_SERVER_FAILED", "error") in codes
    assert ("mcp__slow__x", "MCP_SERVER_PENDING", "warning") in codes
    assert ("mcp__gone", "MCP_SERVER_NEEDS_AUTH", "error") in codes
