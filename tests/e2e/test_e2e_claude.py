"""End to end with the real Claude Code CLI: the real gateway server (``create_app``) spawns the
pinned CLI against the rig's scripted Messages API, and real WebSocket masters drive it.

Every test here asserts what actually came out of the CLI through parser, mapper, session machine
and server: frame sequences and payloads, files on disk, and the model requests the scripted server
received. Scenarios (``tests/support/rig/scenarios/claude-code-e2e/``) hold only ``[[calls]]`` and
workspace files: the gateway, not the rig's runner, writes the CLI's stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import uuid
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from gateway.protocol.frames import Features
from gateway.server import CONFIG, SESSIONS
from tests.support import realcli
from tests.support.gateway_peer import Master, greeting, of, prompt_and_wait
from tests.support.logs import deletions, watch_sessions
from tests.support.paths import RIG
from tests.support.procs import cmdline, descendants, group_alive
from tests.support.realcli import Rig
from tests.support.rig.anthropic import last_user_text
from tests.support.waiting import eventually

pytestmark = pytest.mark.realcli

SCENARIOS = RIG / "scenarios" / "claude-code-e2e"


def gateway(
    scenario: str,
    *,
    profile: str = "claude-code",
    max_frame_size: int | None = None,
    **kw: Any,
) -> contextlib.AbstractAsyncContextManager[Rig]:
    """The real-CLI gateway for a scenario of ``claude-code-e2e`` (``kw``: see realcli.gateway)."""
    server = {"max_frame_size": max_frame_size} if max_frame_size else None
    return realcli.gateway(SCENARIOS / f"{scenario}.toml", profile, server=server, **kw)


async def prompt(master: Master, text: str) -> dict[str, Any]:
    return await master.send("control.prompt.request", {"prompt_text": text})


async def turn(master: Master, text: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Send a prompt and read its turn, checked (``check_turn``); the frames up to the
    session.usage after session.turn.end (the idle agent.state.changed that must come next is
    read but not returned)."""
    frames = await prompt_and_wait(master, text, timeout=timeout)
    change = await master.next()
    assert change["type"] == "agent.state.changed", change
    assert change["payload"]["current_state"] == "idle"
    check_turn(master, frames)
    return frames


TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d)$")


def check_turn(master: Master, frames: list[dict[str, Any]]) -> None:
    """DPS-2.1-envelope and DPS-2.1-turn-id over one turn as a master received it: every frame a
    valid envelope of this session; every frame from session.turn.start on carries its turn_id."""
    for f in frames:
        assert f["v"] == 1 and isinstance(f["payload"], dict), f
        assert uuid.UUID(f["message_id"]).version == 4, f
        assert TIMESTAMP.match(f["timestamp"]), f["timestamp"]
        assert f["session_id"] == master.session_id
        assert isinstance(f.get("metadata", {}), dict)
    starts = [i for i, f in enumerate(frames) if f["type"] == "session.turn.start"]
    assert len(starts) == 1, [f["type"] for f in frames]
    turn_id = frames[starts[0]]["payload"]["turn_id"]
    own = [f for f in frames[starts[0] :] if not f["type"].startswith("control.")]
    assert all(f.get("turn_id") == turn_id for f in own), [
        f["type"] for f in own if f.get("turn_id") != turn_id
    ]


async def end_of_turn(master: Master, *, idle: bool = True) -> None:
    """After session.turn.end: session.usage at once (DPS-7.5.2-usage), then the state is idle
    (``idle=False``: a turn in which the agent never left idle has no state change to undo)."""
    assert (await master.next())["type"] == "session.usage"
    if not idle:
        return
    change = await master.next()
    assert change["type"] == "agent.state.changed", change
    assert change["payload"]["current_state"] == "idle"


def texts(frames: list[dict[str, Any]]) -> str:
    return "".join(f["payload"]["text"] for f in of(frames, "agent.text.delta"))


def tool_results_sent(rig: Rig) -> list[dict[str, Any]]:
    """Every tool_result block in the conversation the CLI last sent the model (what the model saw
    of each tool; each request carries the whole history)."""
    out: list[dict[str, Any]] = []
    for r in rig.requests[-1:]:
        for msg in r.body.get("messages", []):
            if msg.get("role") == "user" and isinstance(msg.get("content"), list):
                out += [b for b in msg["content"] if b.get("type") == "tool_result"]
    return out


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "".join(c.get("text", "") for c in content if isinstance(c, dict))
    return str(content)


# --- prompt, turn, usage --------------------------------------------------------------------------


async def test_prompt_turn_and_usage():
    """DPS-12.2-caps, DPS-7.5.1-start, DPS-4.1-text, DPS-7.5.2-end, DPS-7.5.2-usage, DPS-7.3-usage,
    DPS-2.1-turn-id, DPS-5.4-catalog, DPS-12.1-commands with the real CLI: the catalog and the
    commands right after session.capabilities, before any prompt (docs/http-api.md), then the
    frames of one turn, in order, carrying what the model streamed and the usage it reported."""
    async with gateway("turn") as rig:
        session = await rig.create()
        sid = session["session_id"]
        master = await rig.attach(sid)
        # the catalog the profile expects, then the commands the CLI lists when asked at spawn
        tools, commands = await greeting(master, timeout=30)
        assert {"Bash", "Read", "Write", "Edit"} <= set(tools)
        listed = {c["name"]: c["description"] for c in commands}
        assert "compact" in listed and all(listed.values())
        assert not rig.requests  # no prompt, no model call: nothing of this came from a turn
        frames = await turn(master, "Say hello.")
        types = [f["type"] for f in frames]
        start = frames[0]
        assert start["type"] == "session.turn.start"
        assert start["payload"]["turn_index"] == 0 and start["payload"]["mode"] == "default"
        turn_id = start["payload"]["turn_id"]
        assert all(f["turn_id"] == turn_id for f in frames)
        # the CLI's init line names the same tools and commands: nothing is published again
        assert not of(frames, "tool.catalog.publish"), tools
        assert not of(frames, "agent.commands.publish")
        said = "Hello from the scripted model, through the gateway."
        assert texts(frames) == said
        done = of(frames, "agent.text.done")
        assert [d["payload"]["full_text"] for d in done] == [said]
        assert types[-2:] == ["session.turn.end", "session.usage"]
        end, usage = frames[-2]["payload"], frames[-1]["payload"]
        assert end == {"turn_id": turn_id, "stop_reason": "end_turn", "tool_invocation_count": 0}
        assert usage["token_usage"]["input_tokens"] == 1234
        assert usage["token_usage"]["output_tokens"] == 56
        assert usage["cost_usage"]["unit"] == "USD" and usage["cost_usage"]["used"] > 0
        assert usage["message_usage"]["used"] == 1
        assert usage["context_window"]["capacity"] > 0
        # the model got the prompt, once
        assert len(rig.requests) == 1
        assert "Say hello." in last_user_text(rig.requests[0].body)
        got = await (await rig.gw.get(f"/v1/session/{sid}")).json()
        assert got["state"] == "IDLE" and got["turn_index"] == 1
        # the id the CLI reported is the one it keeps its transcript under
        asid = got["agent_session_id"]
        # (where it keeps them: a walk of the whole HOME races the CLI's lock directories, which
        # come and go as it writes .claude.json)
        assert list(rig.home(sid).glob(f".claude/projects/*/{asid}.jsonl")), asid


