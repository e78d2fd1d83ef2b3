"""The client library: the master-side rules as pure tests of ``MasterView``, and ``Connection``'s
bookkeeping for reattach over a stub socket.

DPS-7.8-finalize: on close, open blocks/calls/turn/interactions are closed locally with synthetic
frames. DPS-7.8-unfinalize: ``session.history`` removes them and replays, except when truncated or
deleted. DPS-2.3-history-order: history is replayed by ``timestamp`` then ``message_id``.
"""

from __future__ import annotations

import itertools

import aiohttp
import msgspec

from gateway.client import (
    SYNTHETIC_OUTPUT,
    Connection,
    MasterView,
    history_order,
    is_synthetic,
    master_capabilities,
)
from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.capabilities import ALL_FEATURES
from gateway.protocol.factory import FrameFactory

SESSION = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
TURN = "7d9f7a52-3b1c-4e5d-8f60-1a2b3c4d5e6f"
CALL = "c0ffee00-0000-4000-8000-000000000001"
ASK = "a5c00000-0000-4000-8000-000000000002"


def make_factory(start_ms: int = 0) -> FrameFactory:
    """Ids and timestamps that are predictable: one millisecond per frame."""
    counter = itertools.count(start_ms + 1)  # distinct factories give distinct ids
    ms = itertools.count(start_ms)
    return FrameFactory(
        SESSION,
        new_id=lambda: f"00000000-0000-4000-8000-{next(counter):012d}",
        clock=lambda: f"2026-11-29T21:00:{(m := next(ms)) // 1000:02d}.{m % 1000:03d}Z",
    )


def call_result(tool: str, status: str, output: str = "") -> F.InvokeResult:
    """The result of the open call (``CALL``), as text."""
    return F.InvokeResult(
        invocation_id=CALL, tool_name=tool, status=status, output=output, output_type="text"
    )


def asked(kind: str, timeout_sec: int) -> F.InteractionRequest:
    """The question ``ASK``, with no options to choose from."""
    return F.InteractionRequest(
        interaction_id=ASK,
        interaction_type=kind,
        question_text="?",
        timeout_sec=timeout_sec,
        options=[],
    )


def open_session(view: MasterView, gw: FrameFactory) -> list[F.Frame]:
    """A turn caught mid-flight: text and thinking streaming, a tool call and a question open."""
    frames = [
        gw.frame(F.TurnStart(turn_id=TURN, turn_index=0, mode="default"), turn_id=TURN),
        gw.frame(F.StateChanged(previous_state="idle", current_state="thinking"), turn_id=TURN),
        gw.frame(F.ThinkingDelta(content_index=0, text="hm"), turn_id=TURN),
        gw.frame(F.TextDelta(content_index=1, text="Hello, "), turn_id=TURN),
        gw.frame(F.TextDelta(content_index=1, text="wor"), turn_id=TURN),
        gw.frame(
            F.InvokeRequest(invocation_id=CALL, tool_name="Bash", input={"command": "rm x"}),
            turn_id=TURN,
        ),
        gw.frame(
            F.InteractionRequest(
                interaction_id=ASK,
                interaction_type="PERMISSION",
                question_text="Allow Bash?",
                timeout_sec=60,
                options=[F.InteractionOption(value="allow", label="Allow")],
                context=F.InteractionContext(tool_name="Bash"),
            ),
            turn_id=TURN,
        ),
    ]
    for frame in frames:
        assert view.apply(frame)
    return frames


def history_payload(
    frames: list[F.Frame], *, truncated: bool = False, lost: int | None = None
) -> F.History:
    return F.History(
        frames=[msgspec.Raw(codec.encode(f)) for f in frames],
        buffer_status=F.BufferStatus(
            policy_applied="RING", truncated=truncated, lost_frame_count=lost
        ),
        last_sync_timestamp=frames[-1].timestamp if frames else "2026-11-29T21:00:00.000Z",
        last_message_id=frames[-1].message_id if frames else "",
    )


def by_type(frames: list[F.Frame]) -> dict[str, F.Payload]:
    return {f.TYPE: f.payload for f in frames}


# --------------------------------------------------------------------------- finalize


