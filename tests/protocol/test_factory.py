"""The frame factory's envelope (DPS-2.1-envelope): ids, timestamps, optional fields."""

from __future__ import annotations

import re
import uuid

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.factory import Clock, FrameFactory, UuidSource

SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
ISO_MS_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_DPS_2_1_envelope_fields_and_types():
    """DPS-2.1-envelope: v=1, type, message_id (UUID v4), ISO 8601 ms timestamp, session_id, payload."""
    factory = FrameFactory(SESSION)
    frame = factory.frame(F.TextDelta(content_index=0, text="a"), turn_id="t", metadata={"k": 1})
    wire = msgspec_decode(codec.encode(frame))
    assert wire["v"] == 1 and isinstance(wire["v"], int)
    assert wire["type"] == "agent.text.delta"
    assert uuid.UUID(wire["message_id"]).version == 4
    assert ISO_MS_Z.match(wire["timestamp"])
    assert wire["session_id"] == SESSION
    assert wire["turn_id"] == "t"
    assert wire["metadata"] == {"k": 1}
    assert wire["payload"] == {"content_index": 0, "text": "a"}


def test_optional_envelope_fields_are_omitted_not_null():
    frame = FrameFactory(SESSION).frame(F.TurnStart(turn_id="t", turn_index=0))
    wire = msgspec_decode(codec.encode(frame))
    assert set(wire) == {"v", "type", "message_id", "timestamp", "session_id", "payload"}


def test_uuid_source_gives_distinct_rfc4122_v4_ids():
    source = UuidSource()
    ids = [source() for _ in range(5000)]  # spans several entropy batches
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text  # canonical lower-case form


def test_uuid_source_uses_the_injected_entropy():
    source = UuidSource(random_bytes=lambda n: bytes(n))
    assert source() == "00000000-0000-4000-8000-000000000000"


def test_uuid_source_takes_its_ids_from_the_entropy_in_order():
    """Each id is its own 16 bytes of the batch, in the order drawn, with only the version and
    variant bits set (as ``uuid.UUID(bytes=..., version=4)`` does)."""
    entropy = bytes(range(256)) * 32  # one batch: 512 ids of 16 bytes
    source = UuidSource(random_bytes=lambda n: entropy[:n])
    for k in range(512):
        expected = uuid.UUID(bytes=entropy[16 * k : 16 * k + 16], version=4)
        assert source() == str(expected)


def test_clock_formats_iso8601_utc_milliseconds_with_z():
    times = iter([0.0, 0.5, 1.999, 1_773_651_600.1234])
    clock = Clock(time=lambda: next(times))
    assert clock() == "1970-01-01T00:00:00.000Z"
    assert clock() == "1970-01-01T00:00:00.500Z"
    assert clock() == "1970-01-01T00:00:01.999Z"
    assert clock() == "2026-03-16T09:00:00.123Z"


def test_clocks_of_different_sessions_each_get_their_own_second():
    """The clocks share the formatting of the last second asked for: one in another second (a
    session whose clock a burst pushed ahead) still gets its own."""
    ahead, now = Clock(time=lambda: 59.5), Clock(time=lambda: 3599.25)
    assert [ahead(), now(), ahead(), now()] == [
        "1970-01-01T00:00:59.500Z",
        "1970-01-01T00:59:59.250Z",
        "1970-01-01T00:00:59.501Z",
        "1970-01-01T00:59:59.251Z",
    ]


def test_DPS_2_3_history_order_timestamps_never_repeat():
    """DPS-2.3-history-order: masters sort history by timestamp then message_id; frames made in one
    millisecond get increasing timestamps, so that sort keeps the order they were sent in."""
    times = iter(
        [5.0001, 5.0002, 5.0003, 5.999, 5.9995, 4.0, 7.0]
    )  # a burst, and a clock step back
    clock = Clock(time=lambda: next(times))
    got = [clock() for _ in range(7)]
    assert got == [
        "1970-01-01T00:00:05.000Z",
        "1970-01-01T00:00:05.001Z",
        "1970-01-01T00:00:05.002Z",
        "1970-01-01T00:00:05.999Z",
        "1970-01-01T00:00:06.000Z",
        "1970-01-01T00:00:06.001Z",
        "1970-01-01T00:00:07.000Z",
    ]
    assert got == sorted(got)


def test_factory_accepts_injected_sources():
    factory = FrameFactory(SESSION, new_id=lambda: "id", clock=lambda: "now")
    frame = factory.frame(F.SessionError(error_code="X", message="m", fatal=False))
    assert (frame.message_id, frame.timestamp) == ("id", "now")


def msgspec_decode(data: bytes) -> dict:
    import msgspec

    return msgspec.json.decode(data)


def test_sessions_share_one_id_source():
    """A source keeps a batch of 512 formatted ids (~45 KiB): one for the process, not one per
    session's factory (bench_fanout measures the memory of an idle session)."""
    a, b = FrameFactory("a" * 36), FrameFactory("b" * 36)
    assert a.new_id is b.new_id
    assert a.frame(F.TurnStart(turn_id="t", turn_index=0)).message_id != b.new_id()
