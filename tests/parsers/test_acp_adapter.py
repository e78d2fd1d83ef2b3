"""The ACP adapter (``parsers/acp/adapter.py``) in the real session machine, sans-IO: JSON-RPC lines in the
shapes of the protocol's schema go in as the agent's stdout, frames and stdin writes come out.
What real agents print is covered by ``tests/e2e/test_e2e_acp.py``; here each rule of the mapping page
is checked on its own, including the agent misbehaving."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from gateway.protocol import actions as act
from gateway.protocol.capabilities import ALL_FEATURES
from gateway.protocol.machine import CANCEL_SIGINT_TIMER, CANCEL_STOP_TIMER, interaction_timer
from gateway.protocol.states import Lifecycle, ProcessState
from parsers import acp
from parsers import events as ev
from parsers.acp import schema
from parsers.acp.adapter import MAX_PENDING
from tests.support.acp_rig import SID, Rig, permission, rpc, update


def test_handshake_and_a_prompt_given_before_the_session_exists():
    """The prompt waits in the adapter until session/new answers, then goes as session/prompt;
    the agent's session id is announced (§18.3)."""
    rig = Rig()
    rig.take(rig.machine.start())
    rig.master("control.prompt.request", {"prompt_text": "early"})
    assert [w["method"] for w in rig.writes] == ["initialize"]
    rig.agent(rpc(id=0, result={"protocolVersion": 1, "agentCapabilities": {}}))
    rig.agent(rpc(id=1, result={"sessionId": SID}))
    assert [w["method"] for w in rig.writes] == ["initialize", "session/new", "session/prompt"]
    assert rig.writes[-1]["params"]["prompt"][0]["text"] == "early"
    caps = rig.of("session.capabilities")
    assert caps[-1]["payload"]["extensions"]["agent_session_id"] == SID
    assert rig.machine.agent_session_id == SID


def test_DPS_4_1_text_and_thinking_chunks_become_blocks_and_the_turn_ends():
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    rig.agent(update("agent_thought_chunk", content={"type": "text", "text": "hmm "}))
    rig.agent(update("agent_thought_chunk", content={"type": "text", "text": "ok"}))
    rig.agent(update("agent_message_chunk", content={"type": "text", "text": "Hel"}))
    rig.agent(update("agent_message_chunk", content={"type": "text", "text": "lo"}))
    rig.agent(
        update("usage_update", used=5000, size=200000, cost={"amount": 0.5, "currency": "USD"})
    )
    usage = {"inputTokens": 10, "outputTokens": 3, "totalTokens": 13, "cachedReadTokens": 2}
    rig.end(pid, usage=usage)
    assert "".join(f["payload"]["text"] for f in rig.of("agent.thinking.delta")) == "hmm ok"
    (done,) = rig.of("agent.text.done")
    assert done["payload"]["full_text"] == "Hello"
    assert len(rig.of("agent.thinking.done")) == 1
    assert rig.frames[-3]["type"] == "session.turn.end"  # then session.usage, then idle
    assert rig.frames[-3]["payload"]["stop_reason"] == "end_turn"
    usage_frame = rig.frames[-2]["payload"]
    assert usage_frame["token_usage"]["input_tokens"] == 10
    assert usage_frame["token_usage"]["cache_read_tokens"] == 2
    assert usage_frame["cost_usage"]["used"] == 0.5
    assert usage_frame["context_window"] == {"capacity": 200000, "used": 5000, "utilization": 0.025}


@pytest.mark.parametrize(
    ("stop", "dps", "code"),
    [
        ("max_tokens", "max_tokens", None),
        ("max_turn_requests", "error", "MAX_TURN_REQUESTS"),
        ("refusal", "error", "AGENT_REFUSED"),
        ("cancelled", "cancelled", None),
    ],
)
def test_DPS_7_5_2_stop_reasons_map_to_end_states_and_errors(stop, dps, code):
    rig = Rig()
    rig.start()
    rig.end(rig.prompt(), stop)
    assert rig.of("session.turn.end")[-1]["payload"]["stop_reason"] == dps
    errors = [f["payload"]["error_code"] for f in rig.of("agent.error")]
    assert errors == ([code] if code else [])


