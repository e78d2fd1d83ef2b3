"""Scenarios for the sans-IO session machine: inputs in, the exact ordered actions out.

Theory of operation
-------------------
A test says what happens to one session as one exchange, in the spirit of mitmproxy's Playbook::

    assert (
        Scenario()
        >> start() << spawn() << stdin(CLAUDE.initialize)
        >> prompt("hi") << relayed("control.prompt.request") << turn_start(TURN)
        << stdin(CLAUDE.prompt("hi"))
    )

``>>`` adds an input (an agent line or events, a master's frame, an exit, a timer firing, a
delete, a rename, an attach...); ``<<`` adds what the machine must answer to the input before it,
in order. Asserting the scenario feeds the inputs not fed yet and compares, input by input: an
action too many, one missing or one out of order fails, and the failure prints the whole exchange
so far as a diff of what was expected against what came.

Values the machine makes up (frame, turn, interaction and request ids) are named by a
``Placeholder``: it binds to the value where it is first seen and must equal it everywhere after
(an input can carry one too: ``cancel(TURN)`` sends the bound turn id). Two placeholders never bind
the same value, so ``TURN`` and ``TURN2`` also say that the two turns' ids differ. Bindings live in
the scenario, so module-level placeholders are safe to share between tests.

What is compared: every action but ``Log`` (``logs=True`` keeps those too) and but a
``CancelTimer`` of a timer that is not running, which changes nothing for the shell; the harness
keeps the running timers as the shell does (``Scenario.timers``). A frame is matched on its type,
``to``/``exclude``, and either its whole payload (a payload object) or the payload fields named;
envelope fields (``turn_id``, ``parent_id``, ``metadata``...) are compared when given.

The machine is built with a deterministic ``FrameFactory`` (a seeded random source, a fixed
clock), and it is reached through ``MachineAdapter`` alone: the one place that knows the
machine's method names and its timer keys, so a change of the machine's API is a change there.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, NamedTuple

import msgspec

from gateway.protocol import actions as act
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from gateway.protocol.factory import Clock, FrameFactory, UuidSource
from gateway.protocol.states import TimerKey, TimerKind
from parsers import events as ev
from parsers.base import AgentPlugin
from parsers.base import get as get_parser

__all__ = [
    "ANY",
    "CANCEL_SIGINT",
    "CANCEL_STOP",
    "CLAUDE",
    "REATTACH_WINDOW",
    "SESSION",
    "STALL",
    "Input",
    "MachineAdapter",
    "Partial",
    "Placeholder",
    "Scenario",
    "Timer",
    "attach",
    "budget_notice",
    "cancel",
    "closed",
    "compact",
    "delete",
    "deleted",
    "detach",
    "deterministic_factory",
    "emit",
    "escalation_ends",
    "events",
    "exited",
    "fire",
    "gate",
    "line",
    "master",
    "master_frame",
    "mcp_reasons",
    "plugin_failed",
    "prompt",
    "raw",
    "refused",
    "rejected",
    "relayed",
    "rename",
    "restore",
    "set_policy",
    "spawn",
    "start",
    "stdin",
    "turn_end",
    "turn_start",
]

SESSION: Final = "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
# 2026-12-01T00:00:00Z: the deterministic clock starts here and moves a millisecond a frame.
EPOCH: Final = 1_796_083_200.0


# --- placeholders and matching ----------------------------------------------------------------


class _Any:
    def __repr__(self) -> str:
        return "…"


ANY: Final = _Any()
"""Matches whatever stands there."""


@dataclass(frozen=True)
class Placeholder:
    """A value the machine makes up: bound where first seen, then it must be the same."""

    name: str
    kind: type = str

    def __repr__(self) -> str:
        return f"<{self.name}>"


class Partial:
    """A dict or an object of which only the named fields are compared."""

    def __init__(self, fields: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        self.fields = {**(fields or {}), **more}

    def __repr__(self) -> str:
        return _show({**self.fields, "…": ANY})


class _Mismatch(Exception):
    """Where a value differs from the one expected, and how."""


def _fields_of(obj: Any) -> dict[str, Any] | None:
    if isinstance(obj, msgspec.Struct):
        return {name: getattr(obj, name) for name in obj.__struct_fields__}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return None


def _match(expected: Any, actual: Any, bound: dict[str, Any], path: str) -> None:
    """Compare, binding placeholders into ``bound`` (the caller keeps them only on success)."""
    if expected is ANY:
        return
    if isinstance(expected, Placeholder):
        if expected.name in bound:
            if bound[expected.name] != actual:
                raise _Mismatch(f"{path}: {expected} is {bound[expected.name]!r}, got {actual!r}")
            return
        if not isinstance(actual, expected.kind):
            raise _Mismatch(f"{path}: {expected} wants a {expected.kind.__name__}, got {actual!r}")
        other = next((k for k, v in bound.items() if v == actual), None)
        if other is not None:
            raise _Mismatch(f"{path}: {expected} would be the same value as <{other}>: {actual!r}")
        bound[expected.name] = actual
        return
    if isinstance(expected, _Expectation):
        expected.match(actual, bound, path)
        return
    if isinstance(expected, Partial):
        for key, want in expected.fields.items():
            if isinstance(actual, Mapping):
                if key not in actual:
                    raise _Mismatch(f"{path}.{key}: missing")
                _match(want, actual[key], bound, f"{path}.{key}")
            elif not hasattr(actual, key):
                raise _Mismatch(f"{path}.{key}: missing")
            else:
                _match(want, getattr(actual, key), bound, f"{path}.{key}")
        return
    want_fields = _fields_of(expected)
    if want_fields is not None:
        if type(actual) is not type(expected):
            raise _Mismatch(f"{path}: a {type(expected).__name__} expected, got {actual!r}")
        got = _fields_of(actual) or {}
        for key, want in want_fields.items():
            _match(want, got[key], bound, f"{path}.{key}")
        return
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping) or set(expected) != set(actual):
            raise _Mismatch(f"{path}: {_show(expected)} expected, got {_show(actual)}")
        for key, want in expected.items():
            _match(want, actual[key], bound, f"{path}.{key}")
        return
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            raise _Mismatch(f"{path}: {_show(expected)} expected, got {_show(actual)}")
        for i, (want, got_item) in enumerate(zip(expected, actual, strict=True)):
            _match(want, got_item, bound, f"{path}[{i}]")
        return
    if type(expected) is bool and type(actual) is not bool:
        raise _Mismatch(f"{path}: {expected!r} expected, got {actual!r}")
    if expected != actual:
        raise _Mismatch(f"{path}: {expected!r} expected, got {actual!r}")


def _resolve(value: Any, bound: Mapping[str, Any]) -> Any:
    """An input's value with the placeholders it names replaced by what they are bound to."""
    if isinstance(value, Placeholder):
        if value.name not in bound:
            raise AssertionError(f"{value} is used in an input before any output bound it")
        return bound[value.name]
    if isinstance(value, Mapping):
        return {k: _resolve(v, bound) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, bound) for v in value]
    if isinstance(value, msgspec.Struct):
        fields = {k: getattr(value, k) for k in value.__struct_fields__}
        resolved = {k: _resolve(v, bound) for k, v in fields.items()}
        changed = {k: v for k, v in resolved.items() if v is not fields[k]}
        return msgspec.structs.replace(value, **changed) if changed else value
    if isinstance(value, Timer):
        return Timer(value.name, _resolve(value.id, bound))
    return value


