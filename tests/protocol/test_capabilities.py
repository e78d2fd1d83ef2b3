"""§12.2 capabilities and the per-connection filter (gateway/protocol/capabilities.py)."""

from __future__ import annotations

import pytest

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.capabilities import (
    ALL_FEATURES,
    FEATURE_OF_TYPE,
    ConnectionFilter,
    agreed_features,
    gateway_capabilities,
    strip_subagent_context,
)
from gateway.protocol.factory import FrameFactory

SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"


def test_DPS_12_2_caps_gateway_capabilities():
    """DPS-12.2-caps: protocol_version rawp-dps-1.0, namespaces, features with adapter_type, max_frame_size."""
    caps = gateway_capabilities(
        F.Features(thinking_stream=True, plan_mode=True),
        max_frame_size=1 << 20,
        extensions={"agent_session_id": "abc"},
    )
    assert caps.protocol_version == "rawp-dps-1.0"
    assert set(caps.supported_namespaces) == {"agent", "tool", "control", "session"}
    assert caps.features.adapter_type == "process"
    assert caps.features.thinking_stream is True
    assert caps.max_frame_size == 1 << 20
    assert caps.extensions == {"agent_session_id": "abc"}


@pytest.mark.parametrize(("frame_type", "feature"), sorted(FEATURE_OF_TYPE.items()))
def test_DPS_12_2_filter_feature_frames_need_the_announced_feature(frame_type, feature):
    """DPS-12.2-filter: no frame for a feature the connection did not announce."""
    assert not ConnectionFilter(F.Features()).admits(frame_type)
    assert not ConnectionFilter(None).admits(frame_type)
    assert not ConnectionFilter(F.Features(**{feature: False})).admits(frame_type)
    assert ConnectionFilter(F.Features(**{feature: True})).admits(frame_type)


@pytest.mark.parametrize(
    "frame_type", ["agent.text.delta", "tool.invoke.request", "tool.invoke.result", "session.usage"]
)
def test_ungated_frames_always_pass(frame_type):
    assert ConnectionFilter(F.Features()).admits(frame_type)


def test_DPS_10_6_caps_subagent_context_is_stripped_not_the_frame():
    """DPS-10.6-caps: a master without subagent_context still gets the frame, flat."""
    factory = FrameFactory(SESSION)
    ctx = F.SubagentContext(parent_invocation_id="p", depth=1, agent_type="Explore")
    frame = factory.frame(
        F.TextDelta(content_index=0, text="x"),
        metadata={"subagent_context": ctx, "content_role": "plan"},
    )
    flat_filter = ConnectionFilter(F.Features(subagent=True))
    assert flat_filter.admits(frame.TYPE)
    assert not flat_filter.keeps_subagent_context
    flat = strip_subagent_context(frame)
    assert flat.metadata == {"content_role": "plan"}
    assert frame.metadata["subagent_context"] is ctx  # the original is untouched
    only_ctx = factory.frame(
        F.TextDelta(content_index=0, text="x"), metadata={"subagent_context": ctx}
    )
    assert b"metadata" not in codec.encode(strip_subagent_context(only_ctx))
    assert ConnectionFilter(ALL_FEATURES).keeps_subagent_context


@pytest.mark.parametrize("feature", sorted({*FEATURE_OF_TYPE.values(), "subagent_context"}))
def test_DPS_12_2_filter_a_feature_the_gateway_did_not_offer_is_not_agreed(feature):
    """DPS-12.2-filter: a connection gets a feature's frames only when the master announced it and
    the gateway's own session.capabilities offered it."""
    assert getattr(agreed_features(ALL_FEATURES, F.Features(**{feature: True})), feature) is True
    assert getattr(agreed_features(ALL_FEATURES, F.Features(**{feature: False})), feature) is False
    assert getattr(agreed_features(ALL_FEATURES, F.Features()), feature) is False
    assert getattr(agreed_features(F.Features(), ALL_FEATURES), feature) is False