def test_DPS_5_3_3_tool_outputs_by_kind_and_content():
    """diff content → a unified diff; read → file_content; search with locations only →
    file_list; execute → text without the agent's code fence; streamed output while running."""
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    diff = {
        "type": "diff",
        "path": "/srv/project/a.txt",
        "oldText": "one\ntwo\n",
        "newText": "one\n2\n",
    }
    rig.agent(
        update("tool_call", toolCallId="c1", title="Edit a.txt", kind="edit", status="pending")
    )
    rig.agent(update("tool_call_update", toolCallId="c1", status="completed", content=[diff]))
    text = {"type": "content", "content": {"type": "text", "text": "line 1\n"}}
    rig.agent(
        update("tool_call", toolCallId="c2", title="Read a", kind="read", status="in_progress")
    )
    rig.agent(update("tool_call_update", toolCallId="c2", status="completed", content=[text]))
    loc = [{"path": "/srv/project/a.txt"}, {"path": "/srv/project/b.txt"}]
    rig.agent(update("tool_call", toolCallId="c3", title="Find", kind="search", locations=loc))
    rig.agent(update("tool_call_update", toolCallId="c3", status="completed"))
    fenced = {"type": "content", "content": {"type": "text", "text": "```console\nhi\n```"}}
    rig.agent(
        update(
            "tool_call",
            toolCallId="c4",
            title="echo hi",
            kind="execute",
            status="in_progress",
            rawInput={"command": "echo hi"},
        )
    )
    rig.agent(update("tool_call_update", toolCallId="c4", status="in_progress", content=[text]))
    rig.agent(update("tool_call_update", toolCallId="c4", status="completed", content=[fenced]))
    rig.end(pid)
    requests = {f["payload"]["invocation_id"]: f["payload"] for f in rig.of("tool.invoke.request")}
    results = [f["payload"] for f in rig.of("tool.invoke.result")]
    assert [r["output_type"] for r in results] == ["diff", "file_content", "file_list", "text"]
    assert results[0]["output"] == (
        "--- /srv/project/a.txt\n+++ /srv/project/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n"
    )
    assert results[1]["output"] == "line 1\n"
    assert results[2]["output"] == ["/srv/project/a.txt", "/srv/project/b.txt"]
    assert results[3]["output"] == "hi\n"
    assert all(r["status"] == "success" for r in results)
    shell = requests[results[3]["invocation_id"]]
    assert shell["tool_name"] == "execute" and shell["input"] == {"command": "echo hi"}
    (stream,) = rig.of("tool.invoke.stream")
    assert stream["payload"]["chunk"] == "line 1\n" and stream["payload"]["stream_type"] == "stdout"


def claude_bash_announced(rig: Rig, call_id: str) -> dict[str, Any]:
    """A Bash call as claude-agent-acp announces it: pending, empty input and content; its
    ``_meta``."""
    meta = {"claudeCode": {"toolName": "Bash"}}
    announce = {"title": "Terminal", "kind": "execute", "status": "pending", "rawInput": {}}
    rig.agent(update("tool_call", toolCallId=call_id, content=[], _meta=meta, **announce))
    return meta


def test_a_pending_call_without_input_waits_for_its_input():
    """Claude's adapter reports a call pending with an empty rawInput, then its input: the
    request carries the input."""
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    meta = claude_bash_announced(rig, "t")
    assert rig.of("tool.invoke.request") == []
    rig.agent(update("tool_call_update", toolCallId="t", rawInput={"command": "ls"}, _meta=meta))
    (req,) = rig.of("tool.invoke.request")
    assert req["payload"]["tool_name"] == "Bash" and req["payload"]["input"] == {"command": "ls"}
    rig.agent(
        update(
            "tool_call_update",
            toolCallId="t",
            status="failed",
            content=[{"type": "content", "content": {"type": "text", "text": "boom"}}],
        )
    )
    rig.end(pid)
    (res,) = rig.of("tool.invoke.result")
    assert res["payload"]["status"] == "error" and res["payload"]["output"] == "boom"


