"""``[mcp.servers.NAME]`` (docs/configuration.md, docs/mcp.md): read like every section, each
``${NAME}`` taken from the gateway's environment at start, and a missing one stops ``serve`` with
one line naming it."""

from __future__ import annotations

import os
import subprocess

import pytest

from gateway.config import ConfigError, load_config
from gateway.protocol.mcp_servers import redacted
from tests.config.test_strict import refused, write
from tests.support.servers import CLI

SERVERS = """
[mcp.servers.docs]
command = ["python3", "-m", "docs_mcp"]
env = { DOCS_TOKEN = "${DOCS_TOKEN}" }
agents = ["claude-code", "claude-acp"]

[mcp.servers.tracker]
url = "https://mcp.example.com/mcp"
headers = { Authorization = "Bearer ${TRACKER_TOKEN}" }
"""


def test_the_control_planes_example_is_read_and_expanded(tmp_path):
    config = load_config(
        write(tmp_path, SERVERS), environ={"DOCS_TOKEN": "d0c", "TRACKER_TOKEN": "tr4"}
    )
    docs, tracker = config.mcp.servers
    assert (docs.name, docs.kind, docs.command, docs.env, docs.agents) == (
        "docs",
        "stdio",
        ("python3", "-m", "docs_mcp"),
        {"DOCS_TOKEN": "d0c"},
        ("claude-code", "claude-acp"),
    )
    assert (tracker.name, tracker.kind, tracker.headers, tracker.agents) == (
        "tracker",
        "http",
        {"Authorization": "Bearer tr4"},
        None,
    )
    assert [s.name for s in config.mcp.for_profile("codex")] == ["tracker"]
    assert "d0c" not in repr(config) and "tr4" not in str([redacted(s) for s in config.mcp.servers])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[mcp.servers.s]\ncommand = ["x"]\nenv = { T = "${NOT_SET_ANYWHERE}" }\n',
            "FILE [mcp.servers.s]: MCP server s: ${NOT_SET_ANYWHERE} is not set in the "
            "gateway's environment",
        ),
        (
            '[mcp.servers.s]\ncommand = ["x"]\nenv = { T = "${RAWP_GATEWAY_TOKEN}" }\n',
            "FILE [mcp.servers.s]: MCP server s: ${RAWP_GATEWAY_TOKEN} is a gateway setting, "
            "never given to an agent",
        ),
        (
            '[mcp.servers.s]\ncommand = ["x"]\nagents = ["nobody"]\n',
            "FILE [mcp.servers.s] agents: nobody is no agent profile; known: ",
        ),
        (
            '[mcp.servers.s]\nurl = "ftp://h/"\n',
            "FILE [mcp.servers.s]: url must be an http:// or https:// URL, got 'ftp://h/'",
        ),
        ("[mcp.servers.s]\nenv = {}\n", "FILE [mcp.servers.s]: MCP server s: give either"),
        ('[mcp.servers.s]\ncomand = ["x"]\n', "FILE:4: unknown key [mcp.servers.s] comand"),
        ('[mcp.servers."a b"]\ncommand = ["x"]\n', "FILE [mcp.servers.a b]: MCP server 'a b':"),
    ],
)
def test_a_server_that_cannot_be_used_is_refused_before_anything_runs(tmp_path, text, message):
    assert refused(tmp_path, text).startswith(message)


def test_serve_with_a_missing_variable_does_not_start_and_names_it_in_one_line(tmp_path):
    path = write(tmp_path, SERVERS)
    env = {k: v for k, v in os.environ.items() if k not in ("DOCS_TOKEN", "TRACKER_TOKEN")}
    done = subprocess.run(
        [*CLI, "serve", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "DOCS_TOKEN": "set"},
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"rawp-gateway: {path} [mcp.servers.tracker]: MCP server tracker: ${{TRACKER_TOKEN}} "
        "is not set in the gateway's environment\n"
    )


def test_no_mcp_section_means_no_servers(tmp_path):
    assert load_config(write(tmp_path, ""), environ={}).mcp.servers == ()
    path = tmp_path / "top.toml"
    path.write_text(f'mcp = 3\n[server]\nworkspace_root = "{tmp_path}"\n')
    with pytest.raises(ConfigError, match="must be tables"):
        load_config(path, environ={})
