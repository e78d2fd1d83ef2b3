"""`rawp-gateway chat` against the real server with the demo agent, and helpers.

What the chat sends is asserted on the wire where it matters: a second master on the session (a
"watcher") gets every control frame the chat sends (DPS-2.4-relay). A connection lost is the
gateway closing the chat's WebSocket. Keyboard tests type into a real pipe once the chat shows what
they answer (``shown``).

Three tests need frames the demo agent never produces (a plan the agent goes on with and a
catalog's diagnostics, subagents and a warning, a gateway that crashed mid-turn): those run against
``FakeGateway``, a scripted stand-in speaking ``rawp-dps-1.0`` per docs/http-api.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import itertools
import os
import re
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient, TestServer

from gateway.chat import add_chat_arguments, run_chat, run_chat_from_args
from gateway.chat.render import answer_value, describe_call, permission_question, summarize_result
from gateway.cli.demo import run_demo_async
from gateway.client import GatewayClient, GatewayError, MasterView, is_synthetic
from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.capabilities import ALL_FEATURES, agreed_features
from gateway.protocol.factory import FrameFactory
from gateway.server import SESSIONS
from tests.support.chat import Pipe, piped_chat, shown
from tests.support.gateway_peer import Master, base_url, create_session, demo_config, start_gateway
from tests.support.logs import deletions, watch_sessions
from tests.support.paths import FIXTURES
from tests.support.waiting import eventually

SUBPROTOCOL = "rawp-dps-1.0"
TOKEN = "s3cret-token"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGP4z8AARww4OQD1MQv1NXv7ggAAAABJRU5ErkJggg=="
)  # a 4x3 red PNG


def usage(turn_id: str) -> F.Usage:
    return F.Usage(
        turn_id=turn_id,
        token_usage=F.TokenUsage(input_tokens=1200, output_tokens=34),
        cost_usage=F.Quota(limit=-1, used=0, unit="USD"),
        message_usage=F.Quota(limit=-1, used=1, unit="COUNT"),
        time_to_reset="2026-11-30T00:00:00.000Z",
    )


def fake_factory(session_id: str) -> FrameFactory:
    """The fake's frames are one millisecond apart, so a replayed history has one order.

    (A real gateway sends several frames in one millisecond; ordered by ``timestamp`` then
    ``message_id`` as DPS-2.3-history-order says, those would replay in random-id order.)
    """
    ms = itertools.count()
    return FrameFactory(
        session_id,
        clock=lambda: (
            f"2026-11-29T21:{(m := next(ms)) // 60000:02d}:{m // 1000 % 60:02d}.{m % 1000:03d}Z"
        ),
    )


@dataclass
class FakeSession:
    session_id: str
    agent: str
    factory: FrameFactory
    log: list[F.Frame] = field(default_factory=list)  # everything sent, for session.history
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    mode: str = "default"
    turn_index: int = 0
    running: str | None = None
    deleted: bool = False
    restarted_at: int | None = None  # index in log of the first frame after a simulated crash

    def obj(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "name": None,
            "agent": self.agent,
            "origin": "remote",
            "state": "TERMINATED" if self.deleted else "RUNNING" if self.running else "IDLE",
            "agent_state": "idle",
            "mode": self.mode,
            "turn_index": self.turn_index,
            "connections": len(self.sockets),
            "created_at": "2026-11-29T21:00:00.000Z",
            "ws_path": f"/v1/session/{self.session_id}/ws",
        }

    async def emit(
        self, payload: F.Payload, *, turn_id: str | None = None, metadata: dict | None = None
    ) -> F.Frame:
        frame = self.factory.frame(payload, turn_id=turn_id, metadata=metadata)
        self.log.append(frame)
        data = codec.encode(frame).decode()
        for ws in list(self.sockets):
            if not ws.closed:
                await ws.send_str(data)
        return frame


class FakeGateway:
    """A scripted stand-in for the real server: enough of docs/http-api.md for a master."""

    url = ""  # set once the test server runs

    def __init__(self, *, token: str | None = None, agents: tuple[str, ...] = ("demo",)) -> None:
        self.token = token
        self.agents = agents
        self.sessions: dict[str, FakeSession] = {}
        self.deleted: list[str] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/session", self.create)
        self.app.router.add_get("/v1/session/{id}", self.get)
        self.app.router.add_delete("/v1/session/{id}", self.delete)
        self.app.router.add_get("/v1/session/{id}/ws", self.websocket)

    @staticmethod
    def error(status: int, code: str, message: str) -> web.Response:
        return web.json_response({"error_code": code, "message": message}, status=status)

    def authorized(self, request: web.Request) -> bool:
        return self.token is None or request.headers.get("Authorization") == f"Bearer {self.token}"

    def session(self) -> FakeSession:
        (only,) = self.sessions.values()
        return only

    async def create(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return self.error(401, "UNAUTHORIZED", "bearer token required")
        body = await request.json()
        if body.get("agent") not in self.agents:
            return self.error(404, "AGENT_NOT_FOUND", f"no agent {body.get('agent')!r}")
        sid = str(uuid.uuid4())
        self.sessions[sid] = FakeSession(sid, body["agent"], fake_factory(sid))
        return web.json_response(self.sessions[sid].obj(), status=201)

    def find(self, request: web.Request) -> FakeSession | web.Response:
        if not self.authorized(request):
            return self.error(401, "UNAUTHORIZED", "bearer token required")
        s = self.sessions.get(request.match_info["id"])
        return s if s is not None else self.error(404, "SESSION_NOT_FOUND", "no such session")

    async def get(self, request: web.Request) -> web.Response:
        s = self.find(request)
        return s if isinstance(s, web.Response) else web.json_response(s.obj())

    async def delete(self, request: web.Request) -> web.Response:
        s = self.find(request)
        if isinstance(s, web.Response):
            return s
        s.deleted = True
        self.deleted.append(s.session_id)
        await s.emit(
            F.Deleted(session_id=s.session_id, reason="master_request", deleted_by="master")
        )
        for ws in list(s.sockets):
            await ws.close()
        return web.json_response(s.obj())

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        s = self.find(request)
        if isinstance(s, web.Response):
            return s
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if SUBPROTOCOL not in offered:
            return self.error(400, "SUBPROTOCOL_REQUIRED", "offer rawp-dps-1.0")
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,))
        await ws.prepare(request)
        caps = F.Capabilities(
            protocol_version="rawp-dps-1.0",
            supported_namespaces=["agent", "tool", "control", "session"],
            features=F.Features(plan_mode=True, context_compaction=True, adapter_type="process"),
        )
        await ws.send_str(codec.encode(s.factory.frame(caps)).decode())
        last = request.query.get("last_message_id")
        if last is not None:
            ids = [f.message_id for f in s.log]
            if last in ids:
                missed = s.log[ids.index(last) + 1 :]
            elif s.restarted_at is not None:  # an id lost in the crash: what came after it
                missed = s.log[s.restarted_at :]
            else:
                missed = s.log
            history = F.History(
                frames=[msgspec.Raw(codec.encode(f)) for f in missed],
                buffer_status=F.BufferStatus(policy_applied="RING", truncated=last not in ids),
                last_sync_timestamp=missed[-1].timestamp if missed else "",
                last_message_id=missed[-1].message_id if missed else last,
            )
            await ws.send_str(codec.encode(s.factory.frame(history)).decode())
        commands = F.CommandsPublish(
            commands=[
                F.Command(name="compact", description="Compact"),
                F.Command(name="cost", description="Cost"),
                F.Command(name="review", description="Review a pull request"),
            ]
        )
        await ws.send_str(codec.encode(s.factory.frame(commands)).decode())
        s.sockets.append(ws)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                result = codec.decode(msg.data)
                assert isinstance(result, codec.Accepted), result
                if result.frame.TYPE.startswith("control."):
                    # DPS-2.4-relay: to every other connection of the session, never back.
                    for other in list(s.sockets):
                        if other is not ws and not other.closed:
                            await other.send_str(msg.data)
                await self.on_control(s, result.frame)
        finally:
            if ws in s.sockets:
                s.sockets.remove(ws)
        return ws

    async def on_control(self, s: FakeSession, frame: F.Frame) -> None:
        if isinstance(frame.payload, F.PromptRequest):
            if s.running:
                await s.emit(
                    F.SessionError(error_code="PROMPT_IN_PROGRESS", message="busy", fatal=False)
                )
                return
            s.running = str(uuid.uuid4())
            asyncio.get_running_loop().create_task(self.turn(s, s.running, frame.payload))

    async def turn(self, s: FakeSession, tid: str, prompt: F.PromptRequest) -> None:
        """One scripted turn; the prompt text picks the script."""
        text = prompt.prompt_text

        async def say(*parts: str, index: int = 0) -> None:
            for part in parts:
                await s.emit(F.TextDelta(content_index=index, text=part), turn_id=tid)
            await s.emit(F.TextDone(content_index=index, full_text="".join(parts)), turn_id=tid)

        async def call(name: str, tool_input: dict[str, Any]) -> str:
            iid = str(uuid.uuid4())
            await s.emit(
                F.InvokeRequest(invocation_id=iid, tool_name=name, input=tool_input), turn_id=tid
            )
            return iid

        async def result(
            iid: str, name: str, status: str, output: Any, output_type: str = "text"
        ) -> None:
            await s.emit(
                F.InvokeResult(
                    invocation_id=iid,
                    tool_name=name,
                    status=status,
                    output=output,
                    output_type=output_type,
                ),
                turn_id=tid,
            )

        await s.emit(F.TurnStart(turn_id=tid, turn_index=s.turn_index, mode=s.mode), turn_id=tid)
        s.turn_index += 1
        stop = "end_turn"
        if text == "crash":
            # The gateway is SIGKILLed mid-turn: the delta it last sent was never written down;
            # the restarted gateway closes the turn in history with GATEWAY_RESTARTED and the
            # reattach is truncated with no lost_frame_count (docs/persistence.md).
            await s.emit(F.TextDelta(content_index=0, text="Working"), turn_id=tid)
            await s.emit(F.TextDelta(content_index=0, text=" hard"), turn_id=tid)
            s.log.pop()
            s.restarted_at = len(s.log)
            closing: list[F.Payload] = [
                F.TextDone(content_index=0, full_text="Working", is_cancelled=True),
                F.AgentError(
                    error_code="GATEWAY_RESTARTED",
                    message="the gateway restarted during this turn",
                    severity="error",
                    recoverable=True,
                ),
                F.TurnEnd(turn_id=tid, stop_reason="error", tool_invocation_count=0),
                usage(tid),
            ]
            s.log.extend(s.factory.frame(p, turn_id=tid) for p in closing)
            s.running = None
            for ws in list(s.sockets):
                await ws.close()
            return
        elif text == "delegate":
            await s.emit(F.ThinkingDelta(content_index=0, text="Hmm."), turn_id=tid)
            await s.emit(F.ThinkingDone(content_index=0), turn_id=tid)
            task = str(uuid.uuid4())
            await s.emit(
                F.InvokeRequest(
                    invocation_id=task,
                    tool_name="Task",
                    input={"description": "Find the tests", "prompt": "find them"},
                    subagent=F.SubagentInfo(agent_type="Explore", description="Find the tests"),
                ),
                turn_id=tid,
            )
            await s.emit(
                F.SubagentStarted(parent_invocation_id=task, depth=1, agent_type="Explore"),
                turn_id=tid,
            )
            ctx = {"subagent_context": {"parent_invocation_id": task, "depth": 1}}
            for payload in (
                F.TextDelta(content_index=0, text="Looking.\nStill looking."),
                F.TextDone(content_index=0),
                F.InvokeRequest(invocation_id="g", tool_name="Grep", input={"pattern": "def test"}),
                F.InvokeResult(
                    invocation_id="g",
                    tool_name="Grep",
                    status="success",
                    output="t.py",
                    output_type="text",
                ),
            ):
                await s.emit(payload, turn_id=tid, metadata=ctx)
            await s.emit(
                F.SubagentEnded(parent_invocation_id=task, status="completed", duration_ms=1500),
                turn_id=tid,
            )
            await result(task, "Task", "success", "Found t.py", "agent_result")
            await s.emit(
                F.AgentError(
                    error_code="RATE_LIMITED",
                    message="slow down",
                    severity="warning",
                    recoverable=True,
                ),
                turn_id=tid,
            )
        elif text == "mcp":
            # What became of two MCP servers, as the gateway publishes it: pending, then the
            # agent's report (one failed, why found later), the same again, and a respawn.
            docs = {"name": "docs", "kind": "stdio", "origin": "config", "command": ["docs-mcp"]}
            http = {"name": "tracker", "kind": "http", "origin": "request", "headers": ["X-Key"]}
            tools = ["mcp__docs__search", "mcp__docs__fetch"]
            for servers in (
                [{**docs, "status": "pending"}, {**http, "status": "pending"}],
                [{**docs, "status": "connected", "tools": tools}, {**http, "status": "failed"}],
                [{**docs, "status": "connected", "tools": tools}, {**http, "status": "failed"}],
                [
                    {**docs, "status": "connected", "tools": tools},
                    {**http, "status": "failed", "reason": "HTTP 401\x1b[2J\nUnauthorized"},
                ],
                [{**docs, "status": "pending"}, {**http, "status": "pending"}],
                [
                    {**docs, "status": "connected", "tools": tools},
                    {**http, "status": "failed", "reason": "HTTP 401\x1b[2J\nUnauthorized"},
                    {"name": "extra", "origin": "agent", "status": "needs-auth"},
                ],
            ):
                await s.emit(
                    F.CatalogPublish(tools=[F.CatalogTool(name="Read", description="Read")]),
                    metadata={"rawp_mcp_servers": servers},
                )
            await say("Servers reported.")
        elif text == "plan it":
            await s.emit(
                F.CatalogPublish(
                    tools=[F.CatalogTool(name="mcp__db__query", description="Query")],
                    diagnostics=[
                        F.Diagnostic(
                            severity="error",
                            tool_name="mcp__db__query",
                            code="TOOL_UNAVAILABLE",
                            message="MCP server db failed to start",
                        )
                    ],
                )
            )
            await s.emit(
                F.TextDelta(content_index=0, text="1. read\n2. write"),
                turn_id=tid,
                metadata={"content_role": "plan"},
            )
            await s.emit(F.TextDone(content_index=0), turn_id=tid)
            iid = await call("Read", {"file_path": "a.txt"})
            await result(iid, "Read", "success", "a", "file_content")
            await s.emit(  # the same plan, going on after the call
                F.TextDelta(content_index=1, text="3. test"),
                turn_id=tid,
                metadata={"content_role": "plan"},
            )
            await s.emit(F.TextDone(content_index=1), turn_id=tid)
        else:
            await say(f"You said: {text}")
        await s.emit(F.TurnEnd(turn_id=tid, stop_reason=stop, tool_invocation_count=1), turn_id=tid)
        await s.emit(usage(tid), turn_id=tid)
        s.running = None


@pytest.fixture
async def fake() -> Any:
    gw = FakeGateway()
    server = TestServer(gw.app)
    await server.start_server()
    gw.url = str(server.make_url("")).rstrip("/")
    yield gw
    await server.close()


async def fake_chat(gw: FakeGateway, stdin: str, **kw: Any) -> tuple[int, str]:
    out = io.StringIO()
    kw.setdefault("agent", "demo")
    rc = await asyncio.wait_for(
        run_chat(gw.url, stdin=io.StringIO(stdin), stdout=out, reattach_delays=(0.05, 0.2), **kw),
        timeout=20,
    )
    return rc, out.getvalue()


# --------------------------------------------------------------------------- the scripted gateway: what the demo agent cannot show


async def test_plan_documents_and_catalog_diagnostics_are_shown(fake: FakeGateway):
    """A plan the agent goes on with after a call, and a catalog's diagnostics (the demo agent
    has neither: the scripted gateway)."""
    _, out = await fake_chat(fake, "plan it\n")
    assert "⚠ mcp__db__query: MCP server db failed to start (TOOL_UNAVAILABLE)\n" in out
    assert "plan:\n1. read\n2. write\n" in out
    assert "\n3. test\n" in out
    assert out.count("plan:") == 1  # one plan, labelled once in its turn


async def test_mcp_servers_are_said_once_per_change_and_listed_by_slash_mcp(fake: FakeGateway):
    """docs/mcp.md#what-masters-see: a line when a server connects or fails (and when why it
    failed is found later), not for every catalog nor for a respawn's pending; ``/mcp`` lists
    them; nothing of the agent's words reaches the terminal as an escape sequence."""
    _, out = await fake_chat(fake, "/mcp\nmcp\n/mcp\n")
    assert "no MCP servers on this session\n" in out
    said = [line for line in out.splitlines() if line.startswith(("⚙ MCP", "✗ MCP"))]
    assert said == [
        "⚙ MCP server docs connected (2 tools)",
        "✗ MCP server tracker failed",
        "✗ MCP server tracker failed: HTTP 401 [2J Unauthorized",
        "✗ MCP server extra needs-auth",
    ]
    assert "\x1b" not in out
    listed = out[out.rindex("MCP servers:") :]
    assert listed.splitlines()[1:4] == [
        "  docs connected (2 tools) · stdio, from config",
        "  tracker failed: HTTP 401 [2J Unauthorized · http, from request",
        "  extra needs-auth · from agent",
    ]


