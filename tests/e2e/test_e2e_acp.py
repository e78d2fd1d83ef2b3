"""End to end with real ACP agents: the real gateway server spawns the agent through its built-in
ACP profile (``gemini-acp``: the pinned Gemini CLI with ``--acp``; ``claude-acp``: claude-agent-acp
with its Claude Code; ``codex-acp``) against the rig's scripted model server, and real WebSocket
masters drive it. The gateway is the agent's ACP client: every frame
here went through the ACP handshake, ``session/prompt``, the agent's ``session/update``
notifications and its ``session/request_permission`` requests, answered by the gateway.
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
from gateway.server import SESSIONS
from tests.support import realcli
from tests.support.gateway_peer import Master, create_session, make_config, of, start_gateway
from tests.support.inside import PROBE, PROBE_AT_ONCE, check_probe, check_process, saved
from tests.support.realcli import MODES
from tests.support.rig.env import require_cli
from tests.support.rig.run import scripted_cli
from tests.support.rig.scenario import parse_scenario

pytestmark = pytest.mark.realcli

GEMINI_MODEL = "gemini-2.5-flash"  # without -m the CLI first makes a routing call
STARTUP = 120.0  # the CLI's start under load (tens of seconds on a busy machine)


@contextlib.asynccontextmanager
async def gemini_acp(
    calls: list[dict[str, Any]], files: dict[str, str], mode: str | None = None
) -> AsyncIterator[Any]:
    """``gemini-acp`` with the rig's Gemini CLI; ``mode``: the isolation (default: the suite's,
    ``realcli.isolation``)."""
    binary = require_cli("gemini")
    scenario = parse_scenario(
        {"run": {"files": files}, "calls": calls}, name="e2e-acp", agent="gemini"
    )
    async with scripted_cli(scenario) as cli:
        base = builtin_profiles(gemini=str(binary))["gemini-acp"]
        command = (str(binary), "-m", GEMINI_MODEL, *base.command[1:])
        profile = replace(base, env=cli.env, command=command)
        config = make_config(
            cli.cwd, agents={"gemini-acp": profile}, isolation=realcli.isolation(mode)
        )
        client = await start_gateway(config)
        try:
            yield cli, client
        finally:
            await client.close()


async def until_usage(master: Master, timeout: float) -> list[dict[str, Any]]:
    start = len(master.frames)
    await master.until("session.turn.end", timeout=timeout)
    assert (await master.next(timeout=10))["type"] == "session.usage"  # DPS-7.5.2-usage
    return master.frames[start:]


async def answer(master: Master, ask: dict[str, Any], value: str) -> None:
    """Answer the agent's question ``ask`` with the option ``value``."""
    await master.send(
        "control.interaction.response",
        {"interaction_id": ask["payload"]["interaction_id"], "selected_value": value},
    )


async def denied_turn(master: Master, text: str) -> list[dict[str, Any]]:
    """A prompt whose permission question the master denies; the turn's frames from the answer
    to its session.usage."""
    await master.send("control.prompt.request", {"prompt_text": text})
    await answer(master, await master.until("agent.interaction.request", timeout=60), "deny")
    return await until_usage(master, 60)


async def cancelled_turn(master: Master, text: str) -> tuple[str, list[dict[str, Any]]]:
    """A prompt cancelled once its text streams; its turn id and the frames from the cancel to
    the session.usage, which must come within the cancel's bounds (15 s)."""
    await master.send("control.prompt.request", {"prompt_text": text})
    start = await master.until("session.turn.start", timeout=30)
    await master.until("agent.text.delta", timeout=60)
    await master.send("control.prompt.cancel", {"target_turn_id": start["payload"]["turn_id"]})
    return start["payload"]["turn_id"], await until_usage(master, 15)


async def unasked_turn(master: Master, text: str) -> list[dict[str, Any]]:
    """A prompt whose turn asks nothing (an ``echo``: neither agent asks before it); every frame
    the master has, to its session.usage."""
    await master.send("control.prompt.request", {"prompt_text": text})
    frames = master.frames[:] + await until_usage(master, STARTUP)
    assert of(frames, "agent.interaction.request") == []
    return frames


WRITE = {
    "functionCall": {"name": "write_file", "args": {"file_path": "notes.txt", "content": "new\n"}}
}
CALLS = [
    # turn 1: a thought, a write the master allows (a diff), then text
    {"parts": [{"text": "Planning the edit.", "thought": True}, WRITE]},
    {"match": {"function_response": True}, "parts": [{"text": "Wrote the file."}]},
    # turn 2: the same write, denied
    {"parts": [WRITE]},
    {"match": {"function_response": True}, "parts": [{"text": "Not allowed, stopping."}]},
    # turn 3: text that never finishes (cancelled mid-stream)
    {"parts": [{"text": "Counting slowly: one, two"}], "hang": True},
]


