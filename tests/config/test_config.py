"""Configuration layering (docs/configuration.md): defaults < TOML < flags < RAWP_GATEWAY_* variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, command_for, load_config, template_args


def write(tmp_path, text: str):
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


def test_defaults(tmp_path):
    config = load_config(None, {"workspace_root": str(tmp_path)}, environ={})
    assert (config.server.host, config.server.port, config.token) == ("127.0.0.1", 8765, None)
    assert config.server.max_frame_size == 1024 * 1024
    assert {"claude-code", "claude-code-oneshot", "demo"} <= set(config.agents)


def test_toml_then_flags_then_environment(tmp_path):
    (tmp_path / "token").write_text("from-file\n")
    path = write(
        tmp_path,
        f"""
[server]
host = "127.0.0.2"
port = 9000
workspace_root = "{tmp_path}"
token_file = "{tmp_path / "token"}"
max_frame_size = 65536
""",
    )
    config = load_config(path, {"port": 9100}, environ={})
    assert (config.server.host, config.server.port, config.token) == (
        "127.0.0.2",
        9100,
        "from-file",
    )
    assert config.server.max_frame_size == 65536
    config = load_config(
        path, {"port": 9100}, environ={"RAWP_GATEWAY_PORT": "9200", "RAWP_GATEWAY_TOKEN": "env"}
    )
    assert (config.server.port, config.token) == (9200, "env")


def test_agent_profiles_replace_and_add(tmp_path):
    path = write(
        tmp_path,
        f"""
[server]
workspace_root = "{tmp_path}"

[agents.claude-code]
command = ["/opt/claude", "-p", "--input-format", "stream-json"]
env = {{ IS_SANDBOX = "1" }}
auto_allow = ["Read"]
permission_timeout_sec = 30

[agents.echo]
parser = "claude-code"
command = ["python3", "-c", "pass", "{{prompt}}"]
single_turn_process = true
features = {{ plan_mode = false, thinking_stream = true }}
""",
    )
    config = load_config(path, environ={})
    claude = config.agents["claude-code"]
    assert claude.command[0] == "/opt/claude"
    assert claude.env == {"IS_SANDBOX": "1"}
    assert claude.auto_allow == frozenset({"Read"})
    assert claude.permission_timeout_sec == 30.0
    assert claude.resume_flag == "--resume {session_id}"  # kept from the built-in
    echo = config.agents["echo"]
    assert (
        echo.single_turn_process and echo.features.thinking_stream and not echo.features.plan_mode
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[server]\nport = 'high'", "port must be an integer from 0 to 65535, got 'high'"),
        ("[server\n", "not valid TOML"),
        ("[agents.x]\ncommand = 'claude -p'", "command must be a non-empty list"),
        ("[agents.x]\ncommand = ['a']", "a new profile needs parser"),
        ("[agents.claude-code]\nfeatures = { plan_mode = 'yes' }", "features"),
        ("[server]\nbuffer_policy = 'LOSSY'", "buffer_policy must be one of"),
        ("[agents.claude-code]\noverride_flags = '--x'", "override_flags must be a table"),
        ("[agents.x]\nparser = 'nope'\ncommand = ['a']", "no agent parser named 'nope'"),
        ("[agents.claude-code]\nfeatures = { plan_mod = false }", "unknown key .* plan_mod"),
        ("[agents.claude-code]\nfeatures = 'all'", "features must be a table"),
    ],
)
def test_errors_name_the_key(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=needle):
        load_config(path, {"workspace_root": str(tmp_path)}, environ={})


def test_missing_file_and_token_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match="cannot read token file"):
        load_config(None, {"token_file": str(tmp_path / "nope")}, environ={})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(None, {"token_file": str(tmp_path / "empty")}, environ={})


def test_argv_templates_never_split_values():
    """Nothing in a frame becomes more than one argument (docs/http-api.md, Security)."""
    from gateway.agent.profiles import builtin_profiles

    oneshot = builtin_profiles("claude")["claude-code-oneshot"]
    argv = command_for(oneshot, prompt="- hi; rm -rf / --flag", workspace="/w")
    # one argument, after the end of options, so a leading "-" is not an option either
    assert argv[-2:] == ["--", "- hi; rm -rf / --flag"]
    assert template_args("--resume {session_id}", session_id="a b;c") == ["--resume", "a b;c"]


def test_state_dir_from_file_flag_and_environment(tmp_path):
    """Unset: sessions in memory only. Set in the file, by --state-dir or RAWP_GATEWAY_STATE_DIR
    (each overriding the one before); an empty value means unset."""
    root = {"workspace_root": str(tmp_path)}
    assert load_config(None, root, environ={}).server.state_dir is None
    path = tmp_path / "c.toml"
    path.write_text('[server]\nstate_dir = "/var/lib/rawp"\n')
    assert str(load_config(path, root, environ={}).server.state_dir) == "/var/lib/rawp"
    flag = load_config(path, {**root, "state_dir": str(tmp_path / "s")}, environ={})
    assert flag.server.state_dir == tmp_path / "s"
    env = load_config(path, root, environ={"RAWP_GATEWAY_STATE_DIR": str(tmp_path / "e")})
    assert env.server.state_dir == tmp_path / "e"
    assert load_config(path, root, environ={"RAWP_GATEWAY_STATE_DIR": ""}).server.state_dir is None


def test_a_profile_of_ones_own_announces_what_its_parser_supports(tmp_path):
    """A profile without ``features`` gets its parser's (``ParserSpec.features``); a ``features``
    table changes only the keys it names, narrowing or widening."""
    from gateway.agent.profiles import parser_features
    from parsers.base import get as get_parser

    path = write(
        tmp_path,
        f"""
