"""Mapper: agent events → DPS frames, agent-neutral, with a deterministic factory (ids and clock)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.factory import FrameFactory
from gateway.protocol.mapper import BLOCKED_OUTPUT, Mapper, Note
from parsers import events as ev

SESSION = "00000000-0000-4000-8000-000000000000"
TURN = "11111111-1111-4111-8111-111111111111"


def factory() -> FrameFactory:
    counter = itertools.count(1)
    return FrameFactory(
        SESSION,
        new_id=lambda: f"{next(counter):08x}-0000-4000-8000-000000000000",
        clock=lambda: "2026-11-29T00:00:00.000Z",
    )


def mapper(**kw: Any) -> Mapper:
    m = Mapper(factory(), **kw)
    m.begin_turn(TURN)
    return m


def run(m: Mapper, *events: ev.AgentEvent) -> list[F.Frame]:
    out: list[F.Frame] = []
    for event in events:
        out += m.map(event)
    return out


def types(frames: list[F.Frame], *, states: bool = False) -> list[str]:
    return [f.TYPE for f in frames if states or f.TYPE != "agent.state.changed"]


def p(frame: F.Frame) -> Any:
    return frame.payload  # type: ignore[attr-defined]


def of(frames: list[F.Frame], t: str) -> list[Any]:
    return [p(f) for f in frames if t == f.TYPE]


def call(call_id: str, name: str = "Bash", **kw: Any) -> ev.ToolCall:
    return ev.ToolCall(call_id=call_id, name=name, input=kw.pop("input", {}), **kw)


def result(call_id: str, output: Any = "ok", **kw: Any) -> ev.ToolResult:
    return ev.ToolResult(call_id=call_id, is_error=kw.pop("is_error", False), output=output, **kw)


# --- content ------------------------------------------------------------------------------------


def test_DPS_4_1_text_content_index_unique_in_the_turn_and_full_text_is_the_deltas():
    """DPS-4.1-text: two API messages both numbering their first block 0 still get distinct
    indexes; full_text is the concatenation of the deltas sent."""
    m = mapper()
    frames = run(
        m,
        ev.TextDelta(block="m1:0", text="a"),
        ev.TextDelta(block="m1:0", text="b"),
        ev.TextEnd(block="m1:0", full_text="something else"),
        ev.TextDelta(block="m2:0", text="c"),
        ev.TextEnd(block="m2:0"),
    )
    assert [d.content_index for d in of(frames, "agent.text.delta")] == [0, 0, 1]
    assert [(d.content_index, d.full_text) for d in of(frames, "agent.text.done")] == [
        (0, "ab"),
        (1, "c"),
    ]
    m.begin_turn("22222222-2222-4222-8222-222222222222")
    again = run(m, ev.TextDelta(block="m3:0", text="x"))
    assert of(again, "agent.text.delta")[0].content_index == 0
    assert again[-1].turn_id == "22222222-2222-4222-8222-222222222222"


def test_a_block_that_ends_with_only_its_full_text_is_said_once():
    frames = run(mapper(), ev.TextEnd(block="b", full_text="whole"))
    assert types(frames) == ["agent.text.delta", "agent.text.done"]
    assert of(frames, "agent.text.done")[0].full_text == "whole"
    assert run(mapper(), ev.TextEnd(block="b")) == []


def test_DPS_4_2_thinking_redacted_is_marked():
    """DPS-4.2-thinking: thinking deltas and one done; redacted blocks say so."""
    frames = run(
        mapper(),
        ev.ThinkingDelta(block="t", text="", redacted=True),
        ev.ThinkingEnd(block="t"),
    )
    assert types(frames) == ["agent.thinking.delta", "agent.thinking.done"]
    assert of(frames, "agent.thinking.delta")[0].redacted is True


def test_plan_text_is_marked_with_its_content_role():
    frames = run(mapper(), ev.TextDelta(block="p", text="1. x", role="plan"), ev.TextEnd(block="p"))
    assert all(f.metadata == {"content_role": "plan"} for f in frames if "text" in f.TYPE)


def test_a_huge_text_delta_is_split_to_fit_the_frame_size():
    m = mapper(max_frame_size=4096)
    # 4000 characters are 8000 bytes: more than a frame, not more than one event may carry.
    frames = run(m, ev.TextDelta(block="b", text="é" * 4000), ev.TextEnd(block="b"))
    deltas = of(frames, "agent.text.delta")
    assert len(deltas) > 1
    assert all(len(codec.encode(f)) <= 4096 for f in frames)
    (done,) = [f for f in frames if f.TYPE == "agent.text.done"]
    assert p(done).full_text is None and done.metadata == {"full_text_omitted": True}
    assert "".join(d.text for d in deltas) == "é" * 4000
    assert not of(frames, "agent.error")


def test_one_event_carries_at_most_max_frame_size_characters_and_says_it_was_cut():
    """A 20 MB line becomes a bounded burst: the first max_frame_size characters in deltas that
    each fit a frame, the last marked text_truncated with the count cut, then a warning."""
    m = mapper(max_frame_size=4096)
    text = "".join(chr(0x61 + i % 26) for i in range(50_000))
    frames = run(m, ev.TextDelta(block="b", text=text), ev.TextDelta(block="b", text="tail"))
    assert all(len(codec.encode(f)) <= 4096 for f in frames)
    deltas = [f for f in frames if f.TYPE == "agent.text.delta"]
    assert "".join(p(d).text for d in deltas) == text[:4096] + "tail"
    cut = [d for d in deltas if d.metadata and d.metadata.get("text_truncated")]
    assert cut == [deltas[-2]]
    assert cut[0].metadata["omitted_chars"] == 50_000 - 4096
    types_ = types(frames)
    assert types_[types_.index("agent.error") - 1] == "agent.text.delta"
    (warning,) = of(frames, "agent.error")
    assert (warning.error_code, warning.severity, warning.recoverable) == (
        "OUTPUT_TRUNCATED", "warning", True,
    )  # fmt: skip
    assert "50000" in warning.message and "4096" in warning.message
    # Thinking and a tool's streamed output are bounded the same way.
    thinking = run(m, ev.ThinkingDelta(block="t", text=text))
    assert sum(len(d.text) for d in of(thinking, "agent.thinking.delta")) == 4096
    assert of(thinking, "agent.error")[0].error_code == "OUTPUT_TRUNCATED"
    stream = run(m, call("c1"), ev.ToolOutput(call_id="c1", chunk=text, stream="stdout"))
    chunks = of(stream, "tool.invoke.stream")
    assert "".join(c.chunk for c in chunks) == text[:4096]
    assert [c.sequence for c in chunks] == list(range(len(chunks)))
    assert all(len(codec.encode(f)) <= 4096 for f in stream)
    (warning,) = of(stream, "agent.error")
    assert warning.details.related_invocation_id == chunks[0].invocation_id


def test_full_text_is_kept_up_to_one_frame_then_dropped_so_a_block_holds_bounded_memory():
    """Many one-line deltas in one block: full_text is kept while it could fit a frame, then
    the kept text is let go (omitted at done, full_text_omitted) and memory stays flat."""
    import tracemalloc

    m = mapper(max_frame_size=64 * 1024)
    few = run(m, *(ev.TextDelta(block="a", text=f"line {i}\n") for i in range(100)))
    done = run(m, ev.TextEnd(block="a"))[-1]
    assert p(done).full_text == "".join(p(f).text for f in few if f.TYPE == "agent.text.delta")
    tracemalloc.start()
    try:
        for i in range(100_000):
            m.map(ev.TextDelta(block="b", text=f"{i:010d}\n"))
            if i == 10_000:  # past the limit: from here on nothing more may pile up
                early = tracemalloc.get_traced_memory()[0]
                tracemalloc.reset_peak()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak - early < 256 * 1024  # 1.1 MB written; the block holds at most one frame's worth
    done = run(m, ev.TextEnd(block="b"))[-1]
    assert p(done).full_text is None and done.metadata == {"full_text_omitted": True}


# --- state ---------------------------------------------------------------------------------------


def test_DPS_4_6_state_follows_the_main_agent():
    """DPS-4.6-state: output → thinking, a call → tool_calling, its result → thinking; a
    subagent's events do not move the state; the turn's end → idle."""
    m = mapper()
    frames = run(
        m,
        ev.TextDelta(block="a", text="x"),
        call("t1", "Agent", subagent_type="general-purpose"),
        ev.TextDelta(block="s", text="inner", parent="t1"),
        call("t2", parent="t1"),
        result("t2", parent="t1"),
        result("t1"),
    )
    frames += m.end_turn("end_turn")
    states = [(s.previous_state, s.current_state) for s in of(frames, "agent.state.changed")]
    assert states == [
        ("idle", "thinking"),
        ("thinking", "tool_calling"),
        ("tool_calling", "thinking"),
        ("thinking", "idle"),
    ]
    assert m.set_agent_state("idle") == []


# --- tools ---------------------------------------------------------------------------------------


def test_DPS_5_2_request_invocation_ids_and_parallel_groups():
    """DPS-5.2-request: a fresh UUID v4 per call, the agent's id in metadata; one group id per
    group value (a lone call gets its own); new groups in a new turn."""
    m = mapper()
    frames = run(
        m,
        call("t1", group="m1"),
        call("t2", group="m1"),
        call("t3"),
        call("t4", group="m2"),
    )
    reqs = [f for f in frames if f.TYPE == "tool.invoke.request"]
    groups = [p(f).parallel_group_id for f in reqs]
    assert groups[0] == groups[1] and len(set(groups)) == 3
    assert len({p(f).invocation_id for f in reqs}) == 4
    assert [f.metadata["agent_call_id"] for f in reqs] == ["t1", "t2", "t3", "t4"]
    assert m.invocation_id("t1") == p(reqs[0]).invocation_id
    assert m.tool_invocation_count == 4
    m.end_turn("end_turn")
    m.begin_turn("22222222-2222-4222-8222-222222222222")
    again = run(m, call("t5", group="m1"))
    assert p(again[-1]).parallel_group_id not in groups


def test_a_call_announced_twice_is_requested_once():
    m = mapper()
    frames = run(m, call("t1"), call("t1"), result("t1"))
    assert types(frames) == ["tool.invoke.request", "tool.invoke.result"]


def test_DPS_5_3_1_result_once_per_request_and_late_results_dropped():
    """DPS-5.3.1-result: a result for a call never seen, or already ended, is not sent."""
    m = mapper()
    frames = run(m, call("t1"), result("t1"), result("t1"), result("nope"))
    assert types(frames) == ["tool.invoke.request", "tool.invoke.result"]
    assert m.dropped_results == 2


@pytest.mark.parametrize(
    ("name", "res", "status", "output_type"),
    [
        ("Read", result("c", "text"), "success", "file_content"),
        ("Edit", result("c", "--- a\n+++ b\n", changed=True), "success", "diff"),
        ("Write", result("c", None, changed=False), "success", "empty"),
        ("Grep", result("c", ["a.py"], listing=True), "success", "file_list"),
        ("Grep", result("c", "a.py:1:x"), "success", "text"),
        ("TodoWrite", result("c", [{"content": "x"}]), "success", "structured"),
        ("WebFetch", result("c", "page"), "success", "web_content"),
        ("mcp__echo__ping", result("c", "pong"), "success", "text"),
        ("Read", result("c", "No such file", is_error=True), "error", "text"),
        ("Bash", result("c", "stopped", is_error=True, cancelled=True), "cancelled", "text"),
    ],
)
def test_DPS_5_3_3_output_type_and_status(name, res, status, output_type):
    """DPS-5.3.3-output-type: the catalog's type, else the category default by what happened;
    an error's message is text. Status from is_error / cancelled."""
    frames = run(mapper(), call("c", name), res)
    (r,) = of(frames, "tool.invoke.result")
    assert (r.status, r.output_type, r.tool_name) == (status, output_type, name)


