"""A scripted Gemini API (generativelanguage ``v1beta``) for the Gemini CLI.

Theory of operation
-------------------
The Gemini CLI is pointed at this server with ``GOOGLE_GEMINI_BASE_URL`` (``env.gemini_env``).
For a turn it calls ``POST /v1beta/models/<model>:streamGenerateContent?alt=sse``; for side
questions (the model router when ``-m`` is not given, and similar helpers)
``POST /v1beta/models/<model>:generateContent``. ``GeminiServer`` answers both from the scenario's
``[[calls]]``, one call per request, in order: the streaming method as server-sent events, one
``GenerateContentResponse`` per ``data:`` line (a text part is cut into a few events, as the real
API does), the last one carrying ``finishReason`` and ``usageMetadata``; ``generateContent`` as one
JSON response holding all the parts. ``:countTokens`` is bookkeeping, not a model turn: it gets a
fixed count and uses up no call. The CLI sends the whole history every time, so nothing is kept
between requests: the script alone decides the answers.

A call is a table with these keys (all optional):

``parts``
    Gemini ``Part`` objects spelled as the API spells them: ``{text = "..."}``,
    ``{text = "...", thought = true}`` (a thought; the CLI does not print these),
    ``{functionCall = {name = "run_shell_command", args = {command = "echo hi"}}}``. A text part
    may carry ``chunks = [...]`` (its pieces, one SSE event each); any other part is one event.
``usage``
    ``prompt``, ``candidates``, ``thoughts``, ``cached`` token counts: small fixed defaults
    (100 / 10 / 0 / 0), so the stats the CLI reports are predictable.
``finish_reason``
    Default ``STOP``.
``error = {status=500, message="...", headers={}}``
    Answer with that HTTP status and a Google error body (``{"error": {code, message, status}}``).
``stream_error = {status=500, message="..."}``
    Stream the parts, then a ``data:`` event holding that error body instead of the last chunk.
``truncate = true``
    Stream the parts, then end the stream without ``finishReason`` and usage.
``hang``, ``delay``, ``event_delay``, ``match``
    As every scripted server takes them (``server.py``); ``match`` keys: ``GeminiServer.matches``.

A request for which no call is left is answered with the text "rig: no scripted answer left" and
is listed in ``server.unexpected``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from .server import ScriptedServer

UNEXPECTED_TEXT = "rig: no scripted answer left"
METHODS = ("streamGenerateContent", "generateContent")

# Google's status names for the HTTP codes a scenario is likely to use.
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def split_text(text: str, parts: int = 2) -> list[str]:
    """Cut text into about `parts` pieces (at least one, even for "")."""
    if len(text) < 4:
        return [text]
    size = -(-len(text) // parts)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _texts(content: dict[str, Any]) -> str:
    return "\n".join(p["text"] for p in content.get("parts", []) if "text" in p)


def last_user_text(body: dict[str, Any]) -> str:
    for content in reversed(body.get("contents", [])):
        if content.get("role", "user") == "user" and _texts(content):
            return _texts(content)
    return ""


def tool_names(body: dict[str, Any]) -> list[str]:
    return [
        f.get("name", "")
        for t in body.get("tools", []) or []
        for f in t.get("functionDeclarations", []) or []
    ]


def ends_with_function_response(body: dict[str, Any]) -> bool:
    contents = body.get("contents", [])
    return bool(contents) and any("functionResponse" in p for p in contents[-1].get("parts", []))


def error_body(status: int, message: str) -> dict[str, Any]:
    return {
        "error": {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}
    }


class GeminiServer(ScriptedServer):
    agent = "gemini"

    def setup_routes(self, app: web.Application) -> None:
        # aiohttp cannot route on the ":method" suffix; one route takes "<model>:<method>".
        app.router.add_post("/v1beta/models/{target}", self.models)

    def matches(self, match: dict[str, Any], body: Any) -> bool:
        """Keys of a call's ``match`` table; all given must hold: method
        ("streamGenerateContent" or "generateContent"), model_contains, function_response (bool:
        the last content carries a functionResponse), last_user_contains, contents_contain (the
        JSON text of ``contents``), tools_include / tools_exclude (lists of function names)."""
        if not isinstance(body, dict):
            return False
        method, model = self._target
        checks = {
            "method": lambda v: method == v,
            "model_contains": lambda v: v in model,
            "function_response": lambda v: ends_with_function_response(body) == v,
            "last_user_contains": lambda v: v in last_user_text(body),
            "contents_contain": lambda v: v in json.dumps(body.get("contents", [])),
        }
        return self.fits(match, checks, lambda: tool_names(body))

    async def models(self, request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["target"].partition(":")
        rec = await self.log_request(request)
        if method == "countTokens":
            rec.answer = "builtin:countTokens"
            return web.json_response({"totalTokens": 100})
        if method not in METHODS:
            rec.answer = "404"
            return web.json_response(error_body(404, f"rig: no method {method!r}"), status=404)
        # matches() only gets the body; the method and model come from the path. Nothing awaits
        # between setting this and take_call, so concurrent requests cannot mix them up.
        self._target = (method, model)
        call = self.take_call(rec)
        if call is None:
            call = {"parts": [{"text": UNEXPECTED_TEXT}]}
        if call.get("delay"):
            await asyncio.sleep(float(call["delay"]))
        if "error" in call:
            err = call["error"]
            status = int(err.get("status", 500))
            return web.json_response(
                error_body(status, err.get("message", f"rig: scripted HTTP {status}")),
                status=status,
                headers=err.get("headers", {}),
            )
        chunks = self.chunks(call, model)
        if method == "generateContent":
            return web.json_response(merge(chunks))
        return await self.stream(request, call, self._events(call, chunks), "text/event-stream")

    _target: tuple[str, str] = ("", "")

    def chunks(self, call: dict[str, Any], model: str) -> list[dict[str, Any]]:
        """The ``GenerateContentResponse`` chunks that answer one call (ignoring hang and
        stream_error, which _stream adds)."""
        parts: list[dict[str, Any]] = []
        for raw in call.get("parts", []):
            part = {k: v for k, v in raw.items() if k != "chunks"}
            if "text" in part:
                for piece in raw.get("chunks") or split_text(str(part["text"])):
                    parts.append({**part, "text": piece})
            else:
                parts.append(part)
        if not parts:
            parts.append({"text": ""})
        out = []
        for part in parts:
            out.append(
                {
                    "candidates": [{"content": {"role": "model", "parts": [part]}, "index": 0}],
                    "modelVersion": model,
                    "responseId": "rig-response",
                }
            )
        if not (call.get("truncate") or call.get("hang") or "stream_error" in call):
            last = out[-1]
            last["candidates"][0]["finishReason"] = call.get("finish_reason", "STOP")
            last["usageMetadata"] = usage_of(call.get("usage", {}))
        return out

    def _events(self, call: dict[str, Any], chunks: list[dict[str, Any]]) -> Iterator[bytes]:
        """The chunks as server-sent events (the real API ends each with CRLF CRLF), then a
        ``stream_error``'s error body."""
        bodies = list(chunks)
        if "stream_error" in call:
            err = call["stream_error"]
            status = int(err.get("status", 500))
            bodies.append(error_body(status, err.get("message", "rig: scripted stream failure")))
        for body in bodies:
            yield f"data: {json.dumps(body)}\r\n\r\n".encode()


def usage_of(spec: dict[str, Any]) -> dict[str, Any]:
    prompt = int(spec.get("prompt", 100))
    cand = int(spec.get("candidates", 10))
    thoughts = int(spec.get("thoughts", 0))
    usage = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": cand,
        "totalTokenCount": prompt + cand + thoughts,
    }
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    if spec.get("cached"):
        usage["cachedContentTokenCount"] = int(spec["cached"])
    return usage


def merge(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """One non-streamed response from a stream's chunks (adjacent texts of a kind joined)."""
    parts: list[dict[str, Any]] = []
    for chunk in chunks:
        for part in chunk["candidates"][0]["content"]["parts"]:
            prev = parts[-1] if parts else None
            if (
                prev is not None
                and "text" in part
                and "text" in prev
                and bool(prev.get("thought")) == bool(part.get("thought"))
            ):
                prev["text"] += part["text"]
            else:
                parts.append(dict(part))
    merged = json.loads(json.dumps(chunks[-1]))
    merged["candidates"][0]["content"] = {"role": "model", "parts": parts}
    return merged
