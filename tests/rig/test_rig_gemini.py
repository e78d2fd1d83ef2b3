"""The rig's own tests for the Gemini half: the scripted Gemini API server answers as scripted,
the Gemini scenario files are valid and Gemini's environment is closed and offline - all without
the Gemini CLI, in about a second."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.rig import env as rigenv
from tests.support.rig.gemini import UNEXPECTED_TEXT, GeminiServer
from tests.support.rig.selftest import assert_event_stream, rest_after_hang, valid_scenarios

STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
GENERATE = "/v1beta/models/gemini-2.5-flash-lite:generateContent"


def request(text: str = "hi", *, function_response: bool = False) -> dict[str, Any]:
    """A request shaped like the Gemini CLI's (the parts the server looks at)."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": text}]}]
    if function_response:
        contents += [
            {
                "role": "model",
                "parts": [{"functionCall": {"name": "run_shell_command", "args": {}}}],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "run_shell_command",
                            "response": {"output": "ok"},
                        }
                    }
                ],
            },
        ]
    return {
        "contents": contents,
        "tools": [{"functionDeclarations": [{"name": "read_file"}, {"name": "run_shell_command"}]}],
        "generationConfig": {"temperature": 1},
    }


async def sse_chunks(resp: Any) -> list[dict[str, Any]]:
    assert_event_stream(resp)
    body = await resp.text()
    # The real API (and so the server) separates events with CRLF CRLF.
    assert "\r\n\r\n" in body
    return [json.loads(c.removeprefix("data: ")) for c in body.strip().split("\r\n\r\n")]


def parts_of(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]


async def test_text_stream_is_several_chunks_with_usage_on_the_last(aiohttp_client: Any) -> None:
    server = GeminiServer([{"parts": [{"text": "Hello there, friend."}]}])
    client = await aiohttp_client(server.app)
    chunks = await sse_chunks(await client.post(STREAM, json=request()))
    assert len(chunks) > 1
    assert "".join(p["text"] for p in parts_of(chunks)) == "Hello there, friend."
    assert all(c["candidates"][0]["content"]["role"] == "model" for c in chunks)
    assert all("finishReason" not in c["candidates"][0] for c in chunks[:-1])
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert chunks[-1]["usageMetadata"] == {
        "promptTokenCount": 100,
        "candidatesTokenCount": 10,
        "totalTokenCount": 110,
    }
    assert chunks[0]["modelVersion"] == "gemini-2.5-flash"
    rec = server.requests[0]
    assert rec.query == {"alt": "sse"} and rec.body["contents"][0]["parts"][0]["text"] == "hi"
    assert rec.answer == "call 1" and not server.unexpected


async def test_thought_and_function_call_parts(aiohttp_client: Any) -> None:
    call = {
        "parts": [
            {"text": "Pondering.", "thought": True},
            {"text": "Running it.", "chunks": ["Run", "ning it."]},
            {"functionCall": {"name": "run_shell_command", "args": {"command": "echo hi"}}},
        ],
        "usage": {"prompt": 5, "candidates": 3, "thoughts": 2, "cached": 1},
    }
    server = GeminiServer([call])
    client = await aiohttp_client(server.app)
    chunks = await sse_chunks(await client.post(STREAM, json=request()))
    parts = parts_of(chunks)
    assert "".join(p["text"] for p in parts if p.get("thought")) == "Pondering."
    assert [p["text"] for p in parts if "text" in p and not p.get("thought")] == ["Run", "ning it."]
    assert parts[-1] == {
        "functionCall": {"name": "run_shell_command", "args": {"command": "echo hi"}}
    }
    assert chunks[-1]["usageMetadata"] == {
        "promptTokenCount": 5,
        "candidatesTokenCount": 3,
        "totalTokenCount": 10,
        "thoughtsTokenCount": 2,
        "cachedContentTokenCount": 1,
    }


async def test_generate_content_answers_with_one_merged_response(aiohttp_client: Any) -> None:
    server = GeminiServer(
        [
            {
                "parts": [
                    {"text": '{"complexity_score": 5}'},
                    {"functionCall": {"name": "f", "args": {}}},
                ]
            }
        ]
    )
    client = await aiohttp_client(server.app)
    resp = await client.post(GENERATE, json=request())
    assert resp.status == 200
    body = await resp.json()
    cand = body["candidates"][0]
    assert cand["content"]["parts"] == [
        {"text": '{"complexity_score": 5}'},
        {"functionCall": {"name": "f", "args": {}}},
    ]
    assert cand["finishReason"] == "STOP" and body["usageMetadata"]["totalTokenCount"] == 110
    assert body["modelVersion"] == "gemini-2.5-flash-lite"


async def test_count_tokens_uses_no_call(aiohttp_client: Any) -> None:
    server = GeminiServer([{"parts": [{"text": "x"}]}])
    client = await aiohttp_client(server.app)
    resp = await client.post("/v1beta/models/gemini-2.5-flash:countTokens", json=request())
    assert (await resp.json()) == {"totalTokens": 100}
    assert server.unused_calls == [1] and server.requests[0].answer == "builtin:countTokens"