# --- how things are shown in a failure ----------------------------------------------------------


def _show(value: Any, names: Mapping[Any, str] | None = None, limit: int = 60) -> str:
    """A short, stable rendering: structs and dataclasses as dicts without their empty fields,
    bound values by their placeholder's name."""
    names = names or {}
    if isinstance(value, str | int) and not isinstance(value, bool) and value in names:
        return f"<{names[value]}>"
    if isinstance(value, Placeholder | _Any | Partial | _Expectation | Timer):
        return repr(value)
    fields = _fields_of(value)
    if fields is not None:
        fields = {k: v for k, v in fields.items() if v is not None and v != [] and v != {}}
        return type(value).__name__ + _show(fields, names, limit)
    if isinstance(value, Mapping):
        inner = ", ".join(
            (f"{_show(v, names, limit)}" if k == "…" else f"{k}: {_show(v, names, limit)}")
            for k, v in value.items()
        )
        return "{" + inner + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v, names, limit) for v in value) + "]"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _show_action(action: Any, names: Mapping[Any, str]) -> str:
    if isinstance(action, act.Emit):
        frame = action.frame
        return _show_frame(
            frame.TYPE,
            _show(frame.payload, names).removeprefix(type(frame.payload).__name__),
            {"turn_id": frame.turn_id, "parent_id": frame.parent_id, "metadata": frame.metadata},
            action.to,
            action.exclude,
            names,
        )
    if isinstance(action, act.WriteStdin):
        try:
            return "stdin " + _show(json.loads(action.data), names)
        except ValueError:
            return "stdin " + _show(action.data, names)
    return _show(action, names)