def test_DPS_7_8_finalize_closes_everything_open_with_synthetic_frames():
    """DPS-7.8-finalize: blocks finalised, calls cancelled "Connection lost", turn disconnected."""
    view = MasterView(SESSION, factory=make_factory(5000))
    open_session(view, make_factory())
    made = view.finalize()

    assert made and all(is_synthetic(f) for f in made)
    payloads = by_type(made)
    assert set(payloads) == {
        "agent.thinking.done",
        "agent.text.done",
        "tool.invoke.result",
        "session.turn.end",
        "agent.state.changed",
    }
    # Text is kept as far as it was received.
    assert payloads["agent.text.done"] == F.TextDone(content_index=1, full_text="Hello, wor")
    result = payloads["tool.invoke.result"]
    assert isinstance(result, F.InvokeResult)
    assert (result.invocation_id, result.tool_name, result.status, result.output) == (
        CALL,
        "Bash",
        "cancelled",
        SYNTHETIC_OUTPUT,
    )
    assert payloads["session.turn.end"].stop_reason == "disconnected"
    assert payloads["agent.state.changed"].current_state == "idle"
    # The synthetic frames belong to the turn they close, so a UI can group them.
    assert all(f.turn_id == TURN for f in made if f.TYPE != "agent.state.changed")

    # Pending interactions are dropped and nothing is open any more.
    assert view.pending_interactions == []
    assert view.open_calls == [] and view.open_blocks == 0
    assert view.turn_id is None and view.agent_state == "idle"
    assert view.finalized
    assert view.transcript[-len(made) :] == made


def test_DPS_7_8_finalize_synthetic_flag_is_on_the_envelope_metadata():
    """DPS-7.8-finalize: ``synthetic: true`` is in the envelope's ``metadata``, also on the wire."""
    view = MasterView(SESSION)
    open_session(view, make_factory())
    for frame in view.finalize():
        wire = msgspec.json.decode(codec.encode(frame))
        assert wire["metadata"]["synthetic"] is True
        assert wire["session_id"] == SESSION


def test_DPS_7_8_finalize_keeps_subagent_context_on_synthetic_frames():
    view = MasterView(SESSION)
    gw = make_factory()
    ctx = {"parent_invocation_id": CALL, "agent_type": "Explore", "depth": 1}
    view.apply(
        gw.frame(F.TextDelta(content_index=0, text="inner"), metadata={"subagent_context": ctx})
    )
    view.apply(gw.frame(F.TextDelta(content_index=0, text="outer")))
    made = view.finalize()
    assert sorted(f.payload.full_text for f in made) == ["inner", "outer"]
    inner = next(f for f in made if f.payload.full_text == "inner")
    assert inner.metadata == {"synthetic": True, "subagent_context": ctx}


def test_DPS_7_8_finalize_with_nothing_open_makes_nothing():
    view = MasterView(SESSION)
    gw = make_factory()
    for payload in (
        F.TurnStart(turn_id=TURN, turn_index=0),
        F.TextDelta(content_index=0, text="hi"),
        F.TextDone(content_index=0, full_text="hi"),
        F.InvokeRequest(invocation_id=CALL, tool_name="Glob", input={}),
        call_result("Glob", "success", output="a"),
        F.TurnEnd(turn_id=TURN, stop_reason="end_turn"),
    ):
        view.apply(gw.frame(payload, turn_id=TURN))
    assert view.finalize() == []


def test_answered_interaction_is_no_longer_pending():
    """Our own response (or one relayed from another master) closes the question."""
    view = MasterView(SESSION)
    open_session(view, make_factory())
    me = make_factory(9000)
    view.apply(me.frame(F.InteractionResponse(interaction_id=ASK, selected_value="allow")))
    assert view.pending_interactions == []


def test_duplicate_frames_are_applied_once():
    view = MasterView(SESSION)
    frame = make_factory().frame(F.TextDelta(content_index=0, text="a"))
    assert view.apply(frame) is True
    assert view.apply(frame) is False
    assert len(view.transcript) == 1


# --------------------------------------------------------------------------- unfinalize


