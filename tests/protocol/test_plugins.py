"""Parser plugins seen by the session machine (sans-IO): their optional capabilities found once
(``parsers.base.AgentPlugin``), for a duck-typed plugin as the documentation writes one, and a
plugin that raises (``SessionMachine.plugin_failed``): its turn ends with ``PARSER_FAILED``, the
agent is stopped, and the session goes on with a fresh parser and input. Each told as its scenario
(``tests/support/scenario.py``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.protocol import actions as act
from gateway.protocol import frames as F
from gateway.protocol.states import ProcessState
from parsers import events as ev
from parsers.base import AgentPlugin, NoInput, PromptImage
from parsers.plain import PlainParser
from tests.support.scenario import (
    CANCEL_STOP,
    CLAUDE,
    STALL,
    Placeholder,
    Scenario,
    Timer,
    cancel,
    closed,
    delete,
    deleted,
    emit,
    events,
    exited,
    fire,
    line,
    master,
    plugin_failed,
    prompt,
    relayed,
    spawn,
    start,
    stdin,
    turn_end,
    turn_start,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "third-party-parsers.md"
TURN, TURN2, CALL, ASK = (Placeholder(n) for n in ("TURN", "TURN2", "CALL", "ASK"))
FEATURES = F.Features(plan_mode=True)


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


def ducks(*raises_in: str) -> Scenario:
    """A session of a duck-typed plugin whose parser and input raise in the methods named, each
    fresh pair alike (a plugin's bug is in its code, not in one instance)."""
    return Scenario(
        plugins=lambda: AgentPlugin.of(DuckParser(*raises_in), DuckInput(*raises_in)),
        agent="mine",
        features=FEATURES,
    )


def parser_failed(message: str, module: str = "input", turn: Any = None) -> Any:
    """DPS-4.4-error: ``agent.error`` ``PARSER_FAILED``, severity error and recoverable (the
    session goes on), with no trace: the details name the plugin's part only."""
    error = F.AgentError(
        error_code="PARSER_FAILED",
        message=message,
        severity="error",
        recoverable=True,
        details=F.ErrorDetails(module=module),
    )
    return emit(error, turn_id=turn)


def logged(where: str, error: Exception, agent: str = "claude-code") -> act.Log:
    """The traceback's way to the operator: the log, with the exception itself."""
    fields = {"agent": agent, "method": where, "error": repr(error)[:512]}
    return act.Log("error", "agent plugin raised", fields, exc=error)


def duck_prompted(text: str, turn: Placeholder, index: int = 0) -> list[Any]:
    return [
        prompt(text),
        relayed("control.prompt.request", prompt_text=text),
        turn_start(turn, index),
        stdin(text.encode() + b"\n"),
    ]


DUCK_STARTED = [start(), spawn(), stdin(b"hello\n"), stdin(b"init\n")]


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


def test_DPS_6_1_2_cancel_the_machine_uses_the_capabilities_it_was_given():
    """The opening, then the commands asked for at the start; a cancel writes the interrupt and,
    ``sigint_on_cancel = False``, starts no SIGINT timer, only the stop's (DPS-6.1.2-cancel);
    the parser names the agent's exit code (DPS-17.2.2-exit)."""
    assert (
        ducks()
        >> DUCK_STARTED
        >> duck_prompted("hi", TURN)
        >> cancel(TURN)
        << relayed("control.prompt.cancel")
        << stdin(b"stop\n")
        << CANCEL_STOP.started(10.0)
        >> events(ev.TurnEnded(stop_reason="end_turn"))
        << CANCEL_STOP.cancelled()
        << turn_end(TURN, "cancelled", settles=None)
        >> exited("error", 3)
        << emit("agent.error", error_code="MY_EXIT", message="my agent exited 3", severity="fatal")
        << deleted("error", "client")
    )


def test_the_documented_example_parser_still_works():
    """The example of docs/third-party-parsers.md, run as it is written there: a turn it says,
    its end before its usage (DPS-7.5.2-usage)."""
    code = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "my_agent_parser.parser"}
    exec(compile(code.group(1), str(DOCS), "exec"), namespace)
    spec = namespace["SPEC"]
    plugin = spec.plugin()
    assert plugin.describe_exit is None and not plugin.accepts_images
    assert (
        Scenario(plugins=spec.plugin)
        >> line({"type": "say", "id": "a", "text": "hi"})
        << turn_start(TURN)
        << emit("agent.state.changed", current_state="thinking", turn_id=TURN)
        << emit("agent.text.delta", text="hi", turn_id=TURN)
        << emit("agent.text.done", full_text="hi", turn_id=TURN)
        >> line({"type": "done", "tokens_in": 3, "tokens_out": 4})
        << turn_end(TURN)
    )


# --- a plugin that raises: the turn ends, the session goes on ------------------------------------