def _show_frame(
    type_: str,
    payload: str,
    envelope: Mapping[str, Any],
    to: Any,
    exclude: Any,
    names: Mapping[Any, str],
) -> str:
    parts = [f"emit {type_} {payload}"]
    parts += [f"{k}={_show(v, names)}" for k, v in envelope.items() if v is not None]
    parts += [f"to={to}"] if to is not None else []
    parts += [f"exclude={exclude}"] if exclude is not None else []
    return " ".join(parts)


# --- what the machine must answer -------------------------------------------------------------


class _Expectation:
    """An expected action described in the scenario's terms."""

    def match(self, actual: Any, bound: dict[str, Any], path: str) -> None:
        raise NotImplementedError


class _Frame(_Expectation):
    def __init__(
        self,
        payload: F.Payload | str,
        fields: dict[str, Any],
        envelope: dict[str, Any],
        to: Any,
        exclude: Any,
        where: Callable[[F.Frame], bool] | None = None,
    ) -> None:
        self.payload, self.fields, self.envelope = payload, fields, envelope
        self.to, self.exclude, self.where = to, exclude, where

    @property
    def frame_type(self) -> str:
        return self.payload if isinstance(self.payload, str) else self.payload.TYPE

    def match(self, actual: Any, bound: dict[str, Any], path: str) -> None:
        if not isinstance(actual, act.Emit):
            raise _Mismatch(f"{path}: a frame {self.frame_type} expected")
        frame = actual.frame
        if self.frame_type != frame.TYPE:
            raise _Mismatch(f"{path}: {self.frame_type} expected, got {frame.TYPE}")
        _match(self.to, actual.to, bound, f"{path}.to")
        _match(self.exclude, actual.exclude, bound, f"{path}.exclude")
        if isinstance(self.payload, str):
            _match(Partial(self.fields), frame.payload, bound, f"{path}.payload")
        else:
            _match(self.payload, frame.payload, bound, f"{path}.payload")
        for key, want in self.envelope.items():
            _match(want, getattr(frame, key), bound, f"{path}.{key}")
        if self.where is not None and not self.where(frame):
            raise _Mismatch(f"{path}: not {self.where.__doc__ or self.where.__name__}")

    def __repr__(self) -> str:
        if isinstance(self.payload, str):
            payload = _show({**self.fields, "…": ANY})
        else:
            payload = _show(self.payload).removeprefix(type(self.payload).__name__)
        shown = _show_frame(self.frame_type, payload, self.envelope, self.to, self.exclude, {})
        return shown if self.where is None else f"{shown} where {self.where.__name__}"


def emit(
    payload: F.Payload | str,
    /,
    *,
    to: str | Placeholder | None = None,
    exclude: str | None = None,
    turn_id: Any = ANY,
    parent_id: Any = ANY,
    metadata: Any = ANY,
    message_id: Any = ANY,
    where: Callable[[F.Frame], bool] | None = None,
    **fields: Any,
) -> _Frame:
    """A frame: a payload object (compared whole) or a frame type and the payload fields named.
    ``to``/``exclude`` are compared always; the envelope's fields when given."""
    envelope = {"turn_id": turn_id, "parent_id": parent_id, "metadata": metadata}
    envelope["message_id"] = message_id
    envelope = {k: v for k, v in envelope.items() if v is not ANY}
    if fields and not isinstance(payload, str):
        raise TypeError("payload fields go with a frame type, not with a payload object")
    return _Frame(payload, fields, envelope, to, exclude, where)


class _Stdin(_Expectation):
    def __init__(self, want: Any) -> None:
        self.want = want

    def match(self, actual: Any, bound: dict[str, Any], path: str) -> None:
        if not isinstance(actual, act.WriteStdin):
            raise _Mismatch(f"{path}: a write on the agent's stdin expected")
        if isinstance(self.want, bytes):
            _match(self.want, actual.data, bound, f"{path}.data")
            return
        try:
            got = json.loads(actual.data)
        except ValueError as error:
            raise _Mismatch(f"{path}: not JSON: {actual.data!r}") from error
        _match(self.want, got, bound, f"{path}.data")

    def __repr__(self) -> str:
        return "stdin " + _show(self.want)


