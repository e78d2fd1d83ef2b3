"""The rig's own tests: the scripted Anthropic server answers as scripted, scenario files load, and
the runner performs actions - all without any agent CLI, in a few seconds."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.rig import env as rigenv
from tests.support.rig.anthropic import COMPACTION_PROMPT, AnthropicServer
from tests.support.rig.run import scripted_cli
from tests.support.rig.scenario import (
    ScenarioError,
    contains,
    fill_from,
    parse_scenario,
)
from tests.support.rig.selftest import assert_event_stream, rest_after_hang, valid_scenarios


def request(text: str = "hi", *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-rig",
        "max_tokens": 100,
        "stream": stream,
        "system": [{"type": "text", "text": "You are a test."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
        **extra,
    }


async def sse_events(resp: Any) -> list[tuple[str, dict[str, Any]]]:
    """Parse a whole SSE body into (event, data) pairs."""
    assert_event_stream(resp)
    body = await resp.text()
    out = []
    for chunk in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def post(client: Any, body: dict[str, Any]) -> Any:
    """As Claude Code posts, with ``?beta=true``."""
    return await client.post("/v1/messages?beta=true", json=body)


async def test_text_stream_has_the_api_event_sequence(aiohttp_client: Any) -> None:
    server = AnthropicServer([{"content": [{"type": "text", "text": "Hello there, how are you?"}]}])
    client = await aiohttp_client(server.app)
    events = await sse_events(await post(client, request()))
    names = [e for e, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    deltas = [d["delta"]["text"] for e, d in events if e == "content_block_delta"]
    assert len(deltas) > 1 and "".join(deltas) == "Hello there, how are you?"
    start = events[0][1]["message"]
    assert (
        start["model"] == "claude-rig" and start["content"] == [] and start["stop_reason"] is None
    )
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert server.requests[0].query == {"beta": "true"}
    assert server.requests[0].body["messages"][0]["content"][0]["text"] == "hi"
    assert server.requests[0].answer == "call 1" and not server.unexpected


async def test_thinking_and_tool_use_blocks(aiohttp_client: Any) -> None:
    call = {
        "content": [
            {"type": "thinking", "thinking": "Let me think about this for a moment."},
            {"type": "text", "text": "Running it."},
            {"type": "tool_use", "name": "Bash", "input": {"command": "echo hi", "n": [1, 2]}},
        ],
        "usage": {"input_tokens": 1234, "output_tokens": 56},
    }
    client = await aiohttp_client(AnthropicServer([call]).app)
    events = await sse_events(await post(client, request()))
    starts = [d["content_block"] for e, d in events if e == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
    assert starts[2]["id"] == "toolu_rig_01_2" and starts[2]["name"] == "Bash"
    by_index: dict[int, list[dict[str, Any]]] = {}
    for e, d in events:
        if e == "content_block_delta":
            by_index.setdefault(d["index"], []).append(d["delta"])
    thinking = by_index[0]
    assert thinking[-1] == {"type": "signature_delta", "signature": "rig-signature-01-0"}
    assert "".join(d["thinking"] for d in thinking[:-1]) == "Let me think about this for a moment."
    tool = by_index[2]
    assert tool[0] == {"type": "input_json_delta", "partial_json": ""}  # as the real API does
    assert json.loads("".join(d["partial_json"] for d in tool)) == call["content"][2]["input"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 1234
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"output_tokens": 56}


async def test_a_paced_call_streams_words_per_delta_after_its_delay(aiohttp_client: Any) -> None:
    """``words_per_delta`` with ``delay`` and ``event_delay``: a model's pace for a timed
    recording. The deltas are that many words each, the first byte comes no sooner than the
    delay, and the stream takes no less than its events' pauses."""
    text = "one two three four five six seven eight nine ten eleven"
    content = [
        {"type": "thinking", "thinking": "think about it first", "signature": "s"},
        {"type": "text", "text": text},
    ]
    call = {"delay": 0.2, "event_delay": 0.01, "words_per_delta": 2, "content": content}
    client = await aiohttp_client(AnthropicServer([call]).app)
    loop = asyncio.get_running_loop()
    sent = loop.time()
    resp = await post(client, request())
    body, first = b"", None
    async for chunk in resp.content.iter_any():
        first = first or loop.time()
        body += chunk
    done = loop.time()
    events = [
        (e, json.loads(d)) for e, d in re.findall(r"event: (\w+)\ndata: (.*)\n", body.decode())
    ]
    deltas = [d["delta"] for e, d in events if e == "content_block_delta"]
    assert [d["text"] for d in deltas if d["type"] == "text_delta"] == [
        "one two ", "three four ", "five six ", "seven eight ", "nine ten ", "eleven"
    ]  # fmt: skip
    assert [d["thinking"] for d in deltas if d["type"] == "thinking_delta"] == [
        "think about ",
        "it first",
    ]
    assert first is not None and first - sent >= 0.2
    assert done - sent >= 0.2 + (len(events) - 1) * 0.01


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (500, "api_error"),
        (529, "overloaded_error"),
    ],
)
async def test_http_errors(aiohttp_client: Any, status: int, kind: str) -> None:
    client = await aiohttp_client(AnthropicServer([{"error": {"status": status}}]).app)
    resp = await post(client, request())
    assert resp.status == status
    body = await resp.json()
    assert body["type"] == "error" and body["error"]["type"] == kind


