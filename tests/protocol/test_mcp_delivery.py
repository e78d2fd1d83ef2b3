"""How each agent is handed a session's MCP servers (gateway/protocol/mcp_delivery.py): Codex's
``-c`` overrides, Gemini's settings and flag, ACP's ``mcpServers``, and an editor's list read as
a master's. The secrets go by variable, never in an argv or a file; what each CLI does with these
is tested against the real ones in tests/e2e/test_e2e_mcp_agents.py."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib

import pytest

from gateway.protocol import mcp_delivery as D
from gateway.protocol.mcp_servers import McpServerError, server_from_table, servers_from_wire

SECRET = "s3cr$t 'with\" quotes"


def spec(**table):
    return server_from_table(table, "request")


DOCS = spec(name="docs", command=["python3", "-m", "docs", "--x=$HOME"], env={"TOKEN": SECRET})
PLAIN = spec(name="plain-one", command=["/usr/bin/plain", "a b"])
TRACKER = spec(name="tracker", url="https://mcp.example.com/mcp", headers={"Authorization": SECRET})


def overrides(args: tuple[str, ...]) -> dict[str, object]:
    """Codex's ``-c key=value`` pairs, each value read as TOML as Codex reads it."""
    assert args[::2] == ("-c",) * (len(args) // 2)
    out = {}
    for pair in args[1::2]:
        key, _, value = pair.partition("=")
        out[key] = tomllib.loads(f"v = {value}")["v"]
    return out


def test_codex_gets_each_server_by_overrides_and_no_secret_in_its_argv():
    got = D.codex_delivery([DOCS, PLAIN, TRACKER])
    assert not any(SECRET in a for a in got.args)
    c = overrides(got.args)
    assert c["mcp_servers.plain-one.command"] == "/usr/bin/plain"
    assert c["mcp_servers.plain-one.args"] == ["a b"]
    assert c["mcp_servers.tracker.url"] == "https://mcp.example.com/mcp"
    (header_var,) = c["mcp_servers.tracker.env_http_headers"].values()  # type: ignore[union-attr]
    assert list(c["mcp_servers.tracker.env_http_headers"]) == ["Authorization"]  # type: ignore[call-overload]
    assert got.env[header_var] == SECRET
    assert c["mcp_servers.docs.command"] == D.SHELL
    (env_var,) = c["mcp_servers.docs.env_vars"]  # type: ignore[misc]
    assert env_var.startswith(D.SECRET_PREFIX) and got.env[env_var] == SECRET
    assert set(got.env) == {env_var, header_var}
    # ... and the commands of its shell tool never see them.
    assert c["shell_environment_policy.exclude"] == [f"{D.SECRET_PREFIX}*"]


def test_codex_starts_a_stdio_server_with_its_own_names_and_its_argv_unchanged():
    """The /bin/sh launcher Codex is given sets the server's own variable from the numbered one
    and runs the argv as it was: a value with quotes and a "$", an argument with a "$", spaces."""
    given = D.codex_delivery([DOCS])
    c = overrides(given.args)
    env = {**given.env, "PATH": os.environ["PATH"]}
    probe = "import os, sys; print(repr(os.environ['TOKEN'])); print(repr(sys.argv[1:]))"
    args = list(c["mcp_servers.docs.args"])  # type: ignore[call-overload]
    args[2:] = ["python3", "-c", probe, "--x=$HOME", "two words"]  # the argv after the script
    out = subprocess.run([D.SHELL, *args], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [repr(SECRET), repr(["--x=$HOME", "two words"])]


def test_gemini_gets_settings_with_variables_for_secrets_and_every_dollar():
    got = D.gemini_delivery([DOCS, PLAIN, TRACKER])
    assert got.args == ("--allowed-mcp-server-names", "docs,plain-one,tracker")
    assert SECRET not in json.dumps(got.servers)
    docs, plain, tracker = (got.servers or {}).values()
    assert plain == {"command": "/usr/bin/plain", "args": ["a b"]}
    assert docs["command"] == "python3" and docs["args"][:2] == ["-m", "docs"]
    # Gemini expands "$NAME" in its settings: such an argument goes by variable too.
    dollar = docs["args"][2]
    assert dollar.startswith("${" + D.SECRET_PREFIX)
    assert got.env[dollar[2:-1]] == "--x=$HOME"
    assert got.env[docs["env"]["TOKEN"][2:-1]] == SECRET
    assert tracker["httpUrl"] == "https://mcp.example.com/mcp"
    assert got.env[tracker["headers"]["Authorization"][2:-1]] == SECRET


def test_gemini_without_servers_gets_nothing_and_its_other_settings_are_kept():
    assert D.gemini_delivery([]) == D.CliDelivery()
    mine = {"security": {"auth": {"selectedType": "gemini-api-key"}}, "mcpServers": {"old": {}}}
    new = D.gemini_settings(mine, {"docs": {"command": "x"}})
    assert new == {"security": mine["security"], "mcpServers": {"docs": {"command": "x"}}}
    assert D.gemini_settings(["not", "an", "object"], {}) == {"mcpServers": {}}


def test_acp_agents_get_acps_shapes_stdio_untyped():
    assert D.acp_servers([DOCS, TRACKER]) == [
        {
            "name": "docs",
            "command": "python3",
            "args": ["-m", "docs", "--x=$HOME"],
            "env": [{"name": "TOKEN", "value": SECRET}],
        },
        {
            "type": "http",
            "name": "tracker",
            "url": "https://mcp.example.com/mcp",
            "headers": [{"name": "Authorization", "value": SECRET}],
        },
    ]


def test_an_editors_list_is_read_as_a_masters_and_comes_back_the_same():
    sent = D.acp_servers([DOCS, TRACKER])
    sent[0]["type"] = "stdio"  # some clients type it; taken all the same
    specs = servers_from_wire(D.editor_servers(sent), "editor")
    assert [(s.name, s.kind, s.origin) for s in specs] == [
        ("docs", "stdio", "editor"),
        ("tracker", "http", "editor"),
    ]
    assert specs[0].command == DOCS.command and specs[0].env == DOCS.env
    assert specs[1].headers == TRACKER.headers


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        ({"name": "x"}, "must be a list"),
        ([{"type": "sse", "name": "s", "url": "http://h/", "headers": []}], "'sse' servers"),
        ([{"name": "s", "command": "x", "args": "y"}], "args must be a list"),
        ([{"name": "s", "command": "x", "env": [{"name": "A", "value": "1"}] * 2}], "twice"),
        ([{"name": "s", "command": "x", "env": [["A", "1"]]}], "lists of {name, value}"),
        ([{"name": "s", "command": "x"}] * 33, "at most 32"),
        (["x"], "must be an object"),
    ],
)
def test_an_editors_list_is_refused_with_the_reason(entries, said):
    with pytest.raises(McpServerError, match=r".*" + said.replace("{", r"\{").replace("}", r"\}")):
        servers_from_wire(D.editor_servers(entries), "editor")


def test_an_editors_table_is_checked_as_a_masters():
    """The bounds are the model's: the same words as for POST /v1/session's mcp_servers."""
    bad = [{"name": "a__b", "command": "x", "args": [], "env": []}]
    with pytest.raises(McpServerError, match="name must be"):
        servers_from_wire(D.editor_servers(bad), "editor")