def stdin(want: Any = ANY, /, **fields: Any) -> _Stdin:
    """A write on the agent's stdin: bytes as they are, or its JSON (a value, or the fields named)."""
    return _Stdin(Partial(fields) if fields else want)


def spawn(**fields: Any) -> act.Spawn:
    """The agent started: Spawn with the fields given and the defaults for the others."""
    return act.Spawn(**fields)


def refused(code: str, *, to: str = "c1", parent_id: Any = ANY, **fields: Any) -> _Frame:
    """A non-fatal ``session.error`` to the master whose frame is refused (DPS-7.4-error)."""
    return emit("session.error", error_code=code, fatal=False, to=to, parent_id=parent_id, **fields)


_REFUSED: Final = itertools.count(1)


def rejected(step: Input, code: str, **fields: Any) -> list[Any]:
    """A master's control frame refused: relayed to the other masters as any is (DPS-2.4-relay),
    then the error to its sender alone, about that frame (``parent_id``)."""
    args = step.args
    mid = args["mid"] or f"refused-{next(_REFUSED)}"  # a frame seen once is not acted on twice
    sent = Input(step.kind, {**args, "mid": mid}, step.shown)
    error = refused(code, to=args["conn"], parent_id=mid, **fields)
    return [sent, relayed(args["type"], args["conn"]), error]


def relayed(type_: str, conn: str = "c1", **fields: Any) -> _Frame:
    """A master's control frame relayed to every other connection (DPS-2.4-relay)."""
    return emit(type_, exclude=conn, **fields)


def turn_start(turn: Placeholder, index: int = 0, mode: str = "default") -> _Frame:
    """DPS-7.5.1-start, carrying its turn's id (DPS-2.1-turn-id)."""
    return emit(F.TurnStart(turn_id=turn, turn_index=index, mode=mode), turn_id=turn)  # type: ignore[arg-type]


def turn_end(
    turn: Placeholder, reason: str = "end_turn", tools: int = 0, *, settles: str | None = "thinking"
) -> list[_Frame]:
    """DPS-7.5.2-end, then the turn's usage right after it (DPS-7.5.2-usage), then the agent's
    state back to idle from ``settles`` (None: it was idle already, nothing is said)."""
    end = F.TurnEnd(turn_id=turn, stop_reason=reason, tool_invocation_count=tools)  # type: ignore[arg-type]
    out = [emit(end, turn_id=turn), emit("session.usage", turn_id=turn)]
    if settles is not None:
        idle = F.StateChanged(previous_state=settles, current_state="idle", reason="turn_end")  # type: ignore[arg-type]
        out.append(emit(idle, turn_id=turn))
    return out


def deleted(reason: str = "master_request", by: str = "master") -> list[Any]:
    """The session's end (DPS-7.7-deleted): ``session.deleted``, then every connection closed."""
    payload = F.Deleted(session_id=SESSION, reason=reason, deleted_by=by)  # type: ignore[arg-type]
    return [emit(payload), act.CloseAll(f"session deleted ({reason})")]


# The claude-code agent's stdin lines as its input writes them, and scenario steps built of them.
class _Claude:
    initialize: ClassVar = Partial(type="control_request", request={"subtype": "initialize"})
    interrupt: ClassVar = Partial(type="control_request", request={"subtype": "interrupt"})
    result: ClassVar = {"type": "result", "subtype": "success", "is_error": False}  # a turn's end

    @staticmethod
    def prompt(text: str) -> dict[str, Any]:
        return {"type": "user", "message": {"role": "user", "content": text}}

    @staticmethod
    def answer(behavior: str, **more: Any) -> Partial:
        """The answer to a permission, whole (``message`` or ``updatedInput`` as it is sent)."""
        answer = {"behavior": behavior, **more}
        return Partial(type="control_response", response=Partial(response=answer))

    @staticmethod
    def set_mode(mode: str) -> Partial:
        request = {"subtype": "set_permission_mode", "mode": mode}
        return Partial(type="control_request", request=request)

    # Whole steps of a scenario with a claude-code agent.

    @staticmethod
    def started() -> list[Any]:
        """A claude-code agent started: spawned, and asked for its commands at once."""
        return [start(), spawn(), stdin(_Claude.initialize)]

    @staticmethod
    def introduced(agent_session_id: str, turn: Placeholder | None = None) -> list[Any]:
        """A claude-code agent's init line naming its session: announced (§18.3), with its (empty)
        catalog and commands, in ``turn`` when one runs."""
        init = {"type": "system", "subtype": "init", "session_id": agent_session_id}
        return [
            line(init),
            emit(
                "session.capabilities",
                extensions={"agent_session_id": agent_session_id},
                turn_id=turn,
            ),
            emit("tool.catalog.publish", turn_id=turn),
            emit("agent.commands.publish", turn_id=turn),
        ]

    @staticmethod
    def prompted(
        text: str,
        turn: Placeholder,
        index: int = 0,
        *,
        conn: str = "c1",
        stall_tick: float | None = None,
    ) -> list[Any]:
        """A prompt to a running claude-code agent: relayed, a turn opened (its stall watchdog
        started when on), the prompt written on stdin."""
        watch = [] if stall_tick is None else [STALL.started(stall_tick)]
        return [
            prompt(text, conn=conn),
            relayed("control.prompt.request", conn, prompt_text=text),
            turn_start(turn, index),
            *watch,
            stdin(_Claude.prompt(text)),
        ]

    @staticmethod
    def escalation(sigint_sec: float = 2.0, stop_sec: float = 10.0) -> list[Any]:
        """A long-lived claude-code agent's turn cancelled (DPS-6.1.2-cancel): the interrupt on
        stdin, then the timers of SIGINT and of the stop."""
        return [
            stdin(_Claude.interrupt),
            CANCEL_SIGINT.started(sigint_sec),
            CANCEL_STOP.started(stop_sec),
        ]