def test_DPS_7_8_unfinalize_removes_synthetic_frames_and_replays_history():
    """DPS-7.8-unfinalize: synthetic frames go, what was open is restored, history replays."""
    gw = make_factory()
    view = MasterView(SESSION, factory=make_factory(50_000))
    before = open_session(view, gw)
    view.finalize()

    missed = [
        gw.frame(F.InteractionResponse(interaction_id=ASK, selected_value="allow"), turn_id=TURN),
        gw.frame(F.TextDelta(content_index=1, text="ld"), turn_id=TURN),
        gw.frame(F.TextDone(content_index=1, full_text="Hello, world"), turn_id=TURN),
        gw.frame(
            call_result("Bash", "success"),
            turn_id=TURN,
        ),
    ]
    outcome = view.history(history_payload(missed))

    assert outcome.unfinalized and outcome.reason is None
    assert outcome.applied == missed
    assert not any(is_synthetic(f) for f in view.transcript)
    assert view.transcript == before + missed
    # The turn was never really over: it is open again; the call got its real result.
    assert view.turn_id == TURN
    assert view.open_calls == []
    assert view.pending_interactions == []
    assert view.agent_state == "thinking"
    assert not view.finalized


def test_DPS_7_8_unfinalize_restores_a_pending_question_still_unanswered():
    view = MasterView(SESSION)
    open_session(view, make_factory())
    view.finalize()
    assert view.pending_interactions == []
    view.history(history_payload([]))
    assert [f.payload.interaction_id for f in view.pending_interactions] == [ASK]
    assert view.open_calls == [CALL]


def test_DPS_7_8_unfinalize_not_when_truncated():
    """DPS-7.8-unfinalize: a truncated buffer means loss; the finalisation stands."""
    gw = make_factory()
    view = MasterView(SESSION)
    open_session(view, gw)
    made = view.finalize()
    missed = [gw.frame(F.TurnEnd(turn_id=TURN, stop_reason="end_turn"), turn_id=TURN)]
    outcome = view.history(history_payload(missed, truncated=True, lost=12))

    assert not outcome.unfinalized
    assert outcome.reason == "truncated" and outcome.lost_frame_count == 12
    assert outcome.frames == missed and outcome.applied == []
    assert view.transcript[-len(made) :] == made  # synthetic frames kept
    assert view.turn_id is None and view.open_calls == []
    assert view.finalized


def test_DPS_7_8_unfinalize_not_when_history_holds_session_deleted():
    """DPS-7.8-unfinalize: a deleted session is not recovered; the deletion is recorded."""
    gw = make_factory()
    view = MasterView(SESSION)
    open_session(view, gw)
    made = view.finalize()
    deleted = F.Deleted(session_id=SESSION, reason="timeout", deleted_by="system")
    missed = [
        gw.frame(
            call_result("Bash", "cancelled"),
            turn_id=TURN,
        ),
        gw.frame(F.TurnEnd(turn_id=TURN, stop_reason="error"), turn_id=TURN),
        gw.frame(deleted),
    ]
    outcome = view.history(history_payload(missed))

    assert not outcome.unfinalized and outcome.reason == "deleted"
    assert view.deleted == deleted
    assert all(f in view.transcript for f in made)
    assert view.finalized


def test_DPS_7_8_unfinalize_twice_lost_connection_restores_everything():
    """Two losses before a history arrives: everything either one closed comes back."""
    gw = make_factory()
    view = MasterView(SESSION)
    open_session(view, gw)
    view.finalize()
    other = "c0ffee00-0000-4000-8000-000000000003"
    view.apply(gw.frame(F.InvokeRequest(invocation_id=other, tool_name="Read", input={})))
    view.finalize()
    view.history(history_payload([]))
    assert sorted(view.open_calls) == sorted([CALL, other])
    assert not any(is_synthetic(f) for f in view.transcript)