async def test_subagents_thinking_and_errors(fake: FakeGateway):
    """Subagents and a warning (the demo agent has neither: the scripted gateway)."""
    _, out = await fake_chat(fake, "delegate\n")
    assert "thinking:\nHmm.\n" in out  # labelled, as a plan is
    assert "→ Task: Find the tests\n⇢ subagent: Explore\n" in out
    # The subagent's frames are indented by their depth, streamed text on every line.
    assert "  Looking.\n  Still looking.\n  → Grep: def test\n  ← ok (1 line)\n    t.py\n" in out
    assert "⇠ subagent completed in 1.5 s\n← ok (1 line)\n  Found t.py\n" in out
    assert "✗ warning RATE_LIMITED: slow down\n" in out


async def test_after_a_gateway_crash_the_reattach_says_frames_are_missing_and_why(
    fake: FakeGateway,
):
    """A truncated history without lost_frame_count (a gateway that crashed and came back) is
    not called a buffer overflow, and the error that closed the turn is shown (DPS-7.1.1)."""
    rc, out = await fake_chat(fake, "crash\nafter\n")
    assert rc == 0, out
    assert "buffer overflowed" not in out
    assert "(reattached, but some frames are missing (the gateway cannot tell how many" in out
    assert "✗ error GATEWAY_RESTARTED: the gateway restarted during this turn" in out
    assert out.index("(reattached, but") < out.index("GATEWAY_RESTARTED")
    assert "You said: after" in out  # the next prompt goes on


