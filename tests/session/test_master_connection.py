"""The seam between a session and a master protocol (``gateway/session/connection.py``): a third
protocol is one class. The smallest ``MasterConnection``, written here, is attached to a live
session running the demo agent beside a DPS master's WebSocket, and a turn its own prompt starts
comes to it as typed frames, each with the JSON and the WebSocket message the DPS master is sent.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gateway.config import Config, ServerSettings, builtin_profiles
from gateway.metrics import GatewayMetrics
from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.capabilities import ConnectionFilter
from gateway.session import LiveSession
from gateway.session.connection import Outgoing, text_frame
from tests.session.test_fanout_bytes import Sink, messages
from tests.support.gateway_peer import envelope

SESSION_ID = "5b1d7e0c-2a4f-4c3e-8d9b-1f2e3a4b5c6d"


async def no_drain() -> None:
    pass


class Recorder:
    """A master protocol that keeps every frame it is sent: nothing but the interface."""

    def __init__(self, conn_id: str) -> None:
        self.id = conn_id
        self.role = "master"
        self.filter = ConnectionFilter()
        self.max_queue_bytes = 1 << 20
        self.queued_bytes = 0
        self.closed = asyncio.Event()
        self.sent: list[Outgoing] = []
        self.turn_ended = asyncio.Event()
        self.close_code: int | None = None

    def send(self, out: Outgoing) -> None:
        self.sent.append(out)
        if isinstance(out.frame.payload, F.TurnEnd):
            self.turn_ended.set()

    def close_after_flush(self, code: int = 1000, reason: str = "") -> None:
        self.close_code = code
        self.closed.set()


async def test_DPS_2_4_broadcast_a_third_master_protocol_gets_the_typed_frames_of_a_turn(
    tmp_path: Path,
):
    """DPS-2.4-broadcast and DPS-2.4-relay through the interface: the recorder gets the turn's
    frames typed, the same bytes as the DPS master, and not its own prompt, which the DPS master
    gets relayed."""
    session = LiveSession(
        SESSION_ID,
        builtin_profiles()["demo"],
        tmp_path,
        config=Config(server=ServerSettings(workspace_root=tmp_path)),
        metrics=GatewayMetrics(agents=["demo"]),
    )
    await session.start()
    try:
        sink = Sink()
        session.attach(
            "dps", None, role="master", last_message_id=None, transport=sink, drain=no_drain
        )
        await asyncio.sleep(0)  # the DPS connection's writes leave at the end of the iteration
        dps_greeting = len(messages(bytes(sink.data)))
        recorder = session.attach_connection(Recorder("third"))
        assert session.connections["third"] is recorder
        greeting = len(recorder.sent)
        assert recorder.sent[0].frame.TYPE == "session.capabilities"

        prompt = envelope(SESSION_ID, "control.prompt.request", {"prompt_text": "hello there"})
        session.receive("third", json.dumps(prompt))
        await asyncio.wait_for(recorder.turn_ended.wait(), 30)

        sent = recorder.sent[greeting:]
        types = [out.frame.TYPE for out in sent]
        turn = sent[: types.index("session.turn.end") + 1]
        types = types[: len(turn)]
        assert types[0] == "session.turn.start"
        assert types[-2:] == ["agent.text.done", "session.turn.end"]
        assert "control.prompt.request" not in types  # never back to its sender
        deltas = [out.frame.payload for out in turn if out.frame.TYPE == "agent.text.delta"]
        assert deltas and all(isinstance(d, F.TextDelta) for d in deltas)
        (done,) = [out.frame.payload for out in turn if isinstance(out.frame.payload, F.TextDone)]
        assert done.full_text == "".join(d.text for d in deltas)
        for out in turn:
            assert isinstance(out.frame, F.Frame)
            assert out.data == codec.encode(out.frame)
            assert out.framed == text_frame(out.data)

        await asyncio.sleep(0)
        dps = [json.loads(m) for m in messages(bytes(sink.data))][dps_greeting:]
        relayed, rest = dps[0], dps[1:]
        assert (relayed["type"], relayed["message_id"]) == (
            "control.prompt.request",
            prompt["message_id"],
        )
        assert rest[: len(turn)] == [json.loads(out.data) for out in turn]
    finally:
        await asyncio.wait_for(session.delete(), 30)
    assert recorder.closed.is_set() and recorder.close_code == 1000