CLAUDE: Final = _Claude()


# --- timers --------------------------------------------------------------------------------------


class Timer(NamedTuple):
    """A timer in the scenario's words; ``MachineAdapter`` translates the machine's keys."""

    name: str
    id: Any = None

    def __repr__(self) -> str:
        return f"Timer({self.name}" + (f" {_show(self.id)})" if self.id is not None else ")")

    @staticmethod
    def interaction(interaction_id: Any) -> Timer:
        """A PERMISSION's timeout (DPS-6.2-interaction)."""
        return Timer("interaction", interaction_id)

    def started(self, seconds: float) -> act.StartTimer:
        return act.StartTimer(self, seconds)  # type: ignore[arg-type]

    def cancelled(self) -> act.CancelTimer:
        return act.CancelTimer(self)  # type: ignore[arg-type]


CANCEL_SIGINT: Final = Timer("cancel-sigint")  # SIGINT if the interrupt did not end the turn
CANCEL_STOP: Final = Timer("cancel-stop")  # stop the agent if the turn still runs
STALL: Final = Timer("stall")  # the stall watchdog's tick
REATTACH_WINDOW: Final = Timer("reattach-window")  # no master came back: the session ends


def escalation_ends() -> list[Any]:
    """The turn ended before either step of the escalation was due: both timers cancelled."""
    return [CANCEL_SIGINT.cancelled(), CANCEL_STOP.cancelled()]


# --- inputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    """Something that happens to the session; ``MachineAdapter.feed`` hands it to the machine."""

    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    shown: str = ""

    def __repr__(self) -> str:
        return self.shown or (f"{self.kind} {_show(self.args)}" if self.args else self.kind)


def start() -> Input:
    """The session was created: a long-lived agent starts."""
    return Input("start")


def attach(conn: str = "c1") -> Input:
    return Input("attach", {"conn": conn}, f"attach {conn}")


def detach(conn: str = "c1") -> Input:
    """A master's connection is gone (a machine that keeps the reattach window has ``detached``)."""
    return Input("detach", {"conn": conn}, f"detach {conn}")


def line(data: bytes | str | Mapping[str, Any]) -> Input:
    """A line of the agent's stdout; a mapping is written as JSON when fed, with the placeholders
    it names replaced by their values."""
    if isinstance(data, str):
        data = data.encode()
    return Input("line", {"data": data}, f"agent line {_show(data, limit=90)}")


def events(*agent_events: ev.AgentEvent) -> Input:
    """What the agent's parser made of its output, as events."""
    shown = "agent events " + ", ".join(_show(e) for e in agent_events)
    return Input("events", {"events": list(agent_events)}, shown)


def closed() -> Input:
    """The agent's stdout ended."""
    return Input("closed")


def exited(
    kind: str = "ok",
    returncode: int | None = 0,
    signum: int | None = None,
    stderr: str = "",
    **more: Any,
) -> Input:
    """The agent process ended (``start_error=``, ``limit=`` as the shell reports them)."""
    args = {"kind": kind, "returncode": returncode, "signum": signum, "stderr": stderr, **more}
    return Input("exited", args, f"agent exited {kind} {returncode} {signum or ''}".rstrip())


