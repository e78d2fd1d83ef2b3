"""The rig's own tests for the Codex half: the scripted Responses API server answers as scripted,
the Codex scenario files are valid, Codex's environment is closed and offline, and the echo MCP
server speaks MCP - all without the Codex CLI, in about a second."""

from __future__ import annotations

import asyncio
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.support.rig import env as rigenv
from tests.support.rig.openai import UNEXPECTED_TEXT, ResponsesServer, input_text
from tests.support.rig.selftest import assert_event_stream, rest_after_hang, valid_scenarios


def request(text: str = "hi", *, tool_output: str | None = None) -> dict[str, Any]:
    """A request shaped like Codex's (the parts the server looks at)."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    ]
    if tool_output is not None:
        items += [
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": tool_output},
        ]
    return {
        "model": "gpt-5.5",
        "stream": True,
        "store": False,
        "input": items,
        "tools": [
            {"type": "function", "name": "exec_command"},
            {"type": "custom", "name": "apply_patch"},
            {"type": "tool_search"},
        ],
    }


async def sse_events(resp: Any) -> list[dict[str, Any]]:
    """Parse a whole SSE body; checks that each event's name matches its data's type."""
    assert_event_stream(resp)
    out = []
    for chunk in (await resp.text()).strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in chunk.splitlines())
        data = json.loads(fields["data"])
        assert fields["event"] == data["type"]
        out.append(data)
    return out


async def post(client: Any, body: dict[str, Any]) -> Any:
    return await client.post("/v1/responses", json=body)


async def test_message_stream_has_the_api_event_sequence(aiohttp_client: Any) -> None:
    server = ResponsesServer([{"output": [{"type": "message", "text": "Hello there, friend."}]}])
    client = await aiohttp_client(server.app)
    events = await sse_events(await post(client, request()))
    types = [e["type"] for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-2:] == ["response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == "Hello there, friend."
    item = events[-2]["item"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["content"][0] == {
        "type": "output_text",
        "text": "Hello there, friend.",
        "annotations": [],
    }
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["output"] == [item]
    assert done["usage"]["input_tokens"] == 100 and done["usage"]["output_tokens"] == 10
    assert done["usage"]["total_tokens"] == 110
    assert server.requests[0].body["input"][0]["content"][0]["text"] == "hi"
    assert server.requests[0].answer == "call 1" and not server.unexpected


async def test_reasoning_function_call_and_custom_tool_call(aiohttp_client: Any) -> None:
    call = {
        "output": [
            {"type": "reasoning", "summary": "Thinking it over.", "content": "raw thoughts"},
            {"type": "function_call", "name": "exec_command", "arguments": {"cmd": "echo hi"}},
            {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch\n"},
        ],
        "usage": {"input_tokens": 7, "cached_tokens": 3, "output_tokens": 5, "reasoning_tokens": 2},
    }
    server = ResponsesServer([call])
    client = await aiohttp_client(server.app)
    events = await sse_events(await post(client, request()))
    done = {
        e["output_index"]: e["item"] for e in events if e["type"] == "response.output_item.done"
    }
    assert done[0]["summary"] == [{"type": "summary_text", "text": "Thinking it over."}]
    assert done[0]["content"] == [{"type": "reasoning_text", "text": "raw thoughts"}]
    assert done[0]["encrypted_content"]
    summary = "".join(
        e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta"
    )
    assert summary == "Thinking it over."
    assert done[1]["type"] == "function_call" and done[1]["name"] == "exec_command"
    assert json.loads(done[1]["arguments"]) == {"cmd": "echo hi"}
    args = "".join(
        e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
    )
    assert args == done[1]["arguments"]
    assert done[2]["type"] == "custom_tool_call" and done[2]["input"] == "*** Begin Patch\n"
    patch = "".join(
        e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"
    )
    assert patch == "*** Begin Patch\n"
    # Call ids are stable, so the next request's tool outputs can be matched to them.
    assert done[1]["call_id"] == "call_rig_01_1" and done[2]["call_id"] == "call_rig_01_2"
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens_details"] == {"cached_tokens": 3}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 2}


async def test_web_search_call(aiohttp_client: Any) -> None:
    action = {"type": "search", "query": "q"}
    server = ResponsesServer([{"output": [{"type": "web_search_call", "action": action}]}])
    client = await aiohttp_client(server.app)
    events = await sse_events(await post(client, request()))
    phases = [e["type"] for e in events if e["type"].startswith("response.web_search_call.")]
    assert phases == [
        f"response.web_search_call.{p}" for p in ("in_progress", "searching", "completed")
    ]
    item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert item == {
        "id": "ws_rig_01_0",
        "type": "web_search_call",
        "status": "completed",
        "action": action,
    }


async def test_tool_search_and_namespaced_call(aiohttp_client: Any) -> None:
    server = ResponsesServer(
        [
            {"output": [{"type": "tool_search_call", "arguments": {"query": "echo"}}]},
            {
                "output": [
                    {
                        "type": "function_call",
                        "namespace": "mcp__echo",
                        "name": "echo",
                        "arguments": {"text": "x"},
                    }
                ]
            },
        ]
    )
    client = await aiohttp_client(server.app)
    first = await sse_events(await post(client, request()))
    item = next(e["item"] for e in first if e["type"] == "response.output_item.done")
    assert item["type"] == "tool_search_call" and item["execution"] == "client"
    assert item["arguments"] == {"query": "echo"}
    second = await sse_events(await post(client, request()))
    added = next(e["item"] for e in second if e["type"] == "response.output_item.added")
    assert added["namespace"] == "mcp__echo" and added["name"] == "echo"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (429, "rate_limit_exceeded"), (500, "server_error")],
)
async def test_http_errors(aiohttp_client: Any, status: int, kind: str) -> None:
    server = ResponsesServer([{"error": {"status": status, "message": "nope", "code": "c"}}])
    client = await aiohttp_client(server.app)
    resp = await post(client, request())
    assert resp.status == status
    assert await resp.json() == {
        "error": {"message": "nope", "type": kind, "param": None, "code": "c"}
    }


async def test_stream_error_sends_response_failed(aiohttp_client: Any) -> None:
    server = ResponsesServer(
        [
            {
                "output": [{"type": "message", "text": "partial"}],
                "stream_error": {"message": "boom"},
            }
        ]
    )
    client = await aiohttp_client(server.app)
    events = await sse_events(await post(client, request()))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert not any(e["type"] == "response.completed" for e in events)


async def test_truncate_ends_without_a_final_event(aiohttp_client: Any) -> None:
    server = ResponsesServer([{"output": [{"type": "message", "text": "cut"}], "truncate": True}])
    client = await aiohttp_client(server.app)
    events = await sse_events(await post(client, request()))
    assert events[-1]["type"] == "response.output_item.done"


async def test_hang_holds_the_stream_open_until_released(aiohttp_client: Any) -> None:
    server = ResponsesServer([{"output": [{"type": "message", "text": "wait"}], "hang": True}])
    client = await aiohttp_client(server.app)
    resp = await post(client, request())
    rest = await rest_after_hang(server, resp, 5)
    assert "response.output_item.done" in rest and "response.completed" not in rest


async def test_match_and_unexpected_requests(aiohttp_client: Any) -> None:
    server = ResponsesServer(
        [
            {"match": {"tool_output": True}, "output": [{"type": "message", "text": "after"}]},
            {
                "match": {"last_user_contains": "first"},
                "output": [{"type": "message", "text": "1"}],
            },
        ]
    )
    client = await aiohttp_client(server.app)
    first = await sse_events(await post(client, request("the first one")))
    assert first[-1]["response"]["output"][0]["content"][0]["text"] == "1"
    second = await sse_events(await post(client, request("x", tool_output="out")))
    assert second[-1]["response"]["output"][0]["content"][0]["text"] == "after"
    assert [r.answer for r in server.requests] == ["call 2", "call 1"]
    third = await sse_events(await post(client, request("more")))
    assert third[-1]["response"]["output"][0]["content"][0]["text"] == UNEXPECTED_TEXT
    assert [r.seq for r in server.unexpected] == [2] and server.unused_calls == []


async def test_capture_fills_arguments_from_the_last_tool_output(aiohttp_client: Any) -> None:
    poll = {
        "type": "function_call",
        "name": "write_stdin",
        "arguments": {"chars": ""},
        "capture": {"session_id": r"session ID (\d+)", "chunk": r"Chunk ID: (\w+)"},
    }
    server = ResponsesServer([{"output": [poll]}])
    client = await aiohttp_client(server.app)
    body = request(tool_output="Chunk ID: ab12\nProcess running with session ID 4242\n")
    events = await sse_events(await post(client, body))
    item = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert json.loads(item["arguments"]) == {"chars": "", "session_id": 4242, "chunk": "ab12"}


def test_match_keys() -> None:
    s = ResponsesServer([])
    body = request("hello", tool_output="Process exited with code 2")
    assert s.matches({"tool_output": True, "input_contains": "exited with code 2"}, body)
    assert s.matches(
        {"tools_include": ["tool_search", "apply_patch"], "model_contains": "gpt"}, body
    )
    assert not s.matches({"tools_exclude": ["exec_command"]}, body)
    assert not s.matches({"tool_output": False}, body)
    with pytest.raises(ValueError, match="unknown match keys"):
        s.matches({"nope": 1}, body)


def developer(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": text}],
    }


def test_namespaces_offered_reads_codexs_last_word() -> None:
    """A resumed Codex resends the history that listed a server, then says it is removed until
    its own is up: only its last word offers the namespace."""
    s = ResponsesServer([])
    listed = "<tools>\nDeferred tool namespaces:\n- mcp__docs\n- multi_agent_v1: Agents.\n</tools>"
    removed = "<tools>\nRemoved deferred tool namespaces:\n- mcp__docs\n</tools>"
    added = "<tools>\nAdded deferred tool namespaces:\n- mcp__docs\n</tools>"
    body = request("Second")
    body["input"][:0] = [developer(listed)]
    assert s.matches({"namespaces_offered": ["mcp__docs", "multi_agent_v1"]}, body)
    body["input"].append(developer(removed))
    assert "- mcp__docs" in input_text(body)  # what a match on the mention found
    assert not s.matches({"namespaces_offered": ["mcp__docs"]}, body)
    assert s.matches({"namespaces_offered": ["multi_agent_v1"]}, body)
    body["input"].append(developer(added))
    assert s.matches({"namespaces_offered": ["mcp__docs"]}, body)
    assert not s.matches({"namespaces_offered": ["mcp__docs"]}, request("- mcp__docs"))


async def test_unknown_paths_are_logged_and_refused(aiohttp_client: Any) -> None:
    server = ResponsesServer([])
    client = await aiohttp_client(server.app)
    resp = await client.get("/v1/models")
    assert resp.status == 404 and server.unexpected[0].path == "/v1/models"


# -- scenario files ----------------------------------------------------------------------------


def test_every_codex_scenario_is_valid() -> None:
    call_keys = {"output", "usage", "error", "stream_error", "truncate", "hang", "delay"}
    call_keys |= {"event_delay", "match"}
    item_types = {"message", "reasoning", "function_call", "custom_tool_call", "tool_search_call"}
    item_types.add("web_search_call")
    for sc in valid_scenarios(ResponsesServer([]), call_keys, 10, request()):
        assert "exit_code" in sc.expect or "signal" in sc.expect, sc.name
        # Codex exec takes the prompt as an argument and prints JSON lines only with --json.
        assert sc.run.args[0] == "exec" and "--json" in sc.run.args, sc.name
        assert "--skip-git-repo-check" in sc.run.args, sc.name
        for call in sc.calls:
            assert {i["type"] for i in call.get("output", [])} <= item_types, sc.name


# -- environment -------------------------------------------------------------------------------


def test_codex_env_is_closed_and_its_config_points_at_the_server(tmp_path: Path) -> None:
    home = rigenv.make_home("codex", tmp_path / "home")
    e = rigenv.agent_env("codex", base_url="http://127.0.0.1:1", home=home)
    assert e["HOME"] == str(home) and e["CODEX_HOME"] == str(home / ".codex")
    assert not {k for k in e if k.startswith(("AWS_", "OPENAI_", "ANTHROPIC_", "GEMINI_", "HTTP"))}
    config = tomllib.loads((home / ".codex" / "config.toml").read_text())
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:1/v1"
    assert provider["wire_api"] == "responses" and provider["supports_websockets"] is False
    assert provider["request_max_retries"] == 0 and provider["stream_max_retries"] == 0
    assert e[provider["env_key"]]
    echo = config["mcp_servers"]["echo"]
    assert echo["enabled"] is False and Path(echo["args"][0]) == rigenv.MCP_ECHO


# -- the echo MCP server -----------------------------------------------------------------------


async def test_mcp_echo_speaks_mcp_over_stdio() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(rigenv.MCP_ECHO),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    msgs = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18"},
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "hi"}},
        },
        {"jsonrpc": "2.0", "id": 4, "method": "bogus"},
        {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "x", "fail": True}},
        },
    ]
    out, _ = await asyncio.wait_for(
        proc.communicate("".join(json.dumps(m) + "\n" for m in msgs).encode()), 10
    )
    replies = {r["id"]: r for r in map(json.loads, out.decode().splitlines())}
    assert set(replies) == {1, 2, 3, 4, 5}  # no reply to the notification
    assert replies[1]["result"]["protocolVersion"] == "2025-06-18"
    tool = replies[2]["result"]["tools"][0]
    assert tool["name"] == "echo" and tool["annotations"]["readOnlyHint"] is True
    assert replies[3]["result"]["content"] == [{"type": "text", "text": "echo: hi"}]
    assert replies[4]["error"]["code"] == -32601
    assert replies[5]["result"]["isError"] is True