async def test_gemini_acp_turns_permissions_cancel_and_reattach():
    """DPS-5.3.1-result, DPS-6.2-interaction, DPS-6.1.2-cancel through ACP: thinking, a write
    allowed through the agent's own options (a real unified diff), the same write denied, a turn
    cancelled mid-stream (``session/cancel``), and a master that reattaches and gets the history."""
    async with gemini_acp(CALLS, {"notes.txt": "old\n"}) as (cli, gw):
        session = await create_session(gw, "gemini-acp")
        sid = session["session_id"]
        master = await Master.attach(gw, sid)
        assert (await master.next())["type"] == "session.capabilities"

        # turn 1 -----------------------------------------------------------------------------
        await master.send("control.prompt.request", {"prompt_text": "Update notes.txt"})
        ask = await master.until("agent.interaction.request", timeout=STARTUP)
        payload = ask["payload"]
        assert payload["interaction_type"] == "PERMISSION"
        values = [o["value"] for o in payload["options"]]
        assert "allow" in values and "deny" in values  # the agent's own options, first of each kind
        assert len(values) == 3  # Gemini: proceed_always, proceed_once, cancel
        await answer(master, ask, "allow")
        frames = master.frames[:] + await until_usage(master, 60)
        assert (cli.cwd / "notes.txt").read_text() == "new\n"
        thinking = "".join(f["payload"]["text"] for f in of(frames, "agent.thinking.delta"))
        assert "Planning" in thinking and "the edit." in thinking  # Gemini marks up its thoughts
        (result,) = of(frames, "tool.invoke.result")
        assert result["payload"]["status"] == "success"
        assert result["payload"]["output_type"] == "diff"
        diff = result["payload"]["output"]
        assert "-old\n" in diff and "+new\n" in diff and diff.startswith("--- ")
        assert of(frames, "agent.text.done")[-1]["payload"]["full_text"] == "Wrote the file."
        assert of(frames, "session.turn.end")[-1]["payload"]["stop_reason"] == "end_turn"
        usage = frames[-1]["payload"]["token_usage"]
        assert usage["input_tokens"] > 0  # Gemini's _meta.quota.token_count

        # turn 2: denied ---------------------------------------------------------------------
        (cli.cwd / "notes.txt").write_text("old\n")
        frames = await denied_turn(master, "Again")
        assert (cli.cwd / "notes.txt").read_text() == "old\n"
        results = of(frames, "tool.invoke.result")
        assert results and results[-1]["payload"]["status"] in ("error", "cancelled")
        assert of(frames, "session.turn.end")[-1]["payload"]["stop_reason"] == "end_turn"

        # turn 3: cancelled mid-stream -------------------------------------------------------
        turn_id, frames = await cancelled_turn(master, "Count")  # no process stopped
        assert of(frames, "session.turn.end")[-1]["payload"]["stop_reason"] == "cancelled"
        assert all(d["payload"].get("is_cancelled") for d in of(frames, "agent.text.done"))
        info = await (await gw.get(f"/v1/session/{sid}")).json()
        assert info["state"] in ("IDLE", "RUNNING") and info["agent"] == "gemini-acp"

        # reattach ---------------------------------------------------------------------------
        seen = [f["message_id"] for f in master.frames]
        await master.ws.close()
        again = await Master.attach(gw, sid, last_message_id=seen[5], announce=False)
        assert (await again.next())["type"] == "session.capabilities"
        history = await again.next()
        assert history["type"] == "session.history"
        replayed = [f["message_id"] for f in history["payload"]["frames"]]
        assert seen[5] not in replayed
        of_cancelled = [f["message_id"] for f in master.frames if f.get("turn_id") == turn_id]
        assert [m for m in replayed if m in of_cancelled] == of_cancelled