def test_DPS_6_3_2_block_a_blocked_call_reports_the_mode():
    """DPS-6.3.2-block: a call the session machine refused for the mode ends as an error saying so."""
    m = mapper()
    run(m, call("t1", "Write"))
    ask = ev.PermissionRequest(request_id="r1", tool_name="Write", input={}, call_id="t1")
    assert m.map_noted(ask, Note(blocked=True)) == []
    (r,) = of(run(m, result("t1", "Plan mode: no changes.", is_error=True)), "tool.invoke.result")
    assert (r.status, r.output) == ("error", BLOCKED_OUTPUT)


def test_DPS_5_3_2_stream_sequence_per_call():
    """DPS-5.3.2-stream: tool output becomes tool.invoke.stream, 0-based per call."""
    m = mapper()
    frames = run(
        m,
        call("t1"),
        call("t2"),
        ev.ToolOutput(call_id="t1", chunk="a", stream="stdout"),
        ev.ToolOutput(call_id="t2", chunk="b"),
        ev.ToolOutput(call_id="t1", chunk="c", stream="stderr"),
        ev.ToolOutput(call_id="gone", chunk="x"),
    )
    streams = of(frames, "tool.invoke.stream")
    assert [(s.chunk, s.sequence, s.stream_type) for s in streams] == [
        ("a", 0, "stdout"),
        ("b", 0, "progress"),
        ("c", 1, "stderr"),
    ]


