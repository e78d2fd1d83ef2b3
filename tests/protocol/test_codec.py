"""The §2 receiving rules and the frame round trip (gateway/protocol/codec.py)."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.factory import FrameFactory
from tests.support.strategies import json_values, payloads

SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"


def envelope(type_: str, payload: object, **extra: object) -> bytes:
    frame = {
        "v": 1,
        "type": type_,
        "message_id": "5f0c6a7e-1d2b-4c3a-8e9f-0a1b2c3d4e5f",
        "timestamp": "2026-03-16T09:00:00.000Z",
        "session_id": SESSION,
        "payload": payload,
    }
    frame.update(extra)
    return json.dumps(frame).encode()


def test_well_formed_control_frame_is_accepted():
    got = codec.decode(envelope("control.prompt.request", {"prompt_text": "hi"}))
    assert isinstance(got, codec.Accepted)
    assert isinstance(got.frame.payload, F.PromptRequest)
    assert got.frame.payload.prompt_text == "hi"
    assert got.frame.payload.input_type == "text"  # the spec's default


@pytest.mark.parametrize("v", [0, 2, "1", None, True, 1.5])
def test_DPS_2_1_v_other_versions_are_ignored_and_answered(v):
    """DPS-2.1-v: v other than 1 is not acted on and is answered with a session.error."""
    got = codec.decode(envelope("control.prompt.request", {"prompt_text": "x"}, v=v))
    assert isinstance(got, codec.Rejected)
    assert got.error.fatal is False
    assert got.error.error_code in ("UNSUPPORTED_VERSION", "INVALID_FRAME")
    if v in (0, 2, "1", None, True):
        assert got.error.error_code == "UNSUPPORTED_VERSION"
        assert "v=" in got.error.message


def test_DPS_2_1_v_applies_even_when_the_rest_is_unreadable():
    got = codec.decode(b'{"v": 2, "type": "whatever"}')
    assert isinstance(got, codec.Rejected)
    assert got.error.error_code == "UNSUPPORTED_VERSION"


def test_DPS_2_2_unknown_field_in_payload_and_envelope_is_ignored():
    """DPS-2.2-unknown-field: unknown payload keys are ignored, the frame is acted on."""
    data = envelope(
        "control.prompt.cancel",
        {"target_turn_id": "t1", "reason": "user_cancelled", "future_field": {"a": [1]}},
        future_envelope_field=3,
    )
    got = codec.decode(data)
    assert isinstance(got, codec.Accepted)
    assert got.frame.payload == F.PromptCancel(target_turn_id="t1", reason="user_cancelled")


@pytest.mark.parametrize(
    "type_", ["x-acme.custom.event", "x-rawp-gateway.unknown", "agent.future.thing", "nonsense"]
)
def test_DPS_2_2_unknown_type_is_ignored_not_an_error(type_):
    """DPS-2.2-unknown-type: ignored (logged by the caller), never an error, x-* included."""
    got = codec.decode(envelope(type_, {"anything": 1}))
    assert isinstance(got, codec.Ignored)
    assert got.frame_type == type_


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b'{"v": 1, "type": "control.prompt.request"}', "message_id"),
        (envelope("control.prompt.request", {}), "payload.prompt_text"),
        (envelope("control.prompt.request", {"prompt_text": 7}), "payload.prompt_text"),
        (envelope("control.mode.switch", {"mode": "turbo"}), "payload.mode"),
        (envelope("control.prompt.request", "a string"), "payload"),
    ],
)
def test_malformed_frames_get_INVALID_FRAME_naming_the_field(data, needle):
    got = codec.decode(data)
    assert isinstance(got, codec.Rejected)
    assert got.error.error_code == "INVALID_FRAME"
    assert got.error.fatal is False
    assert needle in got.error.message


def test_rejected_frame_keeps_its_message_id_for_parent_id():
    got = codec.decode(envelope("control.prompt.request", {"prompt_text": 7}))
    assert isinstance(got, codec.Rejected)
    assert got.message_id == "5f0c6a7e-1d2b-4c3a-8e9f-0a1b2c3d4e5f"


def test_DPS_2_1_idempotent_seen_window_acts_once_and_is_bounded():
    """DPS-2.1-idempotent: a message_id seen before is not acted on twice; memory is bounded."""
    window = codec.SeenWindow(capacity=3)
    assert window.first_time("a")
    assert not window.first_time("a")
    for mid in "bcd":
        assert window.first_time(mid)
    assert len(window) == 3
    assert window.first_time("a")  # fell out of the window


@given(
    payloads,
    st.none() | st.text(max_size=10),
    st.none() | st.dictionaries(st.text(max_size=5), json_values, max_size=3),
)
def test_factory_frames_round_trip_unchanged(payload, turn_id, metadata):
    factory = FrameFactory(SESSION)
    frame = factory.frame(payload, turn_id=turn_id, metadata=metadata)
    got = codec.decode(codec.encode(frame))
    assert isinstance(got, codec.Accepted), got
    assert got.frame == frame


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(data):
    assert isinstance(codec.decode(data), codec.Accepted | codec.Rejected | codec.Ignored)


@given(json_values)
def test_arbitrary_json_never_raises(value):
    got = codec.decode(msgspec.json.encode(value))
    assert isinstance(got, codec.Accepted | codec.Rejected | codec.Ignored)


frame_like = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 1, 2, "1"]),
        "type": st.sampled_from(sorted(F.PAYLOAD_CLASSES)) | st.text(max_size=12),
        "message_id": st.text(max_size=5) | st.integers(),
        "timestamp": st.text(max_size=5),
        "session_id": st.text(max_size=5),
        "payload": json_values,
    }
)


@given(frame_like)
def test_arbitrary_frame_shaped_json_never_raises(value):
    got = codec.decode(msgspec.json.encode(value))
    assert isinstance(got, codec.Accepted | codec.Rejected | codec.Ignored)
    if isinstance(got, codec.Rejected):
        assert got.error.error_code in ("INVALID_FRAME", "UNSUPPORTED_VERSION")