# --- tools and permissions --------------------------------------------------------------------------


async def test_DPS_5_2_parallel_tools():
    """DPS-5.2-request, DPS-5.3.1-result, DPS-5.3.3-output-type: three calls in one model message
    share a parallel_group_id; each gets exactly one result with its own output and type."""
    async with gateway(
        "parallel",
        extra_args=("--tools", "Bash,Read,Glob"),
        auto_allow=frozenset({"Read", "Glob", "Bash"}),
    ) as rig:
        session = await rig.create()
        master = await rig.attach(session["session_id"])
        frames = await turn(master, "Look around.")
        requests = of(frames, "tool.invoke.request")
        assert [r["payload"]["tool_name"] for r in requests] == ["Read", "Bash", "Glob"]
        groups = {r["payload"].get("parallel_group_id") for r in requests}
        assert len(groups) == 1 and None not in groups
        results = {
            r["payload"]["invocation_id"]: r["payload"] for r in of(frames, "tool.invoke.result")
        }
        assert len(of(frames, "tool.invoke.result")) == 3
        by_name = {}
        for req in requests:
            res = results[req["payload"]["invocation_id"]]
            assert res["tool_name"] == req["payload"]["tool_name"]
            assert res["status"] == "success", res
            by_name[res["tool_name"]] = res
        assert "some notes" in by_name["Read"]["output"]
        assert by_name["Read"]["output_type"] == "file_content"
        assert "parallel-e2e" in by_name["Bash"]["output"]
        assert by_name["Bash"]["output_type"] == "text"
        assert "src/a.py" in json.dumps(by_name["Glob"]["output"])
        assert by_name["Glob"]["output_type"] == "file_list"
        assert "agent.interaction.request" not in master.types()  # all three auto-allowed
        end = of(frames, "session.turn.end")[0]["payload"]
        assert (end["stop_reason"], end["tool_invocation_count"]) == ("end_turn", 3)
        assert texts(frames).endswith("Done looking.")
        sent = tool_results_sent(rig)
        assert len(sent) == 3 and not any(b.get("is_error") for b in sent)


async def test_DPS_6_2_permission_allow_deny_and_timeout():
    """DPS-4.3-interaction, DPS-5.2-request, DPS-6.2-interaction: the CLI asks (can_use_tool) for a
    Write, a Bash and two more Writes; the master allows the first (the file is written), denies the
    second (the command never runs), lets timeout_sec pass on the third and sends
    control.interaction.timeout for the fourth (both denied, not written)."""
    async with gateway("permissions", permission_timeout_sec=1.5) as rig:
        session = await rig.create()
        master = await rig.attach(session["session_id"])
        start = len(master.frames)
        await prompt(master, "Write allowed.txt, run a command, write late.txt.")

        async def ask(tool: str) -> dict[str, Any]:
            request = await master.until("tool.invoke.request", timeout=30)
            assert request["payload"]["tool_name"] == tool
            frame = await master.until("agent.interaction.request", timeout=30)
            p = frame["payload"]
            assert p["interaction_type"] == "PERMISSION" and p["context"]["tool_name"] == tool
            assert p["default_value"] == "deny" and p["timeout_sec"] == 1.5
            assert {o["value"] for o in p["options"]} == {"allow", "deny"}
            assert frame["metadata"]["invocation_id"] == request["payload"]["invocation_id"]
            return frame

        allow = await ask("Write")
        assert "allowed.txt" in allow["payload"]["question_text"]
        await master.send(
            "control.interaction.response",
            {"interaction_id": allow["payload"]["interaction_id"], "selected_value": "allow"},
        )
        result = await master.until("tool.invoke.result", timeout=30)
        assert (result["payload"]["tool_name"], result["payload"]["status"]) == ("Write", "success")
        assert result["payload"]["output_type"] == "diff"  # DPS-5.3.3-output-type: a new file
        assert "+allowed" in result["payload"]["output"]

        deny = await ask("Bash")
        await master.send(
            "control.interaction.response",
            {"interaction_id": deny["payload"]["interaction_id"], "selected_value": "deny"},
        )
        result = await master.until("tool.invoke.result", timeout=30)
        assert (result["payload"]["tool_name"], result["payload"]["status"]) == ("Bash", "error")

        late = await ask("Write")
        asked_at = asyncio.get_running_loop().time()
        result = await master.until("tool.invoke.result", timeout=30)
        waited = asyncio.get_running_loop().time() - asked_at
        assert (result["payload"]["tool_name"], result["payload"]["status"]) == ("Write", "error")
        # Not decided before timeout_sec (1.5 s, less the request's way to this master); that the
        # gateway's timer decided it is what the CLI was told ("timed out", below).
        assert waited > 1.0, waited
        assert late["payload"]["interaction_id"] != deny["payload"]["interaction_id"]

        gave_up = await ask("Write")  # DPS-6.2-interaction: the master's own timeout frame
        await master.send(
            "control.interaction.timeout", {"interaction_id": gave_up["payload"]["interaction_id"]}
        )
        result = await master.until("tool.invoke.result", timeout=30)
        assert (result["payload"]["tool_name"], result["payload"]["status"]) == ("Write", "error")

        end = await master.until("session.turn.end", timeout=30)
        await end_of_turn(master)
        assert end["payload"]["stop_reason"] == "end_turn"
        assert end["payload"]["tool_invocation_count"] == 4
        frames = master.frames[start:]
        assert len(of(frames, "agent.interaction.request")) == 4
        assert "session.error" not in [f["type"] for f in frames]
        ws = rig.cli.cwd
        assert (ws / "allowed.txt").read_text() == "allowed\n"
        assert not (ws / "denied.txt").exists()
        assert not (ws / "late.txt").exists()
        assert not (ws / "gave-up.txt").exists()
        sent = tool_results_sent(rig)
        assert [bool(b.get("is_error")) for b in sent] == [False, True, True, True]
        assert "denied" in result_text(sent[1])
        assert "timed out" in result_text(sent[2])
        assert "timed out" in result_text(sent[3])
        assert texts(frames) == "One written, one denied, two timed out."


