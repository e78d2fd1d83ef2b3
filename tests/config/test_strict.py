"""A strict configuration (docs/configuration.md): an unknown section or key, in every kind of
section, is an error naming the file, the line and the nearest known name; ``[isolation]`` refuses
every value it could not apply; a profile's ``env`` may not
name a gateway setting; ``serve`` with such a file does not start and says why in one line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config
from gateway.config.strict import Locator
from tests.support.servers import CLI


def write(tmp_path: Path, text: str, workspace_root: Path | None = None) -> Path:
    """A config file of ``text`` after ``[server]`` (its workspace root ``tmp_path``, or the one
    given)."""
    path = tmp_path / "gateway.toml"
    path.write_text(f'[server]\nworkspace_root = "{workspace_root or tmp_path}"\n{text}')
    return path


def refused(tmp_path: Path, text: str) -> str:
    """The error the file with ``text`` after its first two lines (``[server]``) gets, with the
    file's name shortened to ``FILE``."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    return str(err.value).replace(str(path), "FILE")


PROFILE = '[agents.mine]\nparser = "plain"\ncommand = ["x"]\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # sections (line 3 is the first after [server])
        (
            '[isolaton]\nmode = "none"\n',
            "FILE:3: unknown section [isolaton]; did you mean [isolation]?",
        ),
        ("[servr]\n", "FILE:3: unknown section [servr]; did you mean [server]?"),
        ("[misc]\nx = 1\n", "FILE:3: unknown section [misc]"),
        ("[auth.odic]\n", "FILE:3: unknown section [auth.odic]; did you mean [auth.oidc]?"),
        # keys of each kind of section
        ("prot = 1\n", "FILE:3: unknown key [server] prot; did you mean port?"),
        ("zzz = 1\n", "FILE:3: unknown key [server] zzz"),
        (
            PROFILE + "auto_alow = []\n",
            "FILE:6: unknown key [agents.mine] auto_alow; did you mean auto_allow?",
        ),
        (
            PROFILE + "features = { thinking_stream = true, plan_mod = false }\n",
            "FILE:6: unknown key [agents.mine.features] plan_mod; did you mean plan_mode?",
        ),
        (
            PROFILE + "[agents.mine.features]\nplan_mode = true\n\nsubagnet = true\n",
            "FILE:9: unknown key [agents.mine.features] subagnet; did you mean subagent?",
        ),
        (
            '[auth]\nusers_fle = "/u"\n',
            "FILE:4: unknown key [auth] users_fle; did you mean users_file?",
        ),
        (
            '[auth.oidc]\nissuer = "https://i"\naudiance = "a"\n',
            "FILE:5: unknown key [auth.oidc] audiance; did you mean audience?",
        ),
        (
            "[notify]\nwebhook = []\n",
            "FILE:4: unknown key [notify] webhook; did you mean webhooks?",
        ),
        (
            '[[notify.webhooks]]\nurl = "http://a"\n[[notify.webhooks]]\nurl = "http://b"\n'
            'evnts = ["turn.ended"]\n',
            "FILE:7: unknown key [[notify.webhooks]] 2 evnts; did you mean events?",
        ),
        (
            '[notify]\nwebhooks = [\n  { url = "http://a" },\n'
            '  { url = "http://b", fromat = "slack" },\n]\n',
            "FILE:6: unknown key [[notify.webhooks]] 2 fromat; did you mean format?",
        ),
        ('[fleet]\npeer = "dns:x:1"\n', "FILE:4: unknown key [fleet] peer; did you mean peers?"),
        (
            '[isolation]\nmode = "none"\nnetwrok = "none"\n',
            "FILE:5: unknown key [isolation] netwrok; did you mean network?",
        ),
        # dotted keys, a top-level key, text that only looks like a table
        (
            "\n[agents]\nmine.parser = 'plain'\nmine.command = ['x']\nmine.enf = 1\n",
            "FILE:7: unknown key [agents.mine] enf; did you mean env?",
        ),
        ('[fleet]\n"peerz" = []\n', "FILE:4: unknown key [fleet] peerz; did you mean peers?"),
        (
            PROFILE + 'description = """\n[isolaton]\nprot = 1\n"""\n[server.x]\n',
            "FILE:10: unknown section [server.x]",
        ),
    ],
)
def test_an_unknown_name_is_an_error_with_its_line_and_the_nearest_known(tmp_path, text, message):
    assert refused(tmp_path, text) == message