def plugin_failed(error: Exception, where: str = "feed") -> Input:
    """The session's parser or input raised ``error`` in its method ``where``, where the shell
    called it (the shell feeds the parser itself on the per-line path)."""
    return Input("plugin_failed", {"error": error, "where": where}, f"{where} raises {error!r}")


def fire(timer: Timer) -> Input:
    return Input("fire", {"timer": timer}, f"timer {timer!r} fires")


def delete(reason: str = "master_request", by: str = "master") -> Input:
    return Input("delete", {"reason": reason, "by": by}, f"delete ({reason}, by {by})")


def rename(name: str, by: str = "master") -> Input:
    """A rename through the control plane (PATCH /v1/session)."""
    return Input("rename", {"name": name, "by": by}, f"rename {name!r} (by {by})")


def gate(refusal: tuple[str, str] | None) -> Input:
    """The shell's budgets now refuse every prompt with (code, message), or none (None)."""
    return Input("gate", {"refusal": refusal}, f"prompts gated: {refusal}")


def budget_notice(code: str, message: str, budget: dict[str, Any], *, cancel: bool) -> Input:
    args = {"code": code, "message": message, "budget": budget, "cancel": cancel}
    return Input("budget", args, f"budget notice {code} (cancel: {cancel})")


def set_policy(rules: tuple[Any, ...], role: str | None) -> Input:
    return Input("policy", {"rules": rules, "role": role}, f"policy set ({len(rules)} rules)")


def mcp_reasons(reasons: Mapping[str, str]) -> Input:
    """The shell found why MCP servers failed (it was asked with ``ReadMcpReasons``)."""
    return Input(
        "mcp_reasons", {"reasons": dict(reasons)}, f"MCP failures explained {_show(reasons)}"
    )


def restore(**saved: Any) -> Input:
    """The session read back after a restart (``name``, ``mode``, ``turn_count``...)."""
    return Input("restore", saved, f"restored {_show(saved)}")


def master(
    type_: str,
    payload: Mapping[str, Any] | None = None,
    *,
    conn: str = "c1",
    mid: str | None = None,
    user: str | None = None,
    **envelope: Any,
) -> Input:
    """A frame a master sends. Its payload may name placeholders (sent as their values);
    ``mid``: its message_id (else a fresh one), for the ``parent_id`` of the answer."""
    args = {"type": type_, "payload": dict(payload or {}), "conn": conn, "mid": mid}
    args.update(user=user, envelope=envelope)
    return Input("master", args, f"{conn} sends {type_} {_show(payload or {})}")


def master_frame(
    type_: str,
    payload: Mapping[str, Any],
    mid: str = "m-1",
    session_id: str = SESSION,
    **envelope: Any,
) -> bytes:
    """A master's frame as it comes over the wire."""
    frame = {
        "v": 1,
        "type": type_,
        "message_id": mid,
        "timestamp": "2026-12-01T00:00:00.000Z",
        "session_id": session_id,
        "payload": payload,
        **envelope,
    }
    return msgspec.json.encode(frame)


def raw(data: bytes | str, conn: str = "c1") -> Input:
    """Bytes a master sends, as they are."""
    return Input("raw", {"data": data, "conn": conn}, f"{conn} sends {_show(data)}")


def prompt(text: str, *, conn: str = "c1", mid: str | None = None, **payload: Any) -> Input:
    return master("control.prompt.request", {"prompt_text": text, **payload}, conn=conn, mid=mid)


def cancel(turn: Any, *, conn: str = "c1", mid: str | None = None, **payload: Any) -> Input:
    return master("control.prompt.cancel", {"target_turn_id": turn, **payload}, conn=conn, mid=mid)


def compact(instruction: str | None = None, *, conn: str = "c1", mid: str | None = None) -> Input:
    payload = {} if instruction is None else {"instruction": instruction}
    return master("control.session.compact", payload, conn=conn, mid=mid)


# --- the machine, reached through one adapter ---------------------------------------------------


def deterministic_factory(session_id: str = SESSION, seed: int = 0) -> FrameFactory:
    """Frames with ids from a seeded random source (still UUID v4) and timestamps from a fixed
    clock that moves a millisecond a frame: the same scenario makes the same frames."""
    source = random.Random(seed)
    return FrameFactory(
        session_id,
        new_id=UuidSource(source.randbytes),
        clock=Clock(time=lambda: EPOCH),
    )


