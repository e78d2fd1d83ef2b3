"""End to end with the real Codex and Gemini CLIs: the real gateway server (``create_app``) spawns
the pinned CLI through its built-in profile (``codex``, ``gemini``) against the rig's scripted model
API, and a real WebSocket master drives it.

Each test asserts what came out of the CLI through parser, mapper, session machine and server:
frame sequences and payloads, and the model requests the scripted server received. The profiles
are the built-in ones with only the binary, the rig's environment and (Gemini) a fixed model
changed, so the argv templates, the resume mechanism and stdin handling are the ones users get.
Scenarios are written here (``parse_scenario``): they hold only the model's answers and the
workspace files, since the gateway, not the rig's runner, starts the CLI.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from tests.support import realcli
from tests.support.gateway_peer import of, prompt_and_wait
from tests.support.inside import PROBE, check_probe, saved
from tests.support.realcli import MODES, Rig

pytestmark = pytest.mark.realcli


def gateway(
    agent: str,
    calls: list[dict[str, Any]],
    *,
    server: dict[str, Any] | None = None,
    mode: str | None = None,
    **run: Any,
) -> contextlib.AbstractAsyncContextManager[Rig]:
    """The real-CLI gateway of the built-in ``agent`` profile answering ``calls``; ``run``: the
    scenario's run table (``files``, ...); ``server``: ``Config`` fields; ``mode``: the isolation
    (default: the suite's, ``realcli.isolation``)."""
    return realcli.gateway(
        realcli.scenario(agent, calls, **run), agent, server=server, isolation_mode=mode
    )


def text_of(frames: list[dict[str, Any]]) -> str:
    return "".join(f["payload"]["full_text"] for f in of(frames, "agent.text.done"))


def check_turn(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """DPS-7.5.1-start, DPS-2.1-turn-id, DPS-5.3.1-result: the turn's frames in order; returns
    its usage payload."""
    start = next(i for i, f in enumerate(frames) if f["type"] == "session.turn.start")
    turn_id = frames[start]["payload"]["turn_id"]
    assert all(f.get("turn_id") == turn_id for f in frames[start:])
    requests = {f["payload"]["invocation_id"] for f in of(frames, "tool.invoke.request")}
    results = [f["payload"]["invocation_id"] for f in of(frames, "tool.invoke.result")]
    assert sorted(results) == sorted(requests)
    assert frames[-2]["type"] == "session.turn.end" and frames[-1]["type"] == "session.usage"
    return frames[-1]["payload"]


# --- Codex --------------------------------------------------------------------------------------

CODEX_SHELL = [
    {"output": [{"type": "function_call", "name": "exec_command", "arguments": {"cmd": PROBE}}]},
    {
        "match": {"tool_output": True, "input_contains": "hi"},
        "output": [{"type": "message", "text": "The command printed hi."}],
    },
]


@pytest.mark.parametrize("mode", MODES)
async def test_codex_prompt_with_a_shell_command(mode):
    """A prompt whose answer runs a command: shell request and its one result (exit 0 →
    success, the command's output), the text, end_turn and the turn's usage. In both isolation
    modes: the command says where it ran, and Codex saved its thread in the session's HOME."""
    async with gateway("codex", CODEX_SHELL, mode=mode) as rig:
        session_id, master = await rig.master()
        frames = await prompt_and_wait(master, "Run echo.")
        usage = check_turn(frames)
        (request,) = of(frames, "tool.invoke.request")
        (result,) = of(frames, "tool.invoke.result")
        assert request["payload"]["tool_name"] == "shell"
        assert PROBE in request["payload"]["input"]["command"]
        assert result["payload"]["status"] == "success"
        box = realcli.isolation(mode)
        check_probe(
            result["payload"]["output"], box.sandboxed, rig.home(session_id), box.system_root
        )
        assert saved(rig.home(session_id), ".codex/sessions/**/rollout-*.jsonl")
        assert result["payload"]["output_type"] == "text"
        assert text_of(frames) == "The command printed hi."
        assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        assert usage["token_usage"]["input_tokens"] > 0
        info = await rig.info(session_id)
        assert info["state"] == "IDLE" and info["agent_session_id"]


async def test_codex_profile_runs_commands_where_codex_sandbox_cannot_start():
    """The profile turns Codex's own sandbox off (docs/codex-mapping.md, "Codex's sandbox"). Here
    Codex's home is under the temp dir, where with a system bwrap older than 0.9 its sandbox could
    start no command ("bwrap: execvp codex-linux-sandbox"; the default read-only sandbox also
    refuses every write: fixture sandbox-denied): the command runs and writes in the workspace."""
    cmd = "echo made > made.txt && cat made.txt"
    calls = [
        {"output": [{"type": "function_call", "name": "exec_command", "arguments": {"cmd": cmd}}]},
        {"match": {"tool_output": True}, "output": [{"type": "message", "text": "Made."}]},
    ]
    async with gateway("codex", calls, env={"TMPDIR": "{home}"}) as rig:
        assert rig.cli.env["CODEX_HOME"].startswith(rig.cli.env["TMPDIR"])
        _, master = await rig.master()
        frames = await prompt_and_wait(master, "Make a file.")
        check_turn(frames)
        (result,) = of(frames, "tool.invoke.result")
        assert (result["payload"]["status"], result["payload"]["output"]) == ("success", "made\n")
        assert (rig.cli.cwd / "made.txt").read_text() == "made\n"


async def test_codex_second_prompt_resumes_the_thread():
    """DPS-18-respawn: the second prompt runs ``codex exec resume <thread_id>``: the model gets
    the first exchange again, the thread id stays, and the usage is the turn's own share of the
    thread's cumulative count."""
    calls = [
        {
            "match": {"last_user_contains": "Remember the number"},
            "output": [{"type": "message", "text": "I will remember 42."}],
        },
        {
            "match": {
                "last_user_contains": "Which number",
                "input_contains": "I will remember 42.",
            },
            "output": [{"type": "message", "text": "You asked me to remember 42."}],
        },
    ]
    async with gateway("codex", calls) as rig:
        session_id, master = await rig.master()
        first = await prompt_and_wait(master, "Remember the number 42.")
        thread = (await rig.info(session_id))["agent_session_id"]
        second = await prompt_and_wait(master, "Which number did I ask you to remember?")
        assert text_of(first) == "I will remember 42."
        assert text_of(second) == "You asked me to remember 42."
        assert (await rig.info(session_id))["agent_session_id"] == thread
        assert len(rig.requests) == 2 and not rig.cli.server.unexpected
        u1, u2 = check_turn(first)["token_usage"], check_turn(second)["token_usage"]
        # Each model call is answered with the same small usage: the second turn's share equals
        # the first turn's, although the CLI reports the thread's sum.
        assert (u2["input_tokens"], u2["output_tokens"]) == (
            u1["input_tokens"],
            u1["output_tokens"],
        )


async def test_codex_http_error_is_an_agent_error_with_a_readable_code():
    """An HTTP 401 from the model API: agent.error API_UNAUTHORIZED (http_status 401), the turn
    ends with error, and the exit 1 that follows is a fatal agent.error named the same (DPS-4.4,
    DPS-17.2.2), then the session ends."""
    calls = [{"error": {"status": 401, "message": "Incorrect API key provided."}}]
    async with gateway("codex", calls) as rig:
        _, master = await rig.master()
        await master.send("control.prompt.request", {"prompt_text": "Say hello."})
        frames = await master.drain_until_closed(timeout=60)
        errors = [f["payload"] for f in of(frames, "agent.error")]
        assert [(e["error_code"], e["severity"]) for e in errors] == [
            ("API_UNAUTHORIZED", "error"),
            ("API_UNAUTHORIZED", "fatal"),
        ]
        assert errors[0]["details"]["http_status"] == 401
        assert "Incorrect API key provided." in errors[0]["message"]
        assert errors[1]["details"]["exit_code"] == 1
        types = [f["type"] for f in frames]
        assert types.index("session.turn.end") < types.index("session.deleted")
        assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "error"


async def test_codex_file_change_is_a_diff_when_the_workspace_shows_one():
    """apply_patch through the real CLI: one request and one result for the file_change item;
    the result is a unified diff when the gateway read the file before the patch landed, else
    the list of changes as text (never a guessed diff)."""
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch\n"
    calls = [
        {"output": [{"type": "custom_tool_call", "name": "apply_patch", "input": patch}]},
        {"match": {"tool_output": True}, "output": [{"type": "message", "text": "Added."}]},
    ]
    async with gateway("codex", calls) as rig:
        _, master = await rig.master()
        frames = await prompt_and_wait(master, "Add hello.txt.")
        check_turn(frames)
        (request,) = of(frames, "tool.invoke.request")
        (result,) = of(frames, "tool.invoke.result")
        path = str(rig.cli.cwd / "hello.txt")
        assert request["payload"]["tool_name"] == "apply_patch"
        assert request["payload"]["input"]["changes"] == [{"path": path, "kind": "add"}]
        assert result["payload"]["status"] == "success"
        assert result["payload"]["output_type"] == "diff"  # an added file needs no "before"
        assert result["payload"]["output"] == f"--- /dev/null\n+++ {path}\n@@ -0,0 +1 @@\n+hello\n"


# --- Gemini ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_gemini_prompt_with_a_shell_command(mode):
    """In both isolation modes: the command says where it ran, and Gemini CLI saved its session
    in the session's HOME."""
    calls = [
        {
            "parts": [
                {"text": "I will run a command."},
                {"functionCall": {"name": "run_shell_command", "args": {"command": PROBE}}},
            ]
        },
        {
            "match": {"function_response": True, "contents_contain": "hi"},
            "parts": [{"text": "The command printed hi."}],
        },
    ]
    async with gateway("gemini", calls, mode=mode) as rig:
        session_id, master = await rig.master()
        frames = await prompt_and_wait(master, "Run echo.")
        usage = check_turn(frames)
        (request,) = of(frames, "tool.invoke.request")
        (result,) = of(frames, "tool.invoke.result")
        assert request["payload"]["tool_name"] == "run_shell_command"
        assert request["payload"]["input"]["command"] == PROBE
        assert result["payload"]["status"] == "success"
        box = realcli.isolation(mode)
        check_probe(
            result["payload"]["output"], box.sandboxed, rig.home(session_id), box.system_root
        )
        assert saved(rig.home(session_id), ".gemini/tmp/*/chats/session-*.jsonl")
        assert [f["payload"]["full_text"] for f in of(frames, "agent.text.done")] == [
            "I will run a command.",
            "The command printed hi.",
        ]
        assert not of(frames, "agent.thinking.delta")
        assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        assert usage["token_usage"]["input_tokens"] > 0
        info = await rig.info(session_id)
        assert info["state"] == "IDLE" and info["agent_session_id"]


async def test_gemini_second_prompt_resumes_the_session():
    """DPS-18-respawn: the second prompt runs with ``--resume <session_id>``: the model gets the
    first exchange again and the session id stays."""
    calls = [
        {"match": {"last_user_contains": "Remember the number"}, "parts": [{"text": "I will."}]},
        {
            "match": {"last_user_contains": "Which number", "contents_contain": "I will."},
            "parts": [{"text": "You asked me to remember 42."}],
        },
    ]
    async with gateway("gemini", calls) as rig:
        session_id, master = await rig.master()
        first = await prompt_and_wait(master, "Remember the number 42.")
        agent_session = (await rig.info(session_id))["agent_session_id"]
        second = await prompt_and_wait(master, "Which number did I ask you to remember?")
        check_turn(first)
        check_turn(second)
        assert text_of(second) == "You asked me to remember 42."
        assert (await rig.info(session_id))["agent_session_id"] == agent_session
        assert len(rig.requests) == 2 and not rig.cli.server.unexpected


async def test_DPS_6_1_1_prompt_starting_with_a_dash_reaches_the_model_on_both():
    """DPS-6.1.1-prompt: a prompt that starts with "-" (a Markdown list, or "--version") is the
    prompt, never a CLI option (Codex puts it after "--", Gemini in one "--prompt=" argument)."""
    for agent in ("codex", "gemini"):
        if agent == "codex":
            calls = [{"output": [{"type": "message", "text": "Listed."}]}]
        else:
            calls = [
                {"match": {"last_user_contains": "- say hello"}, "parts": [{"text": "Listed."}]}
            ]
        async with gateway(agent, calls) as rig:
            _, master = await rig.master()
            frames = await prompt_and_wait(master, "- say hello\n- then stop")
            check_turn(frames)
            assert text_of(frames) == "Listed.", agent
            assert len(rig.requests) == 1 and not rig.cli.server.unexpected
            assert "- say hello" in json.dumps(rig.requests[0].body)


async def test_gemini_http_error_is_an_agent_error_with_a_readable_code():
    """HTTP 400: the CLI exits 144 (400 cut to 8 bits), which DPS-17.2.2 alone would call signal
    16; the fatal agent.error says API_BAD_REQUEST with the API's message, exit code 144 in
    details, and the session ends."""
    calls = [{"error": {"status": 400, "message": "Request contains an invalid argument."}}]
    async with gateway("gemini", calls) as rig:
        _, master = await rig.master()
        await master.send("control.prompt.request", {"prompt_text": "Say hello."})
        frames = await master.drain_until_closed(timeout=60)
        errors = [f["payload"] for f in of(frames, "agent.error")]
        assert [(e["error_code"], e["severity"]) for e in errors] == [
            ("API_BAD_REQUEST", "error"),
            ("API_BAD_REQUEST", "fatal"),
        ]
        fatal = errors[1]
        assert fatal["details"]["exit_code"] == 144 and "signal" not in fatal["details"]
        assert "HTTP 400" in fatal["message"]
        assert fatal["message"].endswith("Request contains an invalid argument.")
        assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "error"
        assert frames[-1]["type"] == "session.deleted"


async def test_gemini_file_edits_are_diffs_read_from_the_workspace():
    """replace and write_file through the real CLI (yolo): one request and one result each, and
    each result the unified diff of what the file became (read before and after the call)."""
    calls = [
        {
            "parts": [
                {
                    "functionCall": {
                        "name": "replace",
                        "args": {
                            "file_path": "{workspace}/notes.txt",
                            "old_string": "beta",
                            "new_string": "gamma",
                            "instruction": "Rename beta to gamma.",
                        },
                    }
                },
                {
                    "functionCall": {
                        "name": "write_file",
                        "args": {"file_path": "{workspace}/hello.txt", "content": "hello\n"},
                    }
                },
            ]
        },
        {"match": {"function_response": True}, "parts": [{"text": "Done."}]},
    ]
    async with gateway("gemini", calls, files={"notes.txt": "alpha\nbeta\n"}) as rig:
        _, master = await rig.master()
        frames = await prompt_and_wait(master, "Change beta to gamma and add hello.txt.")
        check_turn(frames)
        requests = of(frames, "tool.invoke.request")
        assert [r["payload"]["tool_name"] for r in requests] == ["replace", "write_file"]
        assert len({r["payload"]["parallel_group_id"] for r in requests}) == 1
        results = {
            r["payload"]["tool_name"]: r["payload"] for r in of(frames, "tool.invoke.result")
        }
        notes, hello = rig.cli.cwd / "notes.txt", rig.cli.cwd / "hello.txt"
        assert notes.read_text() == "alpha\ngamma\n" and hello.read_text() == "hello\n"
        assert results["replace"]["output_type"] == "diff"
        assert results["replace"]["output"] == (
            f"--- {notes}\n+++ {notes}\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+gamma\n"
        )
        assert results["write_file"]["output_type"] == "diff"
        assert (
            results["write_file"]["output"]
            == f"--- /dev/null\n+++ {hello}\n@@ -0,0 +1 @@\n+hello\n"
        )


# --- cancel, for both -------------------------------------------------------------------------------

CANCEL_CALLS = {
    "codex": [
        {"output": [{"type": "message", "text": "Hello, I am still typ"}], "hang": True},
        {
            "match": {"last_user_contains": "Again"},
            "output": [{"type": "message", "text": "Back again."}],
        },
    ],
    "gemini": [
        {"parts": [{"text": "Hello, I am still typing"}], "hang": True},
        {"match": {"last_user_contains": "Again"}, "parts": [{"text": "Back again."}]},
    ],
}


@pytest.mark.parametrize("agent", ["codex", "gemini"])
async def test_DPS_6_1_2_cancel_mid_stream_then_the_next_prompt_resumes(agent: str):
    """DPS-6.1.2-cancel: control.prompt.cancel while the model is still streaming stops the CLI
    (SIGINT; codex exec then exits 1, Gemini 0): the turn ends cancelled, no fatal error, the
    session stays IDLE and the next prompt resumes the agent's session."""
    async with gateway(agent, CANCEL_CALLS[agent]) as rig:
        session_id, master = await rig.master()
        start = len(master.frames)
        await master.send("control.prompt.request", {"prompt_text": "Say hello slowly."})
        turn_start = await master.until("session.turn.start")
        await master.until("agent.text.delta", timeout=60)
        await master.send(
            "control.prompt.cancel", {"target_turn_id": turn_start["payload"]["turn_id"]}
        )
        end = await master.until("session.turn.end", timeout=30)
        assert end["payload"]["stop_reason"] == "cancelled"
        assert (await master.next())["type"] == "session.usage"
        frames = master.frames[start:]
        assert not of(frames, "agent.error")
        (done,) = of(frames, "agent.text.done")
        assert done["payload"]["full_text"].startswith("Hello, I am still typ")
        if agent == "gemini":
            # Its chunks were still coming: the block was cut off.
            assert done["payload"]["is_cancelled"] is True
        agent_session = (await rig.info(session_id))["agent_session_id"]
        assert (await rig.info(session_id))["state"] == "IDLE" and agent_session
        frames = await prompt_and_wait(master, "Again, please.")
        check_turn(frames)
        assert text_of(frames) == "Back again."
        assert of(frames, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        assert (await rig.info(session_id))["agent_session_id"] == agent_session
