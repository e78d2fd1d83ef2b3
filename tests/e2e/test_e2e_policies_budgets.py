"""Permission rules and budgets end to end with real agents: the real Claude Code CLI and Claude
Code under claude-agent-acp (an ACP agent), each against the rig's scripted Messages API, in the
real gateway (docs/policies.md, docs/budgets.md).

Rules: a ``mkdir`` by Bash is allowed, an ``rm`` denied with a message, a ``touch`` asked. The
allowed command runs with no master attached; the denied one never runs and reaches the model as
a refused tool call, carrying the rule's message where the agent takes one (Claude Code's
permission prompt does; ACP's answer is an option only); the asked one waits for a master. A
Write through a symlink in the workspace that leads out of it is judged where it leads: denied at
once by the starter rules about writes, never allowed. Budgets: the scripted answers' tokens make
Claude Code report a cost that crosses a tiny session budget; the next prompt is refused with
``BUDGET_EXCEEDED``, still after the gateway restarts on its state dir, and goes on once an admin
raises the budget.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.agent.profiles import builtin_profiles
from gateway.protocol.budget import Limits
from gateway.protocol.policy import Glob, Rule
from gateway.server import SESSIONS
from tests.support.auth import bearer, users_config
from tests.support.gateway_peer import Master, of, start_gateway
from tests.support.rig.env import require_cli
from tests.support.rig.run import CliSetup, scripted_cli
from tests.support.rig.scenario import parse_scenario
from tests.support.waiting import eventually

pytestmark = pytest.mark.realcli

ADMIN, OPERATOR = "e2e-admin-token", "e2e-operator-token"
USERS = {"ann": ("admin", ADMIN), "olga": ("operator", OPERATOR)}
STARTUP = 120.0  # a CLI's first answer on a busy machine
DENIED = "rm is not allowed here: keep the files"
SHELL = ["Bash", "execute"]  # Claude Code's tool; an ACP agent's kind for a command
RULES = (
    Rule("mkdir-allowed", "allow", tuple(map(Glob, SHELL)), (("command", Glob("mkdir *")),)),
    Rule("no-rm", "deny", tuple(map(Glob, SHELL)), (("command", Glob("rm *")),), message=DENIED),
    Rule("ask-touch", "ask", tuple(map(Glob, SHELL)), (("command", Glob("touch *")),)),
)


def bash(command: str) -> dict[str, Any]:
    return {"type": "tool_use", "name": "Bash", "input": {"command": command}}


def tool_call_then(word: str, command: str, answer: str) -> list[dict[str, Any]]:
    """The model's two answers to a prompt holding ``word``: a Bash call, then text."""
    return [
        {"match": {"last_user_contains": word}, "content": [bash(command)]},
        {"match": {"tool_result": True}, "content": [{"type": "text", "text": answer}]},
    ]


RULED_CALLS = [
    *tool_call_then("List", "mkdir listed", "Listed."),
    *tool_call_then("Remove", "rm keep.txt", "I may not remove it."),
    *tool_call_then("Touch", "touch asked.txt", "Touched."),
]
# Each answer reports 50,000 input tokens (a quarter of the context, so no compaction): a cost
# of cents, past a budget of $0.001.
COSTLY = {"input_tokens": 50_000, "output_tokens": 50}
BUDGET_CALLS = [
    {
        "match": {"last_user_contains": f"Costly {n}"},
        "usage": COSTLY,
        "content": [{"type": "text", "text": f"Answer {n}."}],
    }
    for n in (1, 2)
]


@contextlib.asynccontextmanager
async def rig(agent: str, calls: list[dict[str, Any]]) -> AsyncIterator[CliSetup]:
    cli_agent = "claude-code" if agent == "claude-code" else agent
    require_cli(cli_agent)
    scenario = parse_scenario(
        {"run": {"files": {"keep.txt": "kept\n"}}, "calls": calls},
        name=f"e2e-rules-{agent}",
        agent=cli_agent,
    )
    async with scripted_cli(scenario) as cli:
        yield cli