class MachineAdapter:
    """The one place that knows ``SessionMachine``'s API: how it is built, which method takes
    each input, and what its timer keys are called. Scenarios say inputs and actions in their own
    words (``Input``, ``Timer``), so a change of the machine's methods or keys is a change here."""

    # The machine's name of each timer (the interaction timer's, before its id).
    _TIMERS: ClassVar[dict[str, Timer]] = {
        "cancel": CANCEL_SIGINT,
        "cancel-kill": CANCEL_STOP,
        "stall": STALL,
        "interaction": Timer("interaction"),
        "reattach-window": REATTACH_WINDOW,
    }

    def __init__(
        self,
        *,
        parser: str = "claude-code",
        session_id: str = SESSION,
        files: Mapping[str, ev.StoredFile] | None = None,
        plugins: Callable[[], AgentPlugin] | None = None,
        **config: Any,
    ) -> None:
        self.session_id = session_id
        # ``plugins``: makes the session's parser and input (else the named parser's), at the
        # start and each time one raised; ``made`` keeps each pair, the session's first first.
        self._plugins = plugins or get_parser(parser).plugin
        self.made: list[AgentPlugin] = []
        first = self._new_plugin()
        self.machine = sm.SessionMachine(
            session_id,
            first.parser,
            first.input,
            sm.SessionConfig(**config),
            factory=deterministic_factory(session_id),
            files=files,
            plugin=first,
            plugins=self._new_plugin,
        )
        self._refusal: tuple[str, str] | None = None
        self._sent = 0

    def _new_plugin(self) -> AgentPlugin:
        plugin = self._plugins()
        self.made.append(plugin)
        return plugin

    def timer_key(self, timer: Timer) -> TimerKey:
        """The machine's key of ``timer``."""
        name = next(k for k, v in self._TIMERS.items() if v.name == timer.name)
        return TimerKey(TimerKind(name), timer.id)

    def timer(self, key: TimerKey) -> Timer:
        """The scenario's ``Timer`` for a key the machine used."""
        return Timer(self._TIMERS[key.kind.value].name, key.interaction_id)

    def feed(self, step: Input, bound: Mapping[str, Any]) -> list[act.Action]:
        m, a = self.machine, _resolve(step.args, bound)
        match step.kind:
            case "start":
                return m.start()
            case "attach":
                return m.attached(a["conn"])
            case "detach":
                return m.detached(a["conn"])  # type: ignore[attr-defined]
            case "line":
                data = a["data"]
                return m.agent_line(data if isinstance(data, bytes) else json.dumps(data).encode())
            case "events":
                return m.agent_events(a["events"])
            case "closed":
                return m.agent_stdout_closed()
            case "exited":
                kind, code, signum, stderr = (
                    a.pop(k) for k in ("kind", "returncode", "signum", "stderr")
                )
                return m.agent_exited(kind, code, signum, stderr, **a)
            case "fire":
                return m.timer_fired(self.timer_key(a["timer"]))
            case "plugin_failed":
                return m.plugin_failed(a["error"], a["where"])
            case "delete":
                return m.delete(a["reason"], a["by"])
            case "rename":
                return m.rename(a["name"], renamed_by=a["by"])
            case "gate":
                self._refusal = a["refusal"]
                m.prompt_gate = lambda: self._refusal
                return []
            case "budget":
                return m.budget_notice(a["code"], a["message"], a["budget"], cancel=a["cancel"])
            case "policy":
                m.set_policy(a["rules"], a["role"])
                return []
            case "restore":
                saved = {"name": None, "mode": "default", "turn_count": 0, "agent_session_id": None}
                m.restore(**{**saved, **a})
                return []
            case "mcp_reasons":
                return m.mcp_reasons(a["reasons"])
            case "master":
                return m.receive(a["conn"], self.encode(a), a["user"])
            case "raw":
                return m.receive(a["conn"], a["data"])
        raise ValueError(f"no such input: {step.kind}")

    def encode(self, a: Mapping[str, Any]) -> bytes:
        self._sent += 1
        mid = a["mid"] or f"{a['conn']}-{self._sent}"
        return master_frame(a["type"], a["payload"], mid, self.session_id, **a["envelope"])

    def normalise(self, action: act.Action) -> Any:
        """An action in the scenario's words (timer keys as ``Timer``)."""
        if isinstance(action, act.StartTimer):
            return act.StartTimer(self.timer(action.key), action.seconds)  # type: ignore[arg-type]
        if isinstance(action, act.CancelTimer):
            return act.CancelTimer(self.timer(action.key))  # type: ignore[arg-type]
        return action


