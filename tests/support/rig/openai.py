"""A scripted OpenAI Responses API for the Codex CLI.

Theory of operation
-------------------
Codex (``codex exec``) is pointed at this server by the model provider that ``env.codex_env``
writes into ``$CODEX_HOME/config.toml`` (``base_url = <server>/v1``, ``wire_api = "responses"``).
It then makes only ``POST /v1/responses`` requests, always streamed. ``ResponsesServer`` answers
each with the scenario's next ``[[calls]]`` table, as server-sent events shaped like the real
API's: ``response.created`` and ``response.in_progress``; per output item
``response.output_item.added``, the item's deltas and ``response.output_item.done``; then
``response.completed`` with usage. Codex sends the whole history every time (``store = false``),
so nothing is kept between requests: the script alone decides the answers, and the items' ids
are derived from the call and item numbers, so two runs of a scenario get the same stream.

A call is a table with these keys (all optional):

``output``
    Items in order, each a table with ``type``:

    * ``message``: ``text`` (streamed as ``response.output_text.delta`` pieces);
    * ``reasoning``: ``summary`` (streamed as ``response.reasoning_summary_text.delta``; Codex
      shows it as a ``reasoning`` item) and/or ``content`` (raw ``reasoning_text``);
    * ``function_call``: ``name`` (e.g. ``exec_command``), ``arguments`` (a table, sent
      JSON-encoded, or a ready string), optional ``namespace`` (MCP tools found through
      ``tool_search`` are called as ``name`` inside namespace ``mcp__<server>``), optional
      ``capture = {argument = "regex"}`` (that argument is the regex's first group in the
      request's last tool output, e.g. the session id of a command still running);
    * ``custom_tool_call``: ``name`` (``apply_patch``) and ``input`` (the freeform text);
    * ``tool_search_call``: ``arguments`` (e.g. ``{query = "echo"}``): Codex's client-side tool
      discovery, the way it reaches MCP tools;
    * ``web_search_call``: ``action`` (e.g. ``{type = "search", query = "..."}``): a search the
      API itself ran; Codex only reports it.

    ``call_id`` defaults to ``call_rig_<call>_<item>``; ``chunks = [...]`` sets the deltas.
``usage``
    ``input_tokens``, ``cached_tokens``, ``output_tokens``, ``reasoning_tokens``: small fixed
    defaults (100 / 0 / 10 / 0), so the usage Codex reports is predictable.
``error = {status=500, message="...", type="server_error", code="...", headers={}}``
    Answer with that HTTP status and an OpenAI error body instead of a stream.
``stream_error = {code="server_error", message="..."}``
    Stream the output, then ``response.failed`` instead of ``response.completed``.
``truncate = true``
    Stream the output, then end the stream without a final event (a dropped connection).
``hang``, ``delay``, ``event_delay``, ``match``
    As every scripted server takes them (``server.py``); ``match`` keys: ``ResponsesServer.matches``.

A request for which no call is left is answered with the text "rig: no scripted answer left" (so
the CLI ends normally) and is listed in ``server.unexpected``.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from .server import RecordedRequest, ScriptedServer

UNEXPECTED_TEXT = "rig: no scripted answer left"
DEFAULT_MODEL = "gpt-5.5"
# The input item types that carry a tool's result back to the model.
OUTPUT_ITEM_TYPES = {"function_call_output", "custom_tool_call_output", "tool_search_output"}


def sse(data: dict[str, Any]) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def split_text(text: str, parts: int = 2) -> list[str]:
    """Cut text into about `parts` pieces (at least one, even for ""), so there are deltas."""
    if len(text) < 4:
        return [text]
    size = -(-len(text) // parts)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        c.get("text", "") for c in content or [] if isinstance(c, dict) and "text" in c
    )


def last_user_text(body: dict[str, Any]) -> str:
    for item in reversed(body.get("input", [])):
        if item.get("type") == "message" and item.get("role") == "user":
            return _content_text(item.get("content"))
    return ""


def input_text(body: dict[str, Any]) -> str:
    """Every text of the request's input (messages and tool outputs), joined."""
    out = []
    for item in body.get("input", []):
        if item.get("type") == "message":
            out.append(_content_text(item.get("content")))
        elif "output" in item:
            out.append(_content_text(item["output"]))
    return "\n".join(out)


# How Codex tells the model which deferred tool namespaces (an MCP server's tools, behind
# tool_search) it has: a developer message "<tools>" block with one of these headings, then a
# "- <namespace>[: what it is]" line each. The first lists them all; the others say what changed
# since the history last said, in the request's own process.
NAMESPACE_HEADINGS = {
    "Deferred tool namespaces:": "listed",
    "Added deferred tool namespaces:": "added",
    "Removed deferred tool namespaces:": "removed",
}


