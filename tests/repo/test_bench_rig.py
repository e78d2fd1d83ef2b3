"""The fan-out bench's lean master (bench/relay_rig.py) reads real WebSocket frames, not a guess.

``bench_fanout.py`` measures latency with ``LeanMaster``, a WebSocket client on a bare
``asyncio.Protocol`` that parses frames itself. These tests hold it to what it claims: against a
real gateway it reads exactly the stamped messages an aiohttp client reads; a frame split across
reads anywhere (header, length, payload, stamp) is carried over; anything but an unmasked final
text frame, a ping or a pong ends it with an error instead of being counted.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import random
import sys

import aiohttp
import pytest

from tests.support.paths import FIXTURES, REPO
from tests.support.servers import free_port

sys.path.insert(0, str(REPO / "bench"))

import relay_rig
from relay_rig import SUBPROTOCOL, WS_GUID, Gateway, LeanMaster, Websocketd


@pytest.fixture(autouse=True)
def worker_ports(monkeypatch):
    """The bench's gateway port (any free one) could be taken by another test worker before the
    gateway binds it; the tests' own come from this worker's block."""
    monkeypatch.setattr(relay_rig, "free_port", free_port)


class RecordingTransport:
    """What a master writes, for the tests that feed it bytes without a socket."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


def server_frame(payload: bytes, first_byte: int = 0x81) -> bytes:
    n = len(payload)
    if n < 126:
        return bytes((first_byte, n)) + payload
    if n < 1 << 16:
        return bytes((first_byte, 126)) + n.to_bytes(2, "big") + payload
    return bytes((first_byte, 127)) + n.to_bytes(8, "big") + payload


def unmask(frame: bytes) -> tuple[int, bytes]:
    """The opcode and payload of one masked client frame (payloads under 126 bytes)."""
    assert frame[1] & 0x80, "a client frame must be masked"
    n = frame[1] & 0x7F
    key, body = frame[2:6], frame[6 : 6 + n]
    return frame[0] & 0x0F, bytes(b ^ key[i % 4] for i, b in enumerate(body))


def upgraded_master() -> tuple[LeanMaster, RecordingTransport]:
    master = LeanMaster(1, "session")
    transport = RecordingTransport()
    master.connection_made(transport)
    accept = base64.b64encode(hashlib.sha1(master.key + WS_GUID).digest())
    master.data_received(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: "
        b"" + SUBPROTOCOL.encode() + b"\r\n\r\n"
    )
    assert master.upgraded.done() and master.upgraded.exception() is None
    return master, transport


def delta(stamp: int, text: str) -> bytes:
    frame = {"type": "agent.text.delta", "payload": {"text": f"@T{stamp};{text}"}}
    return json.dumps(frame).encode()


async def test_lean_master_reads_the_stamped_messages_an_aiohttp_master_reads():
    gateway = Gateway()
    try:
        await gateway.ready()
        async with aiohttp.ClientSession() as http:
            session_id = await gateway.new_session(http)
            lean = await LeanMaster.attach(gateway.port, session_id)
            reference = await gateway.attach(http, session_id)
            await reference.request_burst(600, 5000)
            await reference.read_burst(timeout=60)
            await asyncio.wait_for(lean.ended, 60)
            lean.close()
            await reference.ws.close()
    finally:
        gateway.stop()
    assert len(reference.stamps_ns) > 400
    assert lean.stamps_ns == reference.stamps_ns
    assert lean.stamped == len(lean.stamps_ns)
    assert all(ns > 0 for ns in lean.latencies_ns)


@pytest.mark.websocketd
async def test_a_bare_lean_master_reads_every_stamped_line_through_websocketd(monkeypatch):
    """bench_fleet.py's reference: a ``LeanMaster`` without a session connects to websocketd, whose
    agent takes its prompt line as the gateway's would be written to it, and reads every stamped
    line the agent wrote, once each, in order."""
    from synth_agent import burst

    monkeypatch.delenv("RAWP_SYNTH_TRANSCRIPT", raising=False)
    written = sum(isinstance(line, tuple) for line in burst(600))
    relay = Websocketd()
    try:
        await relay.ready()
        lean = await LeanMaster.attach(relay.port, None)
        lean.request_burst(600, 5000)
        await asyncio.wait_for(lean.ended, 60)
        lean.close()
    finally:
        relay.stop()
    assert lean.stamped == len(lean.stamps_ns) == written > 400
    assert lean.stamps_ns == sorted(lean.stamps_ns)
    assert all(ns > 0 for ns in lean.latencies_ns)