# --------------------------------------------------------------------------- the real server


@dataclass
class Gateway:
    """The real server (``create_app``) with the demo agent, workspace root ``root``."""

    client: TestClient
    root: Path
    watchers: set[str] = field(default_factory=set)  # server-side ids of the watchers' sockets

    @property
    def url(self) -> str:
        return base_url(self.client)

    @property
    def sessions(self) -> dict[str, Any]:
        return self.client.server.app[SESSIONS]

    def only_session(self) -> Any:
        (only,) = self.sessions.values()
        return only

    async def watcher(self, session_id: str) -> Master:
        """Another master on the session (the chat's control frames are relayed to it)."""
        master = await Master.attach(self.client, session_id)
        await master.until("session.capabilities")
        self.watchers |= set(self.sessions[session_id].connections)
        return master


async def start_real_gateway(root: Path, delay_ms: int = 1, **config: Any) -> Gateway:
    return Gateway(await start_gateway(demo_config(root, delay_ms, **config)), root)


@pytest.fixture
async def gw(tmp_path: Path) -> Any:
    gateway = await start_real_gateway(tmp_path)
    yield gateway
    await gateway.client.close()


async def chat(gw: Gateway, stdin: str, **kw: Any) -> tuple[int, str]:
    return await piped_chat(gw.url, stdin, **kw)


async def relayed(master: Master, type_: str, turns: int = 1) -> list[dict[str, Any]]:
    """The payloads of ``type_`` a watcher got, read up to the end of the session's ``turns``-th
    turn (what the chat sent for a turn is relayed before that turn ends)."""
    while master.types().count("session.turn.end") < turns:
        await master.next(timeout=10)
    return [f["payload"] for f in master.frames if f["type"] == type_]


async def drop_chat(gw: Gateway, session_id: str) -> None:
    """Close the chat's WebSocket from the gateway's side (the chat sees its connection lost)."""
    live = gw.sessions[session_id]
    (conn,) = [c for cid, c in live.connections.items() if cid not in gw.watchers]
    await conn.ws.close(code=1001)


