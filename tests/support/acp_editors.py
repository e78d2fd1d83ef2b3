"""Editors no one here wrote, launching ``rawp-gateway acp`` as a custom agent over stdio: the
official ACP Python SDK (``agent-client-protocol``, its ``spawn_agent_process``) and the official
TypeScript SDK (``@agentclientprotocol/sdk``, driven through ``acp_ts_client.mjs``). Both look the
same to a test (``Editor``): requests in, ``session/update`` params and permission questions out,
the relay's stderr in a file. The scenarios every editor plays (a turn with a permission and a cancel,
the load of a DPS master's session, a viewer refused) are here, whatever carries it to ``/acp``.
And ``CutProxy``, a loopback TCP hop between the relay and the
gateway that a test cuts to drop the connection the hard way, and holds shut while it likes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import AllowedOutcome, ClientCapabilities, DeniedOutcome, RequestPermissionResponse

from tests.support.auth import bearer
from tests.support.gateway_peer import Master, prompt_and_wait
from tests.support.paths import REPO
from tests.support.procs import reap
from tests.support.servers import CLI, free_port
from tests.support.waiting import eventually

TS_SDK_PREFIX = REPO / ".agents" / "acp-sdk"
WS_PREFIX = REPO / ".agents" / "ws"  # the WebSocket the SDK's WebSocket client is given
TS_CLIENT = Path(__file__).with_name("acp_ts_client.mjs")
TURN = 60.0  # a bound on a hang, not a measure


class EditorError(Exception):
    """The JSON-RPC error an editor got for a request."""

    def __init__(self, code: int | None, message: str, data: Any) -> None:
        super().__init__(f"{code}: {message} {data!r}")
        self.code = code
        self.data = data if isinstance(data, dict) else {}


class Editor:
    """What both SDK editors share: what they got, and their questions answered by index."""

    def __init__(self, stderr: Path) -> None:
        self.updates: list[dict[str, Any]] = []  # session/update params, _meta included
        self.questions: list[dict[str, Any]] = []  # session/request_permission params
        self.stderr_path = stderr

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def ids(self, session_id: str) -> list[str]:
        """The gateway frame ids of the updates this editor got for a session, in order."""
        return [
            u["_meta"]["rawp"]["messageId"]
            for u in self.updates
            if u["sessionId"] == session_id and "_meta" in u
        ]

    def text(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        return "".join(
            u["update"]["content"].get("text", "")
            for u in self.updates
            if u["sessionId"] == session_id and u["update"]["sessionUpdate"] == kind
        )

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        raise NotImplementedError

    async def answer(self, n: int, option_id: str | None) -> None:
        raise NotImplementedError


def relay_argv(url: str, agent: str | None = None, token_file: Path | None = None) -> list[str]:
    argv = [*CLI, "acp", "--url", url]
    if agent:
        argv += ["--agent", agent]
    if token_file:
        argv += ["--token-file", str(token_file)]
    return argv


def relay_env(token: str | None = None) -> dict[str, str]:
    """The relay's environment: this one's (the package is importable from it), a token maybe."""
    env = {k: v for k, v in os.environ.items() if k != "RAWP_GATEWAY_TOKEN"}
    if token:
        env["RAWP_GATEWAY_TOKEN"] = token
    return env


# --- the Python SDK ------------------------------------------------------------------------------


class _PyClient:
    """The client side the Python SDK calls."""

    def __init__(self, editor: PyEditor) -> None:
        self.editor = editor

    async def session_update(self, session_id: str, update: Any, **meta: Any) -> None:
        params: dict[str, Any] = {
            "sessionId": session_id,
            "update": update.model_dump(by_alias=True, exclude_none=True),
        }
        if meta:
            params["_meta"] = meta
        self.editor.updates.append(params)

    async def request_permission(self, session_id, tool_call, options, **meta):
        answer: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.editor.questions.append(
            {
                "sessionId": session_id,
                "toolCall": tool_call.model_dump(by_alias=True, exclude_none=True),
                "options": [o.model_dump(by_alias=True) for o in options],
                "_meta": meta,
            }
        )
        self.editor.answers.append(answer)
        option = await answer
        if option is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option)
        )


class PyEditor(Editor):
    """An editor built on the Python SDK's typed client connection."""

    def __init__(self, stderr: Path) -> None:
        super().__init__(stderr)
        self.answers: list[asyncio.Future[str | None]] = []
        self.conn: Any = None

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        conn = self.conn
        try:
            if method == "initialize":
                result = await conn.initialize(
                    protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
                )
            elif method == "session/new":
                result = await conn.new_session(cwd=params["cwd"])
            elif method == "session/load":
                result = await conn.load_session(cwd=params["cwd"], session_id=params["sessionId"])
            elif method == "session/list":
                result = await conn.list_sessions()
            elif method == "session/prompt":
                blocks = [text_block(b["text"]) for b in params["prompt"]]
                result = await conn.prompt(session_id=params["sessionId"], prompt=blocks)
            else:
                raise ValueError(method)
        except RequestError as err:
            raise EditorError(err.code, str(err), err.data) from None
        return result.model_dump(by_alias=True, exclude_none=True) if result is not None else {}

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        assert method == "session/cancel"
        await self.conn.cancel(session_id=params["sessionId"])

    async def answer(self, n: int, option_id: str | None) -> None:
        self.answers[n].set_result(option_id)


