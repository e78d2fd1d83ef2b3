"""The agent stands outside the gateway's trust boundary: no ``RAWP_GATEWAY_*`` variable reaches it
(the token above all), while the rest of the gateway's environment, the profile's ``env`` and the
``RAWP_*`` variables of DPS §17.2.1 do. Seen by real agent processes started by the real gateway,
in-process and as a ``rawp-gateway serve`` process: a single-turn ``plain`` agent and an ACP agent
asked for its conversations write their environment to a file, the long-lived demo agent's is read
from /proc."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.agent.environment import RAWP_DPS_VERSION, agent_environment
from gateway.agent.profiles import AgentProfile, parser_features
from tests.support.gateway_peer import (
    SUBPROTOCOL,
    Master,
    create_session,
    fast_demo,
    make_config,
    prompt_and_wait,
    start_gateway,
)
from tests.support.procs import session_processes
from tests.support.serve_process import serve
from tests.support.waiting import eventually

# What the gateway's own environment holds: its settings, and what an agent needs.
GATEWAY_SETTINGS = {
    "RAWP_GATEWAY_TOKEN": "admin-token-never-for-agents",
    "RAWP_GATEWAY_TOKEN_FILE": "/run/secrets/rawp-token",
    "RAWP_GATEWAY_MAX_SESSIONS": "7",
    "RAWP_GATEWAY_CLAUDE": "claude",
}
PASSED = {"ANTHROPIC_API_KEY": "sk-ant-passes-through", "SHARED_VAR": "the gateway's"}
PROFILE_ENV = {"PROFILE_VAR": "from-the-profile", "SHARED_VAR": "the profile's"}
# An agent that writes its whole environment to the file its first argument names.
DUMP = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w')); print('ok')"


@pytest.fixture
def gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**GATEWAY_SETTINGS, **PASSED}.items():
        monkeypatch.setenv(name, value)


def dumping(tmp_path: Path, **changes: Any) -> tuple[AgentProfile, Path]:
    out = tmp_path / "agent-env.json"
    profile = AgentProfile(
        name="envdump",
        parser="plain",
        command=(sys.executable, "-c", DUMP, str(out), "{prompt}"),
        single_turn_process=True,
        env=PROFILE_ENV,
        features=parser_features("plain"),
    )
    return replace(profile, **changes), out


def check(env: dict[str, str], session_id: str, workspace: Path) -> None:
    assert sorted(k for k in env if k.startswith("RAWP_GATEWAY_")) == []
    assert "admin-token-never-for-agents" not in json.dumps(env)
    wanted = {**PASSED, **PROFILE_ENV}  # the profile's env over the gateway's
    assert {k: env.get(k) for k in wanted} == wanted
    assert env["PATH"] == os.environ["PATH"]
    assert env["RAWP_SESSION_ID"].startswith(session_id)
    assert env["RAWP_WORKSPACE_PATH"] == str(workspace)
    assert env["RAWP_DPS_VERSION"] == RAWP_DPS_VERSION


def test_the_one_function_drops_the_gateways_settings_and_layers_the_rest() -> None:
    gateway = {**GATEWAY_SETTINGS, **PASSED, "PATH": "/usr/bin", "RAWP_DPS_VERSION": "old"}
    env = agent_environment(
        {**PROFILE_ENV, "RAWP_GATEWAY_TOKEN": "made-in-code", "RAWP_SESSION_ID": "mine"},
        session_id="s-1",
        workspace="/w",
        gateway_env=gateway,
    )
    assert env == {
        "PATH": "/usr/bin",
        **PASSED,
        **PROFILE_ENV,
        "RAWP_SESSION_ID": "s-1",
        "RAWP_WORKSPACE_PATH": "/w",
        "RAWP_DPS_VERSION": RAWP_DPS_VERSION,
    }
    # Without a session: what the agent would see, for finding its executable or its store.
    assert agent_environment({}, gateway_env=gateway) == {**PASSED, "PATH": "/usr/bin"} | {
        "RAWP_DPS_VERSION": "old"
    }


async def test_a_single_turn_agent_gets_no_gateway_setting(tmp_path, gateway_env) -> None:
    profile, out = dumping(tmp_path)
    gw = await start_gateway(make_config(tmp_path, agents={"envdump": profile}))
    try:
        sid = (await create_session(gw, "envdump"))["session_id"]
        master = await Master.attach(gw, sid)
        await prompt_and_wait(master, "show me")
        check(json.loads(out.read_text()), sid, tmp_path.resolve())
    finally:
        await gw.close()


async def test_the_long_lived_demo_agent_gets_no_gateway_setting(tmp_path, gateway_env) -> None:
    demo = fast_demo()
    demo = replace(demo, env={**demo.env, **PROFILE_ENV})
    gw = await start_gateway(make_config(tmp_path, agents={"demo": demo}))
    try:
        sid = (await create_session(gw, "demo"))["session_id"]
        (pid,) = await eventually(
            lambda: session_processes(sid, "gateway.demo_agent"), "the demo agent"
        )
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(v.split("=", 1) for v in f.read().decode().split("\0") if "=" in v)
        check(env, sid, tmp_path.resolve())
        assert env["RAWP_DEMO_DELAY_MS"] == "1"
    finally:
        await gw.close()


async def test_an_acp_agent_asked_for_its_conversations_gets_no_gateway_setting(
    tmp_path, gateway_env
) -> None:
    # It writes its environment and ends without an answer: the listing fails, the file stays.
    profile, out = dumping(
        tmp_path,
        name="envdump-acp",
        parser="acp",
        command=(sys.executable, "-c", DUMP, str(tmp_path / "agent-env.json")),
        single_turn_process=False,
        features=parser_features("acp"),
    )
    gw = await start_gateway(make_config(tmp_path, agents={"envdump-acp": profile}))
    try:
        resp = await gw.get("/v1/agents/envdump-acp/conversations")
        assert resp.status >= 400, await resp.text()
        check(json.loads(out.read_text()), "conversations-", tmp_path.resolve())
    finally:
        await gw.close()


async def test_serve_with_the_token_in_its_environment_keeps_it_from_the_agent(tmp_path) -> None:
    """``rawp-gateway serve`` as a process, its token (and other settings) in its environment, a
    profile from its config file."""
    out = tmp_path / "agent-env.json"
    config = tmp_path / "gateway.toml"
    command = [sys.executable, "-c", DUMP, str(out), "{prompt}"]
    config.write_text(
        '[agents.envdump]\nparser = "plain"\nsingle_turn_process = true\n'
        f"command = {json.dumps(command)}\n"
        f"env = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in PROFILE_ENV.items())} }}\n"
    )
    env = dict(os.environ, **GATEWAY_SETTINGS, **PASSED, RAWP_GATEWAY_WORKSPACE_ROOT=str(tmp_path))
    auth = {"Authorization": f"Bearer {GATEWAY_SETTINGS['RAWP_GATEWAY_TOKEN']}"}
    async with (
        serve("--config", str(config), env=env) as (_, url),
        aiohttp.ClientSession(headers=auth) as http,
    ):
        async with http.post(url + "/v1/session", json={"agent": "envdump"}) as resp:
            assert resp.status == 201, await resp.text()
            session = await resp.json()
        ws = await http.ws_connect(url + session["ws_path"], protocols=(SUBPROTOCOL,))
        master = Master(ws, session["session_id"])
        await prompt_and_wait(master, "show me")
        await ws.close()
    check(json.loads(out.read_text()), session["session_id"], tmp_path.resolve())