def test_output_larger_than_the_frame_size_is_cut_and_marked():
    m = mapper(max_frame_size=4096)
    frames = run(m, call("t1"), result("t1", "x" * 10000), call("t2", "Glob"))
    frames += run(m, result("t2", [f"src/file{i}.py" for i in range(1000)], listing=True))
    frames += run(m, call("t3", "Agent", subagent_type="x"), result("t3", {"text": "y" * 9000}))
    for r in of(frames, "tool.invoke.result"):
        assert r.truncated is True
    assert all(len(codec.encode(f)) <= 4096 for f in frames)
    text, paths, agent = of(frames, "tool.invoke.result")
    assert text.output == "x" * len(text.output) and len(text.output) > 3000
    assert isinstance(paths.output, list) and paths.output[0] == "src/file0.py"
    assert isinstance(agent.output, str)  # cut as its JSON text


def test_a_request_whose_input_is_too_large_is_cut():
    m = mapper(max_frame_size=4096)
    (req,) = [
        f
        for f in run(m, call("t1", "Write", input={"file_path": "/a", "content": "z" * 9000}))
        if f.TYPE == "tool.invoke.request"
    ]
    assert len(codec.encode(req)) <= 4096
    assert req.metadata["input_truncated"] is True
    assert p(req).input["file_path"] == "/a"
    (res,) = of(run(m, result("t1", None, changed=False)), "tool.invoke.result")
    assert res.truncated is None


