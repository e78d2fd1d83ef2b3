"""Recorded ACP transcripts (``tests/fixtures/acp/``, both directions, made by
``tests/support/rig/record_acp.py`` from the real agents) replayed by ``rawp-gateway translate --agent acp``:
the frames a master would have got, checked against the conformance rules every agent is held to."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.translate import translate
from gateway.protocol import codec
from tests.support import frame_checks
from tests.support.paths import FIXTURES

ACP = FIXTURES / "acp"
TRANSCRIPTS = sorted(ACP.glob("*.jsonl"))


def replay(path: Path) -> tuple[list[Any], list[dict[str, Any]], int]:
    out, err = io.BytesIO(), io.StringIO()
    bad = translate(path.read_bytes().splitlines(), out, agent="acp", session_id="s-acp", err=err)
    lines = out.getvalue().splitlines()
    frames = [codec.decode(line).frame for line in lines]  # type: ignore[union-attr]
    return frames, [json.loads(line) for line in lines], bad


def test_there_are_transcripts():
    assert [p.stem for p in TRANSCRIPTS] == [
        "claude-bash",
        "claude-write",
        "codex-edit",
        "codex-exec",
        "gemini-shell",
        "gemini-write",
    ]


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.stem)
def test_DPS_2_1_envelope_and_DPS_5_3_1_result_of_every_transcript(path: Path):
    frames, _, bad = replay(path)
    assert bad == 0
    frame_checks.assert_valid_envelopes(frames, "s-acp")
    frame_checks.assert_one_result_per_request(frames)
    frame_checks.assert_blocks_joined(frames)


def test_gemini_write_replays_both_turns_with_the_diff_and_usage():
    """DPS-7.5.2-usage, DPS-5.3.3-output-type: Gemini CLI --acp: a thought, a write_file asked
    with its own options and allowed once, its diff, two turns each followed by its usage (from
    Gemini's ``_meta.quota``)."""
    _, frames, _ = replay(ACP / "gemini-write.jsonl")
    types = [f["type"] for f in frames]
    assert types.count("session.turn.start") == 2 and types.count("session.turn.end") == 2
    ends = [i for i, t in enumerate(types) if t == "session.turn.end"]
    assert all(types[i + 1] == "session.usage" for i in ends)
    (ask,) = [f for f in frames if f["type"] == "agent.interaction.request"]
    assert [o["value"] for o in ask["payload"]["options"]] == ["allow_always", "allow", "deny"]
    (result,) = [f["payload"] for f in frames if f["type"] == "tool.invoke.result"]
    assert result["output_type"] == "diff" and "-old\n+new\n" in result["output"]
    texts = [f["payload"]["full_text"] for f in frames if f["type"] == "agent.text.done"]
    assert texts == ["Wrote the file.", "Hello there."]
    usage = [f["payload"]["token_usage"] for f in frames if f["type"] == "session.usage"]
    assert usage == [
        {"input_tokens": 200, "output_tokens": 20},
        {"input_tokens": 100, "output_tokens": 10},
    ]
    commands = [f for f in frames if f["type"] == "agent.commands.publish"][-1]
    assert any(c["name"] == "memory" for c in commands["payload"]["commands"])


def test_claude_write_replays_the_diff_reported_with_the_input():
    """claude-agent-acp: a Write announced pending with an empty input, then its input and diff,
    then completed with no content: one request with the input, a diff result from /dev/null,
    the adapter's usage and cost (DPS-7.5.2-usage)."""
    _, frames, _ = replay(ACP / "claude-write.jsonl")
    (request,) = [f["payload"] for f in frames if f["type"] == "tool.invoke.request"]
    assert request["tool_name"] == "Write" and request["input"]["content"] == "new\n"
    (result,) = [f["payload"] for f in frames if f["type"] == "tool.invoke.result"]
    assert result["output_type"] == "diff" and result["output"].startswith("--- /dev/null\n")
    thinking = "".join(f["payload"]["text"] for f in frames if f["type"] == "agent.thinking.delta")
    assert thinking == "Think first."
    usage = [f["payload"] for f in frames if f["type"] == "session.usage"][-1]
    assert usage["token_usage"]["input_tokens"] > 0 and usage["cost_usage"]["used"] > 0
    assert usage["context_window"]["capacity"] > 0


def test_claude_bash_streams_no_description_and_its_result_is_the_output():
    """DPS-5.3.2-stream: claude-agent-acp sends a Bash call's description ("Print hi") as content
    in an update without a status while the call waits: it is no stdout; the result is the
    command's output, without the fence."""
    _, frames, _ = replay(ACP / "claude-bash.jsonl")
    assert [f for f in frames if f["type"] == "tool.invoke.stream"] == []
    (request,) = [f["payload"] for f in frames if f["type"] == "tool.invoke.request"]
    assert request["tool_name"] == "Bash" and request["input"]["command"] == "echo hi"
    (result,) = [f["payload"] for f in frames if f["type"] == "tool.invoke.result"]
    assert (result["status"], result["output"], result["output_type"]) == (
        "success",
        "hi\n",
        "text",
    )


def test_gemini_shell_result_is_not_its_working_directory_note():
    """DPS-5.3.1-result: Gemini CLI --acp announces run_shell_command with a "[current working
    directory ...]" note and completes it with ``"content": []``, which replaces the note: the
    result is empty (Gemini reports no output through ACP), never the note, and nothing is
    streamed."""
    _, frames, _ = replay(ACP / "gemini-shell.jsonl")
    assert [f for f in frames if f["type"] == "tool.invoke.stream"] == []
    (result,) = [f["payload"] for f in frames if f["type"] == "tool.invoke.result"]
    assert (result["status"], result["output"], result["output_type"]) == ("success", "", "empty")
    texts = [f["payload"]["full_text"] for f in frames if f["type"] == "agent.text.done"]
    assert texts == ["It printed hi."]


def test_codex_exec_replays_the_command_asked_and_its_output():
    """codex-acp: a command asked with Codex's own options (approved, approved for the prefix,
    abort), its empty output from rawOutput, the reasoning as thinking."""
    _, frames, _ = replay(ACP / "codex-exec.jsonl")
    (ask,) = [f["payload"] for f in frames if f["type"] == "agent.interaction.request"]
    assert ask["question_text"] == "Allow execute: echo hi > made.txt?"
    assert [o["value"] for o in ask["options"]] == ["allow", "allow_always", "deny"]
    (result,) = [f["payload"] for f in frames if f["type"] == "tool.invoke.result"]
    assert (result["status"], result["output"], result["output_type"]) == ("success", "", "empty")
    assert any(f["type"] == "agent.thinking.delta" for f in frames)
    texts = [f["payload"]["full_text"] for f in frames if f["type"] == "agent.text.done"]
    assert texts == ["Made it."]


def test_codex_edit_replays_apply_patch_as_a_diff():
    """codex-acp: apply_patch is an ``edit`` call whose diff content becomes the unified diff
    (DPS-5.3.3-output-type), asked first with the diff in the question's tool call."""
    _, frames, _ = replay(ACP / "codex-edit.jsonl")
    (ask,) = [f["payload"] for f in frames if f["type"] == "agent.interaction.request"]
    assert ask["question_text"].startswith("Allow edit: Edit ")
    (result,) = [f["payload"] for f in frames if f["type"] == "tool.invoke.result"]
    assert result["output_type"] == "diff" and " alpha\n-beta\n+gamma\n" in result["output"]


def test_a_transcripts_permission_answer_settles_its_question():
    """The client's answer in the transcript ends the interaction where it was given (before the
    tool's result), as a master's answer would."""
    _, frames, _ = replay(ACP / "gemini-write.jsonl")
    reasons = [f["payload"].get("reason") for f in frames if f["type"] == "agent.state.changed"]
    answered = reasons.index("permission_answered")
    assert reasons[answered - 1] == "permission_request" and reasons[answered + 1] == "tool_result"