async def test_DPS_6_3_2_plan_mode_blocks_a_write():
    """DPS-6.3.2-mode and DPS-6.3.2-block: after control.mode.switch to plan the CLI (which, with a
    permission prompt tool, only asks) wants to Write; the gateway refuses it without asking a
    master, the result says so and the file is not written. Switched back to default, the Write is
    asked for again and, allowed, writes the file."""
    async with gateway("plan-mode") as rig:
        session = await rig.create()
        master = await rig.attach(session["session_id"])
        await master.send("control.mode.switch", {"mode": "plan"})
        change = await master.until("agent.state.changed", reason="mode_switch")
        assert change["metadata"] == {"mode": "plan", "previous_mode": "default"}
        frames = await turn(master, "Create plan.txt.")
        assert frames[0]["type"] == "session.turn.start"
        assert frames[0]["payload"]["mode"] == "plan"
        [request] = of(frames, "tool.invoke.request")
        [result] = of(frames, "tool.invoke.result")
        assert request["payload"]["tool_name"] == "Write"
        assert result["payload"]["invocation_id"] == request["payload"]["invocation_id"]
        assert result["payload"]["status"] == "error"
        assert result["payload"]["output"] == "Tool not allowed in current mode"
        assert "agent.interaction.request" not in master.types()
        assert not (rig.cli.cwd / "plan.txt").exists()
        [sent] = tool_results_sent(rig)
        assert sent.get("is_error") is True
        assert "Tool not allowed in current mode" in result_text(sent)
        assert texts(frames) == "Plan: write plan.txt once plan mode ends."
        assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"

        # back to default: the CLI's mode is switched back too, and the same Write is asked for
        await master.send("control.mode.switch", {"mode": "default"})
        change = await master.until("agent.state.changed", reason="mode_switch")
        assert change["metadata"] == {"mode": "default", "previous_mode": "plan"}
        start_at = len(master.frames)
        await prompt(master, "Now write it.")
        ask = await master.until("agent.interaction.request", timeout=30)
        assert ask["payload"]["context"]["tool_name"] == "Write"
        await master.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
        )
        await master.until("session.turn.end", timeout=30)
        await end_of_turn(master)
        frames = master.frames[start_at:]
        assert frames[0]["payload"]["mode"] == "default"
        [result] = of(frames, "tool.invoke.result")
        assert result["payload"]["status"] == "success"
        assert (rig.cli.cwd / "plan.txt").read_text() == "written after plan mode\n"


async def first_turn(rig, text: str):
    """A new session with a master attached and ``text`` prompted, once its turn has started: the
    session id, the master, where the turn's frames begin in ``master.frames``, the turn's start."""
    session = await rig.create()
    sid = session["session_id"]
    master = await rig.attach(sid)
    start_at = len(master.frames)
    await prompt(master, text)
    return sid, master, start_at, await master.until("session.turn.start")


# --- cancel -------------------------------------------------------------------------------------


