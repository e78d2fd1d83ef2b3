"""The reference in docs/ covers what the code does: every endpoint and error code of the server, every
configuration key, variable and flag, every session.error code, a mapping page per parser, and the
README's profile table uses the placeholders the profiles really have."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gateway import cli, config
from gateway.agent import profiles
from gateway.config import settings, strict
from gateway.protocol import codec, frames
from gateway.server import create_app
from parsers.base import _BUILTIN
from tests.support.paths import REPO

DOCS = REPO / "docs"


def doc(name: str) -> str:
    return (DOCS / name).read_text()


def package_source(*parts: str) -> str:
    """The text of every module of a gateway package, wherever in it a rule's code now lives."""
    folder = REPO.joinpath("gateway", *parts)
    return "\n".join(p.read_text() for p in sorted(folder.rglob("*.py")))


def code_cell(text: str, value: str) -> bool:
    """``value`` appears as inline code, alone or as the start of a table cell's code."""
    return f"`{value}`" in text or f"`{value} " in text or f"`{value}=" in text


# --------------------------------------------------------------------------- http-api.md


def test_every_route_of_the_server_is_documented(tmp_path):
    app = create_app(config.Config(server=config.ServerSettings(workspace_root=tmp_path)))
    text = doc("http-api.md")
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    assert routes
    for method, path in routes:
        documented = path.replace("{session_id}", "{id}")
        assert f"`{method} {documented}" in text or f"`{method} {path}" in text, (method, path)


def test_every_error_code_of_the_server_is_documented():
    source = package_source("server")
    app_keys = set(re.findall(r'web\.AppKey\("(\w+)"', source))
    literals = set(re.findall(r'"([A-Z][A-Z0-9_]*[A-Z0-9])"', source))
    # Not error codes: the application's keys, the session state and the HTTP methods compared in
    # the handlers.
    methods = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
    codes = literals - {k.upper() for k in app_keys} - {"TERMINATED"} - methods
    assert {"AGENT_NOT_FOUND", "UNAUTHORIZED", "SUBPROTOCOL_REQUIRED"} <= codes
    text = doc("http-api.md")
    assert sorted(c for c in codes if f"`{c}`" not in text) == []


def test_the_handshake_and_reattach_are_documented():
    text = doc("http-api.md")
    for needle in (
        "rawp-dps-1.0",
        "?last_message_id=",
        "X-RAWP-Last-Message-Id",
        "role=local-ui",
        "lost_frame_count",
        "Authorization: Bearer",
        "1013",
        "1009",
    ):
        assert needle in text, needle


# --------------------------------------------------------------------------- configuration.md


# A sub-table documented as one key of its section, its names checked one by one below
# (test_every_feature_and_builtin_profile_is_documented).
TABLES_AS_KEYS = {("agents.NAME", "features")}


def known_keys(schema: Mapping[str, Any], label: str = "") -> Iterator[tuple[str, str]]:
    """Every (section, key) the file may have, from the names the strict reading knows, the
    section as docs/configuration.md writes it inside its brackets (``server``,
    ``agents.NAME``, ``[policy.rules]`` for ``[[policy.rules]]``)."""
    for name, sub in schema.items():
        inner = "NAME" if name == strict.ANY_NAME else name
        section = f"{label}.{inner}" if label else inner
        if isinstance(sub, list):
            yield from known_keys(sub[0], f"[{section}]")
        elif isinstance(sub, Mapping) and (label, name) not in TABLES_AS_KEYS:
            yield from known_keys(sub, section)
        else:
            yield label, name


