"""Parser plugins seen by the session machine (sans-IO): their optional capabilities found once
(``parsers.base.AgentPlugin``), for a duck-typed plugin as the documentation writes one, and a
plugin that raises (``SessionMachine.plugin_failed``): the session ends with ``PARSER_FAILED``."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.protocol import actions as act
from gateway.protocol import frames as F
from gateway.protocol import machine as sm
from parsers import events as ev
from parsers.base import AgentPlugin, NoInput, PromptImage
from parsers.plain import PlainInput, PlainParser

SESSION = "5d0c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "third-party-parsers.md"


class Bug(Exception):
    pass


class DuckInput:
    """An input written against the documented API, naming no class of the gateway: every
    optional capability, and a bug in the methods named in ``raises_in``."""

    accepts_images = True
    sigint_on_cancel = False

    def __init__(self, *raises_in: str) -> None:
        self.raises_in = set(raises_in)
        self.images: list[Sequence[PromptImage]] = []

    def _call(self, method: str, data: bytes) -> bytes:
        if method in self.raises_in:
            raise Bug(f"{method} went wrong")
        return data

    def prompt(self, text: str, *, images: Sequence[PromptImage] = ()) -> bytes | None:
        self.images.append(images)
        return self._call("prompt", text.encode() + b"\n")

    def interrupt(self, request_id: str) -> bytes | None:
        return self._call("interrupt", b"stop\n")

    def permission(self, request_id: str, *, allow: bool, **_: Any) -> bytes | None:
        return self._call("permission", b"yes\n" if allow else b"no\n")

    def set_mode(self, request_id: str, mode: str) -> bytes | None:
        return self._call("set_mode", f"mode {mode}\n".encode())

    def opening(self, resume_id: str | None) -> bytes | None:
        return self._call("opening", b"hello\n")

    def initialize(self, request_id: str) -> bytes | None:
        return self._call("initialize", b"init\n")


class DuckParser(PlainParser):
    """``plain``'s parser with the parser side's optional capabilities, and a bug in ``end`` or
    ``describe_exit`` when asked."""

    def __init__(self, *raises_in: str) -> None:
        super().__init__()
        self.raises_in = set(raises_in)
        self.workspace: str | None = None

    def end(self) -> list[ev.AgentEvent]:
        if "end" in self.raises_in:
            raise Bug("end went wrong")
        return super().end()

    def describe_exit(self, returncode: int) -> tuple[str, str] | None:
        if "describe_exit" in self.raises_in:
            raise Bug("describe_exit went wrong")
        return ("MY_EXIT", f"my agent exited {returncode}")

    def set_workspace(self, workspace: str) -> None:
        self.workspace = workspace


def machine(parser: Any = None, agent_input: Any = None, **config: Any) -> sm.SessionMachine:
    features = F.Features(plan_mode=True)
    return sm.SessionMachine(
        SESSION,
        parser if parser is not None else PlainParser(),
        agent_input if agent_input is not None else PlainInput(),
        sm.SessionConfig(agent="mine", features=features, **config),
    )


def frame(type_: str, payload: dict[str, Any]) -> str:
    return json.dumps(
        {
            "v": 1,
            "type": type_,
            "message_id": f"m-{type_}-{json.dumps(payload, sort_keys=True)}",
            "timestamp": "2026-11-29T00:00:00.000Z",
            "session_id": SESSION,
            "payload": payload,
        }
    )


def prompt(m: sm.SessionMachine, text: str = "hi") -> list[act.Action]:
    return m.receive("c1", frame("control.prompt.request", {"prompt_text": text}))


def payloads(actions: list[act.Action]) -> list[Any]:
    return [a.frame.payload for a in actions if isinstance(a, act.Emit)]


def parser_failed(actions: list[act.Action]) -> list[F.AgentError]:
    return [
        p
        for p in payloads(actions)
        if isinstance(p, F.AgentError) and p.error_code == "PARSER_FAILED"
    ]


def logged(actions: list[act.Action]) -> list[act.Log]:
    return [a for a in actions if isinstance(a, act.Log) and a.exc is not None]


# --- the capabilities, found once ----------------------------------------------------------------


def test_a_duck_typed_plugin_has_its_capabilities_found_once():
    """What the documentation has always promised: a method or flag of the documented name is the
    capability; the class names nothing of the gateway's."""
    parser, agent_input = DuckParser(), DuckInput()
    plugin = AgentPlugin.of(parser, agent_input)
    assert (plugin.parser, plugin.input) == (parser, agent_input)
    assert plugin.describe_exit == parser.describe_exit
    assert plugin.set_workspace == parser.set_workspace
    assert (plugin.opening, plugin.initialize) == (agent_input.opening, agent_input.initialize)
    assert (plugin.accepts_images, plugin.sigint_on_cancel) == (True, False)
    image = PromptImage("image/png", b"\x89PNG")
    assert plugin.prompt_with_images is not None
    assert plugin.prompt_with_images("look", [image]) == b"look\n"
    assert agent_input.images == [[image]]  # by keyword: this input takes them only so

    bare = AgentPlugin.of(PlainParser(), NoInput())
    assert (bare.describe_exit, bare.set_workspace, bare.opening, bare.initialize) == (None,) * 4
    assert (bare.accepts_images, bare.sigint_on_cancel) == (False, True)