def test_frame_size_limit_has_a_floor():
    with pytest.raises(ValueError):
        Mapper(factory(), max_frame_size=100)


# --- subagents -------------------------------------------------------------------------------------


def test_DPS_10_3_order_foreground_subagent():
    """DPS-10.3-order, DPS-10.1-request, DPS-10.5-usage: request (with subagent) → started → inner
    frames with context → the subagent's usage → ended → agent_result."""
    m = mapper()
    frames = run(
        m,
        call("a1", "Agent", input={"description": "d"}, subagent_type="Explore", description="d"),
        call("b1", parent="a1"),
        result("b1", parent="a1"),
        ev.SubagentEnded(
            call_id="a1",
            status="completed",
            duration_ms=30,
            usage=ev.UsageInfo(input_tokens=5, output_tokens=2),
        ),
        result("a1", {"text": "done"}),
    )
    assert types(frames) == [
        "tool.invoke.request",
        "agent.subagent.started",
        "tool.invoke.request",
        "tool.invoke.result",
        "session.usage",
        "agent.subagent.ended",
        "tool.invoke.result",
    ]
    request = of(frames, "tool.invoke.request")[0]
    assert request.subagent == F.SubagentInfo(agent_type="Explore", description="d")
    inv = request.invocation_id
    started = of(frames, "agent.subagent.started")[0]
    assert (started.parent_invocation_id, started.depth, started.agent_type) == (inv, 1, "Explore")
    inner = [f for f in frames if "subagent_context" in (f.metadata or {})]
    assert len(inner) == 3  # the inner request, its result, the subagent's usage
    assert all(
        f.metadata["subagent_context"]
        == F.SubagentContext(parent_invocation_id=inv, depth=1, agent_type="Explore")
        for f in inner
    )
    ended = of(frames, "agent.subagent.ended")[0]
    assert (ended.status, ended.duration_ms) == ("completed", 30)
    assert of(frames, "tool.invoke.result")[-1].output_type == "agent_result"


