"""Test utilities: a real gateway server in-process and a real WebSocket master talking to it.

``gateway(tmp_path, ...)`` runs ``create_app`` on an aiohttp test server; ``Master`` is a thin
master over aiohttp's WebSocket client that announces its features and collects frames as dicts.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import (
    AcpSettings,
    Config,
    NotifySettings,
    PolicySettings,
    ServerSettings,
    builtin_profiles,
    with_made_token,
)
from gateway.local_token import forget_token, token_path, write_token
from gateway.protocol.capabilities import ALL_FEATURES
from gateway.server import create_app
from gateway.server.refusals import JsonErrorRunner

SUBPROTOCOL = "rawp-dps-1.0"
# A WebSocket upgrade sent by hand, without a subprotocol: for what the server answers an upgrade
# it refuses before the handshake.
UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


def make_config(root: Path, **kw: Any) -> Config:
    """A config serving ``root``: ``agents`` over the built-ins, the other ``kw`` any of Config's
    fields or a ``[server]`` key, ``policy`` its rules and ``webhooks`` ``[notify]``'s."""
    agents = dict(builtin_profiles())
    agents.update(kw.pop("agents", {}))
    server = {k: kw.pop(k) for k in list(kw) if k in ServerSettings.__dataclass_fields__}
    if "policy" in kw:
        kw["policy"] = PolicySettings(kw["policy"])
    if "webhooks" in kw:
        kw["notify"] = NotifySettings(kw.pop("webhooks"))
    if "acp_default_agent" in kw:
        kw["acp"] = AcpSettings(kw.pop("acp_default_agent"))
    return Config(
        server=ServerSettings(workspace_root=root.resolve(), **server), agents=agents, **kw
    )


def fast_demo(delay_ms: int = 1, **changes: Any):
    demo = builtin_profiles()["demo"]
    return replace(demo, env={"RAWP_DEMO_DELAY_MS": str(delay_ms)}, **changes)


class GatewayTestServer(TestServer):
    """aiohttp's test server on the runner ``serve`` uses (JSON answers from the HTTP layer)."""

    async def _make_runner(self, **kwargs: Any) -> JsonErrorRunner:
        return JsonErrorRunner(self.app, **kwargs)


def demo_config(root: Path, delay_ms: int = 1, **kw: Any) -> Config:
    """A config whose one agent is the demo agent answering every ``delay_ms`` ms."""
    return make_config(root, agents={"demo": fast_demo(delay_ms)}, **kw)


async def start_gateway(config: Config, **app: Any) -> TestClient:
    """The gateway serving ``config`` (``app``: more arguments of ``create_app``). A config with
    no credential gets a token made for it and kept in its port's file, as ``serve`` does, so a
    client (``chat``, ``acp``, a test's own) finds it as the person's would; the test client sends
    it on every request unless a test sends its own ``Authorization`` (``client.token`` is it)."""
    made = with_made_token(config)
    headers = {"Authorization": f"Bearer {made.token}"} if made is not config else {}
    gateway = create_app(made, **app)
    client = TestClient(GatewayTestServer(gateway), headers=headers)
    client.token = made.token  # type: ignore[attr-defined]
    kept = made is not config and made.token is not None
    if kept:

        async def forget(_: object) -> None:
            forget_token(token_path(client.port), str(made.token))

        gateway.on_cleanup.append(forget)
    await client.start_server()
    if kept:
        write_token(token_path(client.port), str(made.token))
    return client


def token_header(client: TestClient) -> dict[str, str]:
    """The ``Authorization`` header of the gateway's token, for a client of its own."""
    return {"Authorization": f"Bearer {client.token}"}  # type: ignore[attr-defined]


def base_url(client: TestClient) -> str:
    """The gateway's URL, as a master outside the test client is given it."""
    return str(client.make_url("")).rstrip("/")