async def test_piped_prompt_streams_text_tool_call_and_turn_end(gw: Gateway, caplog):
    watch_sessions(caplog)
    for name in "abcde":
        (gw.root / f"{name}.txt").write_text("x\n")
    rc, out = await chat(gw, "list files\n")
    assert rc == 0
    assert "> list files\n" in out
    assert "I'll list the files in the workspace.\n" in out  # the deltas, streamed into one line
    assert "→ Glob: **/*\n" in out
    assert "← ok (5 lines)" in out
    assert "  a.txt\n  b.txt\n  c.txt\n  … 2 more\n" in out
    assert "The workspace has 5 files" in out
    assert re.search(r"— end_turn · \d+ in / \d+ out tokens · 1 tool call\n", out)
    assert "\x1b[" not in out  # no ANSI when stdout is not a terminal
    # It created the session and deletes it on the way out.
    session = gw.only_session()
    assert session.state == "TERMINATED"
    assert deletions(caplog, session.id) == [("master_request", "master")]


async def test_announces_every_feature_first(gw: Gateway):
    """The chat's session.capabilities comes first and announces every feature: the connection
    gets every feature the agent offers."""
    pipe, out = Pipe(), io.StringIO()
    task = asyncio.create_task(
        run_chat(gw.url, agent="demo", stdin=pipe.reader, stdout=out, interactive=True)
    )
    try:
        await eventually(lambda: "Ctrl-D quits" in out.getvalue(), "the chat's prompt")
        live = gw.only_session()
        (conn,) = live.connections.values()
        await eventually(lambda: conn.filter.announced != F.Features(), "the chat's capabilities")
        offered = live.machine.config.features
        assert conn.filter.announced == agreed_features(ALL_FEATURES, offered)
    finally:
        pipe.close()
    assert await asyncio.wait_for(task, 10) == 0
    pipe.reader.close()


async def test_several_prompts_run_one_after_the_other(gw: Gateway):
    rc, out = await chat(gw, "one\nlist files\n\n")
    assert rc == 0
    assert out.index("> one") < out.index("Hello! I am") < out.index("> list files")
    assert out.index("> list files") < out.index("→ Glob")
    assert out.count("— end_turn") == 2
    assert "PROMPT_IN_PROGRESS" not in out


async def test_real_server_write_asks_permission_and_yes_allows_it(gw: Gateway):
    sid = (await create_session(gw.client))["session_id"]
    watcher = await gw.watcher(sid)
    rc, out = await chat(gw, "write hello.txt\n", agent=None, session_id=sid, auto_answer="allow")
    assert rc == 0, out
    assert "→ Write: " in out and "hello.txt" in out
    assert "? [y/N] y (--yes)\n" in out
    assert (gw.root / "hello.txt").exists()
    assert "— end_turn" in out
    (answer,) = await relayed(watcher, "control.interaction.response")
    assert answer["selected_value"] == "allow"


async def test_real_server_write_denied_with_no(gw: Gateway):
    sid = (await create_session(gw.client))["session_id"]
    watcher = await gw.watcher(sid)
    rc, out = await chat(gw, "write hello.txt\n", agent=None, session_id=sid, auto_answer="deny")
    assert rc == 0, out
    assert "? [y/N] n (--no)\n" in out
    assert "← error" in out
    assert not (gw.root / "hello.txt").exists()
    (answer,) = await relayed(watcher, "control.interaction.response")
    assert answer["selected_value"] == "deny"


async def test_permission_without_a_terminal_or_default_is_denied(gw: Gateway):
    _, out = await chat(gw, "write hello.txt\n")
    assert "not a terminal" in out
    assert not (gw.root / "hello.txt").exists()


async def test_slash_commands(gw: Gateway):
    sid = (await create_session(gw.client))["session_id"]
    watcher = await gw.watcher(sid)
    stdin = "/plan\n/compact keep the tests\n/cost\nhi\n/quit\nnever sent\n"
    rc, out = await chat(gw, stdin, agent=None, session_id=sid)
    assert rc == 0
    assert await relayed(watcher, "control.mode.switch", turns=3) == [{"mode": "plan"}]
    assert await relayed(watcher, "control.session.compact", turns=3) == [
        {"instruction": "keep the tests"}
    ]
    prompts = await relayed(watcher, "control.prompt.request", turns=3)
    assert [(p["prompt_text"], p.get("input_type")) for p in prompts] == [
        ("/cost", "slash_command"),
        ("hi", None),
    ]
    assert "mode: plan" in out
    assert re.search(r"compacted \(requested\): [\d,]+ → [\d,]+ tokens", out)
    assert "never sent" not in out


async def test_a_plan_is_labelled_once_in_its_turn(gw: Gateway):
    _, out = await chat(gw, "/plan\nlist files\n")
    assert "mode: plan" in out
    assert out.count("plan:") == 1  # one plan, labelled once in its turn


async def test_a_diff_shows_what_changed(gw: Gateway):
    """The changed lines, not the ---/+++/@@ headers followed by "… N more"."""
    (gw.root / "a.py").write_text("def f():\n    return 1\n")
    _, out = await chat(gw, 'write a.py "def f(): return 2"\n', auto_answer="allow")
    assert "← ok (+1 -2)" in out
    assert "  -def f():\n  -    return 1\n  +def f(): return 2\n" in out
    assert "@@" not in out and "+++" not in out
    (gw.root / "a.py").write_text("def f():\n    return 1\n")
    _, out = await chat(gw, 'write a.py "def f(): return 2"\n', auto_answer="allow", color=True)
    assert "  \x1b[31m-    return 1\x1b[0m\n  \x1b[32m+def f(): return 2\x1b[0m\n" in out


async def test_a_long_diff_keeps_its_first_and_last_changes(gw: Gateway):
    (gw.root / "long.txt").write_text("".join(f"old {i}\n" for i in range(20)))
    _, out = await chat(gw, 'write long.txt "new"\n', auto_answer="allow")
    assert "← ok (+1 -20)" in out
    assert "  -old 0\n" in out and "  -old 19\n  +new\n" in out  # the ends stay
    assert "  … 9 more\n" in out


def test_diff_colours_and_files():
    from gateway.chat.render import diff_preview

    two_files = ["--- a/x", "+++ b/x", "@@ -1 +1 @@", "-a", "+b", "--- a/y", "+++ b/y", "+c"]
    assert diff_preview(two_files) == (2, 1, ["x:", "-a", "+b", "y:", "+c"])
    # a removed line that starts with "-- " is a change, not a header
    assert diff_preview(["@@ -1 +1 @@", "--- old", "+new"]) == (1, 1, ["--- old", "+new"])
    assert diff_preview(["just text"]) is None


async def test_help_lists_only_the_agent_commands_this_client_passes_on(fake: FakeGateway):
    """/review and /compact are this client's own (mode switch, compaction): not listed again as
    agent commands (the demo agent publishes only /compact: the scripted gateway)."""
    _, out = await fake_chat(fake, "/help\n")
    assert "agent commands: /cost\n" in out


