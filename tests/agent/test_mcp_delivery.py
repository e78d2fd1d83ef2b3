"""How Claude Code is handed a session's MCP servers (gateway/agent/mcp.py, docs/mcp.md), and how
the reason of a failure is read from its MCP logs: bounded, never through a link, no secret."""

from __future__ import annotations

import json
import os

from gateway.agent import mcp as agent_mcp
from gateway.agent.profiles import builtin_profiles
from gateway.protocol import mcp_servers as M

STDIO = M.server_from_table(
    {"name": "local", "command": ["python3", "srv.py", "--x"], "env": {"TOKEN": "env-s3cret"}},
    "request",
)
HTTP = M.server_from_table(
    {"name": "remote", "url": "http://h/mcp", "headers": {"Authorization": "Bearer tok-s3cret"}},
    "request",
)
PROFILES = builtin_profiles()


def test_claude_code_gets_a_strict_config_file_with_a_type_on_every_entry(tmp_path):
    given = agent_mcp.delivery(PROFILES["claude-code"], [STDIO, HTTP], str(tmp_path))
    path = str(tmp_path / agent_mcp.CLAUDE_CONFIG_FILE)
    assert given.flags == ("--mcp-config", path, "--strict-mcp-config")
    assert json.loads(given.files[agent_mcp.CLAUDE_CONFIG_FILE]) == {
        "mcpServers": {
            "local": {
                "type": "stdio",
                "command": "python3",
                "args": ["srv.py", "--x"],
                "env": {"TOKEN": "env-s3cret"},
            },
            # An entry with a url and no type is dropped by Claude Code without a word.
            "remote": {
                "type": "http",
                "url": "http://h/mcp",
                "headers": {"Authorization": "Bearer tok-s3cret"},
            },
        }
    }


def test_an_agent_that_takes_none_or_a_session_without_any_gets_nothing(tmp_path):
    assert agent_mcp.kinds_of(PROFILES["claude-code"]) == ("stdio", "http")
    assert agent_mcp.kinds_of(PROFILES["claude-code-oneshot"]) == ("stdio", "http")
    assert agent_mcp.kinds_of(PROFILES["demo"]) == ()
    assert agent_mcp.delivery(PROFILES["demo"], [STDIO], str(tmp_path)) == agent_mcp.Delivery()
    assert agent_mcp.delivery(PROFILES["claude-code"], [], str(tmp_path)) == agent_mcp.Delivery()


def log_dir(home, workspace, name):
    slug = "".join(c if c.isalnum() else "-" for c in workspace)
    path = home / ".cache" / "claude-cli-nodejs" / slug / f"mcp-logs-{name}"
    path.mkdir(parents=True)
    return path


def test_the_reason_is_the_last_error_of_the_newest_log_without_a_secret(tmp_path):
    workspace = "/srv/space-1"
    logs = log_dir(tmp_path, workspace, "remote")
    (logs / "2026-01-01T00-00-00-000Z.jsonl").write_text('{"error":"old"}\n')
    (logs / "2026-01-02T00-00-00-000Z.jsonl").write_text(
        '{"debug":"Starting"}\n'
        '{"error":"HTTP 401 with Bearer tok-s3cret and env-s3cret"}\n'
        "not json\n"
    )
    reasons = agent_mcp.claude_failure_reasons(
        str(tmp_path), workspace, ["remote", "missing"], [STDIO, HTTP]
    )
    assert reasons == {"remote": "HTTP 401 with [REDACTED] and [REDACTED]"}


def test_a_log_reached_through_a_link_or_not_a_file_is_not_read(tmp_path):
    workspace = "/w"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.jsonl").write_text('{"error":"read through a link"}\n')
    logs = log_dir(tmp_path, workspace, "remote")
    logs.rmdir()
    logs.symlink_to(elsewhere)
    fifo = log_dir(tmp_path, workspace, "local") / "x.jsonl"
    os.mkfifo(fifo)  # opening it to read would block for ever
    got = agent_mcp.claude_failure_reasons(str(tmp_path), workspace, ["remote", "local"], [])
    assert got == {}


def test_a_long_reason_is_cut():
    text = agent_mcp.without_secrets("x" * 10_000, [])
    assert len(text) == agent_mcp.MAX_REASON_CHARS and text.endswith("...")
