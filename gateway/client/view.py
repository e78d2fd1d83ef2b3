"""The master's view of a session and the master-side rules of §7.8, with no I/O at all.

``MasterView``, fed frames (received, or sent by us), tracks open text/thinking blocks, open tool
calls, the open turn, pending interactions and the agent state. ``finalize()`` (the socket closed
or failed) closes everything locally and returns the synthetic frames it made, each with
``metadata.synthetic: true`` (DPS-7.8-finalize). ``history(payload)`` (after a reattach) removes
those synthetic frames, restores what was open and replays the history ordered by ``timestamp``
then ``message_id`` (DPS-2.3-history-order, DPS-7.8-unfinalize), except when the buffer was
truncated or the history holds ``session.deleted``: then the finalisation stands. Because that
order shuffles frames of one millisecond (message ids are random), an opening frame never
reopens what a frame of the same or a later timestamp already closed.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, cast

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.factory import FrameFactory

log = logging.getLogger(__name__)

SYNTHETIC_OUTPUT: Final = "Connection lost"  # §7.8.1: the output of a synthesised cancelled result
DISCONNECTED: Final = "disconnected"  # §7.8.1: the stop_reason of a turn ended by finalisation


def payload_of(frame: F.Frame) -> F.Payload:
    """A frame's payload: every concrete frame class has one, the ``Frame`` base declares none."""
    return frame.payload


def is_synthetic(frame: F.Frame) -> bool:
    """True for a frame this master made up locally during finalisation (§7.8.1)."""
    return bool(frame.metadata and frame.metadata.get("synthetic") is True)


def timestamp_key(ts: str) -> _dt.datetime:
    try:
        t = _dt.datetime.fromisoformat(ts)
    except ValueError:
        return _dt.datetime.max.replace(tzinfo=_dt.UTC)  # unparseable: after everything else
    # A timestamp without an offset is taken as UTC, so naive and aware ones compare.
    return t if t.tzinfo else t.replace(tzinfo=_dt.UTC)


def history_order(frames: Iterable[F.Frame]) -> list[F.Frame]:
    """``frames`` ordered by ``timestamp``, then ``message_id`` (DPS-2.3-history-order).

    Timestamps are compared as instants, not strings, so ``+09:00`` and ``Z`` forms interleave
    correctly; ``message_id`` breaks ties between frames of the same millisecond.
    """
    return sorted(frames, key=lambda f: (timestamp_key(f.timestamp), f.message_id))


def decode_history(payload: F.History) -> list[F.Frame]:
    """The frames embedded in a ``session.history``, decoded; invalid and unknown ones skipped."""
    out: list[F.Frame] = []
    for raw in payload.frames:
        result = codec.decode(bytes(raw))
        if isinstance(result, codec.Accepted):
            out.append(result.frame)
        else:
            log.info("skipping a history frame: %s", result)
    return out


# (turn_id, parent_invocation_id of a subagent or None, content_index): content indexes count
# per turn, and a subagent's blocks are its own.
_BlockKey = tuple[str | None, str | None, int]


def _block_key(frame: F.Frame, content_index: int) -> _BlockKey:
    ctx = (frame.metadata or {}).get("subagent_context")
    parent = ctx.get("parent_invocation_id") if isinstance(ctx, dict) else None
    return (frame.turn_id, parent, content_index)


@dataclass
class _Open:
    """Everything that is open at a moment: what finalisation closes and unfinalisation reopens."""

    text: dict[_BlockKey, tuple[F.Frame, list[str]]] = field(default_factory=dict)
    thinking: dict[_BlockKey, tuple[F.Frame, list[str]]] = field(default_factory=dict)
    calls: dict[str, F.Frame] = field(default_factory=dict)  # invocation_id -> request frame
    interactions: dict[str, F.Frame] = field(default_factory=dict)  # interaction_id -> request
    turn: F.Frame | None = None  # the session.turn.start of the open turn
    agent_state: str = "idle"

    def merge(self, other: _Open) -> None:
        self.text.update(other.text)
        self.thinking.update(other.thinking)
        self.calls.update(other.calls)
        self.interactions.update(other.interactions)
        self.turn = other.turn or self.turn
        if other.agent_state != "idle":
            self.agent_state = other.agent_state


@dataclass(frozen=True, slots=True)
class HistoryOutcome:
    """What ``MasterView.history`` did.

    ``unfinalized`` is False when the finalisation stands (``reason`` ``"truncated"`` or
    ``"deleted"``); ``frames`` is the history in replay order either way, for display;
    ``applied`` are those that changed the view (duplicates of frames already seen are not).
    """

    unfinalized: bool
    reason: str | None
    frames: list[F.Frame]
    applied: list[F.Frame]
    lost_frame_count: int | None = None