def test_DPS_2_3_history_order_by_timestamp_then_message_id():
    """DPS-2.3-history-order: replay sorts by timestamp, then message_id, whatever the order."""

    def at(ts: str, mid: str, text: str) -> F.Frame:
        return F.FRAME_CLASSES["agent.text.delta"](
            v=1,
            message_id=mid,
            timestamp=ts,
            session_id=SESSION,
            payload=F.TextDelta(content_index=0, text=text),
        )

    a = at("2026-11-29T21:00:00.001Z", "00000000-0000-4000-8000-00000000000b", "a")
    b = at("2026-11-29T21:00:00.001Z", "00000000-0000-4000-8000-00000000000c", "b")
    # The same instant as 21:00:00.002Z written with another offset: ordered as an instant.
    c = at("2026-11-30T06:00:00.002+09:00", "00000000-0000-4000-8000-00000000000a", "c")
    d = at("2026-11-29T21:00:00.010Z", "00000000-0000-4000-8000-000000000001", "d")
    assert history_order([d, c, b, a]) == [a, b, c, d]

    view = MasterView(SESSION)
    outcome = view.history(history_payload([d, b, c, a]))
    assert outcome.applied == [a, b, c, d]
    texts = "".join(f.payload.text for f in view.transcript)
    assert texts == "abcd"


def test_DPS_2_3_history_order_ties_never_leave_closed_things_open():
    """DPS-2.3-history-order sorts same-millisecond frames by message_id, which can put a closer
    before its opener (a result before its request); the view still ends with nothing open."""
    same_ms = "2026-11-29T21:00:00.005Z"
    ids = iter(f"00000000-0000-4000-8000-{n:012d}" for n in range(99, 0, -1))  # falling ids

    def at(payload: F.Payload) -> F.Frame:
        cls = F.FRAME_CLASSES[payload.TYPE]
        return cls(
            v=1,
            message_id=next(ids),
            timestamp=same_ms,
            session_id=SESSION,
            turn_id=TURN,
            payload=payload,
        )

    produced = [
        at(F.TurnStart(turn_id=TURN, turn_index=0)),
        at(F.ThinkingDelta(content_index=0, text="hm")),
        at(F.ThinkingDone(content_index=0)),
        at(F.TextDelta(content_index=1, text="hi")),
        at(F.TextDone(content_index=1, full_text="hi")),
        at(F.InvokeRequest(invocation_id=CALL, tool_name="Glob", input={})),
        at(asked("YN", timeout_sec=1)),
        at(F.InteractionTimeout(interaction_id=ASK)),
        at(call_result("Glob", "success")),
        at(F.TurnEnd(turn_id=TURN, stop_reason="end_turn")),
    ]
    replayed = history_order(produced)
    assert replayed == produced[::-1]  # every closer now comes before its opener

    view = MasterView(SESSION)
    outcome = view.history(history_payload(produced))
    assert outcome.applied == replayed
    assert view.turn_id is None and view.open_calls == [] and view.open_blocks == 0
    assert view.pending_interactions == []
    assert view.finalize() == []  # nothing made up for things that really ended


def test_a_new_block_with_an_index_reused_in_a_later_turn_opens():
    gw = make_factory()
    view = MasterView(SESSION)
    view.apply(gw.frame(F.TextDelta(content_index=0, text="a"), turn_id=TURN))
    view.apply(gw.frame(F.TextDone(content_index=0), turn_id=TURN))
    view.apply(gw.frame(F.TextDelta(content_index=0, text="b"), turn_id="another-turn"))
    assert view.open_blocks == 1


def test_DPS_2_3_history_order_skips_frames_already_seen():
    gw = make_factory()
    view = MasterView(SESSION)
    seen = gw.frame(F.TextDelta(content_index=0, text="x"))
    view.apply(seen)
    new = gw.frame(F.TextDelta(content_index=0, text="y"))
    outcome = view.history(history_payload([seen, new]))
    assert outcome.applied == [new]


def test_history_tolerates_unknown_and_invalid_embedded_frames():
    """DPS-2.2-unknown-type applies inside a history too: skipped, never an error."""
    gw = make_factory()
    good = gw.frame(F.TextDelta(content_index=0, text="ok"))
    unknown = (
        b'{"v":1,"type":"x-other.thing","message_id":"m","timestamp":"2026-11-29T21:00:00.000Z",'
        b'"session_id":"' + SESSION.encode() + b'","payload":{}}'
    )
    payload = history_payload([good])
    payload.frames.insert(0, msgspec.Raw(unknown))
    payload.frames.append(msgspec.Raw(b'{"not": "a frame"}'))
    assert MasterView(SESSION).history(payload).applied == [good]