def test_the_machine_uses_the_capabilities_it_was_given():
    m = machine(DuckParser(), DuckInput())
    writes = [a.data for a in m.start() if isinstance(a, act.WriteStdin)]
    assert writes == [b"hello\n", b"init\n"]  # the opening, then the commands asked for
    prompt(m)
    cancel = m.receive(
        "c1",
        frame(
            "control.prompt.cancel", {"target_turn_id": m.turn.turn_id, "reason": "user_cancelled"}
        ),
    )
    assert act.WriteStdin(b"stop\n") in cancel
    # sigint_on_cancel = False: no SIGINT after the interrupt, only the stop if the turn never ends
    keys = [a.key for a in cancel if isinstance(a, act.StartTimer)]
    assert keys == ["cancel-kill"]
    m.agent_events([ev.TurnEnded(stop_reason="cancelled")])
    (exit_error,) = [p for p in payloads(m.agent_exited("error", 3)) if isinstance(p, F.AgentError)]
    assert (exit_error.error_code, exit_error.message) == ("MY_EXIT", "my agent exited 3")


def test_the_documented_example_parser_still_works():
    """The example of docs/third-party-parsers.md, run as it is written there."""
    code = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "my_agent_parser.parser"}
    exec(compile(code.group(1), str(DOCS), "exec"), namespace)
    spec = namespace["SPEC"]
    plugin = spec.plugin()
    assert plugin.describe_exit is None and not plugin.accepts_images
    m = sm.SessionMachine(SESSION, plugin.parser, plugin.input, plugin=plugin)
    m.agent_line(b'{"type": "say", "id": "a", "text": "hi"}')
    out = m.agent_line(b'{"type": "done", "tokens_in": 3, "tokens_out": 4}')
    kinds = [type(p).__name__ for p in payloads(out)]
    assert kinds.index("TurnEnd") < kinds.index("Usage")


# --- a plugin that raises ------------------------------------------------------------------------


def test_DPS_4_4_error_plugin_failed_ends_the_turn_and_the_session_as_a_fatal_error():
    """DPS-4.4-error: a parser that raised gives a fatal, unrecoverable agent.error PARSER_FAILED
    in the turn with the exception's type and message, no trace; the process is stopped, and its
    exit brings the cleanup frames: the turn ends error, the session is deleted (DPS-17.2.2-exit)."""
    m = machine(single_turn_process=False)
    m.start()
    prompt(m)
    turn_id = m.turn.turn_id
    out = m.plugin_failed(Bug("no " + "y" * 1000), "feed")
    (error,) = parser_failed(out)
    assert (error.severity, error.recoverable, error.details.module) == ("fatal", False, "parser")
    assert error.details.trace is None
    assert error.message.startswith("the mine agent's parser raised ")
    assert "test_plugins.Bug in feed: no yyy" in error.message
    assert len(error.message) < 300
    assert next(a.frame.turn_id for a in out if isinstance(a, act.Emit)) == turn_id
    (log,) = logged(out)
    assert log.level == "error" and isinstance(log.exc, Bug)
    assert out[-1] == act.Terminate()
    assert m.turn is not None  # it ends with the cleanup frames, once the agent is gone

    # Lines the dying agent still prints, or its parser raising again: no second error.
    assert parser_failed(m.plugin_failed(Bug("again"), "end")) == []
    exited = m.agent_exited("signal", None, 15)
    kinds = [type(p).__name__ for p in payloads(exited)]
    assert "AgentError" not in kinds
    assert kinds[-1] == "Deleted" and kinds.index("TurnEnd") < kinds.index("Deleted")
    end = next(p for p in payloads(exited) if isinstance(p, F.TurnEnd))
    assert end.stop_reason == "error"
    assert next(p for p in payloads(exited) if isinstance(p, F.Deleted)).reason == "error"
    assert isinstance(exited[-1], act.CloseAll)