@pytest.mark.websocketd
async def test_the_fleet_bench_runs_both_relays_at_tiny_scale(monkeypatch, capsys):
    """``bench_fleet.py`` with its websocketd reference, two sessions, one round each: both relays
    measured, and every row printed for both with the ratio."""
    import bench_fleet

    monkeypatch.delenv("RAWP_SYNTH_TRANSCRIPT", raising=False)
    argv = ["--sessions", "2", "--seconds", "1", "--warmup", "0.5", "--rate", "100"]
    await bench_fleet.main(bench_fleet.arguments([*argv, "--rounds", "1", "--transcript", ""]))
    out = capsys.readouterr().out
    assert "rawp-gateway: 2 sessions open" in out and "websocketd: 2 sessions open" in out
    head = next(line for line in out.splitlines() if line.startswith("measure"))
    assert head.split() == ["measure", "rawp-gateway", "websocketd", "gateway/websocketd"]
    rows = {line.split("  ")[0]: line.split()[-3:] for line in out.splitlines()}
    for label, _, _ in bench_fleet.ROWS:
        assert len(rows[label]) == 3, out  # both relays, and the ratio (or "-")


async def test_a_replayed_recording_is_whole_turns_of_the_real_clis_output(monkeypatch):
    """``RAWP_SYNTH_TRANSCRIPT`` (bench_fleet.py): two copies of a recorded turn with three
    parallel tool calls reach a master through the real gateway as six calls and six results,
    each with an invocation id of its own, and no error."""
    from synth_agent import transcript_template

    recording = FIXTURES / "claude-code/parallel--partial.jsonl"
    monkeypatch.setenv("RAWP_SYNTH_TRANSCRIPT", str(recording))
    copy = len(transcript_template(str(recording)))
    gateway = Gateway()  # the agent inherits the variable through the gateway's environment
    seen: list[dict] = []
    try:
        await gateway.ready()
        async with aiohttp.ClientSession() as http:
            session_id = await gateway.new_session(http)
            master = await gateway.attach(http, session_id)
            await master.request_burst(2 * copy, 0)
            async with asyncio.timeout(60):
                while not seen or seen[-1]["type"] != "session.turn.end":
                    seen.append(json.loads((await master.ws.receive()).data))
            await master.ws.close()
    finally:
        gateway.stop()
    calls = [f["payload"]["invocation_id"] for f in seen if f["type"] == "tool.invoke.request"]
    results = [f for f in seen if f["type"] == "tool.invoke.result"]
    assert len(calls) == len(set(calls)) == 6 and len(results) == 6
    assert not [f for f in seen if f["type"] in ("agent.error", "session.error")]


def test_a_timed_recording_is_cut_into_its_turns_with_their_recorded_offsets():
    """``recorded_turns`` (bench_fleet.py's pace): one turn a prompt, every recorded line in
    exactly one, each as long after its prompt as it came in the recording, each turn ending with
    its ``result``."""
    from synth_agent import recorded_turns

    recording = FIXTURES / "claude-code/working-session.jsonl"
    meta = json.loads(recording.with_name("working-session.meta.json").read_text())
    turns = recorded_turns(str(recording))
    assert turns is not None and len(turns) == len(meta["stdin_times"]) == 3
    assert sum(len(t) for t in turns) == meta["stdout_lines"]
    flat = [off for k, turn in enumerate(turns) for off, _ in turn]
    recorded = [
        int((t - max(p for p in meta["stdin_times"] if p <= t)) * 1e9) for t in meta["stdout_times"]
    ]
    assert flat == recorded
    assert all(json.loads(turn[-1][1])["type"] == "result" for turn in turns)
    untimed = FIXTURES / "claude-code/parallel--partial.jsonl"
    assert recorded_turns(str(untimed)) is None


def test_the_fleet_bench_prompts_as_the_recording_did_and_waits_a_mean_think_time_to_loop():
    """``bench_fleet.Pace``: the recorded prompts' texts at the times they were written, and a
    cycle that is the recording plus the mean of its think times (from a turn's last line to the
    next prompt), so that a session that starts again waits as a person did."""
    from bench_fleet import Pace

    recording = FIXTURES / "claude-code/working-session.jsonl"
    meta = json.loads(recording.with_name("working-session.meta.json").read_text())
    pace = Pace.of(recording)
    written, times = meta["stdin_times"], meta["stdout_times"]
    assert [at for at, _ in pace.prompts] == written
    assert [text for _, text in pace.prompts] == [
        json.loads(line)["message"]["content"] for line in meta["stdin"]
    ]
    thinks = [t - max(x for x in times if x < t) for t in written[1:]]
    assert all(think >= 25 for think in thinks)  # the scenario's person waits 30 s, then 25 s
    assert pace.cycle == times[-1] + sum(thinks) / len(thinks)
    assert pace.lines == meta["stdout_lines"]