def test_subagent_context_of_a_parent_for_the_session_machine():
    m = mapper()
    (req,) = [
        f
        for f in run(m, call("a1", "Agent", subagent_type="Explore"))
        if f.TYPE == "tool.invoke.request"
    ]
    question = F.InteractionRequest("i1", "PERMISSION", "May it?", 60.0, [])

    def asked(parent: str | None) -> F.Frame:
        ask = ev.PermissionRequest(request_id="r", tool_name="Bash", input={}, parent=parent)
        return m.map_noted(ask, Note(asks=question))[0]

    assert asked(None).metadata is None and asked("unknown").metadata is None
    assert asked("a1").metadata == {
        "subagent_context": F.SubagentContext(
            parent_invocation_id=p(req).invocation_id, depth=1, agent_type="Explore"
        )
    }


def test_a_subagent_result_without_its_end_gets_a_synthesised_one():
    frames = run(
        mapper(),
        call("a1", "Task", subagent_type="x"),
        result("a1", "failed", is_error=True, duration_ms=9),
    )
    assert types(frames)[-2:] == ["agent.subagent.ended", "tool.invoke.result"]
    ended = of(frames, "agent.subagent.ended")[0]
    assert (ended.status, ended.duration_ms) == ("failed", 9)


def test_DPS_10_2_context_nested_depth_is_counted():
    """DPS-10.2-context: a subagent's own subagent is depth 2 and points at its direct parent."""
    m = mapper()
    frames = run(
        m,
        call("a1", "Agent", subagent_type="outer"),
        call("a2", "Agent", subagent_type="inner", parent="a1"),
        ev.TextDelta(block="x", text="deep", parent="a2"),
    )
    a2 = [f for f in frames if f.TYPE == "tool.invoke.request"][1]
    started = [f for f in frames if f.TYPE == "agent.subagent.started"]
    assert p(started[1]).depth == 2
    assert a2.metadata["subagent_context"].depth == 1
    deep = next(f for f in frames if f.TYPE == "agent.text.delta")
    assert deep.metadata["subagent_context"] == F.SubagentContext(
        parent_invocation_id=p(a2).invocation_id, depth=2, agent_type="inner"
    )
    assert "subagent_context" not in (started[0].metadata or {})


def test_a_delegate_tool_without_a_subagent_type_still_starts_a_subagent():
    frames = run(mapper(), call("a1", "Task"))
    assert types(frames) == ["tool.invoke.request", "agent.subagent.started"]
    frames = run(mapper(), call("s1", "SendMessage"))
    assert types(frames) == ["tool.invoke.request"]


def test_DPS_10_5_usage_background_subagent_result_held_until_it_ends():
    """A background subagent's immediate result is held; at its end: its usage (with context),
    ended, then the result with the subagent's summary."""
    m = mapper()
    frames = run(
        m,
        call("a1", "Agent", subagent_type="general-purpose"),
        result("a1", {"text": "launched", "agent_id": "x"}, background=True),
        ev.TextDelta(block="m", text="main goes on"),
        call("b1", parent="a1"),
        result("b1", parent="a1"),
    )
    assert "tool.invoke.result" not in [
        f.TYPE for f in frames if not (f.metadata or {}).get("subagent_context")
    ]
    end = run(
        m,
        ev.SubagentEnded(
            call_id="a1",
            status="completed",
            summary="found it",
            duration_ms=99,
            usage=ev.UsageInfo(total_tokens=120),
        ),
    )
    assert types(end) == ["session.usage", "agent.subagent.ended", "tool.invoke.result"]
    assert end[0].metadata["total_tokens"] == 120
    assert "subagent_context" in end[0].metadata
    final = p(end[2])
    assert final.output == {"text": "found it", "agent_id": "x", "status": "completed"}
    assert (final.status, final.duration_ms, final.output_type) == ("success", 99, "agent_result")