def test_a_key_outside_any_section(tmp_path):
    path = tmp_path / "gateway.toml"
    for text, message in (
        (
            'isolaton = "none"\n',
            ":1: unknown key isolaton outside any section; did you mean [isolation]?",
        ),
        ('isolation = "sandbox"\n', ":1: [isolation] must be a table"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError) as err:
            load_config(path, {"workspace_root": str(tmp_path)}, environ={})
        assert str(err.value) == f"{path}{message}"


def test_a_name_the_scan_cannot_place_is_reported_with_its_section_alone():
    locate = Locator("FILE", "[server]\nport = 1\n")
    assert (locate(("server",)), locate(("server", "port"))) == ("FILE:1", "FILE:2")
    assert locate(("server", "prot")) == "FILE"


def test_every_documented_section_loads(tmp_path):
    (tmp_path / "secret").write_text("s3cret\n")
    config = load_config(
        write(
            tmp_path,
            '[agents.claude-code]\nenv = { IS_SANDBOX = "1" }\n'
            'override_flags = { model = "--model" }\nfeatures = { plan_mode = false }\n'
            '[auth]\naudit_log = "audit.jsonl"\n[auth.oidc]\nissuer = "https://i"\naudience = "a"\n'
            f'[[notify.webhooks]]\nurl = "http://h"\nsecret_file = "{tmp_path / "secret"}"\n'
            '[fleet]\npeers = []\n[isolation]\nmode = "none"\n',
        ),
        environ={},
    )
    assert config.agents["claude-code"].env == {"IS_SANDBOX": "1"}
    assert config.notify.webhooks[0].secret == b"s3cret"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[isolation]\nmode = "off"\n',
            'FILE:4: [isolation] mode must be "none" or "sandbox", got \'off\'',
        ),
        (
            '[isolation]\nmode = "sandbox"\nnetwork = "bridge"\n',
            'FILE:5: [isolation] network must be "host" or "none", got \'bridge\'',
        ),
        (
            '[isolation]\nmode = "sandbox"\nbind_ro = ["relative/path"]\n',
            "FILE:5: [isolation] bind_ro entries must be absolute paths of at most 1024 "
            "characters, got 'relative/path'",
        ),
        (
            '[isolation]\nmode = "sandbox"\nbind_rw = ["/no/such/dir/anywhere"]\n',
            "FILE:5: [isolation] bind_rw: /no/such/dir/anywhere does not exist",
        ),
        (
            '[isolation]\nbind_ro = "/usr"\n',
            "FILE:4: [isolation] bind_ro must be a list of at most 64 paths, got '/usr'",
        ),
        (
            "[isolation]\nbind_ro = [" + ", ".join(['"/usr"'] * 65) + "]\n",
            "FILE:4: [isolation] bind_ro must be a list of at most 64 paths",
        ),
        (
            '[isolation]\nbind_ro = ["/"]\n',
            "FILE:4: [isolation] bind_ro: / would show the whole machine",
        ),
        (
            "[isolation]\nmax_processes = 4\n",
            "FILE:4: [isolation] max_processes must be an integer from 16 to 1048576, got 4",
        ),
        (
            '[isolation]\nmax_memory_mb = "4G"\n',
            "FILE:4: [isolation] max_memory_mb must be an integer from 256 to 16777216, got '4G'",
        ),
    ],
)
def test_isolation_refuses_what_it_cannot_apply(tmp_path, text, message):
    """Every key is checked before anything runs: a security setting is never taken and silently
    not applied."""
    assert refused(tmp_path, text) == message