async def test_a_timed_recording_replays_a_turn_per_prompt_at_its_pace(monkeypatch):
    """Through the real gateway, each prompt gets the recording's next turn: two prompts, the
    first two turns, each ended by the gateway and taking no less than it took in the recording,
    their tool calls with invocation ids of their own, no error."""
    from synth_agent import recorded_turns

    recording = FIXTURES / "claude-code/working-session.jsonl"
    turns = recorded_turns(str(recording))
    monkeypatch.setenv("RAWP_SYNTH_TRANSCRIPT", str(recording))
    gateway = Gateway()
    seen: list[dict] = []
    took: list[float] = []
    loop = asyncio.get_running_loop()
    try:
        await gateway.ready()
        async with aiohttp.ClientSession() as http:
            session_id = await gateway.new_session(http)
            master = await gateway.attach(http, session_id)
            for text in ("first prompt", "second prompt"):
                sent = loop.time()
                await master.send_frame("control.prompt.request", {"prompt_text": text})
                async with asyncio.timeout(60):
                    while not seen or seen[-1]["type"] != "session.turn.end":
                        seen.append(json.loads((await master.ws.receive()).data))
                took.append(loop.time() - sent)
                seen.append({"type": "(next prompt)"})
            await master.ws.close()
    finally:
        gateway.stop()
    ends = [f for f in seen if f["type"] == "session.turn.end"]
    assert len(ends) == 2
    for turn, seconds in zip(turns, took, strict=False):
        assert seconds >= turn[-1][0] / 1e9
    calls = [f["payload"]["invocation_id"] for f in seen if f["type"] == "tool.invoke.request"]
    tools_in_recording = sum(
        1
        for turn in turns[:2]
        for _, line in turn
        for block in json.loads(line).get("message", {}).get("content", [])
        if isinstance(block, dict) and block.get("type") == "tool_use"
    )
    assert len(calls) == len(set(calls)) == tools_in_recording
    assert not [f for f in seen if f["type"] in ("agent.error", "session.error")]


@pytest.mark.parametrize("text_size", [10, 300, 70_000])  # 7-bit, 16-bit and 64-bit lengths
async def test_frames_split_anywhere_across_reads_are_carried_over(text_size):
    master, _ = upgraded_master()
    stamps = [1_000_000 + k for k in range(5)]
    stream = b"".join(server_frame(delta(s, "x" * text_size)) for s in stamps)
    stream += server_frame(b'{"type": "session.state"}')  # a message without a stamp
    stream += server_frame(delta(2_000_000, "END-OF-BURST"))
    rng = random.Random(text_size)
    cuts = sorted(rng.sample(range(1, len(stream)), min(200, len(stream) - 1)))
    cuts += range(1, 40)  # byte by byte through the first header and stamp
    cuts = sorted(set(cuts))
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        master.data_received(stream[start:end])
    assert master.stamps_ns == [*stamps, 2_000_000]
    assert master.messages == 7
    assert master.ended.done() and master.ended.exception() is None
    assert master.carry == b""


async def test_a_message_with_several_stamps_is_counted_but_not_timed():
    master, _ = upgraded_master()
    done = json.dumps({"type": "agent.text.done", "payload": {"text": "@T5;a @T6;b"}}).encode()
    master.data_received(server_frame(done) + server_frame(delta(7, "c")))
    assert master.messages == 2
    assert master.stamps_ns == [7]


async def test_a_ping_is_answered_with_a_masked_pong():
    master, transport = upgraded_master()
    transport.written.clear()
    master.data_received(server_frame(b"beat", 0x89) + server_frame(delta(9, "d")))
    assert [unmask(frame) for frame in transport.written] == [(0xA, b"beat")]
    assert master.stamps_ns == [9]


@pytest.mark.parametrize(
    "frame",
    [
        server_frame(delta(1, "binary"), 0x82),
        server_frame(delta(1, "a fragment"), 0x01),  # FIN clear: the gateway never fragments
        server_frame(b"\x03\xe8bye", 0x88),  # close
        bytes((0x81, 0x80 | 4)) + b"mask" + b"abcd",  # masked, as only a client may send
    ],
    ids=["binary", "fragment", "close", "masked"],
)
async def test_anything_but_a_server_text_frame_ends_the_master(frame):
    master, transport = upgraded_master()
    master.data_received(frame)
    assert transport.aborted
    with pytest.raises(ConnectionError):
        master.ended.result()
    assert master.stamps_ns == []


async def test_an_upgrade_with_a_wrong_accept_is_refused():
    master = LeanMaster(1, "session")
    transport = RecordingTransport()
    master.connection_made(transport)
    assert transport.written[0].startswith(b"GET /v1/session/session/ws HTTP/1.1\r\n")
    assert f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n".encode() in transport.written[0]
    master.data_received(
        b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: wrong\r\n"
        b"Sec-WebSocket-Protocol: " + SUBPROTOCOL.encode() + b"\r\n\r\n"
    )
    with pytest.raises(ConnectionError, match="Accept"):
        master.upgraded.result()
    assert transport.aborted