async def test_DPS_6_1_2_cancel_mid_stream():
    """DPS-6.1.2-cancel: mid-stream, the open text block is finished with is_cancelled, the turn
    ends cancelled with its usage; the same CLI process then answers the next prompt.
    DPS-17.3.2-one-prompt: a prompt sent during the turn is refused and not delivered."""
    async with gateway("cancel-stream") as rig:
        sid, master, start_at, start = await first_turn(rig, "Write a long story.")
        await master.until("agent.text.delta", timeout=30)
        pid = rig.session(sid).process.pid
        # DPS-17.3.2-one-prompt: a second prompt meanwhile is refused and never reaches the CLI
        second = await prompt(master, "Still there?")
        err = await master.until("session.error")
        assert (err["payload"]["error_code"], err["payload"]["fatal"]) == (
            "PROMPT_IN_PROGRESS",
            False,
        )
        assert err["parent_id"] == second["message_id"]
        await master.send("control.prompt.cancel", {"target_turn_id": start["payload"]["turn_id"]})
        end = await master.until("session.turn.end", timeout=15)
        assert end["payload"]["stop_reason"] == "cancelled"
        await end_of_turn(master)
        assert len(rig.requests) == 1  # the refused prompt started no model request
        frames = master.frames[start_at:]
        done = of(frames, "agent.text.done")
        assert done and done[-1]["payload"].get("is_cancelled") is True
        assert done[-1]["payload"]["full_text"] == texts(frames)
        assert texts(frames)
        assert "Once upon a time there was a very long story that".startswith(texts(frames))
        after = await turn(master, "Still there?")
        assert texts(after) == "Still here."
        assert of(after, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        # the interrupt did it: the same process answers (the SIGINT fallback would end it)
        assert rig.session(sid).process.pid == pid


@pytest.mark.parametrize("open_block", ["agent.thinking.delta", "agent.text.delta"])
async def test_DPS_6_1_2_cancel_while_the_model_streams_ends_open_blocks_cancelled(open_block):
    """DPS-6.1.2-cancel: the model streams thinking then text slowly (no hang); cancelled while a
    block is open, every block open at that moment ends with is_cancelled, although the CLI closes
    an interrupted thinking block as if it were complete; the next prompt is answered as usual."""
    async with gateway("cancel-streaming") as rig:
        _, master, start_at, start = await first_turn(rig, "Write a long story.")
        await master.until(open_block, timeout=30)
        frames = master.frames[start_at:]
        done_before = {f["payload"]["content_index"] for f in frames if f["type"].endswith(".done")}
        open_at_cancel = {
            f["payload"]["content_index"] for f in frames if f["type"].endswith(".delta")
        } - done_before
        await master.send("control.prompt.cancel", {"target_turn_id": start["payload"]["turn_id"]})
        end = await master.until("session.turn.end", timeout=15)
        assert end["payload"]["stop_reason"] == "cancelled"
        await end_of_turn(master)
        frames = master.frames[start_at:]
        done = {f["payload"]["content_index"]: f for f in frames if f["type"].endswith(".done")}
        assert open_at_cancel and open_at_cancel <= set(done)
        for index in open_at_cancel:
            assert done[index]["payload"].get("is_cancelled") is True, done[index]
        after = await turn(master, "Still there?")
        assert texts(after) == "Still here."


async def test_DPS_6_1_2_cancel_mid_tool():
    """DPS-6.1.2-cancel: while a Bash command runs, cancel gives the open call a cancelled result,
    the turn ends cancelled, the command's process is gone, and the session keeps working."""
    async with gateway("cancel-tool", auto_allow=frozenset({"Bash"})) as rig:
        sid, master, start_at, start = await first_turn(rig, "Wait for a while.")
        request = await master.until("tool.invoke.request", timeout=30)
        assert request["payload"]["tool_name"] == "Bash"
        pid = rig.session(sid).process.pid
        marker = "time.sleep(30)"
        await eventually(
            lambda: [p for p in descendants(pid) if marker in cmdline(p)], what="the command"
        )
        await master.send("control.prompt.cancel", {"target_turn_id": start["payload"]["turn_id"]})
        end = await master.until("session.turn.end", timeout=15)
        assert end["payload"]["stop_reason"] == "cancelled"
        await end_of_turn(master)
        frames = master.frames[start_at:]
        results = of(frames, "tool.invoke.result")
        assert len(results) == 1
        assert results[0]["payload"]["invocation_id"] == request["payload"]["invocation_id"]
        assert results[0]["payload"]["status"] == "cancelled"
        await eventually(
            lambda: not [p for p in descendants(pid) if marker in cmdline(p)],
            what="the command to stop",
        )
        after = await turn(master, "Still there?")
        assert texts(after) == "Still here."
        assert rig.session(sid).process.pid == pid


# --- compaction and the single-turn profile ------------------------------------------------------


async def test_DPS_6_3_1_compaction_requested():
    """DPS-6.3.1-compact and DPS-7.2-compacted: control.session.compact makes the CLI compact (the
    model gets its compaction request) and masters get session.compacted, trigger requested, with
    the model's summary."""
    async with gateway("compact") as rig:
        session = await rig.create()
        master = await rig.attach(session["session_id"])
        await turn(master, "Tell me something to remember.")
        start_at = len(master.frames)
        await master.send("control.session.compact", {"instruction": "keep the rig facts"})
        compacted = await master.until("session.compacted", timeout=30)
        await master.until("session.turn.end", timeout=30)
        await end_of_turn(master)
        p = compacted["payload"]
        assert p["trigger"] == "requested"
        assert "e2e-compaction-summary" in p["summary"]
        # the CLI's pre_tokens/post_tokens: the context the first answer reported, then less
        assert p["previous_token_count"] >= 50000 > p["current_token_count"] > 0
        frames = master.frames[start_at:]
        assert frames[0]["type"] == "session.turn.start"
        assert {f["turn_id"] for f in frames} == {frames[0]["payload"]["turn_id"]}
        assert [r.answer for r in rig.requests] == ["call 1", "call 2"]
        compaction = json.dumps(rig.requests[1].body["messages"][-1])
        assert "CRITICAL: Respond with TEXT ONLY" in compaction
        assert "keep the rig facts" in compaction


async def test_DPS_18_respawn_oneshot_resumes_across_two_prompts(caplog):
    """DPS-18-respawn: on claude-code-oneshot each prompt is one CLI process; after the first the
    session is IDLE with no process; the second is spawned with --resume <agent session id> and the
    model gets the first exchange again; DELETE while idle ends the session at once."""
    caplog.set_level(logging.INFO, logger="rawp_gateway.session")
    async with gateway("oneshot-resume", profile="claude-code-oneshot") as rig:
        session = await rig.create()
        sid = session["session_id"]
        live = rig.session(sid)
        assert live.process is None  # nothing runs before the first prompt
        master = await rig.attach(sid)
        first = await turn(master, "Remember the number 42.")
        assert texts(first) == "I will remember 42."
        assert of(first, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        await eventually(lambda: live.process is None and not live._spawning, what="the exit")
        got = await (await rig.gw.get(f"/v1/session/{sid}")).json()
        assert got["state"] == "IDLE"
        asid = got["agent_session_id"]
        second = await turn(master, "Which number did I ask you to remember?")
        assert texts(second) == "You asked me to remember 42."
        assert of(second, "session.turn.start")[0]["payload"]["turn_index"] == 1
        await eventually(lambda: live.process is None, what="the second exit")
        argvs = [r.argv for r in caplog.records if r.getMessage() == "agent started"]
        assert len(argvs) == 2
        assert "--resume" not in argvs[0]
        assert "Remember the number 42." in argvs[0]  # one argument, whatever the layout
        i = argvs[1].index("--resume")
        assert argvs[1][i + 1] == asid
        assert "Which number did I ask you to remember?" in argvs[1]
        # call 2 only answers a request that carries the first exchange
        assert [r.answer for r in rig.requests] == ["call 1", "call 2"]
        history = json.dumps(rig.requests[1].body["messages"])
        assert "Remember the number 42." in history and "I will remember 42." in history
        assert (await (await rig.gw.get(f"/v1/session/{sid}")).json())["agent_session_id"] == asid
        # DELETE while idle: nothing to stop, the session ends at once
        start_at = len(master.frames)
        resp = await rig.gw.delete(f"/v1/session/{sid}")
        assert (await resp.json())["state"] == "TERMINATED"
        rest = await master.drain_until_closed()
        assert (
            [f["type"] for f in master.frames[start_at:]]
            == ["session.deleted"]
            == [f["type"] for f in rest]
        )


# --- masters: fan-out, reattach ---------------------------------------------------------------------


async def test_DPS_2_4_two_masters_fan_out_relay_no_echo():
    """DPS-2.4-broadcast, DPS-2.4-relay: both masters get every frame of the real CLI's turn in the
    same order; the prompt is relayed to the other master and never echoed to its sender."""
    async with gateway("turn") as rig:
        session = await rig.create()
        sid = session["session_id"]
        a = await rig.attach(sid)
        b = await rig.attach(sid)
        sent = await prompt(a, "Say hello.")
        for m in (a, b):
            await m.until("session.turn.end", timeout=30)
            await end_of_turn(m)
        relayed = of(b.frames, "control.prompt.request")
        # The very frame, with the sender named (the gateway's own token: user "admin").
        named = {**sent, "metadata": {**sent.get("metadata", {}), "rawp_user": "admin"}}
        assert len(relayed) == 1 and relayed[0] == named
        assert "control.prompt.request" not in a.types()

        def turn_frames(m: Master) -> list[str]:
            return [f["message_id"] for f in m.frames if f.get("turn_id")]

        assert turn_frames(a) == turn_frames(b)
        assert texts(b.frames) == "Hello from the scripted model, through the gateway."
        got = await (await rig.gw.get(f"/v1/session/{sid}")).json()
        assert got["connections"] == 2


async def test_DPS_7_1_history_reattach_after_a_drop_gets_exactly_the_missed_frames():
    """DPS-7.1-history: a master loses its connection (TCP abort, no close frame) in the middle of a
    real turn; on reattach with last_message_id its first frame after capabilities is
    session.history holding exactly the frames it missed, in order, not truncated."""
    async with gateway("two-turns") as rig:
        session = await rig.create()
        sid = session["session_id"]
        watcher = await rig.attach(sid)
        leaver = await rig.attach(sid)
        await turn(leaver, "The first prompt.")
        await watcher.until("session.turn.end", timeout=30)
        await end_of_turn(watcher)
        await prompt(watcher, "The second prompt.")
        await leaver.until("session.turn.start", timeout=30)
        await leaver.until("agent.text.delta", timeout=30)
        last_seen = leaver.frames[-1]["message_id"]
        leaver.drop()
        await watcher.until("session.turn.end", timeout=30)
        await end_of_turn(watcher)
        await eventually(lambda: len(rig.session(sid).connections) == 1, what="the drop noticed")
        idx = next(i for i, f in enumerate(watcher.frames) if f["message_id"] == last_seen)
        missed = watcher.frames[idx + 1 :]
        assert "agent.text.done" in [f["type"] for f in missed]
        assert "session.turn.end" in [f["type"] for f in missed]

        back = await rig.attach(sid, last_message_id=last_seen, announce=False)
        assert (await back.next())["type"] == "session.capabilities"
        history = await back.next()
        assert history["type"] == "session.history"
        replayed = history["payload"]["frames"]
        assert replayed == missed  # the very frames, byte for byte as JSON values
        status = history["payload"]["buffer_status"]
        assert status["truncated"] is False and status["lost_frame_count"] == 0
        assert status["policy_applied"] == "RING"
        assert history["payload"]["last_message_id"] == missed[-1]["message_id"]
        assert texts(missed).endswith("while a master is away.")


# --- the session's end ------------------------------------------------------------------------------


async def test_DPS_7_5_3_delete_during_a_turn(caplog):
    """DPS-7.5.3-cleanup, DPS-7.7-deleted, DPS-17.2.3-signals: DELETE while a real Bash command
    runs: the CLI ends on SIGTERM (no SIGKILL needed), the open call's result is cancelled, then
    session.turn.end error, then session.deleted, then the WebSocket closes; the CLI and the
    command's process are gone."""
    caplog.set_level(logging.INFO, logger="rawp_gateway.session")
    async with gateway("delete-mid-tool", auto_allow=frozenset({"Bash"})) as rig:
        session = await rig.create()
        sid = session["session_id"]
        master = await rig.attach(sid)
        await prompt(master, "Wait for a while.")
        request = await master.until("tool.invoke.request", timeout=30)
        pid = rig.session(sid).process.pid
        marker = "time.sleep(30)"
        tool_pids = await eventually(
            lambda: [p for p in descendants(pid) if marker in cmdline(p)], what="the command"
        )
        t0 = asyncio.get_running_loop().time()
        resp = await rig.gw.delete(f"/v1/session/{sid}")
        assert resp.status == 200
        assert (await resp.json())["state"] == "TERMINATED"
        assert asyncio.get_running_loop().time() - t0 < 5.0  # within the SIGTERM grace
        [exited] = [r for r in caplog.records if r.getMessage() == "agent exited"]
        assert exited.returncode in (143, -signal.SIGTERM), exited.returncode
        rest = await master.drain_until_closed()
        # a close frame, code 1000, after session.deleted
        assert master.end is not None and master.end.type == aiohttp.WSMsgType.CLOSE
        assert master.end.data == 1000, master.end
        types = [f["type"] for f in rest]
        assert types[-1] == "session.deleted"
        assert rest[-1]["payload"] == {
            "session_id": sid, "reason": "master_request", "deleted_by": "master",
        }  # fmt: skip
        [result] = [f for f in rest if f["type"] == "tool.invoke.result"]
        assert result["payload"]["invocation_id"] == request["payload"]["invocation_id"]
        assert result["payload"]["status"] == "cancelled"
        [end] = [f for f in rest if f["type"] == "session.turn.end"]
        assert end["payload"]["stop_reason"] == "error"
        assert types.index("tool.invoke.result") < types.index("session.turn.end")
        assert types.index("session.turn.end") < types.index("session.deleted")
        assert types.index("session.usage") == types.index("session.turn.end") + 1
        assert not group_alive(pid)
        await eventually(
            lambda: not [p for p in tool_pids if marker in cmdline(p)],
            timeout=5,
            what="the command's processes to go",
        )
        assert (await (await rig.gw.get(f"/v1/session/{sid}")).json())["state"] == "TERMINATED"


async def test_DPS_17_2_2_exit_agent_killed_by_a_signal():
    """DPS-17.2.2-exit, DPS-4.4-error: the CLI's process group gets SIGKILL mid-stream: agent.error
    fatal SIGNAL_EXIT (signal 9), then session.turn.end error, then the session ends."""
    async with gateway("hang") as rig:
        session = await rig.create()
        sid = session["session_id"]
        master = await rig.attach(sid)
        await prompt(master, "Write a long story.")
        await master.until("agent.text.delta", timeout=30)
        pid = rig.session(sid).process.pid
        os.killpg(pid, signal.SIGKILL)
        rest = await master.drain_until_closed()
        types = [f["type"] for f in rest]
        [error] = [f for f in rest if f["type"] == "agent.error"]
        p = error["payload"]
        assert (p["error_code"], p["severity"], p["recoverable"]) == ("SIGNAL_EXIT", "fatal", False)
        assert p["details"]["signal"] == signal.SIGKILL
        [end] = [f for f in rest if f["type"] == "session.turn.end"]
        assert end["payload"]["stop_reason"] == "error"
        assert types.index("agent.error") < types.index("session.turn.end")
        assert types[types.index("session.turn.end") + 1] == "session.usage"
        assert types[-1] == "session.deleted"
        assert rest[-1]["payload"]["reason"] == "error"
        assert master.end is not None and master.end.type == aiohttp.WSMsgType.CLOSE
        assert error["turn_id"] == end["turn_id"]
        got = await (await rig.gw.get(f"/v1/session/{sid}")).json()
        assert got["state"] == "TERMINATED"


# --- protocol edges and security --------------------------------------------------------------------


async def test_DPS_2_1_v_and_DPS_2_2_unknown_type_with_the_real_cli():
    """DPS-2.1-v: a v 2 prompt is answered with session.error and never reaches the CLI;
    DPS-2.2-unknown-type: unknown types (x-* and not) are ignored without an error or a disconnect;
    the session then runs a real turn."""
    async with gateway("turn") as rig:
        session = await rig.create()
        master = await rig.attach(session["session_id"])
        await master.send("x-acme.custom", {"a": 1})
        await master.send("agent.teleport", {"to": "mars"})
        bad = await master.send("control.prompt.request", {"prompt_text": "Say hello."}, v=2)
        err = await master.until("session.error")
        assert err["payload"]["error_code"] == "UNSUPPORTED_VERSION"
        assert err["payload"]["fatal"] is False
        assert err["parent_id"] == bad["message_id"]
        frames = await turn(master, "Say hello.")
        assert texts(frames) == "Hello from the scripted model, through the gateway."
        # The refused prompt started nothing: one turn, one model call, both the good prompt's.
        assert len(rig.requests) == 1 and master.types().count("session.turn.start") == 1
        assert [f for f in master.frames if f["type"] == "session.error"] == [err]


async def test_401_without_the_token():
    """docs/http-api.md Security: without the bearer token (or with a wrong one) HTTP and the
    WebSocket upgrade are 401 UNAUTHORIZED and no session or CLI is started; with it a real turn
    runs."""
    async with gateway("turn", token="e2e-s3cret") as rig:
        gw = rig.gw
        for headers in (None, {"Authorization": "Bearer wrong"}):
            resp = await gw.post("/v1/session", json={"agent": "claude-code"}, headers=headers)
            assert resp.status == 401
            assert (await resp.json())["error_code"] == "UNAUTHORIZED"
        assert gw.server.app[SESSIONS] == {}
        session = await rig.create()
        sid = session["session_id"]
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await Master.attach(gw, sid)
        assert refused.value.status == 401
        resp = await gw.get(f"/v1/session/{sid}")
        assert resp.status == 401
        master = await rig.attach(sid)
        frames = await turn(master, "Say hello.")
        assert texts(frames) == "Hello from the scripted model, through the gateway."


@pytest.mark.parametrize("max_frame_size", [None, 16384], ids=["default-1MiB", "16KiB"])
async def test_10_mib_tool_output_is_cut_below_max_frame_size(max_frame_size):
    """docs/http-api.md (a frame is never larger than max_frame_size; long tool output is cut and
    marked truncated), DPS-5.3.1-result: a real Bash command prints 10 MiB. The CLI itself keeps
    30000 characters (and says how much there was): truncated true at the default 1 MiB limit; at
    16 KiB the gateway cuts further. Every frame fits; the session keeps working."""
    kw = {} if max_frame_size is None else {"max_frame_size": max_frame_size}
    async with gateway("big-output", auto_allow=frozenset({"Bash"}), **kw) as rig:
        limit = rig.gw.server.app[CONFIG].server.max_frame_size
        assert limit == (max_frame_size or 1024 * 1024)
        session = await rig.create()
        sid = session["session_id"]
        master = await rig.attach(sid)
        frames = await turn(master, "Print a lot.", timeout=60)
        [result] = of(frames, "tool.invoke.result")
        p = result["payload"]
        assert (p["tool_name"], p["status"], p["truncated"]) == ("Bash", "success", True)
        assert set(p["output"]) == {"x"}
        assert 1000 < len(p["output"]) <= 30000 < 10485760
        if max_frame_size is not None:
            assert len(p["output"]) < max_frame_size
        encoded = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
        assert len(encoded) <= limit
        for f in master.frames:
            size = len(json.dumps(f, separators=(",", ":"), ensure_ascii=False).encode())
            assert size <= limit, (f["type"], size)
        assert texts(frames) == "That was a lot of output."
        after = await turn(master, "Still there?")
        assert texts(after) == "Still here."


async def test_DPS_6_1_2_cancel_while_a_permission_is_pending():
    """DPS-6.1.2-cancel with DPS-6.2-interaction: cancelling while the CLI waits for a permission
    answer denies it, gives the call a cancelled result and ends the turn cancelled; the file is
    not written and the session keeps working."""
    async with gateway("cancel-permission") as rig:
        _, master, start_at, start = await first_turn(rig, "Write never.txt.")
        request = await master.until("tool.invoke.request", timeout=30)
        ask = await master.until("agent.interaction.request", timeout=30)
        await master.send("control.prompt.cancel", {"target_turn_id": start["payload"]["turn_id"]})
        end = await master.until("session.turn.end", timeout=15)
        assert end["payload"]["stop_reason"] == "cancelled"
        await end_of_turn(master)
        frames = master.frames[start_at:]
        [result] = of(frames, "tool.invoke.result")
        assert result["payload"]["invocation_id"] == request["payload"]["invocation_id"]
        assert result["payload"]["status"] == "cancelled", result
        assert not (rig.cli.cwd / "never.txt").exists()
        late = await master.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
        )
        err = await master.until("session.error")
        assert err["payload"]["error_code"] == "INTERACTION_NOT_FOUND"
        assert err["parent_id"] == late["message_id"]
        after = await turn(master, "Still there?")
        assert texts(after) == "Still here."
        assert not (rig.cli.cwd / "never.txt").exists()


async def test_DPS_7_1_history_detached_session_reattach_answers_the_pending_permission():
    """DPS-7.1-history with the session DETACHED: the only master drops while the real CLI waits
    for a permission answer; the session keeps the CLI and the question; on reattach the master gets
    session.history (nothing new was missed) and the question again, answers it, and the turn
    finishes with the file written."""
    async with gateway("drop-permission") as rig:
        session = await rig.create()
        sid = session["session_id"]
        master = await rig.attach(sid)
        await prompt(master, "Write after-drop.txt.")
        ask = await master.until("agent.interaction.request", timeout=30)
        await master.until("agent.state.changed", current_state="awaiting_input")
        last_seen = master.frames[-1]["message_id"]
        pid = rig.session(sid).process.pid
        master.drop()
        await eventually(lambda: rig.session(sid).state == "DETACHED", what="DETACHED")
        got = await (await rig.gw.get(f"/v1/session/{sid}")).json()
        assert (got["state"], got["connections"]) == ("DETACHED", 0)

        back = await rig.attach(sid, last_message_id=last_seen)
        assert (await back.next())["type"] == "session.capabilities"
        history = await back.next()
        assert history["type"] == "session.history"
        assert history["payload"]["frames"] == []
        assert history["payload"]["buffer_status"]["truncated"] is False
        again = await back.until("agent.interaction.request")
        assert again == ask  # the same frame, sent again to the new connection
        await back.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
        )
        await back.until("session.turn.end", timeout=30)
        await end_of_turn(back)
        assert (rig.cli.cwd / "after-drop.txt").read_text() == "written after a reattach\n"
        assert texts(back.frames) == "Written after all."
        assert rig.session(sid).process.pid == pid