def envelope(session_id: str, type_: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    frame = {
        "v": 1,
        "type": type_,
        "message_id": str(uuid.uuid4()),
        "timestamp": "2026-11-29T00:00:00.000Z",
        "session_id": session_id,
        "payload": payload,
    }
    frame.update(extra)
    return frame


async def receive_json(ws: aiohttp.ClientWebSocketResponse, timeout: float) -> dict[str, Any]:
    """The next text message of ``ws``, decoded; a close or a binary message is an error. One
    deadline for the whole wait: aiohttp's own receive timeout starts again at each ping it
    answers, so past the gateway's heartbeat interval it would never fire."""
    async with asyncio.timeout(timeout):
        msg = await ws.receive()
    if msg.type != aiohttp.WSMsgType.TEXT:
        raise ConnectionError(f"not a text message: {msg.type} {msg.data!r} {msg.extra!r}")
    return json.loads(msg.data)


class Master:
    """A master on one WebSocket of a session."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, session_id: str) -> None:
        self.ws = ws
        self.session_id = session_id
        self.frames: list[dict[str, Any]] = []
        self.end: aiohttp.WSMessage | None = None  # what drain_until_closed stopped at

    @classmethod
    async def open(cls, client: TestClient, agent: str = "demo", **session: Any) -> Master:
        """A new session of ``agent`` (``session``: ``create_session``'s keywords) and a master
        attached to it."""
        created = await create_session(client, agent, **session)
        return await cls.attach(client, created["session_id"])

    @classmethod
    async def attach(
        cls,
        client: TestClient,
        session_id: str,
        *,
        features: Any = ALL_FEATURES,
        announce: bool = True,
        last_message_id: str | None = None,
        history: str | None = None,
        headers: dict[str, str] | None = None,
        role: str | None = None,
    ) -> Master:
        params = {}
        if last_message_id:
            params["last_message_id"] = last_message_id
        if history:
            params["history"] = history
        if role:
            params["role"] = role
        ws = await client.ws_connect(
            f"/v1/session/{session_id}/ws", protocols=(SUBPROTOCOL,), params=params, headers=headers
        )
        master = cls(ws, session_id)
        if announce:
            caps = {
                "protocol_version": "rawp-dps-1.0",
                "supported_namespaces": ["agent", "tool", "control", "session"],
                "features": msgspec.to_builtins(features),
            }
            await master.send("session.capabilities", caps)
        return master

    async def send(self, type_: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
        frame = envelope(self.session_id, type_, payload, **extra)
        await self.ws.send_str(json.dumps(frame))
        return frame

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        frame = await receive_json(self.ws, timeout)
        self.frames.append(frame)
        return frame

    async def until(
        self, type_: str, timeout: float = 15.0, **payload_match: Any
    ) -> dict[str, Any]:
        """Read frames until one of ``type_`` whose payload has the given values."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            left = end - loop.time()
            if left <= 0:
                raise TimeoutError(f"no {type_} {payload_match or ''} within {timeout} s")
            frame = await self.next(timeout=left)
            if frame["type"] == type_ and all(
                frame["payload"].get(k) == v for k, v in payload_match.items()
            ):
                return frame

    async def drain_until_closed(self, timeout: float = 15.0) -> list[dict[str, Any]]:
        got = []
        while True:
            async with asyncio.timeout(timeout):  # as in next(): pings would restart aiohttp's own
                msg = await self.ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                self.end = msg
                return got
            frame = json.loads(msg.data)
            self.frames.append(frame)
            got.append(frame)

    def types(self) -> list[str]:
        return [f["type"] for f in self.frames]

    def drop(self) -> None:
        """Lose the connection the hard way: abort the TCP transport, no WebSocket close frame
        (a network drop, as opposed to ``ws.close()``)."""
        transport = getattr(getattr(self.ws, "_writer", None), "transport", None)
        if transport is None:  # pragma: no cover - aiohttp internals moved
            raise RuntimeError("cannot reach the WebSocket's transport to abort it")
        transport.abort()


def of(frames: list[dict[str, Any]], type_: str) -> list[dict[str, Any]]:
    """The frames of one type, in order."""
    return [f for f in frames if f["type"] == type_]


async def prompt_and_wait(
    master: Master, text: str, *, timeout: float = 60.0, idle: bool = False, **payload: Any
) -> list[dict[str, Any]]:
    """Send a prompt (``payload``: more fields of it) and read its turn: up to session.turn.end,
    then the session.usage that must follow at once (DPS-7.5.2-usage); with ``idle`` also up to
    the agent's state change to idle. The frames the master got from the prompt on."""
    start = len(master.frames)
    await master.send("control.prompt.request", {"prompt_text": text, **payload})
    await master.until("session.turn.end", timeout=timeout)
    assert (await master.next(timeout=timeout))["type"] == "session.usage"
    if idle:
        await master.until("agent.state.changed", timeout=timeout, current_state="idle")
    return master.frames[start:]


async def history(client: TestClient, session_id: str) -> list[dict[str, Any]]:
    """The session's whole history (``history=all``) as a master attaching now is sent it."""
    master = await Master.attach(client, session_id, history="all")
    await master.next()
    frames = (await master.until("session.history"))["payload"]["frames"]
    await master.ws.close()
    return frames


async def create_session(client: TestClient, agent: str = "demo", **body: Any) -> dict[str, Any]:
    resp = await client.post("/v1/session", json={"agent": agent, **body})
    assert resp.status == 201, await resp.text()
    return await resp.json()


async def prompted(client: TestClient, text: str, **session: Any) -> Master:
    """A new session (``session``: ``create_session``'s keywords) and a master attached to it
    that has sent ``text`` as its first prompt."""
    created = await create_session(client, **session)
    master = await Master.attach(client, created["session_id"])
    await master.send("control.prompt.request", {"prompt_text": text})
    return master


async def greeting(master: Master, timeout: float = 10.0) -> tuple[list[str], list[dict[str, Any]]]:
    """What a master gets on attaching, before any prompt (docs/http-api.md), checked:
    session.capabilities of this protocol from a process adapter, the tool catalog, then the
    commands the agent lists (``timeout``: how long that may take). The catalog's tool names, and
    the commands."""
    caps = await master.next()
    assert caps["type"] == "session.capabilities"
    assert caps["payload"]["protocol_version"] == SUBPROTOCOL
    assert caps["payload"]["features"]["adapter_type"] == "process"
    catalog = await master.next()
    assert catalog["type"] == "tool.catalog.publish"
    commands = await master.next(timeout=timeout)
    assert commands["type"] == "agent.commands.publish"
    return [t["name"] for t in catalog["payload"]["tools"]], commands["payload"]["commands"]