async def test_gemini_acp_shell_result_is_not_its_working_directory_note():
    """DPS-5.3.1-result, DPS-5.3.2-stream: Gemini CLI announces run_shell_command with a "[current
    working directory ...]" note and completes it with ``"content": []``, which replaces the note
    (ACP): the master gets an empty result (Gemini reports no output through ACP) and no stream,
    never the note as the command's output."""
    shell = {"functionCall": {"name": "run_shell_command", "args": {"command": "echo hi"}}}
    calls = [
        {"parts": [shell]},
        {"match": {"function_response": True}, "parts": [{"text": "It printed hi."}]},
    ]
    async with gemini_acp(calls, {}) as (_, gw):
        sid = (await create_session(gw, "gemini-acp"))["session_id"]
        master = await Master.attach(gw, sid)
        frames = await unasked_turn(master, "Run echo.")
        (request,) = of(frames, "tool.invoke.request")
        (result,) = of(frames, "tool.invoke.result")
        assert request["payload"]["tool_name"] == "execute"
        assert (result["payload"]["status"], result["payload"]["output"]) == ("success", "")
        assert result["payload"]["output_type"] == "empty"
        assert of(frames, "tool.invoke.stream") == []
        assert not any("current working directory" in json.dumps(f) for f in frames[1:])
        assert of(frames, "agent.text.done")[-1]["payload"]["full_text"] == "It printed hi."


# --- Claude Code through claude-agent-acp ----------------------------------------------------


@contextlib.asynccontextmanager
async def adapter_acp(
    agent: str,
    calls: list[dict[str, Any]],
    mode: str | None = None,
    *,
    changes: dict[str, Any] | None = None,
    **config_fields: Any,
) -> AsyncIterator[Any]:
    """``claude-acp`` or ``codex-acp``: the pinned adapter, the CLI underneath pointed at the
    rig's scripted server (the rig's environment for that CLI); ``mode`` as for ``gemini_acp``;
    ``changes``: the profile's fields, ``config_fields``: the ``Config``'s."""
    binary = require_cli(agent)
    scenario = parse_scenario({"run": {}, "calls": calls}, name=f"e2e-{agent}", agent=agent)
    async with scripted_cli(scenario) as cli:
        base = builtin_profiles(claude_acp=str(binary), codex_acp=str(binary))[agent]
        profile = replace(base, env=cli.env, **(changes or {}))
        config = make_config(
            cli.cwd, agents={agent: profile}, isolation=realcli.isolation(mode), **config_fields
        )
        client = await start_gateway(config)
        try:
            yield cli, client
        finally:
            await client.close()


def claude_write(name: str) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "name": "Write",
        "input": {"file_path": f"{{workspace}}/{name}", "content": "new\n"},
    }