async def test_DPS_7_7_deleted_reattach_window_runs_out_mid_turn(caplog):
    """DPS-7.7-deleted (reason timeout), DPS-17.2.3-signals: the only master drops mid-turn and
    does not come back within reattach_window_sec; the session ends and the real CLI is stopped."""
    watch_sessions(caplog)
    async with gateway("hang") as rig:
        session = await rig.create(reattach_window_sec=0.5)
        sid = session["session_id"]
        master = await rig.attach(sid)
        await prompt(master, "Write a long story.")
        await master.until("agent.text.delta", timeout=30)
        pid = rig.session(sid).process.pid
        master.drop()
        live = rig.session(sid)
        await live.terminated.wait()
        assert deletions(caplog, sid) == [("timeout", "system")]
        await eventually(lambda: not group_alive(pid), timeout=10, what="the CLI to be stopped")
        assert live.machine.turn is None
        # nobody was attached, but the turn was still ended the DPS way (error) before the end
        metrics = await (await rig.gw.get("/metrics")).text()
        assert 'rawp_gateway_turns_total{stop_reason="error"} 1.0' in metrics
        resp = await rig.gw.get(f"/v1/session/{sid}")
        assert (await resp.json())["state"] == "TERMINATED"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await rig.attach(sid)
        assert refused.value.status == 409


