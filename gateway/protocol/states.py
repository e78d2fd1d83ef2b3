"""The session machine's states and transition tables, its timers' keys and its exit input, sans-IO.

A session is in one state of each of three charts, each an enum, and moves only along the
transitions of its table (``move``); a transition the table does not hold is a bug of the machine,
and raises ``IllegalTransition`` naming the chart, the state and the step. What goes with a state
(the open turn, the prompt waiting for a process, the delete's reason) stays in the machine's
fields; which state it is in is one value of each enum.

* ``Lifecycle``: ``IDLE`` (no turn), ``RUNNING`` (a turn is open), ``TERMINATING`` (the session is
  being deleted and waits for its agent to exit) and ``TERMINATED`` (``session.deleted`` is sent).
* ``Attachment``: ``ATTACHED`` while at least one master's connection is, else ``DETACHED``; a
  detached session is deleted when its reattach window (a ``REATTACH_WINDOW`` timer) runs out.
* ``ProcessState``: the agent process as the machine knows it. ``NONE``: none runs (a single-turn
  agent between turns, or after any exit). ``ALIVE``: one was spawned and has not exited (its start
  failing is reported as an exit, so starting is not a state of its own). ``EXITING_BEFORE_RESPAWN``:
  its turn ended but it is still exiting (codex exec writes its thread after ``turn.completed``), and
  a prompt waits for that exit to spawn the next. ``STOPPING_FOR_CANCEL``, ``STOPPING_FOR_STALL``,
  ``STOPPING_FOR_DELETE``, ``STOPPING_FOR_PLUGIN``: the gateway is stopping it for an ignored
  cancel, for the stall watchdog, for a delete, because the session's parser or input raised (its
  turn ended with ``PARSER_FAILED``, and the next process gets a fresh parser and input); what its
  exit then means is each state's (``SessionMachine._EXITS``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

__all__ = [
    "ATTACHMENT",
    "LIFECYCLE",
    "PROCESS",
    "AgentExit",
    "Attachment",
    "AttachmentStep",
    "IllegalTransition",
    "Lifecycle",
    "LifecycleStep",
    "ProcessState",
    "ProcessStep",
    "TimerKey",
    "TimerKind",
    "move",
]


class IllegalTransition(RuntimeError):
    """The machine took a step its table does not allow from the state it is in: a bug, never
    the masters' or the agent's doing (what they send is refused with an error frame instead)."""


class Lifecycle(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    TERMINATING = "terminating"
    TERMINATED = "terminated"


class LifecycleStep(enum.Enum):
    TURN_OPENED = "turn opened"
    TURN_ENDED = "turn ended"
    STOPPING = "delete began, the agent is told to stop"
    DELETED = "session.deleted sent"


LIFECYCLE: Final[dict[Lifecycle, dict[LifecycleStep, Lifecycle]]] = {
    Lifecycle.IDLE: {
        LifecycleStep.TURN_OPENED: Lifecycle.RUNNING,
        LifecycleStep.STOPPING: Lifecycle.TERMINATING,
        LifecycleStep.DELETED: Lifecycle.TERMINATED,
    },
    Lifecycle.RUNNING: {
        LifecycleStep.TURN_ENDED: Lifecycle.IDLE,
        LifecycleStep.STOPPING: Lifecycle.TERMINATING,
        LifecycleStep.DELETED: Lifecycle.TERMINATED,
    },
    # The agent may still print while it is stopped (a turn opens and ends for its output): the
    # session stays terminating, and the masters' controls stay refused.
    Lifecycle.TERMINATING: {
        LifecycleStep.TURN_OPENED: Lifecycle.TERMINATING,
        LifecycleStep.TURN_ENDED: Lifecycle.TERMINATING,
        LifecycleStep.DELETED: Lifecycle.TERMINATED,
    },
    Lifecycle.TERMINATED: {},
}


class Attachment(enum.Enum):
    ATTACHED = "attached"
    DETACHED = "detached"


class AttachmentStep(enum.Enum):
    FIRST_MASTER = "a master attached to a session with none"
    LAST_MASTER_LEFT = "the last master detached"


ATTACHMENT: Final[dict[Attachment, dict[AttachmentStep, Attachment]]] = {
    Attachment.DETACHED: {AttachmentStep.FIRST_MASTER: Attachment.ATTACHED},
    Attachment.ATTACHED: {AttachmentStep.LAST_MASTER_LEFT: Attachment.DETACHED},
}


class ProcessState(enum.Enum):
    NONE = "none"
    ALIVE = "alive"
    EXITING_BEFORE_RESPAWN = "exiting before a respawn"
    STOPPING_FOR_CANCEL = "stopping for a cancel"
    STOPPING_FOR_STALL = "stopping for a stall"
    STOPPING_FOR_DELETE = "stopping for a delete"
    STOPPING_FOR_PLUGIN = "stopping for a plugin that raised"


class ProcessStep(enum.Enum):
    SPAWNED = "spawned"
    PROMPT_WAITS = "a prompt waits for the exit"
    PROMPT_WITHDRAWN = "the waiting prompt was cancelled"
    STOP_FOR_CANCEL = "stopped for an ignored cancel"
    STOP_FOR_STALL = "stopped by the stall watchdog"
    STOP_FOR_DELETE = "stopped for a delete"
    STOP_FOR_PLUGIN = "stopped for its parser or input that raised"
    EXITED = "exited"


PROCESS: Final[dict[ProcessState, dict[ProcessStep, ProcessState]]] = {
    # An exit with no process known (reported twice, or by a test) is taken as an ordinary one.
    ProcessState.NONE: {
        ProcessStep.SPAWNED: ProcessState.ALIVE,
        ProcessStep.EXITED: ProcessState.NONE,
    },
    ProcessState.ALIVE: {
        ProcessStep.PROMPT_WAITS: ProcessState.EXITING_BEFORE_RESPAWN,
        ProcessStep.STOP_FOR_CANCEL: ProcessState.STOPPING_FOR_CANCEL,
        ProcessStep.STOP_FOR_STALL: ProcessState.STOPPING_FOR_STALL,
        ProcessStep.STOP_FOR_DELETE: ProcessState.STOPPING_FOR_DELETE,
        ProcessStep.STOP_FOR_PLUGIN: ProcessState.STOPPING_FOR_PLUGIN,
        ProcessStep.EXITED: ProcessState.NONE,
    },
    ProcessState.EXITING_BEFORE_RESPAWN: {
        # The waiting prompt's turn ended before its process ran (the exiting process's late
        # output ended it): the next prompt takes its place.
        ProcessStep.PROMPT_WAITS: ProcessState.EXITING_BEFORE_RESPAWN,
        ProcessStep.PROMPT_WITHDRAWN: ProcessState.ALIVE,
        ProcessStep.STOP_FOR_STALL: ProcessState.STOPPING_FOR_STALL,
        ProcessStep.STOP_FOR_DELETE: ProcessState.STOPPING_FOR_DELETE,
        ProcessStep.STOP_FOR_PLUGIN: ProcessState.STOPPING_FOR_PLUGIN,
        ProcessStep.EXITED: ProcessState.NONE,
    },
    # A prompt that comes while the agent is stopped for a cancel waits for its exit too; the
    # state stays, since that exit is still the cancel's (never a fatal error).
    ProcessState.STOPPING_FOR_CANCEL: {
        ProcessStep.PROMPT_WAITS: ProcessState.STOPPING_FOR_CANCEL,
        ProcessStep.PROMPT_WITHDRAWN: ProcessState.STOPPING_FOR_CANCEL,
        ProcessStep.STOP_FOR_STALL: ProcessState.STOPPING_FOR_STALL,
        ProcessStep.STOP_FOR_DELETE: ProcessState.STOPPING_FOR_DELETE,
        ProcessStep.STOP_FOR_PLUGIN: ProcessState.STOPPING_FOR_PLUGIN,
        ProcessStep.EXITED: ProcessState.NONE,
    },
    ProcessState.STOPPING_FOR_STALL: {
        ProcessStep.PROMPT_WAITS: ProcessState.STOPPING_FOR_STALL,
        ProcessStep.PROMPT_WITHDRAWN: ProcessState.STOPPING_FOR_STALL,
        ProcessStep.STOP_FOR_DELETE: ProcessState.STOPPING_FOR_DELETE,
        ProcessStep.STOP_FOR_PLUGIN: ProcessState.STOPPING_FOR_PLUGIN,
        ProcessStep.EXITED: ProcessState.NONE,
    },
    ProcessState.STOPPING_FOR_DELETE: {ProcessStep.EXITED: ProcessState.NONE},
    # The turn ended when the plugin raised, so a prompt may come before the exit: it waits for
    # it (a new process, with a fresh parser and input, must not run beside the old one).
    ProcessState.STOPPING_FOR_PLUGIN: {
        ProcessStep.PROMPT_WAITS: ProcessState.STOPPING_FOR_PLUGIN,
        ProcessStep.PROMPT_WITHDRAWN: ProcessState.STOPPING_FOR_PLUGIN,
        ProcessStep.STOP_FOR_DELETE: ProcessState.STOPPING_FOR_DELETE,
        ProcessStep.EXITED: ProcessState.NONE,
    },
}

_S = TypeVar("_S", bound=enum.Enum)
_E = TypeVar("_E", bound=enum.Enum)


def move(chart: str, table: dict[_S, dict[_E, _S]], state: _S, step: _E) -> _S:
    """The state ``step`` leads to from ``state`` in ``table``; ``IllegalTransition`` if none."""
    try:
        return table[state][step]
    except KeyError:
        raise IllegalTransition(
            f"{chart}: no transition for {step.value!r} in state {state.value!r}"
        ) from None


# --- timers ---------------------------------------------------------------------------------------


class TimerKind(enum.Enum):
    CANCEL_SIGINT = "cancel"  # SIGINT to an agent the interrupt did not stop
    CANCEL_STOP = "cancel-kill"  # stop the agent: a cancelled turn must end
    STALL = "stall"  # the stall watchdog's tick
    INTERACTION = "interaction"  # a question to the masters timed out (with its id)
    REATTACH_WINDOW = "reattach-window"  # no master came back: the session is deleted


@dataclass(frozen=True, slots=True)
class TimerKey:
    """Which timer a ``StartTimer``/``CancelTimer``/``timer_fired`` is about: a kind, and for an
    ``INTERACTION`` the interaction's id (one timer each)."""

    kind: TimerKind
    interaction_id: str | None = None


# --- the agent's exit -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentExit:
    """How the agent process ended (DPS-17.2.2): ``kind`` ok (0), error (1-127) or signal,
    ``returncode`` (None: no process ran), ``signal`` N when one ended it, the tail of its stderr,
    ``start_error`` when it could not start at all, and ``limit``, the sandbox's limit it most
    likely ran into."""

    kind: Literal["ok", "error", "signal"]
    returncode: int | None
    signal: int | None = None
    stderr_tail: str = ""
    start_error: str | None = None
    limit: str | None = None
