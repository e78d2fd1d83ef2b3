"""What the real Claude Code CLI must print for its scenarios (tests/rig/test_rig_cli.py runs them):
the kinds of events of the recorded fixture (``shape``) for every scenario, and the checks
specific to some (``CHECKS``, by fixture name: ``tool-bash--partial`` is the ``partial`` variant
of ``tool-bash``)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.support.rig import env as rigenv
from tests.support.rig.run import CliSetup, RunResult

PARALLEL = 6  # scenario runs side by side


def blocks(message: Any) -> tuple[str, ...]:
    """The types of a message's content blocks (a plain string is one text block)."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        return tuple(b.get("type", "?") for b in content if isinstance(b, dict))
    return ("text",) if isinstance(content, str) else ()


# Line types that a scenario prints in some runs and not in others, as the CLI's timing falls, not
# its format (all seen under load): SIGINT in -p mode races the result line; a SIGINT or an
# interrupt 0.2 s into the stream can come before the CLI has read the streamed text, and then it
# prints no partial assistant message.
UNSTABLE_LINES = {"sigint": {"result", "assistant"}, "interrupt-stream": {"assistant"}}


def shape(fixture: str, events: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """What kinds of events a run printed, as a multiset: the line's type and subtype, the types
    of a message's content blocks, a stream event's type, a control request's subtype. Counts,
    not order: results of parallel tools come in the order they finish."""
    unstable = UNSTABLE_LINES.get(fixture, set())
    return Counter(
        (
            e["type"],
            e.get("subtype"),
            blocks(e.get("message")),
            (e.get("event") or {}).get("type"),
            (e.get("request") or {}).get("subtype"),
        )
        for e in events
        if e["type"] not in unstable
    )


def texts(r: RunResult) -> list[str]:
    return [
        b["text"]
        for e in r.of_type("assistant")
        for b in e["message"]["content"]
        if b["type"] == "text"
    ]


def check_text(r: RunResult, cli: CliSetup) -> None:
    init, *_ = r.events
    assert init["type"] == "system" and init["subtype"] == "init"
    assert init["claude_code_version"] == rigenv.AGENTS["claude-code"].version
    assert texts(r) == ["Hello from the scripted model. Nothing else to do."]
    (result,) = r.of_type("result")
    assert result["subtype"] == "success" and result["is_error"] is False
    assert [(q.method, q.path, q.query) for q in r.requests] == [
        ("POST", "/v1/messages", {"beta": "true"})
    ]
    assert r.requests[0].body["stream"] is True


def check_bash_tool_with_partial_messages(r: RunResult, cli: CliSetup) -> None:
    kinds = {e["event"]["type"] for e in r.of_type("stream_event")}
    assert {"message_start", "content_block_delta", "message_stop"} <= kinds
    (tool_use,) = [
        b
        for e in r.of_type("assistant")
        for b in e["message"]["content"]
        if b["type"] == "tool_use"
    ]
    results = [
        b for e in r.of_type("user") for b in e["message"]["content"] if b["type"] == "tool_result"
    ]
    assert [(b["tool_use_id"], b["content"]) for b in results] == [
        (tool_use["id"], "hello from bash")
    ]
    # The second request carries the tool result back to the model.
    last = r.requests[1].body["messages"][-1]["content"]
    assert any(b.get("type") == "tool_result" for b in last)


def check_interrupt_stream(r: RunResult, cli: CliSetup) -> None:
    (resp,) = r.of_type("control_response")
    assert resp["response"]["request_id"] == "rig-interrupt-1"
    assert resp["response"]["subtype"] == "success"
    (result,) = r.of_type("result")
    assert result["subtype"] == "error_during_execution"
    assert result["terminal_reason"] == "aborted_streaming"
    assert any("[Request interrupted by user]" in json.dumps(e) for e in r.of_type("user"))


def check_permission_prompt(r: RunResult, cli: CliSetup) -> None:
    # The allowed Write happened, the denied Bash did not.
    assert (cli.cwd / "allowed.txt").read_text() == "allowed\n"
    assert not (cli.cwd / "denied.txt").exists()
    asked = [e["request"]["tool_name"] for e in r.of_type("control_request")]
    assert asked == ["Write", "Bash"]
    (result,) = r.of_type("result")
    assert [d["tool_name"] for d in result["permission_denials"]] == ["Bash"]


def check_working_session(r: RunResult, cli: CliSetup) -> None:
    """The timed recording's pace is the scripted model's and the script's person's: every prompt
    written at least its delay after the result before it, each call's first delta at least its
    delay after the request, and a streamed answer no faster than its event_delay a delta."""
    assert len(r.stdout_times) == len(r.stdout_lines) and r.stdout_times == sorted(r.stdout_times)
    results = [r.stdout_times[i] for i, e in enumerate(r.events) if e["type"] == "result"]
    delays = [a.delay for a in cli.scenario.run.actions if a.do == "write"]
    assert len(r.stdin_times) == 3 and len(results) == 3
    for written, result, delay in zip(r.stdin_times[1:], results[:-1], delays, strict=True):
        assert written >= result + delay
    # The longest answer: every text delta of it, at event_delay or more apart.
    texts = [
        (e["event"]["index"], e.get("api_message_id"), t)
        for e, t in zip(r.events, r.stdout_times, strict=True)
        if e["type"] == "stream_event" and e["event"].get("delta", {}).get("type") == "text_delta"
    ]
    assert len(texts) > 150
    by_message: dict[Any, list[float]] = {}
    for index, message, t in texts:
        by_message.setdefault((message, index), []).append(t)
    longest = max(by_message.values(), key=len)
    pace = cli.scenario.calls[2]["event_delay"]
    assert longest[-1] - longest[0] >= (len(longest) - 1) * pace * 0.9


CHECKS: dict[str, Callable[[RunResult, CliSetup], None]] = {
    "text": check_text,
    "tool-bash--partial": check_bash_tool_with_partial_messages,
    "interrupt-stream": check_interrupt_stream,
    "permission-prompt": check_permission_prompt,
    "working-session": check_working_session,
}
