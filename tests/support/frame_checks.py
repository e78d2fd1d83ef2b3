"""Agent-neutral checks of a frame sequence, shared by the fixture tests of every agent.

Each function asserts one conformance rule over the frames one recorded run produced (a list of
``gateway.protocol.frames.Frame``), so the Claude Code and the Codex/Gemini fixture tests hold every
agent to the same rules with the same code. Agent-specific expectations (what the CLI's own lines
say) stay in the test files.
"""

from __future__ import annotations

import re
from collections import Counter

from gateway.protocol import codec
from gateway.protocol import frames as F

UUID4 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
RESERVED_STATES = ("idle", "thinking", "tool_calling", "awaiting_input", "error")


def assert_valid_envelopes(frames: list[F.Frame], session_id: str) -> None:
    """DPS-2.1-envelope: every frame survives encode → decode as Accepted, with a UUID v4
    message_id, the session's id and a UTC timestamp."""
    assert frames
    for frame in frames:
        decoded = codec.decode(codec.encode(frame))
        assert isinstance(decoded, codec.Accepted), (frame.TYPE, decoded)
        assert UUID4.match(frame.message_id)
        assert frame.session_id == session_id
        assert frame.timestamp.endswith("Z")


def assert_one_result_per_request(frames: list[F.Frame]) -> dict[str, int]:
    """DPS-5.3.1-result: one tool.invoke.result per request, after it, with the same id and tool
    name. Returns each request's invocation id → its index in ``frames``."""
    requests: dict[str, int] = {}
    results: Counter[str] = Counter()
    for i, frame in enumerate(frames):
        p = frame.payload  # type: ignore[attr-defined]
        if frame.TYPE == "tool.invoke.request":
            assert UUID4.match(p.invocation_id)
            assert p.invocation_id not in requests
            requests[p.invocation_id] = i
        elif frame.TYPE == "tool.invoke.result":
            assert p.invocation_id in requests, "result without a request before it"
            request = frames[requests[p.invocation_id]].payload  # type: ignore[attr-defined]
            assert p.tool_name == request.tool_name
            results[p.invocation_id] += 1
    assert set(results) == set(requests)
    assert all(n == 1 for n in results.values())
    return requests


def assert_blocks_joined(frames: list[F.Frame]) -> None:
    """DPS-4.1-text and DPS-4.2-thinking: per turn, each content block has deltas then exactly one
    done of its own kind; a text done's full_text is the concatenation of its deltas; a
    content_index is never reused for another block in the turn."""
    parts: dict[tuple[str, int], list[str]] = {}
    kinds: dict[tuple[str, int], str] = {}
    done: set[tuple[str, int]] = set()
    for frame in frames:
        p = frame.payload  # type: ignore[attr-defined]
        key = (frame.turn_id or "", getattr(p, "content_index", -1))
        if frame.TYPE in ("agent.text.delta", "agent.thinking.delta"):
            kind = frame.TYPE.split(".")[1]
            assert kinds.setdefault(key, kind) == kind, "content_index reused across blocks"
            assert key not in done, "delta after done"
            parts.setdefault(key, []).append(p.text)
        elif frame.TYPE in ("agent.text.done", "agent.thinking.done"):
            assert key in parts and key not in done
            assert kinds[key] == frame.TYPE.split(".")[1]
            done.add(key)
            if frame.TYPE == "agent.text.done":
                assert p.full_text == "".join(parts[key])
    assert done == set(parts), "a block without its done"


def assert_states_consistent(frames: list[F.Frame]) -> None:
    """DPS-4.6-state: each agent.state.changed starts from the state the previous one reached and
    uses the reserved states; the run ends idle. A mode switch leaves the state as it is."""
    state = "idle"
    for frame in frames:
        if frame.TYPE != "agent.state.changed":
            continue
        p = frame.payload  # type: ignore[attr-defined]
        if p.reason == "mode_switch":
            assert p.previous_state == p.current_state == state
            continue
        assert p.previous_state == state
        assert p.current_state in RESERVED_STATES
        state = p.current_state
    assert state == "idle"
