"""The agent as a would-be master of its own gateway (tests/server/test_a_credential_always.py):
the hostile ACP agent tests/support/hostile/masters_itself.py as a profile, and the person's side of
one round: the person creates a session of it beside another one, prompts it, and reads what
each of its attempts on 127.0.0.1 got while its permission question waited."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.gateway_peer import SUBPROTOCOL, Master
from tests.support.paths import REPO
from tests.support.waiting import eventually

SCRIPT = REPO / "tests" / "support" / "hostile" / "masters_itself.py"
# Every attempt the agent makes with no credential (the token file and variable aside).
ATTEMPTS = (
    "list",
    "read own",
    "read other",
    "whoami",
    "create",
    "ticket",
    "attach and answer",
    "attach with a guessed ticket",
    "acp",
    "delete other",
)


def profile_toml(python: str = "/usr/bin/python3") -> str:
    """The ``[agents.hostile]`` table: the script under ``python`` (the system's: it runs in the
    sandbox too), through the ACP parser (whose agents ask permission)."""
    return f'[agents.hostile]\nparser = "acp"\ncommand = ["{python}", "{SCRIPT}"]\n'


async def play(
    http: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    workspace: Path,
    token_file: Path,
    **body: Any,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """As the person (``headers``: their credential): a demo session ("the other"), a session of
    the hostile agent (``body``: more of its create request; ``workspace``: where it runs), a
    prompt naming the gateway, the other session and ``token_file``. Once its report is there,
    the question must still be pending: the person denies it, and the agent says what it got.
    What each attempt got, and the sessions the person sees afterwards."""
    sessions = []
    for agent, extra in (("demo", {}), ("hostile", body)):
        async with http.post(
            url + "/v1/session", json={"agent": agent, **extra}, headers=headers
        ) as resp:
            assert resp.status == 201, await resp.text()
            sessions.append(await resp.json())
    other, own = sessions
    ws = await http.ws_connect(url + own["ws_path"], protocols=(SUBPROTOCOL,), headers=headers)
    master = Master(ws, own["session_id"])
    caps = {
        "protocol_version": "rawp-dps-1.0",
        "supported_namespaces": ["agent", "tool", "control", "session"],
        "features": {},
    }
    await master.send("session.capabilities", caps)
    target = {"url": url, "other": other["session_id"], "token_file": str(token_file)}
    await master.send("control.prompt.request", {"prompt_text": json.dumps(target)})
    ask = await master.until("agent.interaction.request", timeout=60)
    report = workspace / "attack.json"
    await eventually(report.exists, "the hostile agent's report", timeout=60)
    attack = json.loads(report.read_text())
    # Nobody but the person answered: the question is still theirs.
    assert "control.interaction.response" not in master.types()
    assert not [f for f in master.frames if f["type"] == "agent.state.changed"
                and f["payload"].get("reason") == "permission_answered"]  # fmt: skip
    interaction = ask["payload"]["interaction_id"]
    await master.send(
        "control.interaction.response", {"interaction_id": interaction, "selected_value": "deny"}
    )
    text = await master.until("agent.text.delta", timeout=60)
    assert text["payload"]["text"].startswith("answered: "), text
    assert "reject" in text["payload"]["text"], text  # the person's answer reached the agent
    await ws.close()
    async with http.get(url + "/v1/sessions", headers=headers) as resp:
        listed = (await resp.json())["sessions"]
    return attack, listed


def refused_every_time(attack: dict[str, Any]) -> None:
    """Each attempt without a credential was 401, nothing else."""
    assert {name: attack[name] for name in ATTEMPTS} == dict.fromkeys(ATTEMPTS, 401), attack
    assert attack["token variable"] is False
