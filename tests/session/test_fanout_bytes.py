"""What masters receive does not change with the pre-framed fan-out: byte for byte, every recorded
fixture, three masters with different announced features.

Each fixture's lines go through a real ``LiveSession`` (parser, session machine, mapper, history,
fan-out) whose connections write to transports that keep every byte. Alongside, each frame the
session emits also goes the way the gateway sent frames before the pre-framed fan-out: encoded per
connection variant (the capability filter, ``subagent_context`` stripped for a master that did not
announce it) and written by aiohttp's own ``WebSocketWriter.send_frame``, one call per frame per
connection. Both byte streams are compared whole (same run, so ids and timestamps are the same
too), and the new one is also parsed back into WebSocket messages to check that each is one whole
JSON frame.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import WSMsgType
from aiohttp._websocket.writer import WebSocketWriter

from gateway.cli.translate import SENT_PREFIX
from gateway.config import Config, ServerSettings, builtin_profiles
from gateway.metrics import GatewayMetrics
from gateway.protocol import actions as act
from gateway.protocol import codec
from gateway.protocol.capabilities import ALL_FEATURES, strip_subagent_context
from gateway.session import LiveSession
from parsers import events as ev
from tests.support.paths import FIXTURES

ALL = sorted(FIXTURES.glob("*/*.jsonl"))
FEATURE_SETS = {
    "everything": ALL_FEATURES,
    "core": None,
    "no-subagent-context": msgspec.structs.replace(ALL_FEATURES, subagent_context=False),
}


class Sink:
    """A transport that keeps what is written (and a protocol that never pauses, for aiohttp)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.writes = 0
        self._paused = False

    def write(self, data: bytes) -> None:
        self.data += data
        self.writes += 1

    def writelines(self, buffers: list[bytes]) -> None:
        for data in buffers:
            self.data += data
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16384, 65536)


async def _no_drain() -> None:
    pass


class OldPathSession(LiveSession):
    """A LiveSession that also sends every frame the way the gateway did before (the reference)
    and does not run an agent (the fixture's lines are fed in directly)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.old: dict[str, tuple[Sink, WebSocketWriter]] = {}
        self.pending: list[asyncio.Future[None]] = []

    def old_writer(self, conn_id: str) -> None:
        sink = Sink()
        self.old[conn_id] = (sink, WebSocketWriter(sink, sink))  # type: ignore[arg-type]

    def _send_old(self, conn_id: str, data: bytes) -> None:
        _, writer = self.old[conn_id]
        self.pending.append(asyncio.ensure_future(writer.send_frame(data, WSMsgType.TEXT)))

    def _emit(self, action: act.Emit) -> None:
        # The fan-out as it was: encode once, the stripped variant per connection that needs it,
        # one send_frame per frame per connection.
        frame = action.frame
        data = codec.encode(frame)
        if action.to is not None:
            if action.to in self.connections:
                self._send_old(action.to, data)
        else:
            has_context = bool(frame.metadata and "subagent_context" in frame.metadata)
            for conn in self.connections.values():
                if conn.id == action.exclude or not conn.filter.admits(frame.TYPE):
                    continue
                if has_context and not conn.filter.keeps_subagent_context:
                    self._send_old(conn.id, codec.encode(strip_subagent_context(frame)))
                else:
                    self._send_old(conn.id, data)
        super()._emit(action)

    def _send_to(self, conn: Any, out: Any) -> None:
        # The greeting of attach: as it was, one send_frame per frame.
        self._send_old(conn.id, codec.encode(out.frame))
        super()._send_to(conn, out)

    def _act_other(self, action: act.Action) -> None:
        if isinstance(action, act.Spawn | act.WriteStdin | act.Signal | act.Terminate):
            return  # no agent process: the fixture is the agent
        super()._act_other(action)


def messages(stream: bytes) -> list[bytes]:
    """Split a server's byte stream into WebSocket messages (unmasked, final text frames)."""
    out, i = [], 0
    while i < len(stream):
        assert stream[i] == 0x81, "a final text frame"
        n = stream[i + 1]
        i += 2
        if n == 126:
            n = int.from_bytes(stream[i : i + 2], "big")
            i += 2
        elif n == 127:
            n = int.from_bytes(stream[i : i + 8], "big")
            i += 8
        out.append(bytes(stream[i : i + n]))
        i += n
    return out


def profile_of(fixture: Path) -> str:
    """The built-in profile a fixture was recorded with: its folder, or for the ACP transcripts
    (one folder for several agents) the profile its meta file names."""
    if fixture.parent.name == "acp":
        return json.loads(fixture.with_suffix(".meta.json").read_text())["agent"]
    return fixture.parent.name