async def test_thinking_is_labelled_without_a_terminal(gw: Gateway):
    _, out = await chat(gw, "think about it\n")
    assert "thinking:\nThe user wrote: think about it." in out  # labelled, as a plan is


async def test_a_file_that_arrived_is_shown_with_where_to_get_it(gw: Gateway):
    """agent.file.transfer: the file's name, type and size, and its URL on the gateway; the
    binary_ref result says how many bytes, not the reference's JSON."""
    (gw.root / "dot.png").write_bytes(PNG)
    _, out = await chat(gw, "read dot.png\n")
    sid = gw.only_session().id
    path = gw.root.resolve() / "dot.png"
    assert f"→ Read: {path}\n⇩ file dot.png (image/png, {len(PNG)} bytes): " in out
    assert f"{gw.url}/v1/session/{sid}/files/" in out
    assert f"← ok (1 file, {len(PNG)} bytes)\ndot.png is a 4x3 image/png image.\n" in out


async def test_ansi_styles_only_when_asked_for(gw: Gateway):
    _, out = await chat(gw, "think, then list files\n", color=True)
    assert "\x1b[36mthinking:\x1b[0m\n\x1b[2mThe \x1b[0m" in out  # labelled, then dimmed
    assert "\x1b[36m→ Glob: **/*\x1b[0m" in out


async def test_keep_leaves_the_session(gw: Gateway):
    rc, out = await chat(gw, "hi\n", keep=True)
    session = gw.only_session()
    assert rc == 0 and session.state != "TERMINATED"
    assert f"session {session.id} kept" in out


async def test_a_failed_mcp_server_is_said_once_and_listed_without_its_secret(gw: Gateway):
    """A master's MCP server on a demo session (the demo agent takes none: failed, and why):
    one line however many catalogs come, ``/mcp`` lists it, its env value is never shown."""
    secret = "chat-mcp-secret-51c2"
    server = {"name": "docs", "command": ["docs-mcp", secret], "env": {"KEY": secret}}
    sid = (await create_session(gw.client, mcp_servers=[server]))["session_id"]
    rc, out = await chat(gw, "hi\n/mcp\nhi again\n", agent=None, session_id=sid)
    assert rc == 0, out
    failed = "✗ MCP server docs failed: the agent does not take stdio servers"
    assert out.count(failed + "\n") == 1, out
    assert "  docs failed: the agent does not take stdio servers · stdio, from request\n" in out
    assert secret not in out


async def test_attach_to_an_existing_session_never_deletes_it(gw: Gateway):
    sid = (await create_session(gw.client))["session_id"]
    rc, out = await chat(gw, "hi\n", agent=None, session_id=sid)
    assert rc == 0 and "Hello! I am the RAWP demo agent" in out
    assert gw.sessions[sid].state != "TERMINATED"


async def test_a_refused_websocket_upgrade_is_a_gateway_error(gw: Gateway):
    async with GatewayClient(gw.url) as client:
        with pytest.raises(GatewayError) as gone:
            await client.attach("00000000-0000-4000-8000-000000000000")
    assert (gone.value.status, gone.value.error_code) == (404, "SESSION_NOT_FOUND")


async def test_errors_from_the_control_plane_are_reported(gw: Gateway):
    rc, out = await chat(gw, "hi\n", agent="nope")
    assert rc == 1
    assert "AGENT_NOT_FOUND" in out


async def test_bearer_token(tmp_path: Path):
    gw = await start_real_gateway(tmp_path, token=TOKEN)
    try:
        rc, out = await chat(gw, "hi\n")
        assert rc == 1 and "UNAUTHORIZED" in out
        rc, out = await chat(gw, "hi\n", token=TOKEN)
        assert rc == 0 and "Hello! I am the RAWP demo agent" in out
    finally:
        await gw.client.close()


async def test_session_deleted_elsewhere_ends_the_chat(gw: Gateway):
    out = io.StringIO()
    pipe = Pipe()
    task = asyncio.create_task(run_chat(gw.url, agent="demo", stdin=pipe.reader, stdout=out))
    try:
        await eventually(
            lambda: gw.sessions and gw.only_session().connections, "the chat to attach"
        )
        assert (await gw.client.delete(f"/v1/session/{gw.only_session().id}")).status == 200
        rc = await asyncio.wait_for(task, 10)
    finally:
        pipe.close()
    pipe.reader.close()
    assert rc == 1
    assert (
        "session ended: a master deleted it (DELETE /v1/session) (master_request, deleted_by: master)"
        in out.getvalue()
    )


REATTACHED = re.compile(r"\(reattached(; \d+ missed frames follow)?\)\n")


@pytest.mark.parametrize("agent_silent", [False, True], ids=["agent-streaming", "agent-silent"])
async def test_DPS_7_8_reattach_after_the_connection_drops(tmp_path: Path, agent_silent: bool):
    """DPS-7.8-finalize then DPS-7.8-unfinalize end to end: the connection is lost mid-turn; the
    chat shows what it had as cancelled, reattaches with the last id it got, and the history
    (with the frames it missed, or none when the agent said nothing in the meantime) brings the
    turn back; its real end follows, and the next prompt waits for it. ``agent_silent``: the agent
    (stopped, as a loaded machine can starve it) prints nothing between the drop and the reattach:
    then, but for lines already in flight, nothing was missed, and the chat says "(reattached)"
    alone (what made this test fail now and then on a loaded machine: it wanted missed frames)."""
    gw = await start_real_gateway(tmp_path, delay_ms=40)
    try:
        sid = (await create_session(gw.client))["session_id"]
        watcher = await gw.watcher(sid)
        out = io.StringIO()
        stdin = io.StringIO("tell me about the weather today\nafter\n")
        chatting = asyncio.create_task(
            run_chat(
                gw.url,
                agent=None,
                session_id=sid,
                stdin=stdin,
                stdout=out,
                reattach_delays=(0.05, 0.2),
            )
        )
        await watcher.until("agent.text.delta")
        live = gw.sessions[sid]
        pid = live.process.pid
        if agent_silent:
            os.kill(pid, signal.SIGSTOP)
        try:
            await drop_chat(gw, sid)
            if agent_silent:
                await eventually(lambda: len(live.connections) == 2, "the chat reattached")
        finally:
            if agent_silent:
                os.kill(pid, signal.SIGCONT)
        rc = await asyncio.wait_for(chatting, 30)
        text = out.getvalue()
    finally:
        await gw.client.close()
    assert rc == 0, text
    assert "connection lost; reattaching…" in text
    # Missed frames or none: the silent agent's last lines may still have been in flight.
    (reattached,) = REATTACHED.finditer(text)
    assert "frames are missing" not in text and "frames lost" not in text  # not truncated
    assert text.count("— end_turn") == 2  # the real end of the first turn, then the second's
    assert reattached.start() < text.index("— end_turn") < text.index("> after")


# --------------------------------------------------------------------------- interactive