def offered_namespaces(body: dict[str, Any]) -> set[str]:
    """The deferred tool namespaces the request's input last told the model it has, its
    announcements read in order. Not merely any mention: a resumed Codex resends the history of
    the process before it, whose servers were up, and then says "Removed" for each of its own
    not up yet (and "Added" once one is)."""
    offered: set[str] = set()
    for item in body.get("input", []):
        if item.get("type") != "message" or item.get("role") != "developer":
            continue
        change = ""
        for line in _content_text(item.get("content")).splitlines():
            if line in NAMESPACE_HEADINGS:
                change = NAMESPACE_HEADINGS[line]
                if change == "listed":
                    offered.clear()
            elif change and line.startswith("- "):
                name = line[2:].partition(":")[0].strip()
                (offered.discard if change == "removed" else offered.add)(name)
            else:
                change = ""
    return offered


def tool_names(body: dict[str, Any]) -> list[str]:
    return [t.get("name") or t.get("type", "") for t in body.get("tools", []) or []]


def ends_with_tool_output(body: dict[str, Any]) -> bool:
    items = body.get("input", [])
    return bool(items) and items[-1].get("type") in OUTPUT_ITEM_TYPES


class ResponsesServer(ScriptedServer):
    agent = "codex"

    def setup_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.responses)

    def matches(self, match: dict[str, Any], body: Any) -> bool:
        """Keys of a call's ``match`` table; all given must hold: tool_output (bool: the input
        ends with a tool's output), last_user_contains, input_contains (any message or tool
        output), model_contains, namespaces_offered (a list: Codex last told the model it has
        these deferred tool namespaces, ``offered_namespaces``), tools_include / tools_exclude
        (lists of tool names)."""
        if not isinstance(body, dict):
            return False
        checks = {
            "tool_output": lambda v: ends_with_tool_output(body) == v,
            "last_user_contains": lambda v: v in last_user_text(body),
            "input_contains": lambda v: v in input_text(body),
            "model_contains": lambda v: v in body.get("model", ""),
            "namespaces_offered": lambda v: set(v) <= offered_namespaces(body),
        }
        return self.fits(match, checks, lambda: tool_names(body))

    async def responses(self, request: web.Request) -> web.StreamResponse:
        rec = await self.log_request(request)
        body = rec.body if isinstance(rec.body, dict) else {}
        call = self.take_call(rec)
        if call is None:
            call = {"output": [{"type": "message", "text": UNEXPECTED_TEXT}]}
        if call.get("delay"):
            await asyncio.sleep(float(call["delay"]))
        if "error" in call:
            return self._error(call["error"])
        events = (sse(e) for e in self.events(call, rec, body))
        return await self.stream(request, call, events, "text/event-stream; charset=utf-8")

    def events(
        self, call: dict[str, Any], rec: RecordedRequest, body: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The SSE payloads that answer one call, in order (without the hang)."""
        tag = f"{rec.call:02d}" if rec.call else f"x{rec.seq}"
        response: dict[str, Any] = {
            "id": f"resp_rig_{tag}",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": "in_progress",
            "model": body.get("model", DEFAULT_MODEL),
            "output": [],
            "usage": None,
        }
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": response},
            {"type": "response.in_progress", "response": response},
        ]
        done = []
        for i, spec in enumerate(call.get("output", [])):
            if "capture" in spec:
                spec = {**spec, "arguments": captured_arguments(spec, body)}
            item_events, item = item_stream(spec, i, f"{tag}_{i}")
            events += item_events
            done.append(item)
        if call.get("hang") or call.get("truncate"):
            pass
        elif "stream_error" in call:
            err = call["stream_error"]
            failed = {
                **response,
                "status": "failed",
                "output": done,
                "error": {
                    "code": err.get("code", "server_error"),
                    "message": err.get("message", "rig: scripted stream failure"),
                },
            }
            events.append({"type": "response.failed", "response": failed})
        else:
            completed = {
                **response,
                "status": "completed",
                "output": done,
                "usage": usage_of(call.get("usage", {})),
            }
            events.append({"type": "response.completed", "response": completed})
        # The real API numbers every event of a response.
        return [{"type": e["type"], "sequence_number": n, **e} for n, e in enumerate(events)]

    def _error(self, err: dict[str, Any]) -> web.Response:
        status = int(err.get("status", 500))
        default_type = {
            400: "invalid_request_error",
            401: "invalid_request_error",
            429: "rate_limit_exceeded",
        }.get(status, "server_error")
        payload = {
            "error": {
                "message": err.get("message", f"rig: scripted HTTP {status}"),
                "type": err.get("type", default_type),
                "param": err.get("param"),
                "code": err.get("code"),
            }
        }
        return web.json_response(payload, status=status, headers=err.get("headers", {}))


def captured_arguments(spec: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A function call's arguments with values taken from the request's last tool output: each
    ``capture`` entry is ``argument = "regex"`` and the argument gets the regex's first group (a
    number when it is all digits). This is how a scripted model polls a command that Codex left
    running, whose session id Codex picks at random."""
    items = body.get("input", [])
    output = _content_text(items[-1].get("output", "")) if items else ""
    args = dict(spec.get("arguments", {}))
    for name, pattern in spec["capture"].items():
        m = re.search(pattern, output)
        if m is None:
            raise ValueError(f"capture {name!r}: {pattern!r} not in the last tool output")
        args[name] = int(m.group(1)) if m.group(1).isdigit() else m.group(1)
    return args


def usage_of(spec: dict[str, Any]) -> dict[str, Any]:
    inp = int(spec.get("input_tokens", 100))
    out = int(spec.get("output_tokens", 10))
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": int(spec.get("cached_tokens", 0))},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": int(spec.get("reasoning_tokens", 0))},
        "total_tokens": inp + out,
    }