def test_DPS_4_4_error_a_parser_that_raises_ends_the_turn_and_the_session_goes_on():
    """DPS-4.4-error: the parser raised mid-turn. The masters get ``PARSER_FAILED`` in the turn
    (the exception's type and bounded message, no trace; the log has the exception), the open call
    is cancelled and the turn ends ``error`` (DPS-7.5.3-cleanup order), the agent is stopped.
    What the stopping agent still prints is dropped, a second raise is only logged, the exit says
    nothing; the next prompt starts the agent again, resumed (DPS-18-respawn), with a fresh
    parser and input."""
    bug = Bug("no " + "y" * 1000)
    s = Scenario(logs=True, features=FEATURES)
    said = f"the claude-code agent's parser raised {Bug.__module__}.Bug in feed: no " + "y" * 196
    assert (
        s
        >> CLAUDE.started()
        >> CLAUDE.introduced("agent-1")
        >> CLAUDE.prompted("run ls", TURN)
        >> events(ev.ToolCall(call_id="toolu_L", name="Bash", input={"command": "ls"}))
        << emit("agent.state.changed", current_state="tool_calling")
        << emit("tool.invoke.request", invocation_id=CALL, tool_name="Bash")
        >> plugin_failed(bug, "feed")
        << parser_failed(said + "…", "parser", TURN)
        << logged("feed", bug)
        << emit("tool.invoke.result", invocation_id=CALL, status="cancelled", turn_id=TURN)
        << turn_end(TURN, "error", 1, settles="tool_calling")
        << act.Terminate()
        >> line(CLAUDE.result)  # the stopping agent's last words: nobody's
        >> closed()
    )
    old, again = s.adapter.machine.parser, Bug("again")
    assert s >> plugin_failed(again, "end") << logged("end", again) >> exited("signal", None, 15)
    assert s.adapter.machine.parser is not old
    assert s.adapter.machine.process is ProcessState.NONE
    assert (
        s
        >> prompt("again")
        << relayed("control.prompt.request", prompt_text="again")
        << turn_start(TURN2, 1)
        << spawn(prompt="again", resume_id="agent-1")
    )
    first, fresh = s.adapter.made
    assert (s.adapter.machine.parser, s.adapter.machine.input) == (fresh.parser, fresh.input)
    assert fresh.parser is not first.parser and fresh.input is not first.input


def test_a_prompt_while_the_agent_is_stopped_for_its_plugin_waits_for_the_exit():
    """The turn ended when the parser raised, so a prompt may come before the stopped agent has
    exited: it waits, and its process starts at that exit (never beside the old one), with the
    fresh parser and input."""
    s = ducks()
    assert (
        s
        >> DUCK_STARTED
        >> duck_prompted("hi", TURN)
        >> plugin_failed(Bug("oops"), "feed")
        << parser_failed(
            f"the mine agent's parser raised {Bug.__module__}.Bug in feed: oops", "parser", TURN
        )
        << turn_end(TURN, "error", settles=None)
        << act.Terminate()
        >> prompt("next")
        << relayed("control.prompt.request", prompt_text="next")
        << turn_start(TURN2, 1)
        >> exited("signal", None, 15)
        << spawn(prompt="next")
        << stdin(b"hello\n")
    )
    assert len(s.adapter.made) == 2
    assert s.adapter.machine.input is s.adapter.made[1].input


def test_DPS_7_5_3_cleanup_a_raise_while_the_session_is_deleted_is_only_logged():
    """DPS-7.5.3-cleanup: the session is being deleted; a plugin that raises then is logged, and
    the cleanup frames, ``session.deleted`` and the close follow the agent's exit as always."""
    late = Bug("late")
    assert (
        Scenario(logs=True)
        >> CLAUDE.started()
        >> CLAUDE.prompted("hi", TURN)
        >> delete()
        << act.Terminate()
        >> plugin_failed(late, "feed")
        << logged("feed", late)
        >> exited("signal", None, 15)
        << turn_end(TURN, "error", settles=None)
        << deleted()[0]
        << act.Log("info", "session deleted", {"reason": "master_request", "deleted_by": "master"})
        << deleted()[1]
    )


def test_a_raise_while_the_watchdog_stops_the_agent_ends_the_turn_and_starts_no_agent():
    """The stall watchdog is stopping the agent (its turn would end at the exit, and a long-lived
    agent start again); the parser raises on its late output: the turn ends now, no second stop is
    sent, and the exit starts nothing: the next prompt starts the agent, with a fresh parser."""
    s = Scenario(stall_timeout_sec=1.0)
    said = f"the claude-code agent's parser raised {Bug.__module__}.Bug in feed: late"
    assert (
        s
        >> CLAUDE.started()
        >> CLAUDE.prompted("x", TURN, stall_tick=0.25)
        >> [fire(STALL), STALL.started(0.25)] * 3
        >> fire(STALL)
        << emit("agent.error", error_code="AGENT_STALLED", severity="error", turn_id=TURN)
        << act.Terminate()
        >> plugin_failed(Bug("late"), "feed")
        << parser_failed(said, "parser", TURN)
        << turn_end(TURN, "error", settles=None)
        >> exited("signal", None, 15)
    )
    assert s.adapter.machine.process is ProcessState.NONE and len(s.adapter.made) == 2