def test_plugin_failed_with_no_process_ends_the_session_at_once():
    m = machine(single_turn_process=True)
    out = m.plugin_failed(Bug("boom"), "end")
    assert [type(p).__name__ for p in payloads(out)] == ["AgentError", "Deleted"]
    assert not any(isinstance(a, act.Terminate) for a in out)
    assert m.phase == "terminated"


@pytest.mark.parametrize("method", ["prompt", "interrupt", "permission", "set_mode"])
def test_DPS_4_4_error_an_input_that_raises_ends_the_session(method: str):
    """DPS-4.4-error: the input's bug, in whichever call, is PARSER_FAILED too (``input``)."""
    m = machine(DuckParser(), DuckInput(method))
    m.start()
    if method == "set_mode":
        out = m.receive("c1", frame("control.mode.switch", {"mode": "plan"}))
    else:
        out = prompt(m)
    if method == "interrupt":
        out = m.receive(
            "c1",
            frame(
                "control.prompt.cancel",
                {"target_turn_id": m.turn.turn_id, "reason": "user_cancelled"},
            ),
        )
    if method == "permission":
        out = m.agent_events(
            [ev.PermissionRequest(request_id="r1", tool_name="Bash", input={"command": "ls"})]
        )
        ask = next(p for p in payloads(out) if isinstance(p, F.InteractionRequest))
        answer = {"interaction_id": ask.interaction_id, "selected_value": "allow"}
        out = m.receive("c1", frame("control.interaction.response", answer))
    (error,) = parser_failed(out)
    assert error.message == f"the mine agent's input raised {Bug.__module__}.Bug in {method}: " + (
        f"{method} went wrong"
    )
    assert error.details.module == "input"
    assert act.Terminate() in out
    assert [log.exc.args for log in logged(out)] == [(f"{method} went wrong",)]


@pytest.mark.parametrize("method", ["opening", "initialize"])
def test_an_input_that_raises_when_the_agent_starts_stops_it(method: str):
    m = machine(DuckParser(), DuckInput(method))
    out = m.start()
    assert isinstance(out[0], act.Spawn)
    (error,) = parser_failed(out)
    assert f"in {method}: {method} went wrong" in error.message
    assert out[-1] == act.Terminate()


def test_a_parser_that_raises_at_the_end_of_stdout():
    m = machine(DuckParser("end"), DuckInput())
    m.start()
    prompt(m)
    (error,) = parser_failed(m.agent_stdout_closed())
    assert "parser raised" in error.message and "in end: end went wrong" in error.message


def test_a_parser_that_raises_in_feed_through_agent_line():
    class Raises(PlainParser):
        def feed(self, line: bytes) -> list[ev.AgentEvent]:
            raise KeyError(line)

    m = machine(Raises())
    (error,) = parser_failed(m.agent_line(b"x"))
    assert error.message == "the mine agent's parser raised KeyError in feed: b'x'"


def test_describe_exit_that_raises_keeps_the_generic_exit_error():
    """DPS-17.2.2-exit: the exit is still said (AGENT_EXIT); the bug is only logged."""
    m = machine(DuckParser("describe_exit"), DuckInput())
    m.start()
    out = m.agent_exited("error", 3)
    errors = [p for p in payloads(out) if isinstance(p, F.AgentError)]
    assert [e.error_code for e in errors] == ["AGENT_EXIT"]
    assert [type(log.exc) for log in logged(out)] == [Bug]