def _text(value: str) -> list[dict[str, Any]]:
    return [{"type": "content", "content": {"type": "text", "text": value}}]


def test_DPS_5_3_1_result_an_empty_content_list_replaces_the_earlier_content():
    """ACP: a tool_call_update's content replaces the call's, an empty list too. Gemini's shell
    is announced in_progress with a note about its working directory and completes with
    ``"content": []``: the result is empty, not the note, and the note is never stdout."""
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    note = "[current working directory /srv/project]"
    rig.agent(
        update(
            "tool_call",
            toolCallId="sh",
            title="echo hi",
            kind="execute",
            status="in_progress",
            content=_text(note),
        )
    )
    rig.agent(
        update("tool_call_update", toolCallId="sh", status="completed", content=[], kind="execute")
    )
    rig.end(pid)
    (request,) = rig.of("tool.invoke.request")
    (result,) = rig.of("tool.invoke.result")
    assert request["payload"]["input"] == {"title": "echo hi"}
    assert (result["payload"]["status"], result["payload"]["output"]) == ("success", "")
    assert result["payload"]["output_type"] == "empty"
    assert rig.of("tool.invoke.stream") == []


def test_DPS_5_3_1_result_content_that_is_left_out_keeps_the_earlier_content():
    """An update without ``content`` changes nothing of it: Claude's Write reports its diff with
    its input and completes with none; the result is that diff."""
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    diff = {"type": "diff", "path": "/srv/project/a.txt", "oldText": None, "newText": "new\n"}
    rig.agent(update("tool_call", toolCallId="w", kind="edit", status="pending", content=[]))
    rig.agent(update("tool_call_update", toolCallId="w", rawInput={"x": 1}, content=[diff]))
    rig.agent(update("tool_call_update", toolCallId="w", status="completed", rawOutput="ok"))
    rig.end(pid)
    (result,) = rig.of("tool.invoke.result")
    assert result["payload"]["output_type"] == "diff"
    assert result["payload"]["output"].startswith("--- /dev/null\n")


def test_DPS_5_3_2_stream_only_content_of_a_running_call_is_streamed():
    """Claude's adapter sends a Bash call's description as its content in an update without a
    status while the call is pending: not output. Content reported while the call is
    ``in_progress`` (said by this update, or by an earlier one: ACP leaves out what did not
    change) is streamed, only what is new of it; the result is the completion's content."""
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    meta = claude_bash_announced(rig, "b")
    rig.agent(
        update(
            "tool_call_update",
            toolCallId="b",
            rawInput={"command": "echo hi", "description": "Print hi"},
            content=_text("Print hi"),
            _meta=meta,
        )
    )
    assert len(rig.of("tool.invoke.request")) == 1
    assert rig.of("tool.invoke.stream") == []
    rig.agent(update("tool_call_update", toolCallId="b", status="in_progress"))
    rig.agent(update("tool_call_update", toolCallId="b", content=_text("h")))
    rig.agent(update("tool_call_update", toolCallId="b", content=_text("hi\n")))
    rig.agent(
        update(
            "tool_call_update",
            toolCallId="b",
            status="completed",
            rawOutput="hi",
            content=_text("```console\nhi\n```"),
        )
    )
    rig.end(pid)
    chunks = [f["payload"]["chunk"] for f in rig.of("tool.invoke.stream")]
    assert chunks == ["h", "i\n"]
    assert all(f["payload"]["stream_type"] == "stdout" for f in rig.of("tool.invoke.stream"))
    (result,) = rig.of("tool.invoke.result")
    assert (result["payload"]["output"], result["payload"]["output_type"]) == ("hi\n", "text")


