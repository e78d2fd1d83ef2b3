"""The ACP view of a session (gateway/protocol/acp_master.py) and the JSON-RPC it reads
(acp_rpc.py), sans-IO: frames in, ACP messages out; requests in, control frames out
(docs/acp-masters.md)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import pytest

from gateway.protocol import acp_rpc, codec
from gateway.protocol import frames as F
from gateway.protocol.acp_master import (
    MAX_ASKED,
    MAX_OPEN_TOOLS,
    MAX_STREAM_CHARS,
    STREAM_STEP_CHARS,
    AcpView,
)
from gateway.protocol.factory import FrameFactory
from parsers.acp import schema as S

SID = "11111111-2222-3333-4444-555555555555"
BUFFER = F.BufferStatus(policy_applied="RING", truncated=False)


def factory() -> FrameFactory:
    counter = itertools.count()
    return FrameFactory(
        SID, new_id=lambda: f"m{next(counter)}", clock=lambda: "2026-12-06T00:00:00.000Z"
    )


@pytest.fixture
def make():
    f = factory()

    def frame(payload: F.Payload, **kw: Any) -> bytes:
        return codec.encode(f.frame(payload, **kw))

    return f, frame


def view(f: FrameFactory, **kw: Any) -> AcpView:
    return AcpView(SID, f, **kw)


def decoded(messages: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(m) for m in messages]


def one_update(messages: list[bytes]) -> dict[str, Any]:
    [message] = decoded(messages)
    assert message["method"] == "session/update"
    assert message["params"]["sessionId"] == SID
    return message["params"]["update"]


def test_text_and_thinking_are_chunks_with_the_frames_message_id(make):
    f, frame = make
    v = view(f)
    data = frame(F.TextDelta(content_index=0, text="Hello"))
    [message] = decoded(v.frame(data))
    assert message["params"]["update"] == {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": "Hello"},
    }
    assert message["params"]["_meta"]["rawp"]["messageId"] == json.loads(data)["message_id"]
    assert v.last_seen == json.loads(data)["message_id"]
    thought = one_update(v.frame(frame(F.ThinkingDelta(content_index=1, text="hmm"))))
    assert thought["sessionUpdate"] == "agent_thought_chunk"
    assert v.frame(frame(F.ThinkingDelta(content_index=1, text="x", redacted=True))) == []
    assert v.frame(frame(F.TextDone(content_index=0, full_text="Hello"))) == []


def test_another_masters_prompt_is_a_user_message_chunk(make):
    f, frame = make
    update = one_update(view(f).frame(frame(F.PromptRequest(prompt_text="from the phone"))))
    assert update == {
        "sessionUpdate": "user_message_chunk",
        "content": {"type": "text", "text": "from the phone"},
    }


def test_a_tool_call_its_stream_and_its_diff(make):
    f, frame = make
    v = view(f)
    tool_input = {"file_path": "/w/a.txt", "old_string": "a", "new_string": "b"}
    call = one_update(
        v.frame(frame(F.InvokeRequest(invocation_id="t1", tool_name="Edit", input=tool_input)))
    )
    assert call["sessionUpdate"] == "tool_call"
    assert call["toolCallId"] == "t1"
    assert call["kind"] == "edit" and call["status"] == "pending"
    assert call["title"] == "Edit: /w/a.txt"
    assert call["locations"] == [{"path": "/w/a.txt"}]
    assert call["rawInput"] == tool_input
    result = F.InvokeResult(
        invocation_id="t1",
        tool_name="Edit",
        status="success",
        output="--- a\n+++ b\n",
        output_type="diff",
    )
    done = one_update(v.frame(frame(result)))
    assert done["status"] == "completed"
    assert done["content"] == [{"type": "diff", "path": "/w/a.txt", "oldText": "a", "newText": "b"}]


def test_a_streamed_command_shows_the_tail_of_its_output_and_a_failure(make):
    f, frame = make
    v = view(f)
    v.frame(frame(F.InvokeRequest(invocation_id="t2", tool_name="Bash", input={"command": "ls"})))
    first = one_update(v.frame(frame(F.InvokeStream(
        invocation_id="t2", tool_name="Bash", stream_type="stdout", chunk="a\n", sequence=0))))  # fmt: skip
    assert first["status"] == "in_progress"
    assert first["content"][0]["content"]["text"] == "a\n"
    big = "x" * (MAX_STREAM_CHARS * 2)
    second = one_update(v.frame(frame(F.InvokeStream(
        invocation_id="t2", tool_name="Bash", stream_type="stdout", chunk=big, sequence=1))))  # fmt: skip
    assert len(second["content"][0]["content"]["text"]) == MAX_STREAM_CHARS
    failed = one_update(v.frame(frame(F.InvokeResult(
        invocation_id="t2", tool_name="Bash", status="error", output="boom", output_type="text"))))  # fmt: skip
    assert failed["status"] == "failed"
    assert failed["content"] == [{"type": "content", "content": {"type": "text", "text": "boom"}}]


def test_a_command_printing_byte_by_byte_is_shown_in_steps_not_per_byte(make):
    f, frame = make
    v = view(f)
    v.frame(frame(F.InvokeRequest(invocation_id="t", tool_name="Bash", input={"command": "yes"})))
    sent = 0
    for i in range(20_000):
        chunk = F.InvokeStream(
            invocation_id="t", tool_name="Bash", stream_type="stdout", chunk="y", sequence=i
        )
        sent += sum(len(m) for m in v.frame(frame(chunk)))
    # Every update shows up to MAX_STREAM_CHARS of output, and comes after at least
    # STREAM_STEP_CHARS more (or half as much again early on): a bounded multiple of the output.
    assert sent < 20_000 * (MAX_STREAM_CHARS / STREAM_STEP_CHARS + 1) + 50_000


def test_a_unified_diff_without_the_tools_input_is_split_by_file(make):
    f, frame = make
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n keep\n-old\n+new\n--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+hi\n"
    result = F.InvokeResult(
        invocation_id="t3",
        tool_name="apply_patch",
        status="success",
        output=diff,
        output_type="diff",
    )
    done = one_update(view(f).frame(frame(result)))
    assert done["content"] == [
        {"type": "diff", "path": "x.py", "oldText": "keep\nold", "newText": "keep\nnew"},
        {"type": "diff", "path": "n.txt", "oldText": None, "newText": "hi"},
    ]


def test_todos_and_plans_are_plan_updates_not_tool_calls(make):
    f, frame = make
    v = view(f)
    todos = {
        "todos": [
            {"content": "one", "status": "in_progress"},
            {"content": "two", "status": "pending", "priority": "high"},
        ]
    }
    plan = one_update(
        v.frame(frame(F.InvokeRequest(invocation_id="p", tool_name="TodoWrite", input=todos)))
    )
    assert plan == {
        "sessionUpdate": "plan",
        "entries": [
            {"content": "one", "status": "in_progress", "priority": "medium"},
            {"content": "two", "status": "pending", "priority": "high"},
        ],
    }
    result = F.InvokeResult(
        invocation_id="p",
        tool_name="TodoWrite",
        status="success",
        output=[],
        output_type="structured",
    )
    assert v.frame(frame(result)) == []


USAGE = F.Usage(
    token_usage=F.TokenUsage(input_tokens=1, output_tokens=2),
    cost_usage=F.Quota(limit=-1, used=0.25, unit="USD"),
    message_usage=F.Quota(limit=-1, used=1, unit="messages"),
    time_to_reset="",
    context_window=F.ContextWindow(capacity=1000, used=10),
)


def test_usage_commands_and_mode(make):
    f, frame = make
    v = view(f)
    assert one_update(v.frame(frame(USAGE))) == {
        "sessionUpdate": "usage_update", "used": 10, "size": 1000, "cost": {"amount": 0.25, "currency": "USD"}}  # fmt: skip
    commands = F.CommandsPublish(commands=[F.Command(name="compact", description="Compact")])
    assert one_update(v.frame(frame(commands)))["availableCommands"] == [
        {"name": "compact", "description": "Compact"}
    ]
    change = F.StateChanged(previous_state="idle", current_state="idle", reason="mode_switch")
    update = one_update(
        v.frame(frame(change, metadata={"mode": "plan", "previous_mode": "default"}))
    )
    assert update == {"sessionUpdate": "current_mode_update", "currentModeId": "plan"}
    assert v.mode == "plan"


def test_a_prompt_is_answered_when_its_turn_ends(make):
    f, frame = make
    v = view(f, turn_events=True)
    mid, data = v.prompt(7, "hi")
    sent = json.loads(data)
    assert sent["type"] == "control.prompt.request" and sent["payload"]["prompt_text"] == "hi"
    assert sent["message_id"] == mid and sent["session_id"] == SID
    [start] = decoded(v.frame(frame(F.TurnStart(turn_id="T1", turn_index=0))))
    assert start["method"] == "_rawp/turn"
    assert start["params"]["event"] == "start" and start["params"]["requestId"] == 7
    assert v.settle(mid) == []  # the turn answers it, later
    [end] = decoded(v.frame(frame(F.TurnEnd(turn_id="T1", stop_reason="end_turn"))))
    # The answer waits for the turn's usage, which follows its end (DPS-7.5.2-usage).
    usage, answer = decoded(v.frame(frame(USAGE)))
    assert usage["params"]["update"]["sessionUpdate"] == "usage_update"
    assert end["params"] == {
        "sessionId": SID, "turnId": "T1", "event": "end", "stopReason": "end_turn",
        "_meta": {"rawp": {"messageId": end["params"]["_meta"]["rawp"]["messageId"]}}}  # fmt: skip
    assert answer == {
        "jsonrpc": "2.0", "id": 7, "result": {"stopReason": "end_turn", "_meta": {"rawp": {"turnId": "T1"}}}}  # fmt: skip


def test_a_turn_that_ends_as_acp_cannot_say_is_an_error_with_the_gateways_code(make):
    stop, code = "error", "TURN_FAILED"
    f, frame = make
    v = view(f)
    v.prompt("p", "hi")
    v.frame(frame(F.TurnStart(turn_id="T", turn_index=0)))
    died = F.AgentError(
        error_code="AGENT_CRASHED", message="exit 1", severity="fatal", recoverable=False
    )
    assert v.frame(frame(died)) == []
    assert v.frame(frame(F.TurnEnd(turn_id="T", stop_reason=stop))) == []
    [_usage, answer] = decoded(v.frame(frame(USAGE)))
    assert answer["error"]["data"]["agentError"] == {
        "error_code": "AGENT_CRASHED",
        "message": "exit 1",
    }
    assert "AGENT_CRASHED" in answer["error"]["message"]
    assert answer["id"] == "p"
    assert answer["error"]["code"] == -32603
    assert answer["error"]["data"]["error_code"] == code
    assert answer["error"]["data"]["turnId"] == "T"


def test_a_refused_control_answers_its_request_with_the_error_code(make):
    f, frame = make
    v = view(f)
    mid, _ = v.prompt(3, "hi")
    error = F.SessionError(error_code="FORBIDDEN", message="needs operator", fatal=False)
    [answer] = decoded(v.frame(frame(error, parent_id=mid)))
    assert answer == {
        "jsonrpc": "2.0", "id": 3, "error": {"code": -32000, "message": "needs operator",
        "data": {"error_code": "FORBIDDEN", "message": "needs operator"}}}  # fmt: skip
    assert v.settle(mid) == []
    # Another master's turn is not this prompt's.
    assert [m for m in decoded(v.frame(frame(F.TurnStart(turn_id="X", turn_index=1))))] == []
    assert v.frame(frame(F.TurnEnd(turn_id="X", stop_reason="end_turn"))) == []


def test_a_mode_switch_is_answered_once_taken(make):
    f, _ = make
    v = view(f)
    mid, data = v.set_mode(9, "plan")
    assert json.loads(data)["payload"] == {"mode": "plan"}
    assert decoded(v.settle(mid)) == [{"jsonrpc": "2.0", "id": 9, "result": {}}]


def test_cancel_names_the_running_turn_and_nothing_without_one(make):
    f, frame = make
    v = view(f)
    assert v.cancel() is None
    v.frame(frame(F.TurnStart(turn_id="T9", turn_index=0)))
    assert json.loads(v.cancel() or b"")["payload"] == {"target_turn_id": "T9"}


def test_a_permission_question_and_its_answer(make):
    f, frame = make
    v = view(f)
    invoke = F.InvokeRequest(invocation_id="t1", tool_name="Write", input={"file_path": "a"})
    [call] = decoded(v.frame(frame(invoke)))
    question = F.InteractionRequest(
        interaction_id="i1",
        interaction_type="PERMISSION",
        question_text="Allow Write to a?",
        timeout_sec=60,
        options=[
            F.InteractionOption(value="allow", label="Allow"),
            F.InteractionOption(value="deny", label="Deny"),
        ],
        context=F.InteractionContext(tool_name="Write", tool_input={"file_path": "a"}),
    )
    [request] = decoded(v.frame(frame(question, metadata={"invocation_id": "t1"})))
    assert request["method"] == "session/request_permission"
    assert request["id"] == "rawp-ask-i1" and v.asked == {"rawp-ask-i1": "i1"}
    params = request["params"]
    assert params["toolCall"]["toolCallId"] == "t1"
    assert params["toolCall"]["kind"] == "edit"
    # The toolCall is an update of the call: its own title stays; the question has its own place.
    assert params["toolCall"]["title"] == call["params"]["update"]["title"]
    assert params["_meta"]["rawp"]["question"] == "Allow Write to a?"
    assert params["options"] == [
        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
        {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
    ]
    answer = v.answer("rawp-ask-i1", b'{"outcome":{"outcome":"selected","optionId":"allow"}}')
    sent = json.loads(answer or b"")
    assert sent["type"] == "control.interaction.response"
    assert sent["payload"] == {"interaction_id": "i1", "selected_value": "allow"}
    assert v.answer("rawp-ask-i1", b'{"outcome":{"outcome":"selected","optionId":"allow"}}') is None
    # A replayed question was answered long ago: it asks nothing.
    history = F.History(
        frames=[msgspec.Raw(codec.encode(f.frame(question)))],
        buffer_status=BUFFER,
        last_sync_timestamp="",
        last_message_id="mX",
    )
    assert v.frame(frame(history)) == []
    assert v.last_seen == "mX"


def test_a_client_that_never_answers_holds_a_bounded_number_of_questions(make):
    f, frame = make
    v = view(f)
    for i in range(MAX_ASKED + 10):
        question = F.InteractionRequest(
            interaction_id=f"i{i}",
            interaction_type="PERMISSION",
            question_text="?",
            timeout_sec=1,
            options=[F.InteractionOption(value="allow", label="Allow")],
        )
        v.frame(frame(question))
    assert len(v.asked) == MAX_ASKED
    assert "rawp-ask-i0" not in v.asked and f"rawp-ask-i{MAX_ASKED + 9}" in v.asked


def test_cancelled_or_malformed_answers_say_nothing(make):
    f, _ = make
    v = view(f)
    v.asked["rawp-ask-a"] = "a"
    v.asked["rawp-ask-b"] = "b"
    assert v.answer("rawp-ask-a", b'{"outcome":{"outcome":"cancelled"}}') is None
    assert v.answer("rawp-ask-b", b"[[[") is None
    assert v.answer("unknown", b"{}") is None


def test_a_history_is_replayed_as_the_same_updates_without_answering_anything(make):
    f, frame = make
    v = view(f, turn_events=True)
    inner = [
        codec.encode(f.frame(F.PromptRequest(prompt_text="earlier"))),
        codec.encode(f.frame(F.TurnStart(turn_id="old", turn_index=0))),
        codec.encode(f.frame(F.TextDelta(content_index=0, text="reply"))),
        codec.encode(f.frame(F.TurnEnd(turn_id="old", stop_reason="end_turn"))),
    ]
    v.prompt(1, "mine")  # waiting for its own turn: a replayed turn is not it
    history = F.History(
        frames=[msgspec.Raw(b) for b in inner],
        buffer_status=BUFFER,
        last_sync_timestamp="",
        last_message_id=json.loads(inner[-1])["message_id"],
    )
    out = decoded(v.frame(frame(history)))
    assert [m["method"] for m in out] == [
        "session/update",
        "_rawp/turn",
        "session/update",
        "_rawp/turn",
    ]
    assert [m["params"].get("event") for m in out] == [None, "start", None, "end"]
    assert "requestId" not in out[1]["params"]
    assert not any("id" in m for m in out)


def test_the_view_forgets_the_oldest_open_tool_calls(make):
    f, frame = make
    v = view(f)
    for i in range(MAX_OPEN_TOOLS + 5):
        v.frame(frame(F.InvokeRequest(invocation_id=f"t{i}", tool_name="Read", input={})))
    assert len(v._tools) == MAX_OPEN_TOOLS


def test_leaving_answers_every_waiting_request(make):
    f, frame = make
    v = view(f)
    v.prompt(1, "a")
    v.frame(frame(F.TurnStart(turn_id="T", turn_index=0)))
    v.set_mode(2, "plan")
    answers = decoded(v.ended("SESSION_TERMINATED", "the session ended"))
    assert sorted(a["id"] for a in answers) == [1, 2]
    assert {a["error"]["data"]["error_code"] for a in answers} == {"SESSION_TERMINATED"}
    assert v.ended("X", "y") == []


# --- JSON-RPC in ---------------------------------------------------------------------------------


def refused(data: str | bytes) -> dict[str, Any]:
    got = acp_rpc.read(data)
    assert isinstance(got, acp_rpc.Refused), got
    return json.loads(got.response)


def test_requests_notifications_and_responses_are_told_apart():
    request = acp_rpc.read(
        '{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s"}}'
    )
    assert isinstance(request, acp_rpc.Message) and request.is_request and request.id == 1
    params = acp_rpc.params(request, S.PromptParams)
    assert isinstance(params, S.PromptParams) and params.sessionId == "s"
    note = acp_rpc.read('{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}')
    assert isinstance(note, acp_rpc.Message) and not note.is_request and note.id is None
    answer = acp_rpc.read(
        '{"jsonrpc":"2.0","id":"rawp-ask-1","result":{"outcome":{"outcome":"cancelled"}}}'
    )
    assert isinstance(answer, acp_rpc.Message) and answer.method is None
    assert json.loads(answer.result or b"") == {"outcome": {"outcome": "cancelled"}}


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ("{not json", -32700),
        ("[" * 5000 + "]" * 5000, -32700),
        ('{"jsonrpc":"2.0","id":1,"method":"x","params":' + "[" * 200 + "]" * 200 + "}", -32700),
        ("[]", -32600),
        ("[1, 2]", -32600),
        ('"a string"', -32600),
        ('{"id":1,"method":"initialize"}', -32600),
        ('{"jsonrpc":"2.0","id":{"a":1},"method":"initialize"}', -32600),
        ('{"jsonrpc":"2.0","id":true,"method":"initialize"}', -32600),
        ('{"jsonrpc":"2.0","id":1,"method":7}', -32600),
        ('{"jsonrpc":"2.0"}', -32600),
        (b"\xff\xfe", -32700),
    ],
)
def test_what_is_not_json_rpc_is_answered_not_raised(data, code):
    assert refused(data)["error"]["code"] == code


def test_params_of_the_wrong_shape_are_invalid_params():
    got = acp_rpc.read(
        '{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"prompt":"no"}}'
    )
    assert isinstance(got, acp_rpc.Message)
    bad = acp_rpc.params(got, S.PromptParams)
    assert isinstance(bad, acp_rpc.Refused)
    assert json.loads(bad.response)["error"]["code"] == -32602
    assert json.loads(bad.response)["id"] == 4


def test_the_rate_limit_refills_and_gives_up_on_a_flood():
    limit = acp_rpc.RateLimit(0.0)
    assert all(limit.take(0.0) for _ in range(acp_rpc.RATE_BURST))
    assert not limit.take(0.0)
    assert limit.take(1.0)  # refilled
    for _ in range(acp_rpc.RATE_BURST + acp_rpc.MAX_REFUSED_IN_A_ROW):
        limit.take(1.0)
    assert limit.hopeless


def test_a_load_replays_news_and_only_the_state_said_after_it_is_marked_state(make):
    """While a view is greeted (a load), the history it replays is the session's news (no
    ``state`` mark: a client loads after its ids); what is said again after it is state."""
    f, frame = make
    v = view(f)
    history = F.History(
        frames=[msgspec.Raw(codec.encode(f.frame(F.PromptRequest(prompt_text="earlier"))))],
        buffer_status=BUFFER,
        last_sync_timestamp="",
        last_message_id="m0",
    )
    v.greeting = True
    [replayed] = decoded(v.frame(frame(history)))
    assert replayed["params"]["_meta"] == {"rawp": {"messageId": "m0"}}
    [again] = decoded(v.frame(frame(F.TextDelta(content_index=0, text="said again"))))
    assert again["params"]["_meta"]["rawp"]["state"] is True
    assert v.last_seen == "m0"


def catalog() -> F.CatalogPublish:
    return F.CatalogPublish(tools=[F.CatalogTool(name="Read", description="Read a file")])


def test_what_became_of_the_mcp_servers_is_a_session_info_update_once_per_change(make):
    """docs/acp-masters.md: the catalog's ``metadata.rawp_mcp_servers`` reaches an editor as a
    ``session_info_update`` with ``_meta.rawp.mcpServers``, when it changed, and again in the
    greeting; a catalog without servers says nothing. The update parses with the pinned SDK's
    schema (agent-client-protocol), which an editor's client validates with."""
    from acp.schema import SessionNotification

    f, frame = make
    v = view(f)
    assert v.frame(frame(catalog())) == []  # a session without servers: nothing to say
    pending = [{"name": "docs", "kind": "stdio", "origin": "editor", "command": ["docs-mcp"],
                "env": ["TOKEN"], "status": "pending"}]  # fmt: skip
    failed = [{**pending[0], "status": "failed", "reason": "Connection closed"}]
    first = v.frame(frame(catalog(), metadata={"rawp_mcp_servers": pending}))
    [message] = decoded(first)
    assert message["params"]["update"] == {
        "sessionUpdate": "session_info_update",
        "_meta": {"rawp": {"mcpServers": pending}},
    }
    assert message["params"]["_meta"]["rawp"]["messageId"]
    parsed = SessionNotification.model_validate(message["params"])
    assert parsed.update.session_update == "session_info_update"
    assert parsed.update.field_meta == {"rawp": {"mcpServers": pending}}
    # The same servers again (a catalog published for its tools): not said twice.
    assert v.frame(frame(catalog(), metadata={"rawp_mcp_servers": pending})) == []
    assert one_update(v.frame(frame(catalog(), metadata={"rawp_mcp_servers": failed}))) == {
        "sessionUpdate": "session_info_update",
        "_meta": {"rawp": {"mcpServers": failed}},
    }
    # An attach says the session's state again, unchanged or not, marked as state.
    v.greeting = True
    [again] = decoded(v.frame(frame(catalog(), metadata={"rawp_mcp_servers": failed})))
    assert again["params"]["update"]["_meta"]["rawp"]["mcpServers"] == failed
    assert again["params"]["_meta"]["rawp"]["state"] is True
    v.greeting = False
    # Servers gone from the catalog (none any more): said once, as an empty list.
    assert one_update(v.frame(frame(catalog())))["_meta"] == {"rawp": {"mcpServers": []}}
    assert v.frame(frame(catalog())) == []
