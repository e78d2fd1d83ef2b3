"""A scripted Anthropic Messages API for Claude Code.

Theory of operation
-------------------
``AnthropicServer`` serves ``POST /v1/messages`` (Claude Code adds ``?beta=true``) from the
scenario's ``[[calls]]``, one call per request, and streams each answer the way the real API does:
``message_start``, then per content block ``content_block_start`` / ``content_block_delta`` ... /
``content_block_stop``, then ``message_delta`` (``stop_reason``, usage) and ``message_stop``. A
request with ``"stream": false`` gets the same message as one JSON body.

A call is a table with these keys (all optional):

``content``
    Blocks in order: ``{type="text", text=...}``, ``{type="thinking", thinking=..., signature=...}``
    (streamed as ``thinking_delta`` then ``signature_delta``), ``{type="tool_use", name=...,
    input={...}}`` (streamed as ``input_json_delta`` pieces; ``id`` defaults to
    ``toolu_rig_<call>_<block>``). ``chunks = [...]`` on a block sets its deltas explicitly.
``stop_reason``
    Defaults to ``tool_use`` when a tool_use block is present, else ``end_turn``.
``usage``
    Merged into the default usage; ``input_tokens`` goes into ``message_start`` and
    ``output_tokens`` into ``message_delta`` (a large ``input_tokens`` is how auto-compaction is
    provoked).
``error = {status=529, type="overloaded_error", message="Overloaded", headers={}}``
    Answer with that HTTP error instead of a stream.
``stream_error = {type="overloaded_error", message="..."}``
    Stream the content, then an SSE ``error`` event instead of ``message_delta``/``message_stop``
    (a non-streaming request gets it as an HTTP error: 529 for overloaded_error, else 500).
``hang = true``
    Stream ``message_start`` and the content, leaving the last block open, then hold the stream
    open until the client goes away or the server closes (for interrupt and signal tests).
``delay``
    Seconds to wait before answering; ``event_delay`` seconds between SSE events.
``words_per_delta``
    Stream text and thinking in deltas of this many words, as a real model's stream comes (a few
    tokens a delta), instead of in about three pieces. With ``delay`` (the time to the first token)
    and ``event_delay`` it paces a call like a real model, for a ``timed`` recording.
``match``
    Answer only a request that fits (see ``matches``).

The compaction request (its last user message starts with ``COMPACTION_PROMPT``) is special: only
a call with ``match = {compaction = true}`` answers it; otherwise a built-in summary does, without
using up a scripted call. A request for which no call is left gets a short text answer
("rig: no scripted answer left") and is listed in ``server.unexpected``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from .server import RecordedRequest, ScriptedServer

COMPACTION_PROMPT = "CRITICAL: Respond with TEXT ONLY"

BUILTIN_SUMMARY = (
    "<analysis>The rig's scripted conversation.</analysis>\n"
    "<summary>1. Primary Request and Intent: the user talked to the rig's scripted model.\n"
    "2. Current Work: nothing pending.</summary>"
)
UNEXPECTED_TEXT = "rig: no scripted answer left"


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def split_words(text: str, n: int) -> list[str]:
    """Cut text into pieces of ``n`` words, each piece keeping the spaces after its words."""
    words = text.split(" ")
    pieces = [" ".join(words[i : i + n]) for i in range(0, len(words), n)]
    return [p + " " for p in pieces[:-1]] + pieces[-1:]


def split_text(text: str, parts: int = 3) -> list[str]:
    """Cut text into about `parts` pieces at spaces, so a stream has several deltas."""
    if len(text) < 8:
        return [text]
    size = max(1, len(text) // parts)
    out, start = [], 0
    while start < len(text):
        end = text.find(" ", start + size)
        end = len(text) if end == -1 or len(out) == parts - 1 else end + 1
        out.append(text[start:end])
        start = end
    return out


def _text_of(content: Any) -> str:
    """The text of a message's content (a string, or text/tool_result blocks)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            parts.append(_text_of(block.get("content", "")))
    return "\n".join(parts)


def last_user_text(body: dict[str, Any]) -> str:
    for msg in reversed(body.get("messages", [])):
        if msg.get("role") == "user":
            return _text_of(msg.get("content"))
    return ""


def last_user_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    for msg in reversed(body.get("messages", [])):
        if msg.get("role") == "user":
            c = msg.get("content")
            return [{"type": "text", "text": c}] if isinstance(c, str) else list(c or [])
    return []


def system_text(body: dict[str, Any]) -> str:
    return _text_of(body.get("system", ""))


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t.get("name", "") for t in body.get("tools", []) or []]