def test_master_capabilities_announce_every_feature():
    caps = master_capabilities()
    assert caps.protocol_version == "rawp-dps-1.0"
    assert caps.features == ALL_FEATURES
    assert set(caps.supported_namespaces) == {"agent", "tool", "control", "session"}


def test_finalize_leaves_an_idle_agent_alone():
    view = MasterView(SESSION)
    view.apply(
        make_factory().frame(F.StateChanged(previous_state="thinking", current_state="idle"))
    )
    assert view.finalize() == []


# --------------------------------------------------------------------------- Connection


class StubSocket:
    """Just enough of aiohttp's client WebSocket: queued messages in, sent text recorded."""

    def __init__(self, frames: list[F.Frame | bytes]) -> None:
        self.inbox = [
            aiohttp.WSMessage(
                aiohttp.WSMsgType.TEXT,
                (f if isinstance(f, bytes) else codec.encode(f)).decode(),
                None,
            )
            for f in frames
        ]
        self.sent: list[str] = []
        self.closed = False

    async def receive(self) -> aiohttp.WSMessage:
        if self.inbox:
            return self.inbox.pop(0)
        return aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None)

    async def send_str(self, data: str) -> None:
        self.sent.append(data)


async def drain(conn: Connection) -> list[F.Frame]:
    return [f async for f in conn]


async def test_last_message_id_only_names_frames_the_buffer_holds():
    """Reattach after the newest buffered frame: not after per-connection or re-sent frames."""
    gw = make_factory()
    caps = gw.frame(master_capabilities())
    catalog = gw.frame(F.CatalogPublish(tools=[]))
    delta = gw.frame(F.TextDelta(content_index=0, text="a"), turn_id=TURN)
    error = gw.frame(F.SessionError(error_code="PROMPT_IN_PROGRESS", message="busy", fatal=False))
    conn = Connection(StubSocket([catalog, delta, caps, error]), SESSION)
    assert [f.message_id for f in await drain(conn)] == [
        catalog.message_id,
        delta.message_id,
        caps.message_id,
        error.message_id,
    ]
    assert conn.last_message_id == delta.message_id
    assert conn.server_capabilities == caps.payload


async def test_last_message_id_after_a_history_ignores_the_greeting_re_sent_after_it():
    gw = make_factory()
    question = gw.frame(
        asked("PERMISSION", timeout_sec=60),
        turn_id=TURN,
    )
    missed = [gw.frame(F.TextDelta(content_index=0, text="b"), turn_id=TURN)]
    history = gw.frame(history_payload(missed))
    live = gw.frame(F.TextDelta(content_index=0, text="c"), turn_id=TURN)
    # On a reattach the gateway sends the history, then re-sends a pending question (older).
    conn = Connection(StubSocket([history, question]), SESSION, last_message_id="x")
    await drain(conn)
    assert conn.last_message_id == missed[-1].message_id
    conn = Connection(StubSocket([history, question, live]), SESSION, last_message_id="x")
    await drain(conn)
    assert conn.last_message_id == live.message_id


async def test_connection_skips_unknown_types_and_answers_another_envelope_version():
    """DPS-2.2-unknown-type: skipped; DPS-2.1-v: ignored and answered with session.error."""
    unknown = (
        b'{"v":1,"type":"x-other.thing","message_id":"m-1","timestamp":"2026-11-29T21:00:00.000Z",'
        b'"session_id":"' + SESSION.encode() + b'","payload":{}}'
    )
    v2 = unknown.replace(b'"v":1', b'"v":2').replace(b"m-1", b"m-2")
    good = make_factory().frame(F.TextDelta(content_index=0, text="ok"))
    ws = StubSocket([unknown, v2, good, good])
    conn = Connection(ws, SESSION)
    assert await drain(conn) == [good]  # and the duplicate once only (DPS-2.1-idempotent)
    (answer,) = [msgspec.json.decode(m) for m in ws.sent]
    assert answer["type"] == "session.error"
    assert answer["payload"]["error_code"] == "UNSUPPORTED_VERSION"
    assert answer["parent_id"] == "m-2"