def test_end_turn_releases_a_held_background_result():
    """If the turn ends before the background subagent, end_turn ends it and releases the result;
    the subagent's later frames keep their context, its late end gives only its usage."""
    m = mapper()
    run(m, call("a1", "Agent", subagent_type="g"), result("a1", "launched", background=True))
    frames = m.end_turn("end_turn")
    assert types(frames) == [
        "agent.subagent.ended",
        "tool.invoke.result",
        "session.turn.end",
        "session.usage",
    ]
    assert frames[0].metadata["background"] is True
    assert p(frames[1]).status == "success"
    late = run(m, ev.TextDelta(block="z", text="late", parent="a1"))
    assert late[0].metadata["subagent_context"].depth == 1
    assert late[0].turn_id is None
    usage = run(
        m, ev.SubagentEnded(call_id="a1", status="completed", usage=ev.UsageInfo(total_tokens=3))
    )
    assert types(usage) == ["session.usage"]


# --- turn end -------------------------------------------------------------------------------------


def test_DPS_6_1_2_cancel_end_turn_closes_everything_in_order():
    """DPS-6.1.2-cancel, DPS-7.5.3-cleanup, DPS-7.5.2-usage: open blocks done with is_cancelled,
    a cancelled result for every open call (a subagent ended first), then turn.end, usage, idle."""
    m = mapper()
    run(
        m,
        ev.TextDelta(block="a", text="Once"),
        ev.ThinkingDelta(block="b", text="hmm"),
        call("t1"),
        call("a1", "Agent", subagent_type="g"),
    )
    frames = m.end_turn("cancelled")
    assert types(frames, states=True) == [
        "agent.text.done",
        "agent.thinking.done",
        "tool.invoke.result",
        "agent.subagent.ended",
        "tool.invoke.result",
        "session.turn.end",
        "session.usage",
        "agent.state.changed",
    ]
    assert p(frames[0]).is_cancelled is True and p(frames[0]).full_text == "Once"
    assert p(frames[1]).is_cancelled is True
    assert [r.status for r in of(frames, "tool.invoke.result")] == ["cancelled", "cancelled"]
    assert p(frames[3]).status == "cancelled"
    end = of(frames, "session.turn.end")[0]
    assert (end.turn_id, end.stop_reason, end.tool_invocation_count) == (TURN, "cancelled", 2)
    assert all(f.turn_id == TURN for f in frames)
    assert m.turn_id is None and m.agent_state == "idle" and m.tool_invocation_count == 0


def test_DPS_7_5_2_usage_from_the_turn_end_event():
    m = mapper()
    ended = ev.TurnEnded(
        stop_reason="end_turn",
        usage=ev.UsageInfo(
            input_tokens=10, output_tokens=4, cache_read_tokens=2, thinking_tokens=1
        ),
        cost_usd=0.25,
        num_turns=3,
        context_window=1000,
        context_used=250,
    )
    frames = m.end_turn("end_turn", ended)
    usage = of(frames, "session.usage")[0]
    assert usage.turn_id == TURN
    assert usage.token_usage == F.TokenUsage(
        input_tokens=10, output_tokens=4, cache_read_tokens=2, thinking_tokens=1
    )
    assert usage.cost_usage == F.Quota(limit=-1, used=0.25, unit="USD")
    assert usage.message_usage == F.Quota(limit=-1, used=3, unit="COUNT")
    assert usage.context_window == F.ContextWindow(capacity=1000, used=250, utilization=0.25)
    outside = m.usage_frame(ended)
    assert outside.turn_id is None and p(outside).turn_id is None


def test_end_turn_without_an_event_reports_zero_usage():
    frames = mapper().end_turn("error")
    usage = of(frames, "session.usage")[0]
    assert usage.token_usage == F.TokenUsage(input_tokens=0, output_tokens=0)
    assert of(frames, "session.turn.end")[0].stop_reason == "error"


# --- session-level events ---------------------------------------------------------------------------