@pytest.mark.parametrize("method", ["prompt", "interrupt", "permission", "set_mode"])
def test_DPS_4_4_error_an_input_that_raises_ends_the_turn(method: str):
    """DPS-4.4-error: the input's bug, in whichever call, is ``PARSER_FAILED`` too (``input``):
    its turn, if one runs, ends ``error``, and the agent is stopped."""
    s = ducks(method)
    said = f"the mine agent's input raised {Bug.__module__}.Bug in {method}: {method} went wrong"
    assert s >> DUCK_STARTED
    if method == "set_mode":
        assert (
            s
            >> master("control.mode.switch", {"mode": "plan"})
            << relayed("control.mode.switch")
            << parser_failed(said)
            << act.Terminate()
            << emit(
                "agent.state.changed",
                reason="mode_switch",
                metadata={"mode": "plan", "previous_mode": "default"},
            )
        )
        return
    if method == "prompt":
        assert (
            s
            >> prompt("hi")
            << relayed("control.prompt.request", prompt_text="hi")
            << turn_start(TURN)
            << parser_failed(said, turn=TURN)
            << turn_end(TURN, "error", settles=None)
            << act.Terminate()
        )
        return
    assert s >> duck_prompted("hi", TURN)
    if method == "interrupt":
        assert (
            s
            >> cancel(TURN)
            << relayed("control.prompt.cancel")
            << parser_failed(said, turn=TURN)
            << turn_end(TURN, "error", settles=None)
            << act.Terminate()
        )
        return
    assert (
        s
        >> events(ev.PermissionRequest(request_id="r1", tool_name="Bash", input={"command": "ls"}))
        << emit("agent.interaction.request", interaction_id=ASK)
        << emit("agent.state.changed", current_state="awaiting_input")
        << Timer.interaction(ASK).started(60.0)
        >> master(
            "control.interaction.response", {"interaction_id": ASK, "selected_value": "allow"}
        )
        << relayed("control.interaction.response")
        << Timer.interaction(ASK).cancelled()
        << act.Settled("PERMISSION", "allowed")
        << parser_failed(said, turn=TURN)
        << turn_end(TURN, "error", settles="awaiting_input")
        << act.Terminate()
    )


@pytest.mark.parametrize("method", ["opening", "initialize"])
def test_an_input_that_raises_when_the_agent_starts_stops_it(method: str):
    said = f"the mine agent's input raised {Bug.__module__}.Bug in {method}: {method} went wrong"
    hello = [stdin(b"hello\n")] if method == "initialize" else []
    assert (
        ducks(method)
        >> start()
        << spawn()
        << hello
        << parser_failed(said)
        << act.Terminate()
        >> exited("signal", None, 15)
    )


def test_a_parser_that_raises_at_the_end_of_stdout():
    said = f"the mine agent's parser raised {Bug.__module__}.Bug in end: end went wrong"
    assert (
        ducks("end")
        >> DUCK_STARTED
        >> duck_prompted("hi", TURN)
        >> closed()
        << parser_failed(said, "parser", TURN)
        << turn_end(TURN, "error", settles=None)
        << act.Terminate()
    )


def test_a_parser_that_raises_in_feed_through_agent_line():
    """The machine's own ``agent_line`` catches a raise as the shell does on its per-line path;
    with no process to stop, the fresh parser takes over at once."""

    class Raises(PlainParser):
        def feed(self, line: bytes) -> list[ev.AgentEvent]:
            raise KeyError(line)

    s = Scenario(plugins=lambda: AgentPlugin.of(Raises(), NoInput()), agent="mine")
    assert (
        s
        >> line(b"x")
        << parser_failed("the mine agent's parser raised KeyError in feed: b'x'", "parser")
    )
    assert len(s.adapter.made) == 2 and s.adapter.machine.parser is s.adapter.made[1].parser


def test_a_fresh_parser_that_cannot_be_made_ends_the_session():
    """Nothing could read the agent any more: the session ends (DPS-7.7-deleted, ``error``)."""
    made = []

    def plugins() -> AgentPlugin:
        if made:
            raise Bug("no second one")
        made.append(1)
        return AgentPlugin.of(PlainParser(), NoInput())

    assert (
        Scenario(plugins=plugins, agent="mine", single_turn_process=True)
        >> plugin_failed(Bug("first"), "feed")
        << parser_failed(
            f"the mine agent's parser raised {Bug.__module__}.Bug in feed: first", "parser"
        )
        << deleted("error", "client")
    )


def test_DPS_17_2_2_exit_describe_exit_that_raises_keeps_the_generic_exit_error():
    """DPS-17.2.2-exit: the exit is still said (AGENT_EXIT); the bug is only logged."""
    assert (
        ducks("describe_exit")
        >> DUCK_STARTED
        >> exited("error", 3)
        << emit("agent.error", error_code="AGENT_EXIT", severity="fatal")
        << deleted("error", "client")
    )