async def test_DPS_6_1_2_cancel_on_the_oneshot_profile():
    """DPS-6.1.2-cancel on claude-code-oneshot (no stdin stream to send an interrupt on): the
    turn still ends cancelled, promptly, with the text block cancelled; the next prompt respawns
    the CLI with --resume and is answered (DPS-18-respawn)."""
    async with gateway("oneshot-cancel", profile="claude-code-oneshot") as rig:
        sid, master, start_at, start = await first_turn(rig, "Write a long story.")
        await master.until("agent.text.delta", timeout=30)
        # SIGINT at once, not after a grace: with every escalation timer far beyond the test's own
        # limit, the turn can end only by the signal the cancel sends itself.
        live = rig.session(sid)
        live.machine.config = replace(
            live.machine.config, cancel_sigint_sec=3600.0, cancel_stop_sec=3600.0
        )
        await master.send("control.prompt.cancel", {"target_turn_id": start["payload"]["turn_id"]})
        end = await master.until("session.turn.end", timeout=15)
        assert end["payload"]["stop_reason"] == "cancelled"
        await end_of_turn(master)
        frames = master.frames[start_at:]
        done = of(frames, "agent.text.done")
        assert done and done[-1]["payload"].get("is_cancelled") is True
        assert "agent.error" not in [f["type"] for f in frames]
        await eventually(lambda: live.process is None, what="the exit")
        assert live.state == "IDLE"
        after = await turn(master, "Still there?")
        assert texts(after) == "Still here."


