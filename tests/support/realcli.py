"""The real-CLI gateway: the rig's scripted model server and a real gateway (``create_app``) whose
profile spawns the pinned CLI against it, for the end-to-end tests of every agent.

The profile is the built-in one with only the binary, the rig's environment and (Gemini) a fixed
model changed, so the argv templates, the resume mechanism and stdin handling are the ones users
get. The scenario holds only the model's answers and the workspace files: the gateway, not the
rig's runner, starts the CLI and writes its stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.agent.sandbox import Isolation
from gateway.config import builtin_profiles
from gateway.server import SESSIONS
from gateway.session import LiveSession
from tests.support import toolchain
from tests.support.gateway_peer import Master, create_session, make_config, start_gateway
from tests.support.paths import REPO
from tests.support.rig.env import AGENTS_DIR, require_cli
from tests.support.rig.run import CliSetup, scripted_cli
from tests.support.rig.scenario import Scenario, parse_scenario

GEMINI_MODEL = "gemini-2.5-flash"  # without -m the CLI first makes a routing call ("auto")
TEST_LIMIT_SEC = 120.0  # one test's body, and separately the gateway's shutdown after it
MODEL_PATHS = ("/v1/messages", "/v1/responses")  # Anthropic, OpenAI; Gemini by its method name
# The one setting that runs every real-CLI test in the agent sandbox: RAWP_TEST_ISOLATION=sandbox
# (docs/isolation.md; needs bwrap). Unset or "none": as the gateway runs by default.
ISOLATION_VAR = "RAWP_TEST_ISOLATION"
# Each agent's end-to-end turn with a tool runs in both: as the suite runs (RAWP_TEST_ISOLATION's
# mode) and in the sandbox.
# And in a team's system (``[isolation] system_root``: Debian trixie made by scripts/build-toolchain,
# whose glibc is not this machine's): the CLIs shown read-only from .agents/, and this machine's
# node for the Node.js ones, which the team's system does not have (docs/isolation.md).
TEAM = "team-system"
MODES = (
    pytest.param(None, id="default"),
    pytest.param("sandbox", id="sandbox", marks=pytest.mark.sandbox),
    pytest.param(TEAM, id=TEAM, marks=(pytest.mark.sandbox, pytest.mark.toolchain)),
)


def isolation(mode: str | None = None) -> Isolation:
    """``[isolation]`` for a real-CLI gateway: ``mode`` (default: ``RAWP_TEST_ISOLATION``'s). In
    the sandbox the agents see, besides the system, the CLIs (``.agents/``), this repository (the
    rig's MCP server, which the CLIs start with this venv's Python) and the Python it runs on,
    read-only; in ``TEAM`` the system is a team's, with this machine's ``node`` shown in it. The demo and plain agents need none of it (tests/e2e/test_e2e_demo_plain.py)."""
    mode = mode or os.environ.get(ISOLATION_VAR) or "none"
    if mode == "none":
        return Isolation()
    shown = {str(REPO), os.path.realpath(AGENTS_DIR), sys.base_prefix}
    if mode == TEAM:
        node = shutil.which("node")
        if node is not None:
            shown.add(node)
        return Isolation(mode="sandbox", bind_ro=tuple(sorted(shown)), system_root=team_root())
    return Isolation(mode="sandbox", bind_ro=tuple(sorted(shown)))


@functools.cache
def team_root() -> str:
    """The team's system scripts/build-toolchain made (built first if it is not there)."""
    return str(toolchain.built(dir_only=True).root)


def agent_of(profile: str) -> str:
    """The CLI a built-in profile runs (``claude-code-oneshot`` runs ``claude-code``)."""
    return "claude-code" if profile.startswith("claude") else profile


def scenario(agent: str, calls: list[dict[str, Any]], **run: Any) -> Scenario:
    """A scenario written in the test: the model's answers (``calls``) and the run table
    (``files``, ...)."""
    return parse_scenario({"run": run, "calls": calls}, name=f"e2e-{agent}", agent=agent)


@dataclass
class Rig:
    """A scripted model server and a gateway whose ``profile`` spawns the real CLI against it."""

    cli: CliSetup
    gw: TestClient
    profile: str
    headers: dict[str, str] | None = None  # the bearer token, when the gateway has one

    @property
    def requests(self) -> list[Any]:
        """The model requests the scripted server received, in order."""
        return [
            r
            for r in self.cli.server.requests
            if r.path.startswith(MODEL_PATHS) or ":streamGenerateContent" in r.path
        ]

    def session(self, session_id: str) -> LiveSession:
        return self.gw.server.app[SESSIONS][session_id]

    def home(self, session_id: str) -> Path:
        """The HOME the session's agent runs with: the rig's, or in the sandbox the session's
        own (docs/isolation.md)."""
        box = self.session(session_id).sandbox()
        return self.cli.home if box is None else Path(box.home)

    async def create(self, **body: Any) -> dict[str, Any]:
        if self.headers:
            resp = await self.gw.post(
                "/v1/session", json={"agent": self.profile, **body}, headers=self.headers
            )
            assert resp.status == 201, await resp.text()
            return await resp.json()
        return await create_session(self.gw, self.profile, **body)

    async def attach(self, session_id: str, **kw: Any) -> Master:
        return await Master.attach(self.gw, session_id, headers=self.headers, **kw)

    async def master(self) -> tuple[str, Master]:
        """A new session and a master attached to it, past its session.capabilities."""
        session_id = (await self.create())["session_id"]
        master = await self.attach(session_id)
        caps = await master.next()
        assert caps["type"] == "session.capabilities"
        return session_id, master

    async def info(self, session_id: str) -> dict[str, Any]:
        return await (await self.gw.get(f"/v1/session/{session_id}", headers=self.headers)).json()

    async def upload(self, session_id: str, name: str, body: bytes, mime: str) -> Any:
        resp = await self.gw.put(
            f"/v1/session/{session_id}/files",
            params={"name": name},
            data=body,
            headers={"Content-Type": mime, **(self.headers or {})},
        )
        return resp.status, await resp.json()


@contextlib.asynccontextmanager
async def gateway(
    scenario: Scenario | Path,
    profile: str,
    *,
    extra_args: tuple[str, ...] = (),
    token: str | None = None,
    server: dict[str, Any] | None = None,
    isolation_mode: str | None = None,
    **changes: Any,
) -> AsyncIterator[Rig]:
    """The scripted model server for ``scenario`` and a gateway whose built-in ``profile`` runs
    the real CLI: its argv plus ``extra_args``, the rig's env, the rig's workspace as workspace
    root. ``changes`` replace profile fields; ``server``: ``Config`` fields; ``token``: the
    gateway's bearer token (the rig sends it); ``isolation_mode``: "none" or "sandbox" (default:
    ``RAWP_TEST_ISOLATION``, see ``isolation``). A hang anywhere (CLI, gateway, a wait in the test)
    fails after TEST_LIMIT_SEC instead of stalling the suite."""
    agent = agent_of(profile)
    binary = str(require_cli(agent))
    async with scripted_cli(scenario, agent=agent) as cli:
        base = builtin_profiles(claude=binary, codex=binary, gemini=binary)[profile]
        command = (*base.command, *extra_args)
        if agent == "gemini":
            command = (binary, "-m", GEMINI_MODEL, *command[1:])
        prof = replace(base, env=cli.env, command=command, **changes)
        config = make_config(
            cli.cwd,
            agents={profile: prof},
            token=token,
            isolation=isolation(isolation_mode),
            **(server or {}),
        )
        client = await start_gateway(config)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            async with asyncio.timeout(TEST_LIMIT_SEC):
                yield Rig(cli, client, profile, headers)
        finally:
            async with asyncio.timeout(TEST_LIMIT_SEC):
                await client.close()  # deletes live sessions: the CLI is stopped