async def run_interactive(
    gw: Gateway, script: Callable[[Pipe, io.StringIO], Any], **kw: Any
) -> tuple[int, str]:
    pipe, out = Pipe(), io.StringIO()
    kw.setdefault("agent", "demo")
    task = asyncio.create_task(
        run_chat(gw.url, stdin=pipe.reader, stdout=out, interactive=True, **kw)
    )
    try:
        # The chat is ready (and its SIGINT handler installed) once it prints its help line;
        # a SIGINT before that would interrupt the test run itself.
        await shown(out, "Ctrl-D quits")
        await asyncio.wait_for(script(pipe, out), 20)
    finally:
        pipe.close()
    rc = await asyncio.wait_for(task, 20)
    pipe.reader.close()
    return rc, out.getvalue()


async def test_permission_asked_at_the_keyboard(gw: Gateway):
    async def script(pipe: Pipe, out: io.StringIO) -> None:
        pipe.type("write hello.txt")
        await shown(out, "? [y/N] ")
        pipe.type("y")
        await shown(out, "— end_turn")

    rc, out = await run_interactive(gw, script)
    assert rc == 0
    # The file's path, cut to the chat's call width when pytest's temporary directory is deep
    # (a pytest-xdist worker's is).
    asked = re.search(r"Allow Write: (.+?)\? \[y/N\] ", out)
    assert asked is not None, out
    assert str(gw.root / "hello.txt").startswith(asked[1].removesuffix("…")), asked[1]
    assert (gw.root / "hello.txt").exists()
    assert "Done: I wrote hello.txt." in out


async def test_DPS_7_8_a_question_withdrawn_by_a_drop_is_asked_again_after_reattach(gw: Gateway):
    """DPS-7.8-finalize drops the pending question; DPS-7.8-unfinalize brings it back."""
    sid = (await create_session(gw.client))["session_id"]
    watcher = await gw.watcher(sid)

    async def script(pipe: Pipe, out: io.StringIO) -> None:
        pipe.type("write hello.txt")
        await shown(out, "? [y/N] ")
        await drop_chat(gw, sid)
        await shown(out, "? [y/N] ", times=2)  # asked again after the reattach
        pipe.type("y")
        await shown(out, "— end_turn")

    rc, out = await run_interactive(gw, script, agent=None, session_id=sid)
    assert rc == 0, out
    assert out.count("? [y/N] ") == 2
    assert "(question withdrawn)" in out
    assert out.index("(question withdrawn)") < out.index("(reattached")
    (answer,) = await relayed(watcher, "control.interaction.response")  # once, after the reattach
    assert answer["selected_value"] == "allow"
    assert (gw.root / "hello.txt").exists()


async def test_a_second_master_sees_the_relayed_prompt_and_the_question_withdrawn(gw: Gateway):
    """DPS-2.4-relay seen from a master: another master's prompt and answer reach this chat."""
    sid = (await create_session(gw.client))["session_id"]
    watcher = await gw.watcher(sid)

    async def script(pipe: Pipe, out: io.StringIO) -> None:
        # Another master prompts and allows, while this chat waits at its prompt.
        rc, _ = await chat(gw, "write hello.txt\n", agent=None, session_id=sid, auto_answer="allow")
        assert rc == 0
        await shown(out, "— end_turn")

    rc, out = await run_interactive(gw, script, agent=None, session_id=sid)
    assert rc == 0, out
    assert "» admin: write hello.txt\n" in out  # who sent it: the token's holder
    assert "? [y/N] " in out
    assert "(question withdrawn)" in out  # answered by the other master
    assert "Done: I wrote hello.txt." in out
    (answer,) = await relayed(
        watcher, "control.interaction.response"
    )  # this chat did not answer too
    assert answer["selected_value"] == "allow"


async def test_ctrl_c_during_a_turn_cancels_it(tmp_path: Path):
    gw = await start_real_gateway(tmp_path, delay_ms=200)

    async def script(pipe: Pipe, out: io.StringIO) -> None:
        pipe.type("tell me about the weather")
        await shown(out, "Hello!")  # the turn streams
        os.kill(os.getpid(), signal.SIGINT)
        await shown(out, "— cancelled")

    try:
        rc, out = await run_interactive(gw, script, handle_sigint=True)
        session = gw.only_session()
    finally:
        await gw.client.close()
    assert rc == 0
    assert "^C cancelling the turn" in out
    assert "(cancelled)" in out
    assert session.state == "TERMINATED"  # deleted on the way out


async def test_ctrl_c_at_the_prompt_quits(gw: Gateway, caplog):
    watch_sessions(caplog)

    async def script(pipe: Pipe, out: io.StringIO) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        await eventually(lambda: gw.only_session().state == "TERMINATED", "the chat to quit")

    rc, out = await run_interactive(gw, script, handle_sigint=True)
    assert rc == 0
    assert "— end_turn" not in out  # nothing was prompted
    assert deletions(caplog, gw.only_session().id) == [("master_request", "master")]


async def test_real_server_list_files_streams_text_and_a_glob_call(gw: Gateway, tmp_path):
    (tmp_path / "notes.md").write_text("hi\n")
    rc, out = await chat(gw, "list files\n")
    assert rc == 0, out
    assert "> list files\n" in out
    assert "→ Glob: " in out
    assert "← ok (1 line)" in out and "  notes.md\n" in out
    assert "— end_turn · " in out and " out tokens" in out


async def test_real_server_plan_mode_blocks_a_write(gw: Gateway, tmp_path):
    rc, out = await chat(gw, "/plan\nwrite x.txt\n", auto_answer="allow")
    assert rc == 0, out
    assert "mode: plan" in out
    assert "Tool not allowed in current mode" in out
    assert not (tmp_path / "x.txt").exists()


async def test_real_server_DPS_7_8_reattach_unfinalizes_from_the_gateway_history(tmp_path):
    """DPS-7.8-finalize/-unfinalize with the real gateway's buffer: drop mid-turn, reattach."""
    gw = await start_real_gateway(tmp_path, delay_ms=30)
    url = gw.url
    try:
        async with GatewayClient(url) as client:
            session = await client.create_session("demo")
            sid = session["session_id"]
            conn = await client.attach(session)
            view = MasterView(sid)
            await conn.prompt("say hello to everyone in the room")
            while True:  # the turn is under way: some text has streamed
                frame = await asyncio.wait_for(conn.receive(), 10)
                assert frame is not None
                view.apply(frame)
                if isinstance(frame.payload, F.TextDelta):
                    break
            await conn.close()
            synthetic = view.finalize()
            assert {f.TYPE for f in synthetic} >= {"agent.text.done", "session.turn.end"}
            # The turn goes on in the gateway, buffered: wait for a frame the master missed.
            history = gw.sessions[sid].buffer
            await eventually(
                lambda: history.since(conn.last_message_id).frames, "a frame after the drop"
            )

            again = await client.attach(sid, last_message_id=conn.last_message_id)
            outcome = None
            while view.turn_id is not None or outcome is None:
                frame = await asyncio.wait_for(again.receive(), 10)
                assert frame is not None
                if isinstance(frame.payload, F.History):
                    assert outcome is None, "one history, first"
                    outcome = view.history(frame.payload)
                    assert outcome.unfinalized and outcome.applied
                else:
                    assert outcome is not None or isinstance(
                        frame.payload,
                        F.Capabilities,
                    )
                    view.apply(frame)
            await again.close()
            await client.delete_session(sid)
    finally:
        await gw.client.close()
    assert not any(is_synthetic(f) for f in view.transcript)
    ends = [f.payload for f in view.transcript if isinstance(f.payload, F.TurnEnd)]
    assert [e.stop_reason for e in ends] == ["end_turn"]
    deltas = [f.payload.text for f in view.transcript if isinstance(f.payload, F.TextDelta)]
    (done,) = [f.payload for f in view.transcript if isinstance(f.payload, F.TextDone)]
    assert "".join(deltas) == done.full_text  # nothing lost, nothing twice