class MasterView:
    """A master's state of one session, and the §7.8 finalisation rules. Sans-IO.

    ``apply(frame)`` for every frame received or sent; ``finalize()`` when the socket closes or
    fails; ``history(payload)`` when a reattach brings ``session.history``. ``transcript`` is every
    applied frame in order, synthetic ones included until unfinalisation removes them.
    """

    def __init__(self, session_id: str, *, factory: FrameFactory | None = None) -> None:
        self.session_id = session_id
        self.factory = factory or FrameFactory(session_id)
        self.transcript: list[F.Frame] = []
        self.mode: str | None = None
        self.deleted: F.Deleted | None = None
        self.last_usage: F.Usage | None = None
        self._open = _Open()
        self._finalized: _Open | None = None  # what finalisation closed, until unfinalisation
        self._seen = codec.SeenWindow(65536)
        # What real frames closed, and when (bounded: only recent closures can be out of order).
        self._closed: OrderedDict[tuple[Any, ...], _dt.datetime] = OrderedDict()
        self._closed_capacity = 4096
        self._late: OrderedDict[str, None] = OrderedDict()  # answers that came too late

    # -- what is open, for a UI

    @property
    def turn_id(self) -> str | None:
        turn = self._open.turn
        if turn is None:
            return None
        start = payload_of(turn)
        assert isinstance(start, F.TurnStart)
        return start.turn_id

    @property
    def agent_state(self) -> str:
        return self._open.agent_state

    @property
    def open_calls(self) -> list[str]:
        return list(self._open.calls)

    @property
    def pending_interactions(self) -> list[F.Frame]:
        return list(self._open.interactions.values())

    def changed_nothing(self, frame: F.Frame) -> bool:
        """True for an answer (or timeout) applied after its question was settled: the session
        refused it (``INTERACTION_NOT_FOUND``) and the first answer stands."""
        return frame.message_id in self._late

    @property
    def open_blocks(self) -> int:
        return len(self._open.text) + len(self._open.thinking)

    @property
    def finalized(self) -> bool:
        return self._finalized is not None

    # -- transitions

    def apply(self, frame: F.Frame) -> bool:
        """Take one frame into the view. False (and no change) for a frame applied before.

        Opening frames (a delta, a tool request, a question, a turn start) never reopen what a
        frame with the same or a later timestamp already closed. In order that cannot happen;
        in a history replayed by timestamp then message_id (DPS-2.3-history-order) it does
        whenever an opener and its closer share a millisecond and the ids sort them the other way
        round, and without this rule the view would be left with a call, block or turn open that
        the gateway closed long ago.
        """
        if not self._seen.first_time(frame.message_id):
            return False
        self.transcript.append(frame)
        o = self._open
        p = payload_of(frame)
        if isinstance(p, F.TextDelta | F.ThinkingDelta):
            blocks = o.text if isinstance(p, F.TextDelta) else o.thinking
            key = _block_key(frame, p.content_index)
            if key in blocks:
                blocks[key][1].append(p.text)
            elif not self._closed_since((p.TYPE, *key), frame):
                blocks[key] = (frame, [p.text])
        elif isinstance(p, F.TextDone | F.ThinkingDone):
            blocks = o.text if isinstance(p, F.TextDone) else o.thinking
            key = _block_key(frame, p.content_index)
            blocks.pop(key, None)
            delta = F.TextDelta.TYPE if isinstance(p, F.TextDone) else F.ThinkingDelta.TYPE
            self._close((delta, *key), frame)
        elif isinstance(p, F.InvokeRequest):
            if not self._closed_since(("call", p.invocation_id), frame):
                o.calls[p.invocation_id] = frame
        elif isinstance(p, F.InvokeResult):
            o.calls.pop(p.invocation_id, None)
            self._close(("call", p.invocation_id), frame)
        elif isinstance(p, F.InteractionRequest):
            if not self._closed_since(("ask", p.interaction_id), frame):
                o.interactions[p.interaction_id] = frame
        elif isinstance(p, F.InteractionResponse | F.InteractionTimeout):
            # Ours or relayed from another master (§2.4): either way nobody needs to ask again.
            asked = ("ask", p.interaction_id)
            if o.interactions.pop(p.interaction_id, None) is None and asked in self._closed:
                # Settled before (answered, timed out, its turn over): every control is relayed
                # (DPS-2.4-relay), the refused ones too, so this one changed nothing.
                self._late[frame.message_id] = None
                if len(self._late) > self._closed_capacity:
                    self._late.popitem(last=False)
            self._close(asked, frame)
        elif isinstance(p, F.TurnStart):
            if not self._closed_since(("turn", p.turn_id), frame):
                o.turn = frame
            if p.mode is not None:
                self.mode = p.mode
        elif isinstance(p, F.TurnEnd):
            if self.turn_id == p.turn_id:
                o.turn = None
            self._close(("turn", p.turn_id), frame)
            # The turn is over, so nothing of it can still be asked.
            for iid, req in list(o.interactions.items()):
                if req.turn_id == p.turn_id:
                    del o.interactions[iid]
                    self._close(("ask", iid), frame)
        elif isinstance(p, F.StateChanged):
            o.agent_state = p.current_state
        elif isinstance(p, F.Usage):
            if not (frame.metadata or {}).get("subagent_context"):
                self.last_usage = p
        elif isinstance(p, F.Deleted):
            self.deleted = p
        return True

    def _close(self, key: tuple[Any, ...], frame: F.Frame) -> None:
        self._closed[key] = timestamp_key(frame.timestamp)
        self._closed.move_to_end(key)
        if len(self._closed) > self._closed_capacity:
            self._closed.popitem(last=False)

    def _closed_since(self, key: tuple[Any, ...], frame: F.Frame) -> bool:
        """True if ``key`` was closed by a frame no older than ``frame`` (see ``apply``)."""
        closed = self._closed.get(key)
        return closed is not None and timestamp_key(frame.timestamp) <= closed

    def _synth(self, payload: F.Payload, like: F.Frame | None) -> F.Frame:
        metadata: dict[str, Any] = {"synthetic": True}
        ctx = (like.metadata or {}).get("subagent_context") if like is not None else None
        if ctx:
            metadata["subagent_context"] = ctx
        turn_id = like.turn_id if like is not None else None
        return self.factory.frame(payload, turn_id=turn_id, metadata=metadata)

    def finalize(self) -> list[F.Frame]:
        """The connection closed or failed: close everything open locally (DPS-7.8-finalize).

        Returns the synthetic frames made (already in ``transcript``): ``agent.text.done`` /
        ``agent.thinking.done`` for open blocks (text kept as received), ``tool.invoke.result``
        ``cancelled`` with output ``"Connection lost"`` for open calls, ``session.turn.end``
        ``disconnected`` for an open turn, ``agent.state.changed`` to ``idle``. Pending
        interactions are dropped, so nothing waits for an answer. Every synthetic frame carries
        ``metadata.synthetic: true``. Nothing open (or a session already deleted): no frames.
        """
        o = self._open
        made: list[F.Frame] = []
        for (_, _, index), (first, _parts) in o.thinking.items():
            made.append(self._synth(F.ThinkingDone(content_index=index), first))
        for (_, _, index), (first, parts) in o.text.items():
            made.append(
                self._synth(F.TextDone(content_index=index, full_text="".join(parts)), first)
            )
        for request in o.calls.values():
            req = payload_of(request)
            assert isinstance(req, F.InvokeRequest)
            result = F.InvokeResult(
                invocation_id=req.invocation_id,
                tool_name=req.tool_name,
                status="cancelled",
                output=SYNTHETIC_OUTPUT,
                output_type="text",
            )
            made.append(self._synth(result, request))
        if o.turn is not None:
            start = payload_of(o.turn)
            assert isinstance(start, F.TurnStart)
            # "disconnected" is a master-side stop_reason (§7.8.1), not one a gateway sends.
            end = F.TurnEnd(turn_id=start.turn_id, stop_reason=cast(F.StopReason, DISCONNECTED))
            made.append(self._synth(end, o.turn))
        if o.agent_state != "idle":
            changed = F.StateChanged(
                previous_state=o.agent_state, current_state="idle", reason=DISCONNECTED
            )
            made.append(self._synth(changed, None))
        # Remember what was open so that a reattach can put it back (§7.8.3).
        if self._finalized is None:
            self._finalized = o
        else:
            self._finalized.merge(o)
        self._open = _Open()
        for frame in made:
            self._seen.first_time(frame.message_id)
            self.transcript.append(frame)
        return made

    def history(self, payload: F.History) -> HistoryOutcome:
        """A reattach brought ``session.history``: unfinalise and replay (DPS-7.8-unfinalize).

        The history's frames are ordered by ``timestamp`` then ``message_id``
        (DPS-2.3-history-order). Unless the buffer was truncated or the history holds
        ``session.deleted``, the synthetic frames are removed from ``transcript``, what
        finalisation closed is open again, and the frames are applied in that order. Otherwise the
        finalisation stands and nothing is applied (a deleted session is still recorded).
        """
        frames = history_order(decode_history(payload))
        status = payload.buffer_status
        deleted = next(
            (p for p in map(payload_of, frames) if isinstance(p, F.Deleted)),
            None,
        )
        reason = "truncated" if status.truncated else "deleted" if deleted is not None else None
        if reason is not None:
            if deleted is not None:
                self.deleted = deleted
            return HistoryOutcome(False, reason, frames, [], status.lost_frame_count)
        self.transcript = [f for f in self.transcript if not is_synthetic(f)]
        if self._finalized is not None:
            # What is open now (opened after the reattach, before the history) stays open too.
            self._finalized.merge(self._open)
            self._open = self._finalized
            self._finalized = None
        applied = [f for f in frames if self.apply(f)]
        return HistoryOutcome(True, None, frames, applied, status.lost_frame_count)