@pytest.mark.parametrize(
    ("status", "name"), [(400, "INVALID_ARGUMENT"), (429, "RESOURCE_EXHAUSTED"), (500, "INTERNAL")]
)
async def test_http_errors(aiohttp_client: Any, status: int, name: str) -> None:
    server = GeminiServer([{"error": {"status": status, "message": "nope"}}])
    client = await aiohttp_client(server.app)
    resp = await client.post(STREAM, json=request())
    assert resp.status == status
    assert await resp.json() == {"error": {"code": status, "message": "nope", "status": name}}


async def test_stream_error_and_truncate(aiohttp_client: Any) -> None:
    server = GeminiServer(
        [
            {"parts": [{"text": "partial"}], "stream_error": {"status": 503, "message": "gone"}},
            {"parts": [{"text": "cut short"}], "truncate": True},
        ]
    )
    client = await aiohttp_client(server.app)
    chunks = await sse_chunks(await client.post(STREAM, json=request()))
    assert chunks[-1] == {"error": {"code": 503, "message": "gone", "status": "UNAVAILABLE"}}
    assert all("finishReason" not in c["candidates"][0] for c in chunks[:-1])
    chunks = await sse_chunks(await client.post(STREAM, json=request()))
    assert all(
        "finishReason" not in c["candidates"][0] and "usageMetadata" not in c for c in chunks
    )


async def test_hang_holds_the_stream_open_until_released(aiohttp_client: Any) -> None:
    server = GeminiServer([{"parts": [{"text": "wait"}], "hang": True}])
    client = await aiohttp_client(server.app)
    resp = await client.post(STREAM, json=request())
    rest = await rest_after_hang(server, resp, 5)
    assert '"it"' in rest and "finishReason" not in rest


async def test_match_and_unexpected_requests(aiohttp_client: Any) -> None:
    server = GeminiServer(
        [
            {"match": {"method": "streamGenerateContent"}, "parts": [{"text": "turn"}]},
            {"match": {"method": "generateContent"}, "parts": [{"text": "route"}]},
        ]
    )
    client = await aiohttp_client(server.app)
    routed = await (await client.post(GENERATE, json=request())).json()
    assert routed["candidates"][0]["content"]["parts"] == [{"text": "route"}]
    turn = await sse_chunks(await client.post(STREAM, json=request()))
    assert "".join(p["text"] for p in parts_of(turn)) == "turn"
    extra = await sse_chunks(await client.post(STREAM, json=request()))
    assert "".join(p["text"] for p in parts_of(extra)) == UNEXPECTED_TEXT
    assert [r.answer for r in server.requests] == ["call 2", "call 1", "unexpected"]


def test_match_keys() -> None:
    s = GeminiServer([])
    s._target = ("streamGenerateContent", "gemini-2.5-flash")
    body = request("hello world", function_response=True)
    assert s.matches({"function_response": True, "last_user_contains": "hello"}, body)
    assert s.matches({"contents_contain": "run_shell_command", "model_contains": "flash"}, body)
    assert s.matches({"tools_include": ["read_file"], "tools_exclude": ["write_file"]}, body)
    assert not s.matches({"method": "generateContent"}, body)
    assert not s.matches({"function_response": True}, request())
    with pytest.raises(ValueError, match="unknown match keys"):
        s.matches({"nope": 1}, body)


async def test_unknown_paths_and_methods_are_logged_and_refused(aiohttp_client: Any) -> None:
    server = GeminiServer([])
    client = await aiohttp_client(server.app)
    assert (await client.get("/v1beta/models")).status == 404
    assert (await client.post("/v1beta/models/m:embedContent", json={})).status == 404
    assert [r.answer for r in server.unexpected] == ["404", "404"]


# -- scenario files ----------------------------------------------------------------------------


def test_every_gemini_scenario_is_valid() -> None:
    call_keys = {"parts", "usage", "finish_reason", "error", "stream_error", "truncate", "hang"}
    call_keys |= {"delay", "event_delay", "match"}
    for sc in valid_scenarios(GeminiServer([]), call_keys, 10, request()):
        assert "exit_code" in sc.expect or "signal" in sc.expect, sc.name
        args = sc.run.args
        assert "-p" in args and args[args.index("--output-format") + 1] == "stream-json", sc.name
        assert "--skip-trust" in args, sc.name  # else exit 55, no output
        for call in sc.calls:
            for part in call.get("parts", []):
                assert set(part) & {"text", "functionCall"}, (sc.name, part)


# -- environment -------------------------------------------------------------------------------


def test_gemini_env_is_closed_and_its_settings_are_headless(tmp_path: Path) -> None:
    home = rigenv.make_home("gemini", tmp_path / "home")
    e = rigenv.agent_env("gemini", base_url="http://127.0.0.1:1", home=home)
    assert e["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:1" and e["GEMINI_API_KEY"]
    assert e["HOME"] == str(home) and Path(e["TMPDIR"]).is_dir()
    assert not {k for k in e if k.startswith(("AWS_", "OPENAI_", "ANTHROPIC_", "CODEX_", "HTTP"))}
    settings = json.loads((home / ".gemini" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["general"]["maxAttempts"] == 1
    assert settings["telemetry"]["enabled"] is False
    assert settings["mcpServers"]["echo"]["trust"] is True
    assert "echo" not in settings["mcp"]["allowed"]  # off unless a scenario allows it