def documented_keys(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """Each key a table of docs/configuration.md lists, with its row's cells by column name: the
    section is the heading's, or written before the key (`[auth] users_file`)."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    sections: list[str] = []
    columns: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            sections, columns = re.findall(r"`\[(\[?[^`\]]+\]?)\]`", line), []
        elif line.startswith("| key |"):
            columns = [c.strip() for c in line.strip()[1:-1].split("|")]
        elif columns and line.startswith("| `"):
            cells = dict(
                zip(columns, (c.strip() for c in line.strip()[1:-1].split("|")), strict=True)
            )
            section = sections[0] if len(sections) == 1 else ""
            for name in re.findall(r"`([^`]+)`", cells["key"]):
                written = re.fullmatch(r"\[(\[?[^\]]+\]?)\] (\w+)", name)
                if written:
                    section, name = written.groups()
                assert section, f"{name}: no section ({line})"
                found[section, name] = cells
        elif not line.startswith("|"):
            columns = []
    return found


def test_every_key_of_every_section_is_documented_with_its_default():
    """Every section's keys are declared with a Setting (gateway/config/settings.py), and the names
    the strict reading knows are exactly those; the docs list every declared key and no other,
    each row with its default and its variable, and, in a table with a type column, its bounds
    and choices."""
    text = doc("configuration.md")
    rows = documented_keys(text)
    known = set(known_keys(config.SCHEMA))
    declared = {
        (section, name)
        for section, cls in config.SECTIONS.items()
        for name in settings.declared(cls)
    }
    assert {s for s, _ in declared} == set(config.SECTIONS)  # no section without a key
    assert {"server", "isolation", "agents.NAME", "[policy.rules]", "[notify.webhooks]"} <= {
        s for s, _ in known
    }
    assert sorted(known - declared) == []  # a name the file may use that declares nothing
    assert sorted(declared - known) == []  # a declared key the file may not use
    assert sorted(declared - set(rows)) == []  # a key the docs do not list
    assert sorted(set(rows) - declared) == []  # a key the docs list that does not exist
    wrong = []
    for section, name in sorted(declared):
        key = settings.declared(config.SECTIONS[section])[name]
        cells = rows[section, name]
        if settings.shown_default(key) not in cells["default"]:
            wrong.append((section, name, settings.shown_default(key), cells["default"]))
        said = set(re.findall(r"RAWP_GATEWAY_\w+", cells.get("variable", "")))
        if said != ({key.setting.env} if key.setting.env else set()):
            wrong.append((section, name, key.setting.env, said))
        if "type" in cells:  # a table with a type column says each key's bounds and choices
            rule = key.setting
            bounds = [
                settings.shown_value(b) for b in (rule.low, rule.above, rule.high) if b is not None
            ]
            choices = [f'"{c}"' for c in rule.choices or ()]
            told = [b.strip("`") for b in bounds] + choices
            if any(t not in cells["type"] for t in told):
                wrong.append((section, name, told, cells["type"]))
    assert wrong == []


def test_every_other_variable_is_documented():
    text = doc("configuration.md")
    for var in (config.TOKEN_VARIABLE, config.CLAUDE_VARIABLE):
        assert f"| `{var}` |" in text, var


def profile_toml_keys(tmp_path: Path) -> list[str]:
    """The AgentProfile fields an [agents.NAME] table may set: those the loader does not refuse
    as unknown keys (a wrong value is an error too, which says the key is known)."""
    path = tmp_path / "probe.toml"
    keys = []
    for name in profiles.AgentProfile.__dataclass_fields__:
        path.write_text(f'[agents.probe]\nparser = "plain"\ncommand = ["x"]\n{name} = "probe"\n')
        try:
            config.load_config(path, {"workspace_root": str(tmp_path)}, environ={})
        except config.ConfigError as err:
            if f"unknown key [agents.probe] {name}" in str(err):
                continue
        keys.append(name)
    return keys


def test_every_agent_profile_key_is_documented(tmp_path):
    keys = profile_toml_keys(tmp_path)
    assert {"parser", "command", "env", "features", "auto_allow"} <= set(keys)
    text = doc("configuration.md")
    assert [k for k in keys if f"| `{k}` |" not in text] == []


def test_every_feature_and_builtin_profile_is_documented():
    text = doc("configuration.md")
    features = [f for f in frames.Features.__struct_fields__ if f != "adapter_type"]
    assert [f for f in features if f"`{f}`" not in text] == []
    assert [p for p in profiles.builtin_profiles() if f"| `{p}` |" not in text] == []


def test_every_flag_of_every_command_is_documented():
    text = doc("configuration.md")
    sub = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, parser in sub.choices.items():
        assert f"rawp-gateway {name}" in text, name
        for action in parser._actions:
            missing += [(name, o) for o in action.option_strings if o.startswith("--")]
    assert [(c, o) for c, o in missing if o != "--help" and o not in text] == []


# --------------------------------------------------------------------------- protocol notes


def test_every_session_error_code_is_documented():
    source = package_source("protocol")
    codes = set(re.findall(r'_error\(\s*"([A-Z_]+)"', source))
    # The shell answers some refusals itself (the agent's stdin is full).
    shell = package_source("session")
    codes |= set(re.findall(r'SessionError\(\s*error_code="([A-Z_]+)"', shell))
    codes |= {codec.INVALID_FRAME, codec.UNSUPPORTED_VERSION, "AGENT_EXIT", "SIGNAL_EXIT"}
    codes.add("AGENT_START_FAILED")
    assert len(codes) > 8
    text = doc("protocol-notes.md")
    assert sorted(c for c in codes if f"`{c}`" not in text) == []


@pytest.mark.parametrize("parser", sorted(_BUILTIN))
def test_every_parser_has_a_mapping_page(parser):
    page = DOCS / f"{parser}-mapping.md"
    assert page.is_file(), page
    assert f"({parser}-mapping.md)" in doc("README.md")


# --------------------------------------------------------------------------- one truth


def placeholders(text: str) -> set[str]:
    return set(re.findall(r"\{([a-z_]+)\}", text))


@pytest.mark.parametrize("page", ["README.md", "docs/configuration.md"])
def test_profile_tables_use_the_placeholders_the_profiles_have(page):
    """What the README says a profile runs and what GET /v1/agents shows agree: a placeholder in
    a profile's row is one its templates really have (Codex resumes with {session_id})."""
    text = (REPO / page).read_text()
    for name, profile in profiles.builtin_profiles().items():
        public = profile.public()
        real = placeholders(" ".join(profile.command))
        real |= placeholders(public["resume_flag"] or "")
        real |= placeholders(" ".join(public["resume_command"] or []))
        real |= placeholders(profile.mode_flag or "") | placeholders(profile.image_flag or "")
        rows = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
        assert len(rows) == 1, (page, name)
        assert placeholders(rows[0]) <= real, (page, name, placeholders(rows[0]) - real)
        if profile.resume_command:
            assert placeholders(" ".join(profile.resume_command)) <= placeholders(rows[0])


# --------------------------------------------------------------------------- the README's commands


def readme_code_lines() -> list[str]:
    """The lines of the README's shell code blocks (```sh or a bare ```)."""
    lines, fence = [], None
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence in ("sh", "bash", ""):
            lines.append(line)
    return lines


def test_readme_rawp_gateway_commands_are_real():
    """Every `rawp-gateway ...` command line in the README's shell blocks parses with the real
    command-line parser (usage lines with [optional] parts aside) and names a built-in profile."""
    commands = []
    for line in readme_code_lines():
        for part in re.split(r"&&|(?<!&)&(?!&)|;", line.split("  #")[0]):
            words = part.split()
            if "[" in part or not any(w.endswith("rawp-gateway") for w in words):
                continue
            argv = words[[w.endswith("rawp-gateway") for w in words].index(True) + 1 :]
            commands.append(argv)
            try:
                args = cli._parser().parse_args(argv)
            except SystemExit:
                pytest.fail(f"README: rawp-gateway {' '.join(argv)} does not parse")
            agent = getattr(args, "agent", None)
            assert agent is None or agent in profiles.builtin_profiles(), argv
    used = {argv[0] for argv in commands}
    assert {"serve", "chat", "translate"} <= used


def test_readme_installs_the_pinned_cli_versions():
    from tests.support.rig.env import AGENTS

    installs = set(re.findall(r"npm install -g (\S+)", "\n".join(readme_code_lines())))
    assert installs == {f"{a.package}@{a.version}" for a in AGENTS.values()}


# --------------------------------------------------------------------------- README lists


def _profile_rows(text: str) -> dict[str, str]:
    """The rows of a built-in profile table: profile name → the whole row."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `([a-z-]+)` \|", line)
        if m and m.group(1) in profiles.builtin_profiles():
            rows[m.group(1)] = line
    return rows


@pytest.mark.parametrize("page", ["README.md", "docs/configuration.md"])
def test_tools_allowed_without_asking_are_the_profiles(page):
    """Each built-in profile row names exactly the tools its profile allows without asking
    (``auto_allow``), and a row names none when the profile allows none."""
    rows = _profile_rows((REPO / page).read_text())
    assert set(rows) == set(profiles.builtin_profiles()), sorted(rows)
    for name, profile in profiles.builtin_profiles().items():
        said = re.search(r";\s*((?:`\w+`,?\s*)+) allowed without asking", rows[name])
        named = set(re.findall(r"`(\w+)`", said.group(1))) if said else set()
        assert named == set(profile.auto_allow), (page, name, sorted(named))


def test_readme_demo_commands_are_the_demo_agents():
    """What the README tells a newcomer to type in the demo is what the demo answers: each
    slash command it names is the chat's own or one the demo agent publishes."""
    from gateway.agent.demo import SLASH_COMMANDS
    from gateway.chat.app import _CLIENT_COMMANDS

    text = (REPO / "README.md").read_text()
    try_it = text.split("## Try it", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`/(\w+)", try_it))
    assert named, try_it
    assert named <= set(_CLIENT_COMMANDS) | {"attach"} | set(SLASH_COMMANDS), sorted(named)