def test_plan_commands_and_mode_updates():
    """plan → update_plan with a structured result; available_commands_update →
    agent.commands.publish; current_mode_update → a mode frame (and the session's mode)."""
    rig = Rig()
    rig.start()
    cmds = [
        {"name": "compact", "description": "Compact the context\nmore"},
        {"name": "init", "description": "Init"},
    ]
    rig.agent(update("available_commands_update", availableCommands=cmds))
    empty, pub = rig.of("agent.commands.publish")  # none at session/new, then the agent's
    assert empty["payload"]["commands"] == []
    assert pub["payload"]["commands"] == [
        {"name": "compact", "description": "Compact the context"},
        {"name": "init", "description": "Init"},
    ]
    pid = rig.prompt()
    entries = [
        {"content": "Read", "priority": "high", "status": "completed"},
        {"content": "Fix", "priority": "low", "status": "pending"},
    ]
    rig.agent(update("plan", entries=entries))
    rig.agent(update("current_mode_update", currentModeId="plan"))
    rig.end(pid)
    (plan,) = rig.of("tool.invoke.result")
    assert plan["payload"]["tool_name"] == "update_plan"
    assert plan["payload"]["output_type"] == "structured" and plan["payload"]["output"] == entries
    switch = [f for f in rig.of("agent.state.changed") if f["payload"]["reason"] == "mode_switch"]
    assert switch[-1]["metadata"] == {
        "mode": "plan",
        "previous_mode": "default",
        "agent_mode": "plan",
    }
    assert rig.machine.mode == "plan"


def test_DPS_6_3_mode_switch_is_session_set_mode():
    rig = Rig()
    rig.start(modes=["default", "autoEdit", "plan"])
    rig.master("control.mode.switch", {"mode": "plan"})
    sent = rig.last_write()
    assert sent["method"] == "session/set_mode" and sent["params"] == {
        "sessionId": SID,
        "modeId": "plan",
    }
    rig.agent(rpc(id=sent["id"], result={}))
    rig.master("control.mode.switch", {"mode": "default"})
    assert rig.last_write()["params"]["modeId"] == "default"


def test_an_agent_without_a_plan_mode_announces_no_plan_mode():
    rig = Rig()
    rig.start(modes=["read-only", "auto"])
    assert rig.machine.config.features.plan_mode is None
    assert rig.of("session.capabilities")[-1]["payload"]["features"].get("plan_mode") is not True
    rig.master("control.mode.switch", {"mode": "plan"})
    assert rig.frames[-1]["payload"]["error_code"] == "MODE_NOT_SUPPORTED"


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ("allow", {"outcome": "selected", "optionId": "proceed_once"}),
        ("allow_always", {"outcome": "selected", "optionId": "proceed_always"}),
        ("deny", {"outcome": "selected", "optionId": "cancel"}),
    ],
)
def test_DPS_6_2_interaction_permission_with_the_agents_own_options(answer, outcome):
    rig = Rig()
    rig.start()
    rig.prompt()
    rig.agent(permission())
    (ask,) = rig.of("agent.interaction.request")
    options = ask["payload"]["options"]
    assert [(o["value"], o["label"]) for o in options] == [
        ("allow_always", "Allow always"),
        ("allow", "Allow once"),
        ("deny", "Reject"),
    ]
    assert ask["payload"]["context"]["affected_paths"] == ["/srv/project/a.txt"]
    assert (
        ask["metadata"]["invocation_id"]
        == rig.of("tool.invoke.request")[0]["payload"]["invocation_id"]
    )
    rig.master(
        "control.interaction.response",
        {"interaction_id": ask["payload"]["interaction_id"], "selected_value": answer},
    )
    assert rig.last_write() == {"jsonrpc": "2.0", "id": 7, "result": {"outcome": outcome}}


def test_DPS_6_1_2_cancel_is_session_cancel_and_a_waiting_permission_is_cancelled():
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    rig.agent(permission(rpc_id="p-9"))
    rig.agent(update("agent_message_chunk", content={"type": "text", "text": "par"}))
    turn_id = rig.of("session.turn.start")[0]["payload"]["turn_id"]
    rig.master("control.prompt.cancel", {"target_turn_id": turn_id})
    assert rig.writes[-2] == {
        "jsonrpc": "2.0",
        "id": "p-9",
        "result": {"outcome": {"outcome": "cancelled"}},
    }
    assert rig.writes[-1] == {
        "jsonrpc": "2.0",
        "method": "session/cancel",
        "params": {"sessionId": SID},
    }
    rig.end(pid, "cancelled")
    assert rig.of("session.turn.end")[-1]["payload"]["stop_reason"] == "cancelled"
    assert rig.of("agent.text.done")[0]["payload"]["is_cancelled"] is True
    assert rig.of("tool.invoke.result")[0]["payload"]["status"] == "cancelled"


