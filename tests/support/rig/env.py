"""Every environment fact the rig knows about the three agent CLIs, in one place.

Theory of operation
-------------------
``AGENTS`` pins each CLI (npm package, version, binary name) and names its scripted model server.
``scripts/install-agents.sh`` installs exactly these pins into ``<repo>/.agents/<agent>/``; a test
checks that the two lists agree.

``agent_env(agent, base_url=..., home=...)`` builds the whole environment a CLI is started with. It
does not inherit the caller's environment (apart from PATH and locale), so a developer's real API
keys, config dirs or proxies never reach a rig run, and the CLI talks only to the scripted server.
``make_home(agent, path)`` creates the throwaway HOME (and any config files the CLI needs there).

``require_cli(agent)`` is what a test calls first: it returns the binary, or skips the test when
the CLI is not installed - except in CI (``CI=true``), where the CLIs are always installed and a
missing one is a failure, never a skip.

Facts marked "verified" were checked by running the pinned CLI against the rig (see
tests/support/rig/README.md for the full list and how each was found).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
AGENTS_DIR = REPO / ".agents"
FIXTURE_ROOT = REPO / "tests" / "fixtures"


@dataclass(frozen=True)
class AgentSpec:
    name: str  # the rig's name: folder under .agents/, scenarios/ and fixtures/
    package: str  # npm package
    version: str  # pinned version
    bin_name: str  # the executable npm links into node_modules/.bin
    server: str  # "module:Class" of the scripted model server

    @property
    def binary(self) -> Path:
        return AGENTS_DIR / self.name / "node_modules" / ".bin" / self.bin_name


AGENTS: dict[str, AgentSpec] = {
    "claude-code": AgentSpec(
        "claude-code",
        "@anthropic-ai/claude-code",
        "2.1.328",
        "claude",
        "tests.support.rig.anthropic:AnthropicServer",
    ),
    "codex": AgentSpec(
        "codex", "@openai/codex", "0.171.0", "codex", "tests.support.rig.openai:ResponsesServer"
    ),
    "gemini": AgentSpec(
        "gemini", "@google/gemini-cli", "0.61.0", "gemini", "tests.support.rig.gemini:GeminiServer"
    ),
    # ACP adapters (Gemini speaks ACP itself: ``gemini --acp``). Each runs the CLI it wraps, so
    # it gets that CLI's environment and scripted server.
    "claude-acp": AgentSpec(
        "claude-acp",
        "@zed-industries/claude-agent-acp",
        "0.23.1",
        "claude-agent-acp",
        "tests.support.rig.anthropic:AnthropicServer",
    ),
    "codex-acp": AgentSpec(
        "codex-acp",
        "@zed-industries/codex-acp",
        "0.16.0",
        "codex-acp",
        "tests.support.rig.openai:ResponsesServer",
    ),
}
# The CLI an ACP adapter runs underneath: its HOME, environment and model server.
WRAPS: dict[str, str] = {"claude-acp": "claude-code", "codex-acp": "codex"}


def spec(agent: str) -> AgentSpec:
    try:
        return AGENTS[agent]
    except KeyError:
        raise KeyError(f"unknown agent {agent!r}; known: {sorted(AGENTS)}") from None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def cli_path(agent: str) -> Path:
    return spec(agent).binary


def cli_installed(agent: str) -> bool:
    return os.access(cli_path(agent), os.X_OK)


def require_cli(agent: str) -> Path:
    """The CLI's binary; pytest.skip when it is missing locally, pytest.fail when CI=true."""
    import pytest

    path = cli_path(agent)
    if not os.access(path, os.X_OK):
        msg = f"{agent} CLI not installed at {path}; run scripts/install-agents.sh"
        if in_ci():
            pytest.fail(msg + " (CI=true: the CLIs must be installed)")
        pytest.skip(msg)
    return path


