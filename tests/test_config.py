"""Configuration layering (control-plane.md): defaults < TOML < flags < RAWP_GATEWAY_* variables."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, command_for, load_config, template_args


def write(tmp_path, text: str):
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


def test_defaults(tmp_path):
    config = load_config(None, {"workspace_root": str(tmp_path)}, environ={})
    assert (config.host, config.port, config.token) == ("127.0.0.1", 8765, None)
    assert config.max_frame_size == 1024 * 1024
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
    assert (config.host, config.port, config.token) == ("127.0.0.2", 9100, "from-file")
    assert config.max_frame_size == 65536
    config = load_config(
        path, {"port": 9100}, environ={"RAWP_GATEWAY_PORT": "9200", "RAWP_GATEWAY_TOKEN": "env"}
    )
    assert (config.port, config.token) == (9200, "env")


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
    assert config.warnings == ()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[server]\nport = 'high'", "port must be int"),
        ("[server\n", "not valid TOML"),
        ("[agents.x]\ncommand = 'claude -p'", "command must be a non-empty list"),
        ("[agents.x]\ncommand = ['a']", "a new profile needs parser"),
        ("[agents.claude-code]\nfeatures = { plan_mode = 'yes' }", "features"),
        ("[server]\nbuffer_policy = 'LOSSY'", "buffer_policy must be one of"),
    ],
)
def test_errors_name_the_key(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=needle):
        load_config(path, {"workspace_root": str(tmp_path)}, environ={})


def test_unknown_keys_are_warnings(tmp_path):
    path = write(tmp_path, f'[server]\nworkspace_root = "{tmp_path}"\nprot = 1\n[misc]\n')
    config = load_config(path, environ={})
    assert any("prot" in w for w in config.warnings)
    assert any("[misc]" in w for w in config.warnings)


def test_missing_file_and_token_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match="cannot read token file"):
        load_config(None, {"token_file": str(tmp_path / "nope")}, environ={})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(None, {"token_file": str(tmp_path / "empty")}, environ={})


def test_argv_templates_never_split_values():
    """Nothing in a frame becomes more than one argument (control-plane.md, Security)."""
    from gateway.config import builtin_profiles

    oneshot = builtin_profiles("claude")["claude-code-oneshot"]
    argv = command_for(oneshot, prompt="- hi; rm -rf / --flag", workspace="/w")
    # one argument, after the end of options, so a leading "-" is not an option either
    assert argv[-2:] == ["--", "- hi; rm -rf / --flag"]
    assert template_args("--resume {session_id}", session_id="a b;c") == ["--resume", "a b;c"]


def test_state_dir_from_file_flag_and_environment(tmp_path):
    """Unset: sessions in memory only. Set in the file, by --state-dir or RAWP_GATEWAY_STATE_DIR
    (each overriding the one before); an empty value means unset."""
    root = {"workspace_root": str(tmp_path)}
    assert load_config(None, root, environ={}).state_dir is None
    path = tmp_path / "c.toml"
    path.write_text('[server]\nstate_dir = "/var/lib/rawp"\n')
    assert str(load_config(path, root, environ={}).state_dir) == "/var/lib/rawp"
    flag = load_config(path, {**root, "state_dir": str(tmp_path / "s")}, environ={})
    assert flag.state_dir == tmp_path / "s"
    env = load_config(path, root, environ={"RAWP_GATEWAY_STATE_DIR": str(tmp_path / "e")})
    assert env.state_dir == tmp_path / "e"
    assert load_config(path, root, environ={"RAWP_GATEWAY_STATE_DIR": ""}).state_dir is None