def config(cli: CliSetup, agent: str, **kw: Any):
    binary = str(cli.binary)
    base = builtin_profiles(claude=binary, claude_acp=binary)[agent]
    profile = replace(base, env=cli.env)
    return users_config(cli.cwd, USERS, agents={agent: profile}, **kw)


async def attach(gw, sid: str, token: str = OPERATOR) -> Master:
    master = await Master.attach(gw, sid, headers=bearer(token))
    assert (await master.until("session.capabilities", timeout=STARTUP))["type"]
    return master


async def new_session(gw, agent: str) -> str:
    resp = await gw.post("/v1/session", json={"agent": agent}, headers=bearer(OPERATOR))
    assert resp.status == 201, await resp.text()
    return (await resp.json())["session_id"]


async def turn(master: Master, text: str) -> list[dict[str, Any]]:
    start = len(master.frames)
    await master.send("control.prompt.request", {"prompt_text": text})
    await master.until("session.turn.end", timeout=STARTUP)
    assert (await master.next(timeout=30))["type"] == "session.usage"
    return master.frames[start:]


def sent_tool_results(cli: CliSetup) -> list[str]:
    """The tool results the model was last sent, as text (each request holds the history)."""
    last = [r for r in cli.server.requests if r.path.startswith("/v1/messages")][-1]
    out = []
    for msg in last.body.get("messages", []):
        if msg.get("role") == "user" and isinstance(msg.get("content"), list):
            for block in msg["content"]:
                if block.get("type") == "tool_result":
                    out.append(json.dumps(block.get("content")))
    return out


@pytest.mark.parametrize("agent", ["claude-code", "claude-acp"])
async def test_rules_allow_with_no_master_deny_to_the_model_and_ask(agent):
    async with rig(agent, RULED_CALLS) as cli:
        gw = await start_gateway(config(cli, agent, policy=RULES))
        try:
            sid = await new_session(gw, agent)
            # Allowed, with nobody attached to answer: the rule does.
            master = await attach(gw, sid)
            await master.send("control.prompt.request", {"prompt_text": "List the files."})
            await master.until("session.turn.start", timeout=STARTUP)
            await master.ws.close()
            listed = cli.cwd / "listed"
            await eventually(listed.exists, "the allowed mkdir to run", STARTUP)
            session = gw.server.app[SESSIONS][sid]
            await eventually(lambda: session.machine.turn is None, "its turn to end", STARTUP)
            master = await attach(gw, sid)
            history = await history_of(gw, sid)
            results = of(history, "tool.invoke.result")
            assert results and results[0]["payload"]["status"] == "success"
            assert results[0]["metadata"]["rawp_policy"] == "mkdir-allowed"
            assert results[0]["metadata"]["rawp_policy_decision"] == "allow"
            assert of(history, "agent.interaction.request") == []

            # Denied: never runs; the model is told the rule's message.
            frames = await turn(master, "Remove keep.txt.")
            assert (cli.cwd / "keep.txt").read_text() == "kept\n"
            (result,) = of(frames, "tool.invoke.result")
            assert result["payload"]["status"] == "error"
            assert result["metadata"]["rawp_policy"] == "no-rm"
            assert of(frames, "agent.interaction.request") == []
            told = sent_tool_results(cli)[-1]
            if agent == "claude-code":
                assert DENIED in told
            else:
                # ACP's answer to session/request_permission is an option, with no room for a
                # message (docs/policies.md): the model hears the agent's own refusal.
                assert "refused permission" in told

            # Asked: a master answers, as without rules.
            await master.send("control.prompt.request", {"prompt_text": "Touch asked.txt."})
            ask = await master.until("agent.interaction.request", timeout=STARTUP)
            assert ask["metadata"]["rawp_policy"] == "ask-touch"
            allow = next(o["value"] for o in ask["payload"]["options"] if o["value"] == "allow")
            await master.send(
                "control.interaction.response",
                {"interaction_id": ask["payload"]["interaction_id"], "selected_value": allow},
            )
            await master.until("session.turn.end", timeout=STARTUP)
            assert (cli.cwd / "asked.txt").exists()
        finally:
            await gw.close()