def test_isolation_defaults_and_a_whole_table(tmp_path):
    config = load_config(write(tmp_path, ""), environ={})
    assert config.isolation.mode == "none"
    (tmp_path / "tools").mkdir()
    (tmp_path / "work").mkdir()
    isolation = (
        f'[isolation]\nmode = "sandbox"\nnetwork = "none"\nbind_ro = ["{tmp_path}/tools/"]\n'
        "bind_rw = []\nmax_processes = 64\nmax_memory_mb = 1024\n"
    )
    config = load_config(write(tmp_path, isolation, tmp_path / "work"), environ={})
    iso = config.isolation
    assert (iso.mode, iso.network, iso.bind_ro, iso.bind_rw) == (
        "sandbox",
        "none",
        (f"{tmp_path}/tools",),
        (),
    )
    assert (iso.max_processes, iso.max_memory_mb) == (64, 1024)


def test_a_bind_may_not_show_what_the_gateway_hides(tmp_path):
    """A bind inside the workspace root (other sessions' workspaces), the state dir or onto a file
    the gateway read a secret from would undo the sandbox's masks."""
    work = tmp_path / "work"
    (work / "shared").mkdir(parents=True)
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'[server]\nworkspace_root = "{work}"\n[isolation]\nmode = "sandbox"\n'
        f'bind_ro = ["{work}/shared"]\n'
    )
    with pytest.raises(ConfigError, match=r"would show .*work, which the agent must not see"):
        load_config(path, environ={})
    path.write_text(
        f'[server]\nworkspace_root = "{work}"\n[isolation]\nmode = "sandbox"\n'
        f'bind_ro = ["{path}"]\n'
    )
    with pytest.raises(ConfigError, match=r"gateway\.toml would show"):
        load_config(path, environ={})


def test_the_gateway_files_are_known_for_masking(tmp_path):
    """Every file the gateway read a setting or secret from, and its audit log with each rotation,
    is in ``gateway_files`` (what the sandbox masks)."""
    (tmp_path / "token").write_text("t0ken\n")
    (tmp_path / "hook").write_text("s3cret\n")
    (tmp_path / "users.toml").write_text("")
    path = write(
        tmp_path,
        f'token_file = "{tmp_path}/token"\n'
        f'[auth]\nusers_file = "{tmp_path}/users.toml"\naudit_log = "{tmp_path}/audit.jsonl"\n'
        "audit_keep = 2\n"
        f'[[notify.webhooks]]\nurl = "http://h"\nsecret_file = "{tmp_path}/hook"\n',
    )
    config = load_config(path, environ={})
    assert {p.name for p in config.gateway_files} == {
        "gateway.toml",
        "token",
        "users.toml",
        "hook",
        "audit.jsonl",
        "audit.jsonl.1",
        "audit.jsonl.2",
    }
    assert str(config.server.workspace_root) in config.hidden_paths


def test_a_profile_may_not_hand_the_agent_a_gateway_setting(tmp_path):
    """Refused rather than dropped: the gateway's settings never reach an agent, and the operator
    who wrote it learns so before anything runs (docs/configuration.md)."""
    message = refused(tmp_path, PROFILE + 'env = { HOME = "/h", RAWP_GATEWAY_TOKEN = "t" }\n')
    assert message == (
        "FILE:6: [agents.mine] env sets RAWP_GATEWAY_TOKEN: RAWP_GATEWAY_* variables are the "
        "gateway's own settings and never reach an agent; remove it"
    )
    message = refused(tmp_path, '[agents.claude-code.env]\nRAWP_GATEWAY_PORT = "1"\n')
    assert message.startswith("FILE:4: [agents.claude-code] env sets RAWP_GATEWAY_PORT")


def test_serve_with_a_typo_does_not_start_and_says_where_in_one_line(tmp_path):
    path = write(tmp_path, '[isolaton]\nmode = "none"\n')
    done = subprocess.run(
        [*CLI, "serve", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"rawp-gateway: {path}:3: unknown section [isolaton]; did you mean [isolation]?\n"
    )