async def test_DPS_6_3_2_plan_mode_blocks_a_write_on_the_oneshot_profile(caplog):
    """DPS-6.3.2-mode and DPS-6.3.2-block on claude-code-oneshot: the mode is switched while no
    process runs, the next spawn carries --permission-mode plan, and the Write the CLI refuses
    itself reaches masters as the DPS block result; the file is not written."""
    caplog.set_level(logging.INFO, logger="rawp_gateway.session")
    async with gateway("oneshot-plan", profile="claude-code-oneshot") as rig:
        session = await rig.create()
        master = await rig.attach(session["session_id"])
        await master.send("control.mode.switch", {"mode": "plan"})
        change = await master.until("agent.state.changed", reason="mode_switch")
        assert change["metadata"]["mode"] == "plan"
        frames = await turn(master, "Create plan.txt.")
        assert frames[0]["payload"]["mode"] == "plan"
        [argv] = [r.argv for r in caplog.records if r.getMessage() == "agent started"]
        assert argv[argv.index("--permission-mode") + 1] == "plan"
        [request] = of(frames, "tool.invoke.request")
        [result] = of(frames, "tool.invoke.result")
        assert request["payload"]["tool_name"] == "Write"
        assert result["payload"]["status"] == "error"
        assert result["payload"]["output"] == "Tool not allowed in current mode"
        assert not (rig.cli.cwd / "plan.txt").exists()


async def test_api_error_ends_the_turn_and_the_session_goes_on():
    """DPS-4.4-error, DPS-7.5.2-end: the model API fails (HTTP 500, retried once by the CLI): a
    recoverable API_RETRY warning, a non-fatal API_ERROR, the turn ends with error; the long-lived
    CLI stays and the next prompt is answered."""
    async with gateway("api-error") as rig:
        session = await rig.create()
        sid = session["session_id"]
        master = await rig.attach(sid)
        start_at = len(master.frames)
        await prompt(master, "Say hello.")
        end = await master.until("session.turn.end", timeout=30)
        await end_of_turn(master, idle=False)
        assert end["payload"]["stop_reason"] == "error"
        errors = [f["payload"] for f in of(master.frames[start_at:], "agent.error")]
        assert [(e["error_code"], e["severity"]) for e in errors] == [
            ("API_RETRY", "warning"),
            ("API_ERROR", "error"),
        ]
        assert errors[0]["recoverable"] is True
        assert errors[1]["details"]["http_status"] == 500
        assert "500" in errors[1]["message"]
        pid = rig.session(sid).process.pid
        after = await turn(master, "Try again.")
        assert texts(after) == "Working again."
        assert rig.session(sid).process.pid == pid
        assert [r.answer for r in rig.requests] == ["call 1", "call 2", "call 3"]


async def test_DPS_18_respawn_oneshot_exit_1_terminates_the_session():
    """DPS-18-respawn, DPS-17.2.2-exit: on claude-code-oneshot the CLI exits 1 after an API error:
    the turn ends with error, then agent.error fatal AGENT_EXIT, then the session ends."""
    async with gateway("api-error", profile="claude-code-oneshot") as rig:
        session = await rig.create()
        sid = session["session_id"]
        master = await rig.attach(sid)
        await prompt(master, "Say hello.")
        rest = await master.drain_until_closed(timeout=30)
        types = [f["type"] for f in rest]
        [end] = [f for f in rest if f["type"] == "session.turn.end"]
        assert end["payload"]["stop_reason"] == "error"
        fatal = [f["payload"] for f in rest if f["type"] == "agent.error"][-1]
        assert (fatal["error_code"], fatal["severity"]) == ("AGENT_EXIT", "fatal")
        assert fatal["details"]["exit_code"] == 1
        assert types.index("session.turn.end") < len(types) - 2
        assert types[-2:] == ["agent.error", "session.deleted"]
        assert rest[-1]["payload"]["reason"] == "error"
        got = await (await rig.gw.get(f"/v1/session/{sid}")).json()
        assert got["state"] == "TERMINATED"