RELAY_EXIT_SEC = 20.0


@contextlib.asynccontextmanager
async def python_editor(argv: list[str], env: dict[str, str], tmp: Path) -> AsyncIterator[PyEditor]:
    stderr = tmp / f"relay-stderr-{free_port()}.txt"
    editor = PyEditor(stderr)
    with stderr.open("wb") as err:
        async with spawn_agent_process(
            _PyClient(editor),
            argv[0],
            *argv[1:],
            env=env,
            # The relay exits on its own once its stdin ends; the SDK waits 2 s for that, then
            # terminates it, and its terminate raises ProcessLookupError when the exit lands in
            # between (seen under a loaded suite). The relay's exit is what is waited for.
            transport_kwargs={"stderr": err.fileno(), "shutdown_timeout": RELAY_EXIT_SEC},
        ) as (conn, _proc):
            editor.conn = conn
            yield editor


# --- the TypeScript SDK ------------------------------------------------------------------------


def node_ready() -> str | None:
    """Why the TypeScript editor cannot run here (None: it can)."""
    if shutil.which("node") is None:
        return "node not found"
    if not (TS_SDK_PREFIX / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
        return "the ACP TypeScript SDK is not installed (scripts/install-agents.sh)"
    if not (WS_PREFIX / "node_modules" / "ws").is_dir():
        return "the ws package is not installed (scripts/install-agents.sh)"
    return None


class TsEditor(Editor):
    """An editor built on the TypeScript SDK, in a Node process driven over its stdio."""

    def __init__(self, stderr: Path, proc: asyncio.subprocess.Process) -> None:
        super().__init__(stderr)
        self.proc = proc
        self.replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ready = asyncio.Event()
        self._n = 0

    async def _send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        await self.proc.stdin.drain()

    async def read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            event = json.loads(line)
            if "reply" in event:
                self.replies.pop(event["reply"]).set_result(event)
            elif event.get("event") == "update":
                self.updates.append(event["params"])
            elif event.get("event") == "question":
                self.questions.append(event["params"])
            elif event.get("event") == "ready":
                self.ready.set()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._n += 1
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.replies[self._n] = reply
        await self._send({"op": "request", "n": self._n, "method": method, "params": params})
        got = await reply
        if "error" in got:
            e = got["error"]
            raise EditorError(e.get("code"), e.get("message", ""), e.get("data"))
        return got["result"] or {}

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._send({"op": "notify", "method": method, "params": params})

    async def answer(self, n: int, option_id: str | None) -> None:
        await self._send({"op": "answer", "n": n, "optionId": option_id})


@contextlib.asynccontextmanager
async def ts_editor(argv: list[str], env: dict[str, str], tmp: Path) -> AsyncIterator[TsEditor]:
    stderr = tmp / f"relay-stderr-{free_port()}.txt"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            "node",
            str(TS_CLIENT),
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            env={**env, "ACP_SDK_PREFIX": str(TS_SDK_PREFIX), "ACP_WS_PREFIX": str(WS_PREFIX)},
        )
        editor = TsEditor(stderr, proc)
        reader = asyncio.create_task(editor.read())
        try:
            await asyncio.wait_for(editor.ready.wait(), 30)
            yield editor
        finally:
            with contextlib.suppress(Exception):
                await editor._send({"op": "exit"})
            await reap(proc)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


# --- what every editor plays -------------------------------------------------------------------


def prompt(session_id: str, text: str) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}


async def asked(ed: Editor, n: int) -> dict[str, Any]:
    await eventually(lambda: len(ed.questions) > n, f"permission question {n}", TURN)
    return ed.questions[n]


