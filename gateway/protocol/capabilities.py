"""Capabilities (§12.2, §17.4): what the gateway announces, and what each connection may receive.

Theory of operation
-------------------
``gateway_capabilities`` builds the gateway's ``session.capabilities`` payload from the agent
profile's features (DPS-12.2-caps), with ``adapter_type`` always filled (§17.4). A connection gets
a feature's frames only when both sides announced it (``agreed_features``).

A master announces its own features in a ``session.capabilities`` frame. ``ConnectionFilter`` holds
them and answers, per frame, whether the frame may go to that connection (DPS-12.2-filter: no
``agent.thinking.*`` without ``thinking_stream``, no ``tool.invoke.stream`` without
``tool_streaming``, no ``agent.subagent.*`` without ``subagent``, no ``session.file.candidates``
without ``file_search_fuzzy``) and whether ``metadata.subagent_context`` must be stripped from it
(DPS-10.6-caps: the frame still goes, flat). Until a master announces anything it is treated as
having announced nothing, as the spec's MUST NOT reads.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from gateway.protocol.frames import PROTOCOL_VERSION, Capabilities, Features, Frame

__all__ = [
    "FEATURE_OF_TYPE",
    "SUPPORTED_NAMESPACES",
    "ConnectionFilter",
    "agreed_features",
    "gateway_capabilities",
    "strip_subagent_context",
]

SUPPORTED_NAMESPACES: Final = ["agent", "tool", "control", "session"]

# The frame types that exist only for a feature.
FEATURE_OF_TYPE: Final[dict[str, str]] = {
    "agent.thinking.delta": "thinking_stream",
    "agent.thinking.done": "thinking_stream",
    "tool.invoke.stream": "tool_streaming",
    "agent.subagent.started": "subagent",
    "agent.subagent.ended": "subagent",
    "session.file.candidates": "file_search_fuzzy",
}

ALL_FEATURES: Final = Features(
    thinking_stream=True,
    tool_streaming=True,
    structured_output=True,
    subagent=True,
    subagent_context=True,
    context_compaction=True,
    plan_mode=True,
    file_reference=True,
    file_search_fuzzy=True,
)


def gateway_capabilities(
    features: Features,
    *,
    max_frame_size: int,
    extensions: dict[str, Any] | None = None,
    adapter_type: str = "process",
) -> Capabilities:
    """The gateway's ``session.capabilities`` payload for a session of an agent with ``features``."""
    return Capabilities(
        protocol_version=PROTOCOL_VERSION,
        supported_namespaces=list(SUPPORTED_NAMESPACES),
        features=msgspec.structs.replace(features, adapter_type=adapter_type),
        max_frame_size=max_frame_size,
        extensions=extensions,
    )


class ConnectionFilter:
    """Per-connection frame admission from the features the connection announced."""

    __slots__ = ("announced", "keeps_subagent_context")

    def __init__(self, announced: Features | None = None) -> None:
        self.announced = announced or Features()
        self.keeps_subagent_context = bool(self.announced.subagent_context)

    def admits(self, frame_type: str) -> bool:
        feature = FEATURE_OF_TYPE.get(frame_type)
        return feature is None or bool(getattr(self.announced, feature))


def agreed_features(announced: Features, offered: Features) -> Features:
    """What a connection receives: each feature that gates frames (and ``subagent_context``) only
    when the master announced it *and* the gateway offered it in its own greeting. A profile that
    says ``thinking_stream = false`` thus sends no ``agent.thinking.*`` to anyone, whatever its
    agent prints."""
    gated = {*FEATURE_OF_TYPE.values(), "subagent_context"}
    return msgspec.structs.replace(
        announced,
        **{f: bool(getattr(announced, f)) and bool(getattr(offered, f)) for f in gated},
    )


def strip_subagent_context(frame: Frame) -> Frame:
    """The frame without ``metadata.subagent_context`` (the same object when it has none)."""
    metadata = frame.metadata
    if not metadata or "subagent_context" not in metadata:
        return frame
    rest = {k: v for k, v in metadata.items() if k != "subagent_context"}
    return msgspec.structs.replace(frame, metadata=rest or None)
