"""A session's MCP servers as the gateway models them (gateway/protocol/mcp_servers.py): what a
master's or the file's table may say, ${NAME} expansion, the merge, and the redacted view."""

from __future__ import annotations

import json

import pytest

from gateway.protocol import mcp_servers as M
from gateway.protocol.mcp_servers import McpServerError, ServerSpec


def wire(**table):
    return M.server_from_table(table, "request")


def test_a_stdio_and_an_http_server_are_read_with_their_kind_and_origin():
    stdio = wire(name="docs", command=["python3", "-m", "docs"], env={"TOKEN": "v"})
    http = wire(name="tracker", url="https://mcp.example.com/mcp", headers={"Authorization": "B"})
    assert (stdio.kind, stdio.command, stdio.env, stdio.origin) == (
        "stdio",
        ("python3", "-m", "docs"),
        {"TOKEN": "v"},
        "request",
    )
    assert (http.kind, http.url, http.headers) == (
        "http",
        "https://mcp.example.com/mcp",
        {"Authorization": "B"},
    )


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"command": ["x"]}, "name must be"),
        ({"name": "a b", "command": ["x"]}, "name must be"),
        ({"name": "a__b", "command": ["x"]}, "name must be"),
        ({"name": "x" * (M.MAX_NAME_CHARS + 1), "command": ["x"]}, "name must be"),
        ({"name": "s"}, "either command (stdio) or url (http)"),
        ({"name": "s", "command": ["x"], "url": "http://h/"}, "either command"),
        ({"name": "s", "command": []}, "non-empty list"),
        ({"name": "s", "command": [""]}, "program must not be empty"),
        ({"name": "s", "command": "x"}, "non-empty list"),
        ({"name": "s", "command": ["x"] * (M.MAX_ARGS + 1)}, f"at most {M.MAX_ARGS}"),
        ({"name": "s", "command": ["x", "y" * M.MAX_ARGV_BYTES]}, "bytes in all"),
        ({"name": "s", "command": ["x\0"]}, "NUL"),
        ({"name": "s", "command": ["x"], "env": {"A B": "v"}}, "not a usable name"),
        ({"name": "s", "command": ["x"], "env": {"A": 1}}, "must be a string"),
        ({"name": "s", "command": ["x"], "env": {"A": "v" * (M.MAX_VALUE_BYTES + 1)}}, "bytes"),
        (
            {"name": "s", "command": ["x"], "env": {f"V{i}": "" for i in range(65)}},
            f"at most {M.MAX_VARIABLES}",
        ),
        ({"name": "s", "command": ["x"], "headers": {"A": "v"}}, "headers are for an http"),
        ({"name": "s", "url": "http://h/", "env": {"A": "v"}}, "env is for a stdio"),
        ({"name": "s", "url": "ftp://h/"}, "http:// or https://"),
        ({"name": "s", "url": "file:///etc/passwd"}, "http:// or https://"),
        ({"name": "s", "url": "http://h/" + "p" * M.MAX_URL_CHARS}, "longer than"),
        ({"name": "s", "url": "http://h/", "headers": {"A": "v\r\nX: y"}}, "line break"),
        ({"name": "s", "url": "http://h/", "headers": {"A:": "v"}}, "not a usable name"),
        ({"name": "s", "command": ["x"], "agents": ["claude-code"]}, "unknown key 'agents'"),
        ({"name": "s", "command": ["x"], "cwd": "/"}, "unknown key 'cwd'"),
    ],
)
def test_a_table_that_cannot_be_used_is_refused_saying_why(table, said):
    with pytest.raises(McpServerError) as err:
        M.server_from_table(table, "request")
    assert said in str(err.value)


def test_a_list_is_bounded_and_its_names_unique():
    with pytest.raises(McpServerError, match="must be a list"):
        M.servers_from_wire({"name": "x"}, "request")
    many = [{"name": f"s{i}", "command": ["x"]} for i in range(M.MAX_SERVERS + 1)]
    with pytest.raises(McpServerError, match=f"at most {M.MAX_SERVERS}"):
        M.servers_from_wire(many, "request")
    twice = [{"name": "s", "command": ["x"]}, {"name": "s", "url": "http://h/"}]
    with pytest.raises(McpServerError, match="given twice"):
        M.servers_from_wire(twice, "request")


def configured(name="docs", agents=None, **keys):
    keys.setdefault("command", ("python3",))
    return M.finished(ServerSpec(agents=agents, **keys), name, "config")