async def a_turn_with_a_permission_then_a_cancel(ed: Editor, cwd: Path) -> str:
    """A new session's turn writes a file once allowed; a second turn, cancelled while it waits
    for its permission, writes nothing. The session's id."""
    sid = (await ed.request("session/new", {"cwd": str(cwd)}))["sessionId"]
    turn = asyncio.ensure_future(ed.request("session/prompt", prompt(sid, "write relay.txt")))
    question = await asked(ed, 0)
    assert question["sessionId"] == sid
    assert {o["optionId"] for o in question["options"]} >= {"allow", "deny"}
    # The toolCall is an update of the call: it keeps the call's own title; the question's words
    # are in _meta.rawp.question.
    [call] = [u["update"] for u in ed.updates if u["update"]["sessionUpdate"] == "tool_call"]
    assert question["toolCall"]["toolCallId"] == call["toolCallId"]
    assert question["toolCall"]["title"] == call["title"]
    assert question["_meta"]["rawp"]["question"] == f"Allow {call['title']}?"
    await ed.answer(0, "allow")
    done = await asyncio.wait_for(turn, TURN)
    assert done["stopReason"] == "end_turn"
    assert (cwd / "relay.txt").exists()
    assert ed.text(sid)
    kinds = [u["update"]["sessionUpdate"] for u in ed.updates if u["sessionId"] == sid]
    assert "tool_call" in kinds and "tool_call_update" in kinds
    turn = asyncio.ensure_future(ed.request("session/prompt", prompt(sid, "write never.txt")))
    await asked(ed, 1)
    await ed.notify("session/cancel", {"sessionId": sid})
    await ed.answer(1, None)
    done = await asyncio.wait_for(turn, TURN)
    assert done["stopReason"] == "cancelled"
    assert not (cwd / "never.txt").exists()
    return sid


async def a_dps_masters_session(gw: Any, token: str) -> tuple[str, Master]:
    """A demo session made over HTTP with a DPS master on it that ran a turn: its id, the master."""
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer(token))
    sid = (await resp.json())["session_id"]
    master = await Master.attach(gw, sid, headers=bearer(token))
    await prompt_and_wait(master, "hello from the phone", timeout=TURN)
    return sid, master


async def load_it_and_prompt_across(ed: Editor, sid: str, master: Master, cwd: Path) -> None:
    """The editor lists and loads the master's session (its history replayed), and its prompt
    reaches the DPS master with who sent it."""
    listed = await ed.request("session/list", {})
    assert sid in {s["sessionId"] for s in listed["sessions"]}
    await ed.request("session/load", {"sessionId": sid, "cwd": str(cwd)})
    assert "hello from the phone" in ed.text(sid, "user_message_chunk")
    assert ed.text(sid)  # the demo agent's answer, replayed
    turn = asyncio.ensure_future(ed.request("session/prompt", prompt(sid, "hello again")))
    relayed = await master.until("control.prompt.request", timeout=TURN)
    assert relayed["payload"]["prompt_text"] == "hello again"
    assert relayed["metadata"]["rawp_user"] == "alice"
    assert (await asyncio.wait_for(turn, TURN))["stopReason"] == "end_turn"


async def shared_with_a_viewer(gw: Any, token: str, viewer: str) -> str:
    """A demo session made with ``token``, shared with the user ``viewer`` as a viewer: its id."""
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer(token))
    sid = (await resp.json())["session_id"]
    members = {"members": {viewer: "viewer"}}
    await gw.patch(f"/v1/session/{sid}", json=members, headers=bearer(token))
    return sid


async def a_viewer_loads_but_may_not_prompt(ed: Editor, sid: str, cwd: Path) -> None:
    """``ed``'s user is a viewer of ``sid``: no session/new, a load, no prompt."""
    with pytest.raises(EditorError) as refused:
        await ed.request("session/new", {"cwd": str(cwd)})
    assert refused.value.data["error_code"] == "FORBIDDEN"
    await ed.request("session/load", {"sessionId": sid, "cwd": str(cwd)})
    with pytest.raises(EditorError) as refused:
        await ed.request("session/prompt", prompt(sid, "may I?"))
    assert refused.value.data["error_code"] == "FORBIDDEN"


# --- a connection a test can cut ---------------------------------------------------------------


class CutProxy:
    """Loopback TCP from ``port`` to ``target``: ``cut()`` aborts every connection through it (a
    network drop, no close frame), ``shut`` refuses new ones until ``open()``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.shut = False
        self.accepted = 0
        self._links: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self, *, shut: bool = False) -> None:
        self.shut = shut
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()

    def open(self) -> None:
        self.shut = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.shut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        self._links |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._links -= {writer, up_writer}