# The starter rules of docs/policies.md about writes, and a Write through a symlink in the
# workspace that leads out of it: judged where it leads, it is denied at once, not allowed.
WRITE_RULES = (
    Rule(
        "writes-outside",
        "deny",
        (Glob("Write"),),  # claude-agent-acp names the call by Claude Code's tool too
        (("file_path", Glob("!{workspace}/*")),),
        message="write inside the project's workspace only",
    ),
    Rule("writes-inside", "allow", (Glob("Write"),)),
)
THROUGH_LINK = [
    {
        "match": {"last_user_contains": "Write"},
        "content": [
            {
                "type": "tool_use",
                "name": "Write",
                "input": {"file_path": "{workspace}/link/planted.txt", "content": "planted\n"},
            }
        ],
    },
    {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Done."}]},
]


@pytest.mark.parametrize("agent", ["claude-code", "claude-acp"])
async def test_a_write_through_a_symlink_out_of_the_workspace_is_not_allowed_at_once(
    agent: str, tmp_path: Path
):
    async with rig(agent, THROUGH_LINK) as cli:
        outside = tmp_path / "outside"
        outside.mkdir()
        (cli.cwd / "link").symlink_to(outside)
        gw = await start_gateway(config(cli, agent, policy=WRITE_RULES))
        try:
            master = await attach(gw, await new_session(gw, agent))
            frames = await turn(master, "Write the planted file.")
            assert not (outside / "planted.txt").exists()
            results = of(frames, "tool.invoke.result")
            assert results and results[0]["payload"]["status"] == "error"
            assert results[0]["metadata"]["rawp_policy"] == "writes-outside"
            assert results[0]["metadata"]["rawp_policy_decision"] == "deny"
        finally:
            await gw.close()


async def history_of(gw, sid: str) -> list[dict[str, Any]]:
    master = await Master.attach(gw, sid, history="all", headers=bearer(OPERATOR))
    frames = (await master.until("session.history", timeout=30))["payload"]["frames"]
    await master.ws.close()
    return frames


@pytest.mark.parametrize("agent", ["claude-code", "claude-acp"])
async def test_a_reported_cost_past_the_budget_refuses_until_raised_across_a_restart(
    agent, tmp_path: Path
):
    async with rig(agent, BUDGET_CALLS) as cli:
        kw = {"budgets": Limits(session_usd=0.001), "state_dir": tmp_path / "state"}
        gw = await start_gateway(config(cli, agent, **kw))
        try:
            sid = await new_session(gw, agent)
            master = await attach(gw, sid)
            frames = await turn(master, "Costly 1.")
            cost = of(frames, "session.usage")[-1]["payload"]["cost_usage"]["used"]
            assert cost > 0.001
            told = await master.until("session.error", error_code="BUDGET_EXCEEDED", timeout=30)
            assert told["metadata"]["rawp_budget"]["scope"] == "session"
            sent = await master.send("control.prompt.request", {"prompt_text": "Costly 2."})
            refused = await master.until("session.error", timeout=30)
            assert refused["parent_id"] == sent["message_id"]
            assert (refused["payload"]["error_code"], refused["payload"]["fatal"]) == (
                "BUDGET_EXCEEDED",
                False,
            )
        finally:
            await gw.close()  # a graceful stop: the session and the ledger stay

        gw = await start_gateway(config(cli, agent, **kw))
        try:
            shown = await (await gw.get(f"/v1/session/{sid}", headers=bearer(OPERATOR))).json()
            assert shown["budget"]["spent_usd"] == pytest.approx(cost, rel=1e-6)
            master = await attach(gw, sid)
            await master.send("control.prompt.request", {"prompt_text": "Costly 2."})
            refused = await master.until("session.error", timeout=30)
            assert refused["payload"]["error_code"] == "BUDGET_EXCEEDED"
            raised = await gw.patch(
                f"/v1/session/{sid}", json={"budget_usd": 100}, headers=bearer(ADMIN)
            )
            assert raised.status == 200
            frames = await turn(master, "Costly 2.")
            assert "Answer 2." in "".join(
                f["payload"]["text"] for f in of(frames, "agent.text.delta")
            )
        finally:
            await gw.close()
