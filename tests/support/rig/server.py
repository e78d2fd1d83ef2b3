"""The agent-neutral part of a scripted model server.

Theory of operation
-------------------
A scripted server is an aiohttp app that answers a CLI's model requests from a scenario's
``calls`` list instead of from a model. ``ScriptedServer`` holds what every such server needs:

* the call queue: ``take_call(body)`` returns the first unused call whose ``match`` (if any) fits
  the request, as decided by the subclass's ``matches``. Calls without ``match`` are served in
  order; a call with ``match`` waits for a request that fits it. When none is left the request is
  *unexpected*: the subclass answers something harmless and the request is listed in
  ``unexpected`` so tests can fail on it.
* the request log: ``requests`` holds every HTTP request received (method, path, query, headers,
  JSON body) with what answered it, so tests can assert on what the CLI sent.
* progress signals the runner waits on to trigger actions: ``wait_call(n)`` (scripted call n,
  1-based, has started to be answered), ``wait_hang(count)`` (a hang step is holding its stream
  open) and ``release_hangs()``.
* ``start()`` binds 127.0.0.1 on a free port and returns the base URL; ``close()`` stops it.

Besides its own, a call may have the keys every server takes: ``hang = true`` (stream the
answer, then hold the stream open until the client goes away or the server closes: for interrupt
and signal tests), ``delay`` and ``event_delay`` (seconds to wait before answering, and between SSE
events) and ``match`` (answer only a request that fits; the keys are the subclass's).

A subclass (``anthropic.AnthropicServer``; the Codex and Gemini servers likewise) adds its routes
in ``setup_routes`` and implements ``matches``. Every server is usable directly in an
aiohttp test client (``aiohttp_client(server.app)``) without starting a CLI.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass
class RecordedRequest:
    seq: int  # 0-based order of arrival
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any  # parsed JSON, or the text when it is not JSON
    answer: str = ""  # "call N" (1-based scripted call), "builtin:<what>", "unexpected", "404"
    call: int | None = None  # 1-based index into calls when a scripted call answered


class ScriptedServer:
    """Base for the scripted model servers. ``calls`` are the scenario's ``[[calls]]`` tables
    (placeholders already expanded)."""

    agent = ""

    def __init__(self, calls: list[dict[str, Any]] | None = None) -> None:
        self.calls: list[dict[str, Any]] = list(calls or [])
        self.used = [False] * len(self.calls)
        self.requests: list[RecordedRequest] = []
        # How far the script got ("calls" started, "hangs" holding); the runner's triggers wait
        # on it.
        self.progress = {"calls": 0, "hangs": 0}
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        self._release: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        self.app = web.Application()
        self.setup_routes(self.app)
        # Anything the subclass does not route is logged and refused, so a new kind of request
        # from a CLI shows up in the request log instead of going unnoticed.
        self.app.router.add_route("*", "/{tail:.*}", self._not_found)

    # -- for subclasses -------------------------------------------------------------------------

    def setup_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def matches(self, match: dict[str, Any], body: Any) -> bool:
        """Does a request body fit a call's ``match`` table? Subclasses define the keys."""
        raise NotImplementedError

    def fits(
        self,
        match: dict[str, Any],
        checks: dict[str, Callable[[Any], bool]],
        tools: Callable[[], list[str]],
    ) -> bool:
        """For ``matches``: every key of ``match`` holds by its check; ``tools`` (the request's
        tool names) serves the tools_include / tools_exclude keys every server takes. A key no
        check knows is a mistake in the scenario, not a request that does not fit."""
        checks = {
            **checks,
            "tools_include": lambda v: set(v) <= set(tools()),
            "tools_exclude": lambda v: not set(v) & set(tools()),
        }
        unknown = set(match) - set(checks)
        if unknown:
            raise ValueError(f"unknown match keys for {type(self).__name__}: {sorted(unknown)}")
        return all(checks[k](v) for k, v in match.items())

    def is_special(self, body: Any) -> str | None:
        """A kind of request (e.g. "compaction") that only calls matching it explicitly may
        answer; others are served by the subclass's built-in answer. None: an ordinary request."""
        return None

    async def log_request(self, request: web.Request) -> RecordedRequest:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        rec = RecordedRequest(
            seq=len(self.requests),
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=dict(request.headers),
            body=body,
        )
        self.requests.append(rec)
        return rec

    def take_call(self, rec: RecordedRequest, special: str | None = None) -> dict[str, Any] | None:
        """Claim the next call for this request (see module doc); marks rec.answer/rec.call."""
        for i, call in enumerate(self.calls):
            if self.used[i]:
                continue
            match = call.get("match")
            if special and not (match and match.get(special)):
                continue
            if match and not self.matches(match, rec.body):
                continue
            self.used[i] = True
            rec.answer, rec.call = f"call {i + 1}", i + 1
            self._bump("calls")
            return call
        rec.answer = f"builtin:{special}" if special else "unexpected"
        return None

    async def stream(
        self,
        request: web.Request,
        call: dict[str, Any],
        events: Iterable[bytes],
        content_type: str,
    ) -> web.StreamResponse:
        """Answer with ``events`` (each a whole server-sent event, the call's ``event_delay``
        after each), then end the stream, or with ``hang`` hold it open. A client that goes away
        mid-stream (interrupt, signal) leaves nothing to answer."""
        resp = web.StreamResponse(
            headers={"Content-Type": content_type, "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        pause = float(call.get("event_delay", 0))
        try:
            for event in events:
                await resp.write(event)
                if pause:
                    await asyncio.sleep(pause)
            if call.get("hang"):
                await self.hold_open()
                return resp
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp

    async def hold_open(self) -> None:
        """A hang step: count it, then wait until released or the client goes away."""
        self._bump("hangs")
        await self._release_event().wait()

    # -- for the runner and tests ---------------------------------------------------------------

    @property
    def unexpected(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.answer in ("unexpected", "404")]

    @property
    def unused_calls(self) -> list[int]:
        """1-based numbers of scripted calls no request has claimed."""
        return [i + 1 for i, used in enumerate(self.used) if not used]

    async def wait_call(self, n: int) -> None:
        await self._wait(lambda: self.progress["calls"] >= n)

    async def wait_hang(self, count: int = 1) -> None:
        await self._wait(lambda: self.progress["hangs"] >= count)

    def release_hangs(self) -> None:
        self._release_event().set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # port 0: ask the socket which port it got
        self.base_url = f"http://{host}:{sock.getsockname()[1]}"
        return self.base_url

    async def close(self) -> None:
        self.release_hangs()
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals ------------------------------------------------------------------------------

    def _release_event(self) -> asyncio.Event:
        # Created lazily so that it belongs to the loop that serves the requests.
        if self._release is None:
            self._release = asyncio.Event()
        return self._release

    def _bump(self, what: str) -> None:
        self.progress[what] += 1
        for pred, fut in list(self._waiters):
            if not fut.done() and pred():
                fut.set_result(None)
        self._waiters = [(p, f) for p, f in self._waiters if not f.done()]

    async def _wait(self, pred: Callable[[], bool]) -> None:
        if pred():
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((pred, fut))
        await fut

    async def _not_found(self, request: web.Request) -> web.Response:
        rec = await self.log_request(request)
        rec.answer = "404"
        return web.json_response(
            {"error": f"scripted server: no route for {request.method} {request.path}"},
            status=404,
        )