def _cancelled_turn(rig: Rig) -> None:
    pid = rig.prompt("count")
    rig.agent(update("agent_message_chunk", content={"type": "text", "text": "one, two"}))
    turn_id = rig.of("session.turn.start")[-1]["payload"]["turn_id"]
    rig.master("control.prompt.cancel", {"target_turn_id": turn_id})
    rig.end(pid, "cancelled")


def test_DPS_6_1_2_cancel_an_empty_answer_right_after_a_cancel_is_flagged():
    """claude-agent-acp 0.23.1 answers the prompt after a cancel at once with an empty
    ``end_turn`` and gives its answer with the next prompt. The turn ends as the agent said
    (``end_turn``), with an ``agent.error`` warning ``ACP_EMPTY_TURN`` saying so; the late answer
    is passed on in the turn it comes in, unhidden. An empty answer with no cancel before it, or
    an answer after a cancel that says something, is not flagged."""
    rig = Rig()
    rig.start()
    rig.end(rig.prompt("nothing to say"))  # empty, but no cancel before it
    _cancelled_turn(rig)
    rig.end(rig.prompt("second"))
    (flag,) = rig.of("agent.error")
    payload = flag["payload"]
    assert (payload["error_code"], payload["severity"]) == ("ACP_EMPTY_TURN", "warning")
    assert payload["recoverable"] is True
    second_turn = rig.of("session.turn.start")[-1]["payload"]["turn_id"]
    assert flag["turn_id"] == second_turn
    assert rig.of("session.turn.end")[-1]["payload"]["stop_reason"] == "end_turn"
    pid = rig.prompt("third")
    for text in ("Answer two.", "Answer three."):
        rig.agent(update("agent_message_chunk", content={"type": "text", "text": text}))
    rig.end(pid)
    assert rig.of("agent.text.done")[-1]["payload"]["full_text"] == "Answer two.Answer three."
    assert len(rig.of("agent.error")) == 1
    _cancelled_turn(rig)
    pid = rig.prompt("fourth")
    rig.agent(update("agent_message_chunk", content={"type": "text", "text": "At once."}))
    rig.end(pid)
    assert len(rig.of("agent.error")) == 1


def test_DPS_6_2_interaction_a_timed_out_permission_answers_cancelled():
    rig = Rig()
    rig.start()
    rig.prompt()
    rig.agent(permission())
    (ask,) = rig.of("agent.interaction.request")
    rig.take(rig.machine.timer_fired(interaction_timer(ask["payload"]["interaction_id"])))
    assert rig.last_write()["result"] == {"outcome": {"outcome": "cancelled"}}


def test_unknown_methods_and_fs_get_json_rpc_errors_and_the_session_goes_on():
    rig = Rig()
    rig.start()
    for method in ("fs/read_text_file", "terminal/create", "x/whatever"):
        rig.agent(
            rpc(id=f"q-{method}", method=method, params={"sessionId": SID, "path": "/etc/passwd"})
        )
        answer = rig.last_write()
        assert answer["id"] == f"q-{method}" and answer["error"]["code"] == -32601
    assert [f["payload"]["error_code"] for f in rig.of("agent.error")] == ["ACP_UNKNOWN_METHOD"] * 3
    assert all(f["payload"]["severity"] == "warning" for f in rig.of("agent.error"))
    assert rig.of("session.turn.start") == []  # said between turns, no turn opened
    pid = rig.prompt()
    rig.end(pid)
    assert rig.of("session.turn.end")[-1]["payload"]["stop_reason"] == "end_turn"