[server]
workspace_root = "{tmp_path}"

[agents.mine]
parser = "claude-code"
command = ["/opt/claude", "-p", "--input-format", "stream-json"]

[agents.narrow]
parser = "claude-code"
command = ["/opt/claude"]
features = {{ plan_mode = false, file_reference = true }}

[agents.claude-code]
features = {{ subagent = false }}

[agents.codex]
parser = "gemini"
""",
    )
    config = load_config(path, environ={})
    claude = get_parser("claude-code").features
    assert {"thinking_stream", "context_compaction", "plan_mode", "subagent"} <= claude
    mine = config.agents["mine"].features
    assert mine == parser_features("claude-code")
    assert all(getattr(mine, name) is True for name in claude)
    narrow = config.agents["narrow"].features
    assert narrow.plan_mode is False and narrow.file_reference is True
    assert narrow.thinking_stream is True and narrow.context_compaction is True  # kept
    built_in = config.agents["claude-code"].features
    assert built_in.subagent is False and built_in.plan_mode is True
    # another parser: that parser's features, not the replaced profile's
    assert config.agents["codex"].features == parser_features("gemini")


def test_builtin_profiles_announce_their_parsers_features():
    from gateway.agent.profiles import builtin_profiles, parser_features

    profiles = builtin_profiles()
    for name in ("claude-code", "claude-code-oneshot", "codex", "gemini", "plain"):
        assert profiles[name].features == parser_features(profiles[name].parser), name
    assert parser_features("codex").thinking_stream is True
    assert parser_features("gemini").thinking_stream is None
    # the demo agent narrows: it speaks Claude Code's stream-json but runs no subagents
    demo = profiles["demo"].features
    assert demo.plan_mode is True and demo.subagent is None


def test_a_token_needs_an_explicit_workspace_root(tmp_path):
    """Without a token the root defaults to the current directory; with one it must be chosen."""
    assert load_config(None, {}, environ={}).server.workspace_root == Path.cwd().resolve()
    with pytest.raises(ConfigError, match="with a token, workspace_root must be set"):
        load_config(None, {}, environ={"RAWP_GATEWAY_TOKEN": "t"})
    config = load_config(
        None, {}, environ={"RAWP_GATEWAY_TOKEN": "t", "RAWP_GATEWAY_WORKSPACE_ROOT": str(tmp_path)}
    )
    assert config.server.workspace_root == tmp_path.resolve()


def test_max_sessions_from_file_and_environment(tmp_path):
    assert (
        load_config(None, {"workspace_root": str(tmp_path)}, environ={}).server.max_sessions == 64
    )
    path = write(tmp_path, f'[server]\nworkspace_root = "{tmp_path}"\nmax_sessions = 3\n')
    assert load_config(path, environ={}).server.max_sessions == 3
    env = {"RAWP_GATEWAY_MAX_SESSIONS": "5"}
    assert load_config(path, environ=env).server.max_sessions == 5
    with pytest.raises(ConfigError, match="max_sessions must be at least 1"):
        load_config(path, environ={"RAWP_GATEWAY_MAX_SESSIONS": "0"})


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_numbers_must_be_finite(tmp_path, value):
    env = {"RAWP_GATEWAY_REATTACH_WINDOW_SEC": value}
    with pytest.raises(ConfigError, match="reattach_window_sec must be a finite number"):
        load_config(None, {"workspace_root": str(tmp_path)}, environ=env)


@pytest.mark.parametrize("host", ["127.0.0.1 ", " 127.0.0.1", "", "local host", "a\0b"])
def test_a_host_with_spaces_is_an_error(tmp_path, host):
    with pytest.raises(ConfigError, match="host must be an address or a name without spaces"):
        load_config(None, {"workspace_root": str(tmp_path), "host": host}, environ={})


def test_an_empty_token_variable_is_an_error_not_no_auth(tmp_path):
    """An empty RAWP_GATEWAY_TOKEN used to win over --token-file and turn authentication off."""
    (tmp_path / "token").write_text("from-file\n")
    flags = {"workspace_root": str(tmp_path), "token_file": str(tmp_path / "token")}
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match="RAWP_GATEWAY_TOKEN is set but empty"):
            load_config(None, flags, environ={"RAWP_GATEWAY_TOKEN": empty})
    assert load_config(None, flags, environ={}).token == "from-file"


def test_a_port_past_65535_is_an_error_not_another_port(tmp_path):
    """99999 used to be taken modulo 65536 by the socket layer: the gateway listened on 34463."""
    with pytest.raises(ConfigError, match="port must be an integer from 0 to 65535, got 99999"):
        load_config(None, {"workspace_root": str(tmp_path), "port": 99999}, environ={})
    assert load_config(
        None, {"workspace_root": str(tmp_path), "port": 65535}, environ={}
    ).server.port


def test_files_that_are_not_utf8_are_clear_errors(tmp_path):
    (tmp_path / "token").write_bytes(b"tok\xff\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(None, {"token_file": str(tmp_path / "token")}, environ={})
    bad = write(tmp_path, "")
    bad.write_bytes(b'[server]\nhost = "\xff"\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, environ={})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server = 1\n", r"\[server\] must be a table"),
        ("agents = 1\n", r"\[agents\] must be a table"),
        ("[agents.demo]\noverride_flags = 3\n", "override_flags must be a table of strings"),
        ("[agents.demo]\npermission_timeout_sec = nan\n", "permission_timeout_sec must be"),
        ("[agents.demo]\npermission_timeout_sec = inf\n", "permission_timeout_sec must be"),
        ("[server]\nshutdown_grace_sec = nan\n", "shutdown_grace_sec must be a finite number"),
    ],
)
def test_config_shapes_that_used_to_be_tracebacks(tmp_path, text, message):
    """Each of these raised AttributeError/TypeError at start, or (nan timeouts) failed later at
    the first permission request."""
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), {"workspace_root": str(tmp_path)}, environ={})


def test_budgets_are_read_into_the_ledgers_limits(tmp_path):
    """``[budgets]`` (docs/budgets.md): each key bounded, the table read in gateway/config/."""
    from gateway.protocol.budget import Limits

    root = {"workspace_root": str(tmp_path)}
    assert load_config(None, root, environ={}).budgets == Limits(0.0, 0.0, 0.8)
    path = write(tmp_path, "[budgets]\nsession_usd = 5\nuser_daily_usd = 50.5\nwarn_at = 1\n")
    assert load_config(path, root, environ={}).budgets == Limits(5.0, 50.5, 1.0)
    for table, says in (
        ("session_usd = -1", r"\[budgets\]: session_usd must be from 0 to 1,000,000"),
        ("user_daily_usd = nan", "user_daily_usd must be a finite number"),
        ("session_usd = '5'", "session_usd must be int or float"),
        ("session_usd = true", "session_usd must be int or float"),
        ("warn_at = 0", "warn_at must be above 0"),
        ("warn_at = 1.5", "warn_at must be at most 1"),
        ("budgets = 1", r"\[budgets\] must be a table"),
    ):
        text = f"{table}\n" if table.startswith("budgets") else f"[budgets]\n{table}\n"
        with pytest.raises(ConfigError, match=says):
            load_config(write(tmp_path, text), root, environ={})


def test_every_unknown_name_is_reported_in_one_line(tmp_path):
    path = write(tmp_path, "[server]\nprot = 1\nzzz = 2\n[budgets]\nsesion_usd = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert str(err.value) == (
        f"{path}:2: unknown key [server] prot; did you mean port?; "
        f"{path}:3: unknown key [server] zzz; "
        f"{path}:5: unknown key [budgets] sesion_usd; did you mean session_usd?"
    )


def test_only_server_keys_have_variables_and_flags():
    """load_config layers variables and flags over [server] alone: a variable or flag declared on
    another section's key would be documented and never read."""
    from gateway.config import SECTIONS
    from gateway.config.settings import declared

    others = [
        (section, key.name)
        for section, cls in SECTIONS.items()
        if section != "server"
        for key in declared(cls).values()
        if key.setting.env or key.setting.flag
    ]
    assert others == []
    server = declared(SECTIONS["server"])
    assert {k for k, key in server.items() if key.setting.flag} == {
        "host", "port", "workspace_root", "token_file", "log_format", "state_dir"
    }  # fmt: skip