def item_stream(
    spec: dict[str, Any], index: int, tag: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events of one output item (added, deltas, done) and the finished item."""
    kind = spec.get("type", "message")
    chunks = spec.get("chunks")
    at = {"output_index": index}
    events: list[dict[str, Any]] = []

    def added(item: dict[str, Any]) -> None:
        events.append({"type": "response.output_item.added", **at, "item": item})

    if kind == "message":
        text = str(spec.get("text", ""))
        iid = f"msg_rig_{tag}"
        part = {"type": "output_text", "text": "", "annotations": []}
        added(
            {
                "id": iid,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        )
        ref = {"item_id": iid, **at, "content_index": 0}
        events.append({"type": "response.content_part.added", **ref, "part": part})
        for d in chunks or split_text(text):
            events.append({"type": "response.output_text.delta", **ref, "delta": d})
        events.append({"type": "response.output_text.done", **ref, "text": text})
        events.append({"type": "response.content_part.done", **ref, "part": {**part, "text": text}})
        item = {
            "id": iid,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{**part, "text": text}],
        }
    elif kind == "reasoning":
        iid = f"rs_rig_{tag}"
        added({"id": iid, "type": "reasoning", "summary": []})
        # Opaque to the client, which only sends it back with the history.
        item = {"id": iid, "type": "reasoning", "summary": [], "encrypted_content": f"rig-{tag}"}
        ref = {"item_id": iid, **at}
        if "summary" in spec:
            summary = str(spec["summary"])
            sref = {**ref, "summary_index": 0}
            part = {"type": "summary_text", "text": ""}
            events.append({"type": "response.reasoning_summary_part.added", **sref, "part": part})
            for d in chunks or split_text(summary):
                events.append({"type": "response.reasoning_summary_text.delta", **sref, "delta": d})
            events.append({"type": "response.reasoning_summary_text.done", **sref, "text": summary})
            events.append(
                {
                    "type": "response.reasoning_summary_part.done",
                    **sref,
                    "part": {**part, "text": summary},
                }
            )
            item["summary"] = [{"type": "summary_text", "text": summary}]
        if "content" in spec:
            content = str(spec["content"])
            cref = {**ref, "content_index": 0}
            for d in split_text(content):
                events.append({"type": "response.reasoning_text.delta", **cref, "delta": d})
            events.append({"type": "response.reasoning_text.done", **cref, "text": content})
            item["content"] = [{"type": "reasoning_text", "text": content}]
    elif kind in ("function_call", "custom_tool_call"):
        # The two kinds of tool call stream their input alike, under different names.
        if kind == "function_call":
            args = spec.get("arguments", {})
            text = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"))
            iid, field, stream = f"fc_rig_{tag}", "arguments", "function_call_arguments"
        else:
            text = str(spec.get("input", ""))
            iid, field, stream = f"ctc_rig_{tag}", "input", "custom_tool_call_input"
        head = {
            "id": iid,
            "type": kind,
            "call_id": spec.get("call_id", f"call_rig_{tag}"),
            "name": spec["name"],
        }
        if "namespace" in spec:
            head["namespace"] = spec["namespace"]
        added({**head, "status": "in_progress", field: ""})
        ref = {"item_id": iid, **at}
        for d in chunks or split_text(text, 3):
            events.append({"type": f"response.{stream}.delta", **ref, "delta": d})
        events.append({"type": f"response.{stream}.done", **ref, field: text})
        item = {**head, "status": "completed", field: text}
    elif kind == "tool_search_call":
        item = {
            "id": f"ts_rig_{tag}",
            "type": "tool_search_call",
            "call_id": spec.get("call_id", f"call_rig_{tag}"),
            "execution": "client",
            "status": "completed",
            "arguments": dict(spec.get("arguments", {})),
        }
        added({**item, "status": "in_progress"})
    elif kind == "web_search_call":
        # A search the API ran itself (no client execution); Codex only reports it.
        iid = f"ws_rig_{tag}"
        action = dict(spec.get("action", {"type": "search", "query": ""}))
        added({"id": iid, "type": "web_search_call", "status": "in_progress", "action": action})
        for phase in ("in_progress", "searching", "completed"):
            events.append({"type": f"response.web_search_call.{phase}", **at, "item_id": iid})
        item = {"id": iid, "type": "web_search_call", "status": "completed", "action": action}
    else:
        raise ValueError(f"unsupported output item type {kind!r}")
    events.append({"type": "response.output_item.done", **at, "item": item})
    return events, item