def test_a_response_to_an_id_never_sent_and_non_json_are_warnings():
    rig = Rig()
    rig.start()
    rig.agent(rpc(id=999, result={"stopReason": "end_turn"}))
    rig.agent(b"this is not json")
    rig.agent(b'{"some": "object"}')
    codes = [f["payload"]["error_code"] for f in rig.of("agent.error")]
    assert codes == ["ACP_UNEXPECTED_RESPONSE", "ACP_INVALID_MESSAGE", "ACP_INVALID_MESSAGE"]
    assert rig.of("session.turn.start") == [] and rig.machine.lifecycle is Lifecycle.IDLE
    for _ in range(2 * acp.MAX_PROTOCOL_WARNINGS):
        rig.agent(b"garbage")
    assert len(rig.of("agent.error")) == acp.MAX_PROTOCOL_WARNINGS  # bounded per process
    assert rig.adapter.parse_errors == 2 * acp.MAX_PROTOCOL_WARNINGS + 2


def test_a_request_with_params_of_the_wrong_shape_is_answered():
    rig = Rig()
    rig.start()
    rig.agent(rpc(id="odd", method="session/request_permission", params={"options": 5}))
    assert rig.last_write() == {
        "jsonrpc": "2.0",
        "id": "odd",
        "error": {"code": -32602, "message": "invalid params"},
    }
    assert rig.of("agent.error")[-1]["payload"]["error_code"] == "ACP_INVALID_MESSAGE"


def test_a_failed_prompt_ends_the_turn_with_error():
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    rig.agent(rpc(id=pid, error={"code": -32603, "message": "Internal error: model down"}))
    assert rig.of("session.turn.end")[-1]["payload"]["stop_reason"] == "error"
    assert rig.of("agent.error")[-1]["payload"]["message"] == "Internal error: model down"