def is_compaction(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    return any(
        b.get("type") == "text" and b.get("text", "").lstrip().startswith(COMPACTION_PROMPT)
        for b in last_user_blocks(body)
    )


class AnthropicServer(ScriptedServer):
    agent = "claude-code"

    def setup_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self.messages)

    def is_special(self, body: Any) -> str | None:
        return "compaction" if is_compaction(body) else None

    def matches(self, match: dict[str, Any], body: Any) -> bool:
        """Keys of a call's ``match`` table; all given must hold:
        compaction (bool), last_user_startswith, last_user_contains, any_user_contains,
        system_contains, subagent (bool: a subagent's request), model_contains,
        tools_include / tools_exclude (lists of tool names),
        tool_result (bool: the last user message carries a tool_result)."""
        if not isinstance(body, dict):
            return False
        checks = {
            "compaction": lambda v: is_compaction(body) == v,
            "last_user_startswith": lambda v: last_user_text(body).lstrip().startswith(v),
            "last_user_contains": lambda v: v in last_user_text(body),
            "any_user_contains": lambda v: any(
                v in _text_of(m.get("content"))
                for m in body.get("messages", [])
                if m.get("role") == "user"
            ),
            "system_contains": lambda v: v in system_text(body),
            # Claude Code marks a subagent's requests in the system prompt's billing header.
            "subagent": lambda v: ("cc_is_subagent=true" in system_text(body)) == v,
            "model_contains": lambda v: v in body.get("model", ""),
            "tool_result": lambda v: (
                v == any(b.get("type") == "tool_result" for b in last_user_blocks(body))
            ),
        }
        return self.fits(match, checks, lambda: tool_names(body))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        rec = await self.log_request(request)
        body = rec.body if isinstance(rec.body, dict) else {}
        special = self.is_special(body)
        call = self.take_call(rec, special)
        if call is None:
            text = BUILTIN_SUMMARY if special == "compaction" else UNEXPECTED_TEXT
            call = {"content": [{"type": "text", "text": text}]}
        if call.get("delay"):
            await asyncio.sleep(float(call["delay"]))
        if "error" in call:
            return self._error(call["error"], rec)
        if "stream_error" in call and not body.get("stream"):
            # No stream to break: a non-streaming request gets the same error as an HTTP error.
            err = call["stream_error"]
            status = {"overloaded_error": 529, "rate_limit_error": 429}.get(err.get("type"), 500)
            return self._error({"status": status, **err}, rec)
        message = self.build_message(call, rec, body)
        if not body.get("stream"):
            return web.json_response(message, headers={"request-id": f"req_rig_{rec.seq}"})
        return await self._stream(request, call, message, rec)

    def build_message(
        self, call: dict[str, Any], rec: RecordedRequest, body: dict[str, Any]
    ) -> dict[str, Any]:
        """The complete assistant message a call stands for (what the stream adds up to)."""
        tag = f"{rec.call:02d}" if rec.call else f"x{rec.seq}"
        content = []
        for i, block in enumerate(call.get("content", [])):
            b = {k: v for k, v in block.items() if k != "chunks"}
            if b["type"] == "tool_use":
                b.setdefault("id", f"toolu_rig_{tag}_{i}")
                b.setdefault("input", {})
            elif b["type"] == "thinking":
                b.setdefault("signature", f"rig-signature-{tag}-{i}")
            content.append(b)
        has_tool = any(b["type"] == "tool_use" for b in content)
        usage = {
            "input_tokens": 100,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 20,
        }
        usage.update(call.get("usage", {}))
        return {
            "id": f"msg_rig_{tag}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "claude-rig"),
            "content": content,
            "stop_reason": call.get("stop_reason", "tool_use" if has_tool else "end_turn"),
            "stop_sequence": None,
            "usage": usage,
        }

    def _error(self, err: dict[str, Any], rec: RecordedRequest) -> web.Response:
        status = int(err.get("status", 500))
        default_type = {
            400: "invalid_request_error",
            401: "authentication_error",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error")
        payload = {
            "type": "error",
            "error": {
                "type": err.get("type", default_type),
                "message": err.get("message", f"rig: scripted HTTP {status}"),
            },
        }
        headers = {"request-id": f"req_rig_{rec.seq}", **err.get("headers", {})}
        return web.json_response(payload, status=status, headers=headers)

    async def _stream(
        self,
        request: web.Request,
        call: dict[str, Any],
        message: dict[str, Any],
        rec: RecordedRequest,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "request-id": f"req_rig_{rec.seq}",
            }
        )
        await resp.prepare(request)
        pause = float(call.get("event_delay", 0))

        async def send(event: str, data: dict[str, Any]) -> None:
            await resp.write(sse(event, data))
            if pause:
                await asyncio.sleep(pause)

        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None}
        start["usage"] = {**usage, "output_tokens": 1}
        try:
            await send("message_start", {"type": "message_start", "message": start})
            blocks = message["content"]
            words = call.get("words_per_delta")
            for i, (block, raw) in enumerate(zip(blocks, call.get("content", []), strict=True)):
                chunks = raw.get("chunks")
                if chunks is None and words and block["type"] in ("text", "thinking"):
                    chunks = split_words(block[block["type"]], int(words))
                await self._stream_block(send, i, block, chunks)
                last_open = call.get("hang") and i == len(blocks) - 1
                if not last_open:
                    await send("content_block_stop", {"type": "content_block_stop", "index": i})
            if call.get("hang"):
                await self.hold_open()
                return resp
            if "stream_error" in call:
                err = call["stream_error"]
                await send(
                    "error",
                    {
                        "type": "error",
                        "error": {
                            "type": err.get("type", "overloaded_error"),
                            "message": err.get("message", "Overloaded"),
                        },
                    },
                )
                return resp
            await send(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
            await send("message_stop", {"type": "message_stop"})
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            # The CLI went away mid-stream (interrupt, signal): nothing left to answer.
            pass
        return resp

    async def _stream_block(
        self, send: Any, index: int, block: dict[str, Any], chunks: list[str] | None
    ) -> None:
        kind = block["type"]
        if kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [
                {"type": "text_delta", "text": c} for c in chunks or split_text(block["text"])
            ]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": c}
                for c in chunks or split_text(block["thinking"])
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            js = json.dumps(block["input"], separators=(",", ":"))
            # The real API opens with an empty partial_json; several pieces follow.
            if chunks:
                pieces = chunks
            elif js == "{}":
                pieces = [""]
            else:
                third = max(1, len(js) // 3)
                pieces = ["", js[:third], js[third : 2 * third], js[2 * third :]]
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
        else:
            raise ValueError(f"unsupported content block type {kind!r}")
        await send(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
        for d in deltas:
            await send(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}
            )
