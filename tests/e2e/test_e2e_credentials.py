"""The real CLIs with no credentials, through the real gateway: what each one says, and the hint
the gateway adds (``details.hint``) naming the variable or file the agent reads them from.

Each CLI runs through its built-in profile against the rig's scripted model server, with the rig's
environment less the key (set empty in the profile's env, so no key the test process may hold
reaches it). What each CLI does then is its own: Claude Code answers "Not logged in · Please run
/login", Codex says which variable is missing, Gemini exits 41.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.agent.profiles import builtin_profiles
from tests.support.gateway_peer import Master, create_session, make_config, start_gateway
from tests.support.rig.env import CODEX_API_KEY_VAR, require_cli
from tests.support.rig.run import scripted_cli
from tests.support.rig.scenario import parse_scenario

pytestmark = pytest.mark.realcli

KEYS = {
    "claude-code": "ANTHROPIC_API_KEY",
    "codex": CODEX_API_KEY_VAR,  # the rig's provider reads its key from this variable
    "gemini": "GEMINI_API_KEY",
}
# What the hint names for each agent, and the agent's own words for the error.
NAMED = {
    "claude-code": ("ANTHROPIC_API_KEY", "~/.claude"),
    "codex": ("OPENAI_API_KEY", "~/.codex"),
    "gemini": ("GEMINI_API_KEY", "~/.gemini/settings.json"),
}
SAID = {
    "claude-code": "Not logged in",
    "codex": f"Missing environment variable: `{CODEX_API_KEY_VAR}`",
    "gemini": "authentication failed",
}


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini"])
async def test_an_agent_without_credentials_is_told_where_they_go(agent):
    binary = require_cli(agent)
    scenario = parse_scenario({"run": {}, "calls": []}, name=f"no-key-{agent}", agent=agent)
    async with scripted_cli(scenario) as cli:
        base = builtin_profiles(claude=str(binary), codex=str(binary), gemini=str(binary))[agent]
        profile = replace(base, env={**cli.env, KEYS[agent]: ""})
        client = await start_gateway(make_config(cli.cwd, agents={agent: profile}))
        try:
            session = await create_session(client, agent)
            master = await Master.attach(client, session["session_id"])
            await master.send("control.prompt.request", {"prompt_text": "hi"})
            await master.until("session.turn.end", timeout=60)
            errors = [f["payload"] for f in master.frames if f["type"] == "agent.error"]
            hinted = [e for e in errors if (e.get("details") or {}).get("hint")]
            assert hinted, errors
            error = hinted[0]
            assert SAID[agent] in error["message"], error
            for where in NAMED[agent]:
                assert where in error["details"]["hint"], error
        finally:
            await client.close()