async def test_stream_error_mid_stream(aiohttp_client: Any) -> None:
    call = {
        "content": [{"type": "text", "text": "partial answer here"}],
        "stream_error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    client = await aiohttp_client(AnthropicServer([call, call]).app)
    events = await sse_events(await post(client, request()))
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    assert "message_stop" not in [e for e, _ in events]
    assert "content_block_delta" in [e for e, _ in events]
    # Without a stream to break, the same call is an HTTP error.
    resp = await post(client, request(stream=False))
    assert resp.status == 529


async def test_hang_holds_the_stream_open_until_released(aiohttp_client: Any) -> None:
    server = AnthropicServer([{"hang": True, "content": [{"type": "text", "text": "Once upon"}]}])
    client = await aiohttp_client(server.app)
    resp = await post(client, request())
    first = await resp.content.readuntil(b"\n\n")
    assert first.startswith(b"event: message_start")
    await asyncio.wait_for(server.wait_call(1), 2)
    rest = await rest_after_hang(server, resp, 2)
    assert "content_block_delta" in rest
    assert "content_block_stop" not in rest and "message_stop" not in rest


async def test_compaction_request_gets_builtin_summary_without_using_a_call(
    aiohttp_client: Any,
) -> None:
    server = AnthropicServer([{"content": [{"type": "text", "text": "normal"}]}])
    client = await aiohttp_client(server.app)
    resp = await post(client, request(COMPACTION_PROMPT + " - summarise.", stream=False))
    assert "<summary>" in (await resp.json())["content"][0]["text"]
    assert server.requests[0].answer == "builtin:compaction"
    resp = await post(client, request("next", stream=False))
    assert (await resp.json())["content"][0]["text"] == "normal"
    assert not server.unexpected and not server.unused_calls


async def test_match_lets_calls_wait_for_their_request(aiohttp_client: Any) -> None:
    calls = [
        {"match": {"compaction": True}, "content": [{"type": "text", "text": "scripted summary"}]},
        {"match": {"last_user_contains": "second"}, "content": [{"type": "text", "text": "2"}]},
        {"content": [{"type": "text", "text": "1"}]},
    ]
    server = AnthropicServer(calls)
    client = await aiohttp_client(server.app)

    async def answer(text: str) -> str:
        return (await (await post(client, request(text, stream=False))).json())["content"][0][
            "text"
        ]

    assert await answer("first") == "1"
    assert await answer("the second one") == "2"
    assert await answer(COMPACTION_PROMPT) == "scripted summary"
    assert await answer("more") == "rig: no scripted answer left"
    assert [r.answer for r in server.requests] == ["call 3", "call 2", "call 1", "unexpected"]
    assert len(server.unexpected) == 1


async def test_unknown_paths_are_logged_and_refused(aiohttp_client: Any) -> None:
    server = AnthropicServer([])
    client = await aiohttp_client(server.app)
    resp = await client.get("/v1/models")
    assert resp.status == 404
    assert server.requests[0].path == "/v1/models" and server.unexpected


async def test_start_binds_localhost_on_a_free_port() -> None:
    async with AnthropicServer([]) as server:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", server.base_url)


# -- scenario files ----------------------------------------------------------------------------


def test_every_scenario_file_loads_and_its_calls_are_valid() -> None:
    block_types = {"text", "thinking", "tool_use"}
    call_keys = {"content", "stop_reason", "usage", "error", "stream_error", "hang", "delay"}
    call_keys |= {"event_delay", "match", "words_per_delta"}
    for sc in valid_scenarios(AnthropicServer([]), call_keys, 30, request()):
        assert "exit_code" in sc.expect, sc.name
        for call in sc.calls:
            assert {b["type"] for b in call.get("content", [])} <= block_types, sc.name


def test_scenario_errors_are_reported() -> None:
    with pytest.raises(ScenarioError, match="unknown top-level"):
        parse_scenario({"agent": "claude-code", "cals": []}, name="x")
    with pytest.raises(ScenarioError, match="needs call"):
        parse_scenario(
            {"run": {"actions": [{"on": "call", "do": "close_stdin"}]}}, name="x", agent="a"
        )
    with pytest.raises(ScenarioError, match="needs line"):
        parse_scenario({"run": {"actions": [{"on": "start", "do": "write"}]}}, name="x", agent="a")


def test_contains_and_fill_from() -> None:
    line = {"type": "control_request", "request_id": "r1", "request": {"input": {"a": [1, 2]}}}
    assert contains(line, {"type": "control_request", "request": {"input": {"a": [2]}}})
    assert not contains(line, {"request": {"input": {"a": [3]}}})
    filled = fill_from({"id": "{{request_id}}", "in": "{{request.input}}", "k": "v"}, line)
    assert filled == {"id": "r1", "in": {"a": [1, 2]}, "k": "v"}


def test_install_script_pins_match_env() -> None:
    script = (rigenv.REPO / "scripts" / "install-agents.sh").read_text()
    pins = dict(re.findall(r'"([\w-]+) (@[\w/.-]+ [\d.]+) [\w-]+"', script))
    assert pins == {a.name: f"{a.package} {a.version}" for a in rigenv.AGENTS.values()}


def test_claude_env_is_closed_and_offline(tmp_path: Path) -> None:
    e = rigenv.agent_env("claude-code", base_url="http://127.0.0.1:1", home=tmp_path)
    assert e["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:1" and e["HOME"] == str(tmp_path)
    for key in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY"):
        assert e[key] == "1"
    assert not {k for k in e if k.startswith(("AWS_", "OPENAI_", "GEMINI_", "HTTP"))}


# -- the runner, with a tiny stand-in for a CLI ------------------------------------------------

FAKE_CLI = r"""
import json, sys, urllib.request
base = sys.argv[1]
print(json.dumps({"type": "start"}), flush=True)
for line in sys.stdin:
    msg = json.loads(line)
    req = urllib.request.Request(base + "/v1/messages", data=json.dumps(
        {"stream": False, "messages": [{"role": "user", "content": msg["text"]}]}).encode())
    answer = json.load(urllib.request.urlopen(req))
    print(json.dumps({"type": "result", "text": answer["content"][0]["text"]}), flush=True)
print(json.dumps({"type": "eof"}), flush=True)
sys.exit(3)
"""


async def test_runner_feeds_stdin_reacts_to_stdout_and_collects_the_exit(tmp_path: Path) -> None:
    script = tmp_path / "fake_cli.py"
    script.write_text(FAKE_CLI)
    sc = parse_scenario(
        {
            "run": {
                "stdin": [{"text": "one"}],
                "actions": [
                    {
                        "on": "stdout",
                        "match": {"type": "result"},
                        "do": "write",
                        "line": {"text": "{{text}}"},
                    },
                    {"on": "stdout", "match": {"type": "result"}, "count": 2, "do": "close_stdin"},
                ],
            },
            "calls": [
                {"content": [{"type": "text", "text": "first answer"}]},
                {
                    "match": {"last_user_contains": "first answer"},
                    "content": [{"type": "text", "text": "2"}],
                },
            ],
        },
        name="fake",
        agent="claude-code",
    )
    async with scripted_cli(sc) as cli:
        cli.argv = [sys.executable, str(script), cli.base_url]
        r = await cli.run(timeout=20)
    assert r.exit_code == 3 and r.signal is None and not r.timed_out, r.describe()
    assert [e["type"] for e in r.events] == ["start", "result", "result", "eof"]
    assert r.events[2]["text"] == "2"
    assert r.stdin_lines == ['{"text":"one"}', '{"text":"first answer"}']
    # When each line came and went (a timed scenario's meta keeps them): one time per line, in
    # order, and the second prompt written after the result that triggered it arrived.
    assert len(r.stdout_times) == len(r.events) and r.stdout_times == sorted(r.stdout_times)
    assert len(r.stdin_times) == 2 and r.stdin_times[1] >= r.stdout_times[1]
    assert not r.unexpected and not r.unused_calls


def test_require_cli_skips_locally_and_fails_in_ci(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(rigenv, "AGENTS_DIR", tmp_path)  # no CLI installed here
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        rigenv.require_cli("claude-code")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        rigenv.require_cli("claude-code")