async def test_real_server_chat_on_an_existing_session_shows_the_conversation_so_far(
    gw: Gateway, tmp_path
):
    """``chat --session`` attaches with ?history=all: the earlier prompt, tool call and answer are
    shown before anything new, with no "incomplete" notice."""
    (tmp_path / "notes.md").write_text("hi\n")
    rc, out = await chat(gw, "list files\n", keep=True)
    assert rc == 0, out
    match = re.search(r"session (\S+) kept", out)
    assert match, out
    rc, out = await chat(gw, "", agent=None, session_id=match.group(1))
    assert rc == 0, out
    assert "(the conversation so far: " in out
    assert "» admin: list files\n" in out  # the earlier prompt, as another master's
    assert "→ Glob: " in out and "  notes.md\n" in out and "— end_turn · " in out
    assert "incomplete" not in out and "no longer has" not in out


async def test_client_full_history_on_first_attach(gw: Gateway):
    """``GatewayClient.attach(full_history=True)``: the joined ``session.history`` holds the
    session's turn, complete; with a ``last_message_id`` too it is refused before connecting."""
    async with GatewayClient(gw.url) as client:
        sid = str((await client.create_session("demo"))["session_id"])
        first = await client.attach(sid)
        await first.prompt("hello")
        async for frame in first:
            if frame.TYPE == "session.turn.end":
                break
        with pytest.raises(ValueError):
            await client.attach(sid, last_message_id="x", full_history=True)
        conn = await client.attach(sid, full_history=True)
        caps = await conn.receive()
        assert caps is not None and caps.TYPE == "session.capabilities"
        history = await conn.receive()
        assert history is not None and isinstance(history.payload, F.History)
        view = MasterView(sid)
        outcome = view.history(history.payload)
        assert outcome.unfinalized and outcome.lost_frame_count == 0
        types = [f.TYPE for f in outcome.applied]
        assert "control.prompt.request" in types
        assert types.index("session.turn.start") < types.index("session.turn.end")
        assert conn.last_message_id == history.payload.last_message_id
        await first.close()
        await conn.close()


async def test_demo_command_runs_a_server_and_the_chat(tmp_path):
    pytest.importorskip("gateway.server")
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--workspace-root")
    add_chat_arguments(parser, with_url=False)
    args = parser.parse_args(["--workspace-root", str(tmp_path), "--yes"])
    out = io.StringIO()
    rc = await asyncio.wait_for(
        run_demo_async(args, stdin=io.StringIO("write hello.txt\n"), stdout=out), 30
    )
    assert rc == 0, out.getvalue()
    assert "rawp-gateway demo: server http://127.0.0.1:" in out.getvalue()
    # The console opens on the terminal's session; the try: line names what the demo does.
    session = re.search(r"^session (\S+) · agent demo", out.getvalue(), re.M)
    assert session, out.getvalue()
    # It carries the demo's token once (the page keeps it and takes it out of its address).
    console = rf"^browser console: http://127\.0\.0\.1:\d+/ui#session={session.group(1)}&token=[\w-]{{43}}$"
    assert re.search(console, out.getvalue(), re.M)
    tried = re.search(r"^try: (.*)$", out.getvalue(), re.M)
    assert tried and "read hello.txt" in tried.group(1) and "/attach PATH" in tried.group(1)
    assert "[y/N] y (--yes)" in out.getvalue()
    assert (tmp_path / "hello.txt").exists()


async def test_demo_ui_serves_the_browser_console_until_stopped(tmp_path):
    from tests.support.chat import demo_ui_args

    args = demo_ui_args(tmp_path)
    out = io.StringIO()
    demo = asyncio.create_task(run_demo_async(args, stdin=io.StringIO(""), stdout=out))
    try:
        found = await eventually(
            lambda: re.search(
                r"^browser console: (http://\S+/ui)#token=\S+ ", out.getvalue(), re.M
            ),
            "the console's URL",
        )
        async with aiohttp.ClientSession() as http, http.get(found.group(1)) as resp:
            assert resp.status == 200
            assert "<title>rawp-gateway console</title>" in await resp.text()
        assert not demo.done()  # no chat ran and ended it: the server stays up
    finally:
        demo.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await demo


# --------------------------------------------------------------------------- pieces


def test_describe_call_picks_the_telling_input():
    assert describe_call("Bash", {"command": "ls -la", "description": "list"}) == "Bash: ls -la"
    assert describe_call("Read", {"file_path": "/w/a.py"}) == "Read: /w/a.py"
    assert describe_call("Glob", {"pattern": "**/*.py"}) == "Glob: **/*.py"
    assert describe_call("TodoWrite", {}) == "TodoWrite"
    assert describe_call("mcp__x", {"n": 1}) == 'mcp__x: {"n": 1}'
    assert describe_call("Bash", {"command": "x" * 200}).endswith("…")


def test_summarize_result():
    def res(**kw: Any) -> F.InvokeResult:
        base = {
            "invocation_id": "i",
            "tool_name": "T",
            "status": "success",
            "output": "",
            "output_type": "text",
        }
        return F.InvokeResult(**{**base, **kw})

    assert summarize_result(res()) == ("ok", [])
    assert summarize_result(res(output="one\n")) == ("ok (1 line)", ["one"])
    assert summarize_result(res(output=["a", "b"], truncated=True)) == (
        "ok (2 lines, truncated)",
        ["a", "b"],
    )
    assert summarize_result(res(status="cancelled", output="Connection lost")) == (
        "cancelled: Connection lost",
        [],
    )
    assert summarize_result(res(output={"k": 1}, duration_ms=5)) == (
        "ok (1 line) 5 ms",
        ['{"k": 1}'],
    )


def ask(kind: str, *values: str, default: str | None = None) -> F.InteractionRequest:
    return F.InteractionRequest(
        interaction_id="i",
        interaction_type=kind,
        question_text="?",
        timeout_sec=60,
        options=[F.InteractionOption(value=v, label=v.title()) for v in values],
        default_value=default,
    )