async def test_DPS_10_subagent_and_DPS_12_2_filter_per_master():
    """DPS-10.1-request, DPS-10.2-context, DPS-10.3-order with the real CLI's foreground subagent,
    and DPS-12.2-filter / DPS-10.6-caps: a master that announced nothing gets no thinking, no
    subagent frames and no subagent_context, but the same tool calls and results."""
    async with gateway("subagent", auto_allow=frozenset({"Agent", "Task", "Bash"})) as rig:
        session = await rig.create()
        sid = session["session_id"]
        full = await rig.attach(sid)
        plain = await rig.attach(sid, features=Features())
        frames = await turn(full, "Delegate a check.")
        await plain.until("session.turn.end", timeout=30)
        await end_of_turn(plain)
        types = [f["type"] for f in frames]
        assert "agent.thinking.delta" in types and "agent.thinking.done" in types
        agent_req = next(
            f for f in of(frames, "tool.invoke.request") if f["payload"]["tool_name"] == "Agent"
        )
        inv = agent_req["payload"]["invocation_id"]
        assert agent_req["payload"]["subagent"]["agent_type"] == "general-purpose"
        assert agent_req["payload"]["subagent"]["description"] == "Check the workspace"
        bash_req = next(
            f for f in of(frames, "tool.invoke.request") if f["payload"]["tool_name"] == "Bash"
        )
        context = bash_req["metadata"]["subagent_context"]
        assert context["parent_invocation_id"] == inv and context["depth"] == 1
        [bash_res] = [
            f for f in of(frames, "tool.invoke.result") if f["payload"]["tool_name"] == "Bash"
        ]
        assert "sub-e2e" in bash_res["payload"]["output"]
        assert bash_res["metadata"]["subagent_context"]["parent_invocation_id"] == inv
        [agent_res] = [
            f for f in of(frames, "tool.invoke.result") if f["payload"]["invocation_id"] == inv
        ]
        assert agent_res["payload"]["output_type"] == "agent_result"
        assert "sub-e2e" in json.dumps(agent_res["payload"]["output"])
        # request → started → inner frames → ended → result
        ids = [f["message_id"] for f in frames]
        started = next(f for f in frames if f["type"] == "agent.subagent.started")
        ended = next(f for f in frames if f["type"] == "agent.subagent.ended")
        assert ended["payload"]["status"] in ("completed", "success")
        order = [agent_req, started, bash_req, bash_res, ended, agent_res]
        positions = [ids.index(f["message_id"]) for f in order]
        assert positions == sorted(positions), [f["type"] for f in order]
        done = {
            f["payload"]["full_text"]: (f.get("metadata") or {}).get("subagent_context")
            for f in of(frames, "agent.text.done")
        }
        assert done["I will delegate this."] is None  # the main agent's frames carry none
        assert done["The subagent reports the command printed sub-e2e."] is None
        # the plain master
        plain_types = plain.types()
        assert not [t for t in plain_types if t.startswith(("agent.thinking", "agent.subagent"))]
        assert not [f for f in plain.frames if "subagent_context" in (f.get("metadata") or {})]
        expected = [
            f["message_id"]
            for f in frames
            if f["type"].startswith("tool.invoke.") and f["type"] != "tool.invoke.stream"
        ]
        got = [
            f["message_id"]
            for f in plain.frames
            if f["type"].startswith("tool.invoke.") and f["type"] != "tool.invoke.stream"
        ]
        assert got == expected


async def test_DPS_6_3_1_auto_compaction():
    """DPS-6.3.1-auto and DPS-7.2-compacted: the CLI compacts on its own before a prompt (its
    context was nearly full): session.compacted trigger auto inside that prompt's turn, then the
    answer."""
    async with gateway("compact-auto") as rig:
        session = await rig.create()
        master = await rig.attach(session["session_id"])
        first = await turn(master, "First message.")
        assert of(first, "session.usage")[0]["payload"]["context_window"]["utilization"] > 0.9
        second = await turn(master, "Second message.")
        [compacted] = of(second, "session.compacted")
        p = compacted["payload"]
        assert p["trigger"] == "auto"
        assert "e2e-auto-summary" in p["summary"]
        assert p["previous_token_count"] >= 990000 > p["current_token_count"]
        assert compacted["turn_id"] == second[0]["payload"]["turn_id"]
        assert texts(second).endswith("Answer to the second message after compaction.")
        assert [r.answer for r in rig.requests] == ["call 1", "call 2", "call 3"]


async def test_DPS_6_1_1_prompt_config_overrides_allowed_and_denied_tools():
    """DPS-6.1.1-prompt: a prompt's config_overrides are honoured for its turn: allowed_tools runs
    Bash without asking, denied_tools refuses it without asking (the command does not run), and
    the next prompt without overrides asks a master again."""
    async with gateway("overrides") as rig:
        session = await rig.create()
        master = await rig.attach(session["session_id"])

        async def run(text: str, overrides: dict[str, Any] | None) -> list[dict[str, Any]]:
            start = len(master.frames)
            body: dict[str, Any] = {"prompt_text": text}
            if overrides:
                body["config_overrides"] = overrides
            await master.send("control.prompt.request", body)
            while True:
                frame = await master.next(timeout=30)
                if frame["type"] == "agent.interaction.request":
                    await master.send(
                        "control.interaction.response",
                        {
                            "interaction_id": frame["payload"]["interaction_id"],
                            "selected_value": "allow",
                        },
                    )
                if frame["type"] == "session.turn.end":
                    await end_of_turn(master)
                    return master.frames[start:]

        one = await run("Run one.", {"allowed_tools": ["Bash"]})
        assert "agent.interaction.request" not in [f["type"] for f in one]
        [result] = of(one, "tool.invoke.result")
        assert result["payload"]["status"] == "success"
        assert (rig.cli.cwd / "override-one.txt").exists()

        two = await run("Run two.", {"denied_tools": ["Bash"]})
        assert "agent.interaction.request" not in [f["type"] for f in two]
        [result] = of(two, "tool.invoke.result")
        assert result["payload"]["status"] == "error"
        assert not (rig.cli.cwd / "override-two.txt").exists()
        assert "denied" in result_text(tool_results_sent(rig)[-1])

        three = await run("Run three.", None)
        assert len(of(three, "agent.interaction.request")) == 1
        [result] = of(three, "tool.invoke.result")
        assert result["payload"]["status"] == "success"
        assert (rig.cli.cwd / "override-three.txt").exists()


async def test_DPS_6_1_1_oneshot_prompt_starting_with_a_dash_is_a_prompt(caplog):
    """DPS-6.1.1-prompt, docs/http-api.md (nothing in a frame becomes part of a command line except
    through the profile's templates): on claude-code-oneshot a prompt that starts with "-" (a
    Markdown list, or "--version") reaches the model as the prompt, not as a CLI option, also when
    the gateway adds --resume and --permission-mode to the command line."""
    caplog.set_level(logging.INFO, logger="rawp_gateway.session")
    async with gateway("oneshot-dash", profile="claude-code-oneshot") as rig:
        session = await rig.create()
        sid = session["session_id"]
        master = await rig.attach(sid)
        first = await turn(master, "- say hello\n- then stop")
        assert texts(first) == "Hello, as listed."
        live = rig.session(sid)
        await eventually(lambda: live.process is None and not live._spawning, what="the exit")
        await master.send("control.mode.switch", {"mode": "plan"})
        await master.until("agent.state.changed", reason="mode_switch")
        second = await turn(master, "--version")
        assert texts(second) == "Not a version: a prompt."
        argvs = [r.argv for r in caplog.records if r.getMessage() == "agent started"]
        assert argvs[1][-2:] == ["--", "--version"]
        assert {"--resume", "--permission-mode"} <= set(argvs[1][: argvs[1].index("--")])
        assert [r.answer for r in rig.requests] == ["call 1", "call 2"]