# --- the scenario ---------------------------------------------------------------------------------


@dataclass
class _Row:
    expected: str
    actual: str | None  # None: as expected


class Scenario:
    """One session's exchange: ``>>`` an input, ``<<`` what it must answer; assert it to run."""

    def __init__(self, *, logs: bool = False, **machine: Any) -> None:
        self.adapter = MachineAdapter(**machine)
        self.logs = logs
        self.bound: dict[str, Any] = {}
        self._steps: list[Any] = []
        self._done = 0  # steps checked
        self._rows: list[_Row] = []
        self._timers: set[Timer] = set()

    # building

    def __rshift__(self, step: Input | Iterable[Any]) -> Scenario:
        self._steps += [step] if isinstance(step, Input) else list(step)
        return self

    def __lshift__(self, expected: Any) -> Scenario:
        if isinstance(expected, list):
            self._steps += expected
        else:
            self._steps.append(expected)
        if not isinstance(self._steps[0], Input):
            raise TypeError("a scenario begins with an input")
        return self

    # reading

    def __getitem__(self, placeholder: Placeholder) -> Any:
        """The value ``placeholder`` was bound to."""
        return self.bound[placeholder.name]

    @property
    def timers(self) -> frozenset[Timer]:
        """The timers running now, as the shell would keep them."""
        return frozenset(self._timers)

    # running

    def __bool__(self) -> bool:
        __tracebackhide__ = True
        self.run()
        return True

    def run(self) -> None:
        """Feed the inputs not fed yet and compare what each gives; on a difference, fail with
        the exchange so far as a diff."""
        __tracebackhide__ = True
        if self._done < len(self._steps) and not isinstance(self._steps[self._done], Input):
            raise TypeError("outputs must follow their input within one assert")
        while self._done < len(self._steps):
            step = self._steps[self._done]
            end = self._done + 1
            while end < len(self._steps) and not isinstance(self._steps[end], Input):
                end += 1
            self._check(step, self._steps[self._done + 1 : end])
            self._done = end

    def _check(self, step: Input, expected: list[Any]) -> None:
        __tracebackhide__ = True
        self._rows.append(_Row(f">> {step!r}", None))
        actual = self._actions(step)
        problem: str | None = None
        for i in range(max(len(expected), len(actual))):
            want = expected[i] if i < len(expected) else None
            got = actual[i] if i < len(actual) else None
            trial = dict(self.bound)
            try:
                if want is None:
                    raise _Mismatch("an action more than expected")
                if got is None:
                    raise _Mismatch("an action expected, none came")
                _match(want, got, trial, "action")
            except _Mismatch as mismatch:
                problem = problem or f"after {step!r}: {mismatch}"
                shown = None if want is None else f"<< {_show(want)}"
                came = None if got is None else f"<< {self._show(got)}"
                self._rows.append(_Row(shown or "", came or ""))
                continue
            self.bound = trial
            self._rows.append(_Row(f"<< {_show(want)}", None))
        if problem is not None:
            raise AssertionError(self._report(problem))

    def _actions(self, step: Input) -> list[Any]:
        if step.kind == "fire":  # it fired: no longer running
            self._timers.discard(_resolve(step.args["timer"], self.bound))
        out: list[Any] = []
        for action in self.adapter.feed(step, self.bound):
            action = self.adapter.normalise(action)
            if isinstance(action, act.Log) and not self.logs:
                continue
            if isinstance(action, act.StartTimer):
                self._timers.add(action.key)  # type: ignore[arg-type]
            elif isinstance(action, act.CancelTimer):
                if action.key not in self._timers:
                    continue  # nothing runs under that key: the shell has nothing to do
                self._timers.discard(action.key)  # type: ignore[arg-type]
            out.append(action)
        return out

    def _show(self, action: Any) -> str:
        names = {v: k for k, v in self.bound.items() if isinstance(v, str | int)}
        return _show_action(action, names)

    def _report(self, problem: str) -> str:
        expected = [r.expected for r in self._rows if r.expected]
        actual = [r.expected if r.actual is None else r.actual for r in self._rows]
        diff = difflib.unified_diff(
            expected, [a for a in actual if a], "expected", "actual", n=len(self._rows), lineterm=""
        )
        bound = ", ".join(f"<{k}> = {v!r}" for k, v in self.bound.items()) or "none"
        return f"scenario differs {problem}\n" + "\n".join(diff) + f"\nbound: {bound}"