def test_answer_value_for_each_interaction_type():
    perm = ask("PERMISSION", "allow", "deny")
    assert answer_value(perm, "y", auto=None) == ("allow", None)
    assert answer_value(perm, "", auto=None) == ("deny", None)  # [y/N]: no means no
    assert answer_value(perm, None, auto="allow") == ("allow", None)
    assert answer_value(perm, None, auto=None) == ("deny", None)
    # Options named otherwise: the one that reads as allowing or denying.
    odd = ask("PERMISSION", "allow_once", "reject")
    assert answer_value(odd, "yes", auto=None) == ("allow_once", None)
    assert answer_value(odd, "n", auto=None) == ("reject", None)
    yn = ask("YN", "yes", "no")
    assert answer_value(yn, "Y", auto=None) == ("yes", None)
    assert answer_value(yn, None, auto="deny") == ("no", None)
    pick = ask("SELECT", "red", "green", "blue", default="green")
    assert answer_value(pick, "3", auto=None) == ("blue", None)
    assert answer_value(pick, "red", auto=None) == ("red", None)
    assert answer_value(pick, None, auto=None) == ("green", None)
    assert answer_value(ask("SELECT", "a", "b"), None, auto="allow") == ("a", None)
    assert answer_value(ask("SELECT", "a", "b"), None, auto=None) == (None, None)  # declines
    many = ask("MULTI_SELECT", "a", "b", "c")
    assert answer_value(many, "1, 3", auto=None) == (["a", "c"], None)
    text = ask("TEXT_INPUT", default="main")
    assert answer_value(text, "fix it", auto=None) == ("fix it", "fix it")
    assert answer_value(text, None, auto="allow") == ("main", None)


def test_permission_question_names_the_tool_and_input():
    req = F.InteractionRequest(
        interaction_id="i",
        interaction_type="PERMISSION",
        question_text="May I?",
        timeout_sec=60,
        options=[],
        context=F.InteractionContext(tool_name="Write", tool_input={"file_path": "hello.txt"}),
    )
    assert permission_question(req) == "Allow Write: hello.txt?"
    assert permission_question(msgspec.structs.replace(req, context=None)) == "May I?"


async def test_arguments_parse_and_run(tmp_path):
    import argparse

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    gw = await start_real_gateway(tmp_path, token=TOKEN)
    try:
        parser = argparse.ArgumentParser()
        add_chat_arguments(parser)
        args = parser.parse_args(
            ["--url", gw.url, "--agent", "demo", "--token-file", str(token_file), "--yes"]
        )
        assert args.auto_answer == "allow" and args.keep is False and args.session_id is None
        out = io.StringIO()
        rc = await run_chat_from_args(args, stdin=io.StringIO("write hello.txt\n"), stdout=out)
        assert rc == 0 and "Done: I wrote hello.txt." in out.getvalue()
    finally:
        await gw.client.close()
    with pytest.raises(SystemExit):
        parser.parse_args(["--url", "u", "--yes", "--no"])


async def test_real_server_attach_uploads_a_file_for_the_next_prompt(gw: Gateway, tmp_path):
    """/attach PATH: the file is uploaded to the session and named in the next prompt's
    context_files; the gateway puts it in the workspace under .rawp/uploads/ for the agent."""
    shot = tmp_path / "outside" / "notes.txt"
    shot.parent.mkdir()
    shot.write_text("hi\n")
    rc, out = await chat(gw, f"/attach {shot}\n/attach nope.txt\nlist files\n")
    assert rc == 0, out
    assert "⇧ attached notes.txt (text/plain, 3 bytes): goes with the next prompt\n" in out
    assert "✗ /attach: no file 'nope.txt'\n" in out
    assert (tmp_path / ".rawp" / "uploads" / "notes.txt").read_text() == "hi\n"
    assert "— end_turn" in out


# --------------------------------------------------------------------------- why an agent died


async def chat_with_profile(tmp_path: Any, profile: Any, stdin: str) -> tuple[int, str]:
    """The chat on a real in-process gateway whose only profile is ``profile`` (named "agent")."""
    from gateway import config as config_mod

    config = config_mod.Config(
        server=config_mod.ServerSettings(workspace_root=tmp_path.resolve()),
        agents={"agent": profile},
    )
    client = await start_gateway(config)  # its token where the chat finds it
    try:
        return await piped_chat(base_url(client), stdin, agent="agent")
    finally:
        await client.close()


def plain_profile(*command: str, parser: str = "plain") -> Any:
    from gateway.agent.profiles import AgentProfile, parser_features

    return AgentProfile(
        name="agent",
        parser=parser,
        command=command,
        single_turn_process=True,
        features=parser_features(parser),
    )


async def test_a_cli_not_on_path_fails_at_once_saying_so(tmp_path):
    """A single-turn profile whose CLI is not installed: the chat says AGENT_START_FAILED and
    which executable, before any prompt, as for a long-lived agent."""
    rc, out = await chat_with_profile(
        tmp_path, plain_profile("rawp-no-such-cli", "{prompt}"), "hello\n"
    )
    assert rc == 1
    assert out.strip() == (
        "✗ AGENT_START_FAILED: the agent agent could not start: agent executable not found: "
        "'rawp-no-such-cli' (not installed, or not on PATH) (HTTP 502)"
    )


async def test_an_agent_that_dies_shows_its_stderr_and_exit_code(tmp_path):
    """The fatal error's details (the end of stderr) under it; the session ended by the gateway,
    not "by client" as if the user had deleted it."""
    script = "import sys; sys.stderr.write('starting\\nno model configured\\n'); sys.exit(3)"
    rc, out = await chat_with_profile(
        tmp_path, plain_profile(sys.executable, "-c", script, "{prompt}"), "hello\n"
    )
    assert rc == 1
    assert "✗ fatal AGENT_EXIT: the agent process ended with exit code 3\n" in out
    assert "  stderr │ starting\n  stderr │ no model configured\n" in out
    assert (
        "session ended: the gateway ended it after a fatal error, or as it shut down "
        "(error, deleted_by: client)"
    ) in out
    assert "by client" not in out


async def test_an_error_about_credentials_says_where_they_go(tmp_path):
    """A recording of the real Claude Code meeting a 401: the error is followed by the hint
    naming ANTHROPIC_API_KEY (the agent's own words stay as they were). ``cat`` exits without
    reading the prompt on its stdin: the turn ends all the same."""
    fixture = FIXTURES / "claude-code" / "api-error-401.jsonl"
    profile = plain_profile("cat", str(fixture), parser="claude-code")
    _, out = await chat_with_profile(tmp_path, profile, "hello\n")
    assert "✗ error API_ERROR: Failed to authenticate. API Error: 401" in out
    hints = [line.strip() for line in out.splitlines() if line.strip().startswith("hint:")]
    assert len(hints) == 1, out  # the retry's warning before it gives none
    assert "ANTHROPIC_API_KEY" in hints[0] and "~/.claude" in hints[0]


async def test_a_url_without_its_scheme_is_named_as_such():
    """``chat --url localhost:8765``: said to lack http://, not "cannot reach the gateway"."""
    out = io.StringIO()
    rc = await run_chat("localhost:8765", agent="demo", stdin=io.StringIO(""), stdout=out)
    assert rc == 1
    assert out.getvalue() == (
        "✗ the gateway URL 'localhost:8765' has no scheme: try http://localhost:8765\n"
    )