async def replay(fixture: Path, tmp_path: Path) -> tuple[OldPathSession, dict[str, Sink]]:
    agent = profile_of(fixture)
    session = OldPathSession(
        "3f0c2a1b-4d5e-4f60-8a7b-9c0d1e2f3a4b",
        builtin_profiles()[agent],
        tmp_path,
        config=Config(server=ServerSettings(workspace_root=tmp_path)),
        metrics=GatewayMetrics(agents=[agent]),
    )
    sinks = {}
    for name, features in FEATURE_SETS.items():
        sink = Sink()
        session.old_writer(name)
        session.attach(
            name, None, role="master", last_message_id=None, transport=sink, drain=_no_drain
        )
        sinks[name] = sink
        if features is not None:
            caps = {
                "v": 1,
                "type": "session.capabilities",
                "message_id": f"00000000-0000-4000-8000-00000000000{len(sinks)}",
                "timestamp": "2026-11-30T00:00:00.000Z",
                "session_id": session.id,
                "payload": {
                    "protocol_version": "rawp-dps-1.0",
                    "supported_namespaces": ["agent", "tool", "control", "session"],
                    "features": msgspec.to_builtins(features),
                },
            }
            session.receive(name, json.dumps(caps))
    parser = session.machine.parser
    # An ACP transcript holds both directions, the gateway's lines wrapped as {"sent": ...}, as
    # `translate` reads it: the adapter then writes nothing of its own.
    sent = getattr(parser, "sent", None)
    if sent is not None:
        parser.read_transcript()
    session.perform(session.machine.agent_events([ev.SessionStarted()]))
    for i, line in enumerate(fixture.read_bytes().splitlines()):
        if sent is not None and line.startswith(SENT_PREFIX):
            session.perform(session.machine.agent_events(sent(line)))
        else:
            session.perform(session.machine.agent_events(parser.feed(line)))
        if i % 7 == 0:
            await asyncio.sleep(0)  # some frames leave in batches, some alone
    session.perform(session.machine.agent_stdout_closed())
    session.perform(session.machine.agent_exited("ok", 0, None, ""))
    await asyncio.sleep(0)
    await asyncio.gather(*session.pending)
    return session, sinks


@pytest.mark.parametrize("fixture", ALL, ids=[f"{p.parent.name}/{p.stem}" for p in ALL])
async def test_every_master_receives_the_same_bytes_as_before(fixture: Path, tmp_path: Path):
    session, sinks = await replay(fixture, tmp_path)
    received = {}
    for name, sink in sinks.items():
        old, _ = session.old[name]
        assert bytes(sink.data) == bytes(old.data), f"{name} received other bytes"
        frames = [json.loads(m) for m in messages(bytes(sink.data))]
        assert frames[0]["type"] == "session.capabilities"
        assert len(frames) == len(messages(bytes(old.data)))
        # frames made in the same loop iteration left in one write
        assert sink.writes < len(frames)
        received[name] = frames
    core = {f["type"] for f in received["core"]}
    assert core <= {f["type"] for f in received["everything"]}


async def test_DPS_7_1_history_a_reattach_leaves_room_in_the_send_queue_for_the_greeting(tmp_path):
    """DPS-7.1-history: a history larger than the send queue is cut to what the queue takes beside
    the catalog and commands that follow it: the reattached master gets capabilities, the history
    (truncated) and those, in order, and is not cut off."""
    session = OldPathSession(
        "3f0c2a1b-4d5e-4f60-8a7b-9c0d1e2f3a4b",
        builtin_profiles()["claude-code"],
        tmp_path,
        config=Config(server=ServerSettings(workspace_root=tmp_path, send_queue_bytes=65536)),
        metrics=GatewayMetrics(agents=["claude-code"]),
    )
    commands = [ev.SlashCommand(name=f"command-{i}", description="d" * 200) for i in range(60)]
    tools = [f"mcp__server__tool_{i}_{'t' * 100}" for i in range(60)]
    session.perform(
        session.machine.agent_events([ev.SessionStarted(tools=tools, commands=commands)])
    )
    seen = session.buffer.last_message_id  # the master left here and missed ~160 KB of text
    for _ in range(40):
        session.perform(session.machine.agent_events([ev.TextDelta(block="b", text="x" * 4000)]))
    sink = Sink()
    session.old_writer("back")
    conn = session.attach(
        "back", None, role="master", last_message_id=seen, transport=sink, drain=_no_drain
    )
    assert not conn.overflowed
    await asyncio.sleep(0)
    types = [json.loads(m)["type"] for m in messages(bytes(sink.data))]
    assert types[0] == "session.capabilities" and "session.history" in types
    assert types[-2:] == ["tool.catalog.publish", "agent.commands.publish"]
    history = [json.loads(m) for m in messages(bytes(sink.data))][1]
    assert history["payload"]["buffer_status"]["truncated"] is True