def test_DPS_12_1_commands_and_catalog_published_only_when_changed():
    """DPS-12.1-commands, DPS-5.4-catalog: sent at start, again only when they change."""
    m = mapper()
    started = ev.SessionStarted(
        agent_session_id="cli-1",
        tools=["Bash"],
        commands=[
            ev.SlashCommand(name="compact", description="Compact"),
            ev.SlashCommand(name="x"),
        ],
    )
    first = run(m, started)
    assert types(first) == ["tool.catalog.publish", "agent.commands.publish"]
    assert [c.description for c in p(first[1]).commands] == ["Compact", "/x"]
    assert m.catalog is first[0] and m.commands is first[1]
    assert run(m, started) == []
    changed = run(m, ev.SessionStarted(tools=["Bash", "Read"], commands=started.commands))
    assert types(changed) == ["tool.catalog.publish"]


def test_DPS_4_4_error_notice_names_the_call():
    m = mapper()
    denied_call = ev.Notice(
        severity="warning", code="PERMISSION_DENIED", message="no", tool_name="Write", call_id="t1"
    )
    api_error = ev.Notice(
        severity="error", code="API_ERROR", message="500", recoverable=False, http_status=500
    )
    frames = run(m, call("t1", "Write"), denied_call, api_error)
    denied, api = of(frames, "agent.error")
    assert denied.details.related_invocation_id == m.invocation_id("t1")
    assert denied.details.related_tool == "Write" and denied.recoverable is True
    assert (api.severity, api.recoverable, api.details.http_status) == ("error", False, 500)


def test_DPS_7_2_compacted_and_the_requested_override():
    """DPS-7.2-compacted, DPS-6.3.1-compact: the agent's trigger, or "requested" when the session
    machine says a master asked."""
    m = mapper()
    event = ev.Compacted(
        trigger="manual",
        summary="s",
        pre_tokens=100,
        post_tokens=10,
        preserved={"files_modified": ["a.py"], "active_todos": [{"content": "x"}]},
    )
    (frame,) = run(m, event)
    assert (p(frame).trigger, p(frame).previous_token_count, p(frame).current_token_count) == (
        "manual",
        100,
        10,
    )
    assert p(frame).preserved_elements.files_modified == ["a.py"]
    m.begin_turn("turn-2", requested_compaction=True)
    assert p(run(m, event)[0]).trigger == "requested"
    bad = ev.Compacted(
        trigger="auto", summary="", pre_tokens=1, post_tokens=1, preserved={"files_modified": [1]}
    )
    assert p(run(m, bad)[0]).preserved_elements is None


def test_unknown_lines_are_forwarded_only_when_asked():
    unknown = ev.Unknown(kind="brand_new", line=b'{"type":"brand_new"}')
    assert run(mapper(), unknown) == []
    (frame,) = run(mapper(forward_unknown=True), unknown)
    assert frame.TYPE == "x-rawp-gateway.agent.raw"
    assert codec.encode(frame).count(b'"line":{"type":"brand_new"}') == 1


def test_events_the_session_machine_owns_give_no_frames():
    m = mapper()
    for event in (
        ev.TurnEnded(stop_reason="end_turn"),
        ev.PermissionRequest(request_id="r", tool_name="Bash", input={}),
        ev.ControlAck(request_id="r", ok=True),
        ev.ParseError(message="bad", line=b"x"),
    ):
        assert m.map(event) == []


def test_every_frame_is_a_valid_envelope():
    m = mapper(forward_unknown=True)
    frames = run(
        m,
        ev.SessionStarted(tools=["Bash"], mcp_servers=[ev.McpServer(name="x", status="failed")]),
        ev.TextDelta(block="a", text="x"),
        call("a1", "Agent", subagent_type="g"),
        ev.ToolOutput(call_id="a1", chunk="p"),
        ev.SubagentEnded(call_id="a1", status="completed", usage=ev.UsageInfo(input_tokens=1)),
        result("a1", {"text": "r"}),
        ev.Notice(severity="warning", code="X", message="m"),
        ev.Compacted(trigger="auto", summary="s", pre_tokens=1, post_tokens=1),
        ev.Unknown(kind="k", line=b"{}"),
    )
    frames += m.end_turn("end_turn")
    for frame in frames:
        assert isinstance(codec.decode(codec.encode(frame)), codec.Accepted | codec.Ignored)