def test_expand_fills_each_variable_from_the_mapping_passed_in():
    spec = configured(env={"TOKEN": "${DOCS_TOKEN}", "BOTH": "${A}-${B}", "PLAIN": "x"})
    assert M.variables(spec) == ["DOCS_TOKEN", "A", "B"]
    out = M.expand(spec, {"DOCS_TOKEN": "s3cret", "A": "1", "B": "2"})
    assert out.env == {"TOKEN": "s3cret", "BOTH": "1-2", "PLAIN": "x"}
    http = configured(command=None, url="http://h/", headers={"Authorization": "Bearer ${T}"})
    assert M.expand(http, {"T": "tok"}).headers == {"Authorization": "Bearer tok"}


def test_expand_names_the_missing_variable_and_refuses_a_gateway_setting():
    spec = configured(env={"TOKEN": "${DOCS_TOKEN}"})
    with pytest.raises(McpServerError, match=r"\$\{DOCS_TOKEN\} is not set"):
        M.expand(spec, {})
    leak = configured(env={"TOKEN": "${RAWP_GATEWAY_TOKEN}"})
    with pytest.raises(McpServerError, match="gateway setting"):
        M.expand(leak, {"RAWP_GATEWAY_TOKEN": "t"})
    broken = configured(command=None, url="http://h/", headers={"A": "${V}"})
    with pytest.raises(McpServerError, match="line break"):
        M.expand(broken, {"V": "x\r\nHost: evil"})


def test_a_masters_server_is_never_expanded():
    spec = wire(name="s", command=["x"], env={"T": "${HOME}"})
    assert spec.env == {"T": "${HOME}"}  # servers_from_wire has no environment to read


def test_merge_keeps_the_profiles_configured_servers_then_the_requests():
    everyone = configured("docs")
    only_codex = configured("codex-only", agents=("codex",))
    request = M.servers_from_wire([{"name": "mine", "url": "http://h/"}], "request")
    editor = M.servers_from_wire([{"name": "ed", "command": ["e"]}], "editor")
    merged = M.merged([everyone, only_codex], "claude-code", request, editor)
    assert [(s.name, s.origin) for s in merged] == [
        ("docs", "config"),
        ("mine", "request"),
        ("ed", "editor"),
    ]
    assert [s.name for s in M.merged([everyone, only_codex], "codex")] == ["docs", "codex-only"]


def test_a_request_may_not_replace_a_configured_server():
    replaced = M.servers_from_wire([{"name": "docs", "command": ["evil"]}], "request")
    with pytest.raises(McpServerError, match="configured server's, which is never replaced"):
        M.merged([configured("docs")], "claude-code", replaced)
    # A configured server the profile does not take leaves its name free.
    assert M.merged([configured("docs", agents=("codex",))], "claude-code", replaced)


def test_merge_bounds_a_sessions_servers_all_origins_together():
    ours = [configured(f"c{i}") for i in range(M.MAX_SERVERS)]
    more = M.servers_from_wire([{"name": "one", "command": ["x"]}], "request")
    with pytest.raises(McpServerError, match=f"at most {M.MAX_SERVERS}"):
        M.merged(ours, "claude-code", more)


def test_the_redacted_view_names_env_and_headers_never_their_values():
    stdio = wire(name="s", command=["run", "--token", "argsecret"], env={"TOKEN": "envsecret"})
    http = wire(
        name="h",
        url="https://user:pw@h.example:8443/mcp?key=querysecret#frag",
        headers={"Authorization": "Bearer headersecret"},
    )
    shown = json.dumps([M.redacted(stdio), M.redacted(http), repr(stdio), repr(http)])
    for secret in ("argsecret", "envsecret", "pw", "querysecret", "headersecret"):
        assert secret not in shown
    assert M.redacted(stdio) == {
        "name": "s",
        "kind": "stdio",
        "origin": "request",
        "command": ["run"],
        "env": ["TOKEN"],
    }
    assert M.redacted(http)["url"] == "https://h.example:8443/mcp"
    assert M.redacted(http)["headers"] == ["Authorization"]


def test_the_wire_form_reads_back_as_the_same_servers():
    specs = M.servers_from_wire(
        [
            {"name": "s", "command": ["x", "y"], "env": {"A": "1"}},
            {"name": "h", "url": "http://h/", "headers": {"B": "2"}},
        ],
        "editor",
    )
    assert M.servers_from_wire(M.servers_to_wire(specs), "editor") == specs