CLAUDE_CALLS = [
    # turn 1: thinking, a Write the master allows (a new file: a diff from /dev/null), text
    {
        "content": [
            {"type": "thinking", "thinking": "Think first.", "signature": "sig"},
            claude_write("a.txt"),
        ]
    },
    {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Wrote a.txt."}]},
    # turn 2: a Write denied
    {"content": [claude_write("b.txt")]},
    {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Denied."}]},
    # turn 3: text that never finishes
    {"content": [{"type": "text", "text": "Counting slowly: one, two"}], "hang": True},
]


async def test_claude_acp_thinking_permissions_diff_cancel_and_two_turns():
    """Claude Code under claude-agent-acp against the scripted Anthropic server: thinking, a
    Write allowed (its diff), a Write denied, a turn cancelled mid-stream; the usage the adapter
    reports (tokens, cost) in session.usage (DPS-7.5.2-usage)."""
    async with adapter_acp("claude-acp", CLAUDE_CALLS) as (cli, gw):
        sid = (await create_session(gw, "claude-acp"))["session_id"]
        master = await Master.attach(gw, sid)
        await master.send("control.prompt.request", {"prompt_text": "Write a.txt"})
        ask = await master.until("agent.interaction.request", timeout=STARTUP)
        values = [o["value"] for o in ask["payload"]["options"]]
        assert values == ["allow_always", "allow", "deny"]  # Always Allow, Allow, Reject
        await answer(master, ask, "allow")
        frames = master.frames[:] + await until_usage(master, 60)
        assert (cli.cwd / "a.txt").read_text() == "new\n"
        assert "Think first." in "".join(
            f["payload"]["text"] for f in of(frames, "agent.thinking.delta")
        )
        (result,) = of(frames, "tool.invoke.result")
        assert result["payload"]["tool_name"] == "Write"
        assert result["payload"]["output_type"] == "diff"
        assert "+++ " in result["payload"]["output"] and "+new\n" in result["payload"]["output"]
        usage = frames[-1]["payload"]
        assert usage["token_usage"]["input_tokens"] > 0 and usage["cost_usage"]["used"] > 0

        frames = await denied_turn(master, "Write b.txt")
        assert not (cli.cwd / "b.txt").exists()
        assert of(frames, "tool.invoke.result")[-1]["payload"]["status"] == "error"

        _, frames = await cancelled_turn(master, "Count")
        assert of(frames, "session.turn.end")[-1]["payload"]["stop_reason"] == "cancelled"


CLAUDE_BASH = {
    "type": "tool_use",
    "name": "Bash",
    "input": {"command": "echo hi", "description": "Print hi"},
}
CLAUDE_AFTER_CANCEL = [
    # turn 1: a Bash call (echo: Claude asks nothing); its description is not output
    {"match": {"last_user_contains": "Run echo"}, "content": [CLAUDE_BASH]},
    {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Ran it."}]},
    # turn 2: text that never finishes (cancelled)
    {
        "match": {"last_user_contains": "Count"},
        "content": [{"type": "text", "text": "Counting slowly: one, two"}],
        "hang": True,
    },
    # turns 3 and 4
    {"match": {"last_user_contains": "Second"}, "content": [{"type": "text", "text": "Two."}]},
    {"match": {"last_user_contains": "Third"}, "content": [{"type": "text", "text": "Three."}]},
]


async def test_claude_acp_answers_the_prompt_after_a_cancel_one_turn_late():
    """DPS-6.1.2-cancel, DPS-5.3.2-stream, as a master sees claude-agent-acp 0.23.1: a Bash
    call's description is no stdout and its result is the command's output; after a cancelled
    turn the adapter answers the next prompt at once with an empty ``end_turn`` (its own open
    bug, docs/acp-mapping.md), which the gateway passes on with an ``ACP_EMPTY_TURN`` warning,
    and gives that prompt's answer in the turn of the prompt after it, before anything of that
    one's own."""
    async with adapter_acp("claude-acp", CLAUDE_AFTER_CANCEL) as (cli, gw):
        sid = (await create_session(gw, "claude-acp"))["session_id"]
        master = await Master.attach(gw, sid)
        frames = await unasked_turn(master, "Run echo.")
        (result,) = of(frames, "tool.invoke.result")
        assert (result["payload"]["tool_name"], result["payload"]["output"]) == ("Bash", "hi\n")
        assert of(frames, "tool.invoke.stream") == []  # "Print hi" is not what it printed

        _, frames = await cancelled_turn(master, "Count")
        assert of(frames, "session.turn.end")[-1]["payload"]["stop_reason"] == "cancelled"

        await master.send("control.prompt.request", {"prompt_text": "Second"})
        second = await until_usage(master, 60)
        assert of(second, "agent.text.delta") == []
        assert of(second, "session.turn.end")[-1]["payload"]["stop_reason"] == "end_turn"
        (flag,) = of(second, "agent.error")
        assert (flag["payload"]["error_code"], flag["payload"]["severity"]) == (
            "ACP_EMPTY_TURN",
            "warning",
        )

        await master.send("control.prompt.request", {"prompt_text": "Third"})
        third = await until_usage(master, 60)
        text = "".join(f["payload"]["text"] for f in of(third, "agent.text.delta"))
        # The late answer first; this prompt's own comes in the same turn or, when the adapter's
        # stale result ends the turn before it (its own race, both seen), in the next one.
        assert text in ("Two.", "Two.Three."), text
        assert of(third, "agent.error") == []
        assert of(third, "session.turn.end")[-1]["payload"]["stop_reason"] == "end_turn"
        assert not cli.server.unexpected or all(r.path == "/" for r in cli.server.unexpected)


# --- Codex through codex-acp -----------------------------------------------------------------


def codex_exec(cmd: str) -> dict[str, Any]:
    return {
        "output": [{"type": "function_call", "name": "exec_command", "arguments": {"cmd": cmd}}]
    }


CODEX_CALLS = [
    # turn 1: reasoning, a command the master allows, text
    {"output": [{"type": "reasoning", "summary": "Check the files."}]}
    | codex_exec("echo hi > made.txt"),
    {"match": {"tool_output": True}, "output": [{"type": "message", "text": "Made it."}]},
    # turn 2: a command denied
    codex_exec("echo no > denied.txt"),
    {"match": {"tool_output": True}, "output": [{"type": "message", "text": "Denied."}]},
    # turn 3: text that never finishes
    {"output": [{"type": "message", "text": "Counting slowly"}], "hang": True},
]


async def test_codex_acp_permissions_cancel_and_two_turns():
    """Codex under codex-acp against the scripted Responses server, as the built-in profile runs it
    (Codex's sandbox off, asking before commands: it works with bubblewrap installed or not): a
    command allowed through the agent's own options, one denied, a turn cancelled mid-stream. Codex lists no plan mode:
    plan_mode is announced off once its session/new answer says so (DPS-12.2-caps)."""
    async with adapter_acp("codex-acp", CODEX_CALLS) as (cli, gw):
        sid = (await create_session(gw, "codex-acp"))["session_id"]
        master = await Master.attach(gw, sid)
        await master.send("control.prompt.request", {"prompt_text": "Make a file"})
        ask = await master.until("agent.interaction.request", timeout=STARTUP)
        assert "allow" in [o["value"] for o in ask["payload"]["options"]]
        await answer(master, ask, "allow")
        frames = master.frames[:] + await until_usage(master, 60)
        assert (cli.cwd / "made.txt").read_text() == "hi\n"
        results = of(frames, "tool.invoke.result")
        assert results[-1]["payload"]["status"] == "success"
        assert of(frames, "agent.text.done")[-1]["payload"]["full_text"] == "Made it."
        caps = of(frames, "session.capabilities")[-1]["payload"]["features"]
        assert caps.get("plan_mode") is not True

        await denied_turn(master, "Another")
        assert not (cli.cwd / "denied.txt").exists()

        _, frames = await cancelled_turn(master, "Count")
        assert of(frames, "session.turn.end")[-1]["payload"]["stop_reason"] == "cancelled"


# --- Every ACP agent, in both isolation modes ----------------------------------------------------

# A shell command (PROBE) each agent's model runs, then its last words; where the agent saves its
# conversations, under its HOME.
PROBE_CALLS: dict[str, tuple[list[dict[str, Any]], str]] = {
    "gemini-acp": (
        [
            {
                "parts": [
                    {"functionCall": {"name": "run_shell_command", "args": {"command": PROBE}}}
                ]
            },
            {"match": {"function_response": True}, "parts": [{"text": "Probed."}]},
        ],
        ".gemini/tmp/*/chats/session-*.jsonl",
    ),
    "claude-acp": (
        [
            {
                "content": [
                    {
                        "type": "tool_use",
                        "name": "Bash",
                        "input": {"command": PROBE, "description": "Probe"},
                    }
                ]
            },
            {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Probed."}]},
        ],
        ".claude/projects/*/*.jsonl",
    ),
    "codex-acp": (
        [
            codex_exec(PROBE_AT_ONCE),
            {"match": {"tool_output": True}, "output": [{"type": "message", "text": "Probed."}]},
        ],
        ".codex/sessions/**/rollout-*.jsonl",
    ),
}


async def allowed_turn(master: Master, text: str) -> list[dict[str, Any]]:
    """A prompt whose every question the master allows; the frames to its session.usage."""
    start = len(master.frames)
    await master.send("control.prompt.request", {"prompt_text": text})
    while True:
        frame = await master.next(timeout=STARTUP)
        if frame["type"] == "agent.interaction.request":
            await answer(master, frame, "allow")
        elif frame["type"] == "session.turn.end":
            assert (await master.next(timeout=10))["type"] == "session.usage"
            return master.frames[start:]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("agent", list(PROBE_CALLS))
async def test_an_acp_agent_runs_a_command_where_its_isolation_says(agent, mode):
    """DPS-5.3.1-result through ACP, in both isolation modes (docs/isolation.md): a turn whose
    command succeeds, run by an agent that is, or is not, under bubblewrap in namespaces of its
    own, and that saved its conversation in its session's HOME."""
    calls, saves = PROBE_CALLS[agent]
    opened = (
        gemini_acp(calls, {}, mode) if agent == "gemini-acp" else adapter_acp(agent, calls, mode)
    )
    async with opened as (cli, gw):
        sid = (await create_session(gw, agent))["session_id"]
        master = await Master.attach(gw, sid)
        frames = await allowed_turn(master, "Probe.")
        results = of(frames, "tool.invoke.result")
        assert results and results[-1]["payload"]["status"] == "success", results
        assert of(frames, "agent.text.done")[-1]["payload"]["full_text"] == "Probed."
        session = gw.server.app[SESSIONS][sid]
        sandboxed = realcli.isolation(mode).sandboxed
        check_process(session, sandboxed)
        box = session.sandbox()
        home = cli.home if box is None else Path(box.home)
        if agent != "gemini-acp":  # Gemini reports no command output through ACP
            system_root = realcli.isolation(mode).system_root
            check_probe(results[-1]["payload"]["output"], sandboxed, home, system_root)
        assert saved(home, saves), f"{agent} saved its conversation in {home}"


@pytest.mark.parametrize("agent", ["claude-acp", "codex-acp"])
def test_the_pinned_acp_adapters_are_installed(agent):
    """scripts/install-agents.sh installed exactly the versions tests/support/rig/env.py pins."""
    from tests.support.rig import env as rigenv

    require_cli(agent)
    assert rigenv.installed_version(agent) == rigenv.AGENTS[agent].version