def test_restart_loads_the_session_and_drops_its_replay():
    """A long-lived agent started again with the agent's session id (a restored session, the
    stall watchdog): session/load, whose replayed updates masters do not get twice."""
    rig = Rig(can_load=True)
    rig.start()
    adapter = rig.adapter
    data = adapter.opening(SID)
    assert json.loads(data)["method"] == "initialize"
    rig.agent(rpc(id=0, result={"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}))
    load = rig.last_write()
    assert load["method"] == "session/load"
    assert load["params"] == {"sessionId": SID, "cwd": "/srv/project", "mcpServers": []}
    before = len(rig.frames)
    rig.agent(update("user_message_chunk", content={"type": "text", "text": "old prompt"}))
    rig.agent(update("agent_message_chunk", content={"type": "text", "text": "old answer"}))
    rig.agent(rpc(id=load["id"], result=None))
    assert [f["type"] for f in rig.frames[before:]] == []  # nothing replayed, same session id
    assert adapter.dropped_load_updates == 2
    pid = rig.prompt()
    rig.end(pid)


def test_restart_without_load_starts_a_new_session_and_says_so():
    rig = Rig(can_load=False)
    rig.start()
    rig.adapter.opening(SID)
    rig.agent(rpc(id=0, result={"protocolVersion": 1, "agentCapabilities": {}}))
    assert rig.last_write()["method"] == "session/new"
    (warning,) = rig.of("agent.error")
    assert warning["payload"]["error_code"] == "ACP_SESSION_NOT_RESUMED"


def test_a_refused_session_new_is_a_fatal_agent_error_and_ends_a_waiting_prompt():
    rig = Rig()
    rig.take(rig.machine.start())
    rig.master("control.prompt.request", {"prompt_text": "x"})
    rig.agent(rpc(id=0, result={"protocolVersion": 1}))
    rig.agent(rpc(id=1, error={"code": -32603, "message": "Query closed before response received"}))
    err = rig.of("agent.error")[-1]["payload"]
    assert err["error_code"] == "ACP_SESSION_FAILED" and "Query closed" in err["message"]
    assert rig.of("session.turn.end")[-1]["payload"]["stop_reason"] == "error"


def test_content_outside_a_prompt_opens_no_turn():
    rig = Rig()
    rig.start()
    rig.agent(update("agent_message_chunk", content={"type": "text", "text": "stray"}))
    rig.agent(update("tool_call_update", toolCallId="late", status="completed"))
    assert rig.of("session.turn.start") == [] and rig.adapter.stray_updates == 2


def test_a_huge_text_chunk_is_cut_to_frames():
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    rig.agent(update("agent_message_chunk", content={"type": "text", "text": "x" * (3 << 20)}))
    rig.end(pid)
    limit = rig.machine.config.max_frame_size
    assert all(len(json.dumps(f)) <= limit for f in rig.frames)
    assert "OUTPUT_TRUNCATED" in [f["payload"]["error_code"] for f in rig.of("agent.error")]


def test_the_adapter_never_raises_on_odd_shapes():
    rig = Rig()
    rig.start()
    pid = rig.prompt()
    for line in [
        b"[]",
        b"null",
        rpc(method="session/update", params={"update": {"sessionUpdate": "tool_call"}}),
        rpc(
            method="session/update",
            params={"update": {"sessionUpdate": "agent_message_chunk", "content": 5}},
        ),
        rpc(method="session/update", params={"update": {"sessionUpdate": "nope"}}),
        rpc(id=3, method="session/request_permission", params=5),
        rpc(id=pid, result="not an object"),
        b"[" * 5000 + b"]" * 5000,
    ]:
        rig.agent(line)
    assert rig.machine.lifecycle is Lifecycle.IDLE  # the odd prompt answer still ended the turn


def test_msgspec_structs_keep_the_schemas_names():
    msg = msgspec.json.decode(
        update("usage_update", used=1, size=2, _meta={"k": 1}), type=schema.Message
    )
    assert msg.params is not None and msg.params.update is not None
    assert msg.params.update.meta == {"k": 1} and msg.params.update.size == 2


def test_compaction_through_the_agents_own_command():
    """A listed ``compress`` (Gemini) or ``compact`` command turns context_compaction on, and
    control.session.compact becomes a prompt of that command; without one, the unsupported
    error."""
    rig = Rig()
    rig.machine.config = replace(
        rig.machine.config, features=msgspec.structs.replace(ALL_FEATURES, context_compaction=None)
    )
    rig.start()
    rig.master("control.session.compact", {})
    assert rig.frames[-1]["payload"]["error_code"] == "COMPACTION_NOT_SUPPORTED"
    rig.agent(
        update(
            "available_commands_update",
            availableCommands=[{"name": "compress", "description": "Compress"}],
        )
    )
    assert rig.machine.config.features.context_compaction is True
    rig.master("control.session.compact", {"instruction": "keep the plan"})
    sent = rig.last_write()
    assert sent["params"]["prompt"] == [{"type": "text", "text": "/compress keep the plan"}]


def test_image_prompts_only_to_an_agent_that_declares_them():
    from parsers.base import PromptImage

    png = PromptImage(mime_type="image/png", data=b"\x89PNG")
    rig = Rig()
    rig.start()  # declares promptCapabilities.image
    blocks = json.loads(rig.adapter.prompt("look", images=[png]))["params"]["prompt"]
    assert blocks == [
        {"type": "text", "text": "look"},
        {"type": "image", "mimeType": "image/png", "data": "iVBORw=="},
    ]
    plain = acp.AcpAdapter()
    plain.opening(None)
    plain.feed(rpc(id=0, result={"protocolVersion": 1, "agentCapabilities": {}}))
    plain.feed(rpc(id=1, result={"sessionId": SID}))
    (block,) = json.loads(plain.prompt("look", images=[png]))["params"]["prompt"]
    assert block["type"] == "text" and "not sent" in block["text"]


def test_requests_never_answered_are_forgotten_past_the_bound():
    rig = Rig()
    rig.start(modes=["default", "plan"])
    for _ in range(3 * MAX_PENDING):
        rig.master("control.mode.switch", {"mode": "plan"})
        rig.master("control.mode.switch", {"mode": "default"})
    assert len(rig.adapter._sent) <= MAX_PENDING


def test_DPS_6_1_2_cancel_sends_no_sigint_but_keeps_the_kill_bound():
    rig = Rig()
    rig.start()
    rig.prompt()
    turn_id = rig.of("session.turn.start")[0]["payload"]["turn_id"]
    rig.master("control.prompt.cancel", {"target_turn_id": turn_id})
    timers = [a.key for a in rig.actions if isinstance(a, act.StartTimer)]
    assert CANCEL_SIGINT_TIMER not in timers and CANCEL_STOP_TIMER in timers


def test_a_prompt_cancelled_before_the_session_exists_is_never_sent():
    rig = Rig()
    rig.take(rig.machine.start())
    rig.master("control.prompt.request", {"prompt_text": "early"})
    turn_id = rig.of("session.turn.start")[0]["payload"]["turn_id"]
    rig.master("control.prompt.cancel", {"target_turn_id": turn_id})
    rig.agent(rpc(id=0, result={"protocolVersion": 1, "agentCapabilities": {}}))
    rig.agent(rpc(id=1, result={"sessionId": SID}))
    assert [w.get("method") for w in rig.writes] == ["initialize", "session/new"]
    assert rig.of("session.turn.end")[-1]["payload"]["stop_reason"] == "cancelled"


def test_the_model_of_session_new_names_the_usage():
    rig = Rig()
    rig.take(rig.machine.start())
    rig.agent(rpc(id=0, result={"protocolVersion": 1, "agentCapabilities": {}}))
    rig.agent(
        rpc(id=1, result={"sessionId": SID, "models": {"currentModelId": "gemini-2.5-flash"}})
    )
    assert rig.machine.model == "gemini-2.5-flash"


def test_an_acp_profile_is_configured_by_parser_and_command_alone(tmp_path):
    from gateway.config import ConfigError, load_config

    path = tmp_path / "c.toml"
    path.write_text('[agents.qwen]\nparser = "acp"\ncommand = ["qwen", "--acp"]\n')
    profile = load_config(path, environ={}).agents["qwen"]
    assert profile.command == ("qwen", "--acp") and not profile.single_turn_process
    assert profile.features.plan_mode is True and profile.features.thinking_stream is True
    path.write_text('[agents.qwen]\nparser = "acp"\ncommand = ["qwen", "{prompt}"]\n')
    with pytest.raises(ConfigError, match="session/prompt"):
        load_config(path, environ={})


def test_a_restarted_agent_is_put_back_in_plan_mode():
    rig = Rig(can_load=True)
    rig.start()
    rig.master("control.mode.switch", {"mode": "plan"})
    rig.agent(rpc(id=rig.last_write()["id"], result={}))
    rig.machine.process = ProcessState.STOPPING_FOR_STALL  # the watchdog stopped it
    rig.take(rig.machine.agent_exited("signal", -15, 15))  # and it was started again
    rig.agent(rpc(id=0, result={"protocolVersion": 1, "agentCapabilities": {"loadSession": True}}))
    rig.agent(rpc(id=1, result=None))
    assert [w.get("method") for w in rig.writes[-3:]] == [
        "initialize",
        "session/load",
        "session/set_mode",
    ]
    assert rig.last_write()["params"]["modeId"] == "plan"


def test_DPS_5_3_3_fetch_is_web_content_and_an_image_is_binary():
    adapter = acp.AcpAdapter()
    adapter.opening(None)
    adapter.feed(rpc(id=0, result={"protocolVersion": 1}))
    adapter.feed(rpc(id=1, result={"sessionId": SID}))
    adapter.prompt("go")
    page = {"type": "content", "content": {"type": "text", "text": "<h1>Hi</h1>"}}
    adapter.feed(
        update("tool_call", toolCallId="f", title="Fetch", kind="fetch", status="in_progress")
    )
    (result,) = adapter.feed(
        update("tool_call_update", toolCallId="f", status="completed", content=[page])
    )
    assert isinstance(result, ev.ToolResult)
    assert (result.output, result.output_type) == ("<h1>Hi</h1>", "web_content")
    shot = {
        "type": "content",
        "content": {"type": "image", "data": "iVBORw==", "mimeType": "image/png"},
    }
    adapter.feed(
        update("tool_call", toolCallId="i", title="Screenshot", kind="other", status="in_progress")
    )
    (result,) = adapter.feed(
        update("tool_call_update", toolCallId="i", status="completed", content=[shot])
    )
    assert result.binary == [ev.BinaryData(data="iVBORw==", mime_type="image/png")]