@functools.cache
def cli_version(agent: str) -> str:
    """The version the installed binary reports (``--version``), e.g. "2.1.328"."""
    # A HOME of its own: the CLIs create their directories there even for --version, and /tmp is
    # shared by every test worker and every other user.
    with tempfile.TemporaryDirectory(prefix=f"rig-version-{agent}-") as home:
        out = subprocess.run(
            [str(cli_path(agent)), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            env=_base_env(Path(home)),
            check=False,
        ).stdout
    m = re.search(r"\d+\.\d+\.\d+\S*", out)
    return m.group(0) if m else out.strip()


def _base_env(home: Path) -> dict[str, str]:
    """What every CLI gets: a PATH that finds node and the shell tools, a UTF-8 locale, and a
    HOME of its own (the CLIs keep sessions, settings and caches under HOME)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "USER": os.environ.get("USER", "rig"),
        "SHELL": "/bin/bash",  # Claude Code's Bash tool runs commands with $SHELL
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
        "NO_COLOR": "1",
    }


def make_home(agent: str, home: Path) -> Path:
    """Create a throwaway HOME for one run (and what the CLI wants to find there)."""
    home.mkdir(parents=True, exist_ok=True)
    agent = WRAPS.get(agent, agent)
    if agent == "claude-code":
        # Not required (the CLI creates ~/.claude on its own), but an empty settings file makes
        # sure no user or managed setting changes what the rig observes.
        (home / ".claude").mkdir(exist_ok=True)
        (home / ".claude" / "settings.json").write_text("{}\n")
        (home / "tmp").mkdir(exist_ok=True)
    elif agent == "gemini":
        (home / ".gemini").mkdir(exist_ok=True)
        (home / ".gemini" / "settings.json").write_text(json.dumps(gemini_settings(), indent=2))
        # verified: failed runs write gemini-client-error-*.json into the temp dir; keep them here.
        (home / "tmp").mkdir(exist_ok=True)
    return home


def claude_code_env(base_url: str, home: Path) -> dict[str, str]:
    env = _base_env(home)
    env.update(
        {
            # verified: with these, the CLI calls only POST {base_url}/v1/messages?beta=true.
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "sk-ant-rig-not-a-real-key",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # verified: 401/500/529 are otherwise retried 10 times with growing back-off; 1 keeps
            # an error run to about two requests (one retry, so retry-then-success still works).
            "CLAUDE_CODE_MAX_RETRIES": "1",
            # verified: the CLI keeps its messaging socket (cc-socks/) and background tasks'
            # output files (claude-<uid>/) under TMPDIR; inside HOME they go away with the run.
            "TMPDIR": str(home / "tmp"),
        }
    )
    if os.geteuid() == 0:
        # verified: as root, --dangerously-skip-permissions / bypassPermissions exit 1 without it.
        env["IS_SANDBOX"] = "1"
    return env


# The tiny stdio MCP server (one tool, "echo") that both Codex and Gemini are configured with.
# It is off unless a scenario turns it on, so that only MCP scenarios start it.
MCP_ECHO = REPO / "tests" / "support" / "rig" / "mcp_echo.py"
CODEX_API_KEY_VAR = "RIG_OPENAI_API_KEY"


def codex_config(base_url: str) -> str:
    """``$CODEX_HOME/config.toml`` for a run against the scripted Responses server."""
    mcp_args = json.dumps([str(MCP_ECHO)])
    return f"""\
# Written by tests/support/rig/env.py for one rig run.
# A provider of the rig's own; its base_url (the server's port) can only be given here or with -c.
# verified: the built-in openai provider pointed here with OPENAI_BASE_URL instead hung for more
# than 90 s without printing anything.
model = "gpt-5.5"
model_provider = "rig"
# No update check: the rig has no network, and a check could only add noise or delay.
check_for_update_on_startup = false

[model_providers.rig]
name = "rig"
base_url = "{base_url.rstrip("/")}/v1"
# verified: "chat" is rejected by 0.171.0; only POST /v1/responses (streamed) is called.
wire_api = "responses"
env_key = "{CODEX_API_KEY_VAR}"
# verified: a custom provider streams over plain HTTP even without this; kept explicit because
# the scripted server speaks no WebSocket.
supports_websockets = false
# verified: with 0 an HTTP error or a broken stream is one request and a quick exit 1.
request_max_retries = 0
stream_max_retries = 0

[analytics]
# verified: the turn metadata the CLI sends then says analytics_enabled=false.
enabled = false

# verified: MCP tools are offered only through tool_search (namespace "mcp__echo"); the echo
# tool declares readOnlyHint, without which exec refuses it ("requires approval, but approval
# policy is never"). Scenarios turn it on with: -c mcp_servers.echo.enabled=true
[mcp_servers.echo]
command = {json.dumps(sys.executable)}
args = {mcp_args}
enabled = false
"""


def codex_env(base_url: str, home: Path) -> dict[str, str]:
    """Also writes ``$CODEX_HOME/config.toml``: the provider's base_url (the server's port) is
    known only now, and Codex reads it from nowhere else."""
    env = _base_env(home)
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url))
    # verified: CODEX_HOME holds config, sessions (for resume) and logs; the API key is read from
    # the provider's env_key and sent as "Authorization: Bearer ...".
    env.update({"CODEX_HOME": str(codex_home), CODEX_API_KEY_VAR: "sk-rig-not-a-real-key"})
    # verified: with a system bwrap older than 0.9 (Debian 12's 0.8.0: no --argv0) Codex's own
    # sandbox starts its helper by the name codex-linux-sandbox, through a PATH alias it makes
    # under CODEX_HOME and refuses to make under the temp dir ("Refusing to create helper
    # binaries under temporary dir"): every sandboxed command then fails ("bwrap: execvp
    # codex-linux-sandbox"). A temp dir of the run's own keeps CODEX_HOME out of it, as ~/.codex
    # is on a user's machine, so scenarios that run exec in its sandbox see what users see.
    tmp = home / "tmp"
    tmp.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp)
    return env


def gemini_settings() -> dict:
    """``~/.gemini/settings.json`` for rig runs (user scope; the workspace has none)."""
    return {
        # verified: without it headless mode exits 41 "Invalid auth method selected."
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "telemetry": {"enabled": False},
        "privacy": {"usageStatisticsEnabled": False},
        # verified: with 1 an HTTP error is one request and the run ends at once; the default is
        # 10 attempts (the CLI's settings schema), which took about 200 s when measured.
        "general": {
            "enableAutoUpdate": False,
            "enableAutoUpdateNotification": False,
            "maxAttempts": 1,
        },
        # verified: an MCP server's tools are offered in the default approval mode only when the
        # server is trusted (else tool_not_registered); their names are mcp_<server>_<tool>.
        # "allowed" names no real server, so echo stays off unless a scenario passes
        # --allowed-mcp-server-names echo (the flag replaces the setting).
        "mcpServers": {"echo": {"command": sys.executable, "args": [str(MCP_ECHO)], "trust": True}},
        "mcp": {"allowed": ["rig-none"]},
    }


def gemini_env(base_url: str, home: Path) -> dict[str, str]:
    env = _base_env(home)
    env.update(
        {
            # verified: with these the CLI calls only {base_url}/v1beta/models/<m>:<method>.
            # Scenarios also pass --skip-trust (verified: else exit 55 with nothing on stdout).
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_API_KEY": "rig-not-a-real-key",
            "TMPDIR": str(home / "tmp"),
        }
    )
    return env


_ENVS = {"claude-code": claude_code_env, "codex": codex_env, "gemini": gemini_env}


def agent_env(
    agent: str, *, base_url: str, home: Path, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The complete environment to start ``agent`` with against the scripted server at base_url."""
    env = _ENVS[WRAPS.get(spec(agent).name, agent)](base_url, home)
    env.update(extra or {})
    return env


def installed_version(agent: str) -> str | None:
    """The version npm installed (from the package manifest; no process started)."""
    s = spec(agent)
    manifest = AGENTS_DIR / s.name / "node_modules" / s.package / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None
