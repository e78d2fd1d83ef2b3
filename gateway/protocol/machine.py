"""The session state machine: turns, modes, pending interactions and the §6 controls, sans-IO.

Theory of operation
-------------------
One ``SessionMachine`` per Agent Session. It is fed its inputs and answers each with an ordered
list of *actions* for the shell (``gateway/session/``) to carry out:

* ``agent_line(line)`` / ``agent_events(events)``: the agent's stdout (parsed by the session's
  agent parser, mapped to frames by ``Mapper``); ``agent_stdout_closed()``;
* ``agent_exited(kind, returncode, ...)``: the agent process ended (DPS-17.2.2, §18.2), taken as
  one ``states.AgentExit``;
* ``receive(conn_id, data)``: a frame a master sent (decoded here by ``codec.decode``);
* ``attached(conn_id)`` / ``detached(conn_id)``: a master's connection came or went;
* ``timer_fired(key)``, a ``states.TimerKey``: a timer the machine started ran out;
* ``start``, ``restore``, ``replay``, ``delete``, ``rename``, ``budget_notice``, ...: the
  control plane;
* ``plugin_failed(err, where)``: the session's parser or input raised where the shell called it.

Actions (``actions.py``): ``Emit`` (a frame: broadcast, or to/away from one connection),
``WriteStdin``, ``WritePrompt`` (a prompt with images, whose bytes only the shell's file store
has), ``PlaceFile`` (copy an uploaded file into the workspace), ``Spawn``, ``Signal``,
``Terminate`` (SIGTERM then SIGKILL), ``StartTimer``/``CancelTimer`` (by ``TimerKey``),
``SetFeatures`` (a master's announced capabilities), ``CloseAll`` (end every WebSocket of the
session) and ``Log``. Because the list is ordered, "cleanup frames, then ``session.deleted``, then
close" (DPS-7.5.3, DPS-7.7) is simply the order of the list.

States and tables
-----------------
The session is in one state of each of three charts (``states.py``, where their tables are), and
moves only along a table's transitions (``_step``, ``_attach_step``, ``_process_step``); a step the
table does not hold raises ``IllegalTransition``, a bug of this file, never a master's or agent's
doing (their wrong input is answered with an error frame).

* **Lifecycle**: ``IDLE`` → ``RUNNING`` when a turn opens (a prompt is accepted, or the agent
  produces output outside a turn: ``rawp-gateway translate`` has no prompts; Claude Code starts a
  turn of its own after a background task), back when it ends; ``TERMINATING`` when a delete must
  wait for the agent to exit, ``TERMINATED`` once ``session.deleted`` is sent. The masters'
  controls are refused from ``TERMINATING`` on; nothing the agent says follows ``TERMINATED``.
  ``turn`` holds the open turn's data.
* **Attachment**: ``ATTACHED`` while any master is (``masters``), else ``DETACHED``; detached, the
  reattach window runs (a ``REATTACH_WINDOW`` timer, from ``start`` and when the last master
  goes, cancelled when one comes) and its end deletes the session (``timeout``, by ``system``).
* **Process**: ``NONE``, ``ALIVE`` (from the ``Spawn``; a start that fails is reported as an
  exit), ``EXITING_BEFORE_RESPAWN``, ``STOPPING_FOR_CANCEL``, ``STOPPING_FOR_STALL``,
  ``STOPPING_FOR_DELETE``, ``STOPPING_FOR_PLUGIN``. What an exit does is the table ``_EXITS``, from the state the process
  was in to its handler. Agent processes are either long-lived (prompts on stdin) or single-turn
  (§18: prompt on the command line, respawned with the agent's session id for the next prompt).

The other tables: ``_OWN_EVENTS`` (the agent events the machine handles alone: a turn's end,
control acks, the agent's own mode, ...) and ``_TIMERS`` (a timer's kind → its handler).

The machine and the mapper
--------------------------
The machine owns the session (turns, interactions, the process); ``Mapper`` owns a turn's blocks,
calls and subagents and the frames they give. One agent event crosses from one to the other once:
the machine decides what it must about the event first (does it open a turn, is its call refused
for the mode or answered by a permission rule, does a question go to the masters) and hands the
event to the mapper with that decision (``mapper.Note``, ``map_noted``), or bare (``map``, the
per-line path: most lines are a delta inside a turn, which nothing here concerns). The question
to the masters is made there, since its metadata (the call's ``invocation_id``, a subagent's
context) is the mapper's; the machine keeps that frame for masters that attach while it waits.
A turn that a master's prompt opens begins for the mapper then (``begin_turn``), not with a line.

Every transition lives in this file, kept whole on purpose: a state machine is read, and its rules
checked, in one place. What holds no state is beside it: the states, tables, timer keys and the
exit input in ``states.py``, the actions in ``actions.py``, how a permission question is worded and
its answer read in ``interactions.py``, which permission rule answers one before any master is
asked in ``policy.py``, what a prompt becomes for the agent (and what it may carry) in
``prompts.py``.

A cancel (DPS-6.1.2) interrupts the agent, sends SIGINT ``cancel_sigint_sec`` later
(``CANCEL_SIGINT`` timer) and stops the process ``cancel_stop_sec`` after the cancel if the turn is
still open (``CANCEL_STOP``: ``STOPPING_FOR_CANCEL``). An agent that exits while its turn is
cancelled, or that the gateway stopped for a cancel, ended because of the cancel: the turn ends
``cancelled`` (no fatal error) and the session goes on, idle with no process, as after any exit
between turns; the next prompt starts the agent again, resumed with its session id. A prompt that
comes while that process is still exiting waits for its exit (as one does for a single-turn
process still exiting: ``EXITING_BEFORE_RESPAWN``).

The stall watchdog: a CLI may go silent mid-turn and never finish it. While a turn runs and no
interaction waits for a master, a ``STALL`` timer ticks (a quarter of the shorter limit); a tick
that saw no agent output adds to the silence. After ``stall_warning_sec`` of silence the masters
get an ``agent.error`` (``AGENT_STALLED``, severity warning, recoverable); after
``stall_timeout_sec`` the agent is stopped (``STOPPING_FOR_STALL``), and when its exit is reported
the turn ends with ``error`` and a long-lived agent is started again (resumed with its session id
where the profile can), instead of the exit ending the session. 0 turns a limit off. Counting
output per line is one integer; no timer is touched per line.

A parser or input that raises (a plugin's bug, which its protocol forbids; the shell catches what
it calls itself) is ``plugin_failed``: it ends the turn, not the session. The masters get
``agent.error`` ``PARSER_FAILED`` (recoverable), the turn ends ``error``, the agent is stopped
(``STOPPING_FOR_PLUGIN``: the plugin is asked nothing more, the process's last lines are dropped,
its exit says nothing), and the session goes on idle: the next prompt starts the agent again with
a fresh parser and input (``plugins``), since the one that raised is in a state nobody knows.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final, Literal, cast

import msgspec

from gateway.protocol import codec, recovery
from gateway.protocol import frames as F
from gateway.protocol.actions import (
    Action,
    CancelTimer,
    CloseAll,
    Emit,
    Log,
    PlaceFile,
    PolicyDecided,
    ReadMcpReasons,
    SetFeatures,
    Settled,
    Signal,
    Spawn,
    StartTimer,
    Terminate,
    WritePrompt,
    WriteStdin,
)
from gateway.protocol.capabilities import agreed_features, gateway_capabilities
from gateway.protocol.factory import FrameFactory
from gateway.protocol.interactions import (
    ALLOW,
    DENY,
    NO_OPTION,
    NoOption,
    chosen_option,
    decision,
    interaction_options,
    permission_question,
)
from gateway.protocol.mapper import BLOCKED_OUTPUT, Mapper, Note
from gateway.protocol.mcp_servers import report as mcp_report
from gateway.protocol.policy import Rule, decide
from gateway.protocol.prompts import (
    UPLOADS_DIR,
    PromptRefused,
    attachments_text,
    context_files,
    nul_refused,
    prompt_text_for_agent,
)
from gateway.protocol.states import (
    ATTACHMENT,
    LIFECYCLE,
    PROCESS,
    AgentExit,
    Attachment,
    AttachmentStep,
    Lifecycle,
    LifecycleStep,
    ProcessState,
    ProcessStep,
    TimerKey,
    TimerKind,
    move,
)
from gateway.protocol.tools import lookup
from parsers import events as ev
from parsers.base import AgentInput, AgentParser, AgentPlugin, ExitDescription
from parsers.saved import ReplayedTurn

__all__ = [
    "CANCEL_SIGINT_TIMER",
    "CANCEL_STOP_TIMER",
    "PARSER_FAILED",
    "REATTACH_WINDOW_TIMER",
    "STALL_TIMER",
    "SessionConfig",
    "SessionMachine",
    "interaction_timer",
]

# Characters of a session.error message: even quoting a master's id it fits the smallest frame.
MAX_ERROR_MESSAGE: Final = 512
# Characters of an earlier prompt a replayed turn shows (and at most a quarter of a frame).
MAX_REPLAYED_PROMPT_CHARS: Final = 64 * 1024
CANCEL_GRACE_SEC: Final = 2.0  # interrupt, then SIGINT if the turn has not ended
CANCEL_KILL_SEC: Final = 10.0  # then stop the process: a turn must end
STALL_TIMER: Final = TimerKey(TimerKind.STALL)
CANCEL_SIGINT_TIMER: Final = TimerKey(TimerKind.CANCEL_SIGINT)
CANCEL_STOP_TIMER: Final = TimerKey(TimerKind.CANCEL_STOP)
REATTACH_WINDOW_TIMER: Final = TimerKey(TimerKind.REATTACH_WINDOW)
# A session the stopping gateway deletes (no state dir): what its masters are told as it closes.
SHUTDOWN_CLOSE: Final = "the gateway stopped; the session ended with it"
# ...and the open turn's error before its end (as a restart's GATEWAY_RESTARTED, recovery.py).
SHUTDOWN_ERROR: Final = F.AgentError(
    error_code="GATEWAY_STOPPED",
    message=SHUTDOWN_CLOSE,
    severity="error",
    recoverable=False,
    details=F.ErrorDetails(module="gateway"),
)
USER_KEY: Final = "rawp_user"  # metadata: the user who sent a relayed control frame
POLICY_KEY: Final = "rawp_policy"  # metadata: the rule that answered a permission
POLICY_DECISION_KEY: Final = "rawp_policy_decision"  # metadata: what that rule decided
BUDGET_KEY: Final = "rawp_budget"  # metadata: the budget a session.error is about
UPLOAD_NOT_PLACED: Final = "UPLOAD_NOT_PLACED"  # agent.error warning: see file_not_placed
PARSER_FAILED: Final = "PARSER_FAILED"  # agent.error that ends the turn: see plugin_failed
MAX_PLUGIN_ERROR_CHARS: Final = 200  # of the exception's message (and of its type) in it


_DELTAS: Final = frozenset({ev.TextDelta, ev.ThinkingDelta})
# Events outside a turn that do not open one: the agent's announcements (and its turnless notices).
_NO_PROCESS: Final = ProcessState.NONE
_TURNLESS: Final = (ev.SessionStarted, ev.CommandsListed, ev.Unknown)
# The process states the stall watchdog watches: not one the gateway is stopping already for a
# stall or a delete (a prompt waiting for a cancelled agent's exit has its turn watched).
_WATCHED: Final = frozenset(
    {ProcessState.ALIVE, ProcessState.EXITING_BEFORE_RESPAWN, ProcessState.STOPPING_FOR_CANCEL}
)
# The process states in which the gateway is stopping the agent while the session may be idle (a
# cancelled turn the agent ended itself; a turn ended as its plugin raised): a prompt waits for
# the exit.
_PROMPTS_WAIT: Final = frozenset(
    {ProcessState.STOPPING_FOR_CANCEL, ProcessState.STOPPING_FOR_PLUGIN}
)
# No process to tell, or one whose input raised and is not asked anything more.
_NO_INPUT: Final = frozenset({ProcessState.NONE, ProcessState.STOPPING_FOR_PLUGIN})
# Stopping already: a plugin's raise then needs no Terminate of its own.
_STOPPING: Final = frozenset({ProcessState.STOPPING_FOR_CANCEL, ProcessState.STOPPING_FOR_STALL})


def interaction_timer(interaction_id: str) -> TimerKey:
    """The key of the timer that denies an unanswered question (DPS-6.2-interaction)."""
    return TimerKey(TimerKind.INTERACTION, interaction_id)


# --- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """What the machine needs to know of the agent profile."""

    agent: str = "claude-code"
    features: F.Features = field(default_factory=F.Features)
    single_turn_process: bool = False
    auto_allow: frozenset[str] = frozenset()
    permission_timeout_sec: float = 60.0
    max_frame_size: int = 1 << 20
    forward_unknown: bool = False
    # The agent takes images with a prompt (its stdin input or the profile's image_flag).
    accepts_images: bool = False
    # The longest prompt (UTF-8 bytes) the agent can take, for a profile whose prompt goes in argv
    # and that has no other way; None: no such limit.
    prompt_argv_max: int | None = None
    stall_warning_sec: float = 0.0  # 0: off
    stall_timeout_sec: float = 0.0  # 0: off
    # A cancel's escalation (docs/protocol-notes.md): the interrupt, SIGINT this long after it if
    # the turn has not ended, the process stopped this long after the cancel.
    cancel_sigint_sec: float = CANCEL_GRACE_SEC
    cancel_stop_sec: float = CANCEL_KILL_SEC
    tools: tuple[str, ...] = ()  # the agent's tools before it reports them (the first catalog)
    credentials: str = ""  # where the agent reads them (ParserSpec.credentials), for error hints
    # The permission rules (docs/policies.md), decided before auto_allow and the masters, with
    # the session's workspace for their {workspace}; ``SessionMachine.set_policy`` replaces them.
    policy: tuple[Rule, ...] = ()
    workspace: str = ""
    # How long a session with no master attached lives (docs/http-api.md); None: for ever (the
    # core on its own, ``rawp-gateway translate``).
    reattach_window_sec: float | None = None
    # The session's MCP servers as they may be shown (``mcp_servers.redacted``: no secret) and
    # the kinds its agent takes: what became of each is reported to masters (docs/mcp.md).
    mcp_servers: tuple[dict[str, Any], ...] = ()
    mcp_kinds: tuple[str, ...] = ()

    @property
    def stall_tick_sec(self) -> float:
        """How often the watchdog looks (0: never): silence is measured to within one tick."""
        limits = [x for x in (self.stall_warning_sec, self.stall_timeout_sec) if x > 0]
        return min(limits) / 4 if limits else 0.0


@dataclass(slots=True)
class _Interaction:
    interaction_id: str
    request_id: str
    tool_name: str
    input: dict[str, Any]
    frame: F.Frame  # sent again to a master that attaches while it is pending
    # The agent's own options (ACP): DPS option value → (the agent's option id, it allows).
    choices: dict[str, tuple[str, bool]] = field(default_factory=dict)
    call_id: str | None = None  # the tool call it asks about, when the agent says


@dataclass(slots=True)
class _Turn:
    turn_id: str
    index: int
    cancel_requested: bool = False
    allowed: frozenset[str] = frozenset()
    denied: frozenset[str] = frozenset()
    # The calls whose permission the cancel denied: their results are cancelled ones.
    cancel_denied: frozenset[str] = frozenset()


# A prompt waiting for a process to exit: its text, its overrides, its images.
_Waiting = tuple[str, F.ConfigOverrides | None, list[ev.StoredFile]]


# --- the machine --------------------------------------------------------------------------------


class SessionMachine:
    # What became of the session's MCP servers (docs/mcp.md#what-masters-see): the agent's own
    # report (None: none yet) and the reasons the shell found for failures it gave none for.
    _mcp_reported: list[ev.McpServer] | None
    _mcp_reasons: dict[str, str]

    def __init__(
        self,
        session_id: str,
        parser: AgentParser,
        agent_input: AgentInput,
        config: SessionConfig | None = None,
        *,
        factory: FrameFactory | None = None,
        seen_window: int = 4096,
        files: Mapping[str, ev.StoredFile] | None = None,
        plugin: AgentPlugin | None = None,
        plugins: Callable[[], AgentPlugin] | None = None,
    ) -> None:
        self.session_id = session_id
        self.config = config or SessionConfig()
        self.factory = factory or FrameFactory(session_id)
        self._take_plugins(parser, agent_input, plugin, plugins)
        # The session's stored files by transfer_id (the shell's FileStore index, read only).
        self.files: Mapping[str, ev.StoredFile] = files if files is not None else {}
        self.mapper = Mapper(
            self.factory,
            max_frame_size=self.config.max_frame_size,
            forward_unknown=self.config.forward_unknown,
            agent=self.config.agent,
            credentials=self.config.credentials,
        )
        self.mode: F.Mode = "default"
        self.turn_count = 0
        # The agent's own session id (§18.3), once known: each spawn resumes it.
        self.agent_session_id: str | None = None
        self.name: str | None = None
        self.model: str | None = None  # the agent's own name for its model, when it says it
        self.interactions: dict[str, _Interaction] = {}
        self.last_decision: str | None = None  # of the permission settled last (allow or deny)
        self._sender: str | None = None  # the user of the master frame being handled
        # The permission rules in force and the role of the session's owner they may name.
        self.policy: tuple[Rule, ...] = self.config.policy
        self.owner_role: str | None = None
        # Why a prompt may not start now (code, message), asked of the shell's budgets at each
        # prompt (docs/budgets.md); None: nothing stops one.
        self.prompt_gate: Callable[[], tuple[str, str] | None] | None = None
        self._seen = codec.SeenWindow(seen_window)
        self._control_seq = 0
        self._pending_controls: dict[str, str] = {}  # request_id → what it was for
        self._charts()
        self._mcp_reported, self._mcp_reasons = None, {}
        self.mapper.mcp_servers = self._mcp_report()
        self._capabilities(None)
        if self.config.tools:
            self.mapper.expect_tools(self.config.tools)

    def _take_plugins(
        self,
        parser: AgentParser,
        agent_input: AgentInput,
        plugin: AgentPlugin | None,
        plugins: Callable[[], AgentPlugin] | None,
    ) -> None:
        self.parser = parser
        self.input = agent_input
        # Their optional capabilities, found once (the shell's, when it made them).
        self.plugin = plugin if plugin is not None else AgentPlugin.of(parser, agent_input)
        # Makes a fresh parser and input for the session (the shell's ``ParserSpec.plugin``, told
        # the workspace): one that raised is replaced once its process is gone. None (the core on
        # its own, whose caller owns the parser): the instance stays.
        self._plugins = plugins
        self._plugin_failing = False  # plugin_failed is running: a raise inside it is only logged

    def _charts(self) -> None:
        """The three charts (``states.py``), each one value moved only by ``_step``,
        ``_attach_step`` and ``_process_step`` along its table, and the data that goes with them."""
        self.lifecycle = Lifecycle.IDLE
        self.attachment = Attachment.DETACHED
        self.process = ProcessState.NONE
        self.turn: _Turn | None = None  # the open turn's data (RUNNING, or output while stopping)
        self.masters: set[str] = set()  # the connections attached (ATTACHED while any)
        # A restored session's agent starts at the next prompt, not at ``start`` (DPS-18-respawn).
        self._restored = False
        # (reason, deleted_by) once delete began: TERMINATING's and TERMINATED's data.
        self._delete_reason: tuple[F.DeleteReason, F.DeletedBy] | None = None
        self._shutdown = False  # ...because the gateway stops (``delete``)
        # A prompt waiting for the previous process to finish exiting (EXITING_BEFORE_RESPAWN's
        # data, or STOPPING_FOR_CANCEL's when one came meanwhile): text, overrides, images.
        self._waiting: _Waiting | None = None
        # The stall watchdog: agent output counted (one per batch), as of the last tick; silence.
        self._activity = 0
        self._activity_seen = 0
        self._silent_sec = 0.0
        self._stall_warned = False

    # --- helpers ---------------------------------------------------------------------------------

    def _step(self, step: LifecycleStep) -> None:
        self.lifecycle = move("lifecycle", LIFECYCLE, self.lifecycle, step)

    def _attach_step(self, step: AttachmentStep) -> None:
        self.attachment = move("attachment", ATTACHMENT, self.attachment, step)

    def _process_step(self, step: ProcessStep) -> None:
        self.process = move("process", PROCESS, self.process, step)

    @property
    def _ending(self) -> bool:
        """The session is being deleted, or is."""
        return self.lifecycle is Lifecycle.TERMINATING or self.lifecycle is Lifecycle.TERMINATED

    def _make(
        self,
        payload: F.Payload,
        *,
        turn: bool = False,
        parent_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ):
        turn_id = self.turn.turn_id if (turn and self.turn) else None
        return self.factory.frame(payload, turn_id=turn_id, parent_id=parent_id, metadata=metadata)

    def _error(self, code: str, message: str, to: str | None, parent_id: str | None) -> Emit:
        if len(message) > MAX_ERROR_MESSAGE:  # it may quote what a master sent (an id, a v)
            message = message[: MAX_ERROR_MESSAGE - 1] + "…"
        frame = self._make(
            F.SessionError(error_code=code, message=message, fatal=False), parent_id=parent_id
        )
        return Emit(frame, to=to)

    def _next_request_id(self, what: str) -> str:
        self._control_seq += 1
        request_id = f"rawp-{self._control_seq}"
        self._pending_controls[request_id] = what
        return request_id

    @staticmethod
    def _emit_all(frames: list[F.Frame]) -> list[Action]:
        return [Emit(f) for f in frames]

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> list[Action]:
        """The session begins: a long-lived agent starts now (a single-turn one, and a restored
        session's, at the first prompt); no master is attached yet, so the reattach window runs."""
        if self.config.single_turn_process or self._restored:
            return self._window_opens()
        self._process_step(ProcessStep.SPAWNED)
        # A session that continues a saved conversation (``replay``) resumes it at once.
        resume_id = self.agent_session_id
        out: list[Action] = [Spawn(resume_id=resume_id, mode=self.mode), *self._opening(resume_id)]
        # docs/http-api.md promises the commands right after session.capabilities: an agent that
        # lists them only when a prompt starts a run (Claude Code) is asked at once.
        initialize = self.plugin.initialize
        if initialize is not None and self.process is ProcessState.ALIVE:  # (else opening raised)
            try:
                data = initialize(self._next_request_id("initialize"))
            except Exception as err:
                return out + self.plugin_failed(err, "initialize")
            if data is not None:
                out.append(WriteStdin(data))
        return out + self._window_opens()

    def restore(
        self,
        *,
        name: str | None,
        mode: str,
        turn_count: int,
        agent_session_id: str | None,
        catalog: F.Frame | None = None,
        commands: F.Frame | None = None,
    ) -> None:
        """A session read back after the gateway restarted. No process runs (``start`` then only
        opens the reattach window): the next prompt spawns the agent resumed with
        ``agent_session_id``, long-lived profiles too, so the model sees the earlier conversation
        (DPS-18-respawn)."""
        self.name = name
        self.mode = mode if mode in ("default", "plan", "review") else "default"  # type: ignore[assignment]
        self.turn_count = turn_count
        if catalog is not None:  # else the catalog the profile expects (``SessionConfig.tools``)
            self.mapper.catalog = catalog
        self.mapper.commands = commands
        if agent_session_id:
            self._know_agent_session(agent_session_id)
        self._restored = True

    def set_policy(self, rules: tuple[Rule, ...], owner_role: str | None) -> None:
        """The rules (read again on SIGHUP) and the owner's role, for the next permission asked;
        one already asked of a master stays asked."""
        self.policy = rules
        self.owner_role = owner_role

    def _know_agent_session(self, agent_session_id: str) -> None:
        """The agent's session id, known before the agent says it: the first spawn resumes it."""
        self.agent_session_id = agent_session_id
        self._capabilities(agent_session_id)

    def _capabilities(self, agent_session_id: str | None) -> F.Capabilities:
        """The gateway's ``session.capabilities`` for the session's features as they are now
        (with the agent's session id once known), kept as the greeting's ``capabilities_frame``."""
        extensions: dict[str, Any] = {}
        if agent_session_id:
            extensions["agent_session_id"] = agent_session_id
        if self.mapper.mcp_servers:  # a gateway extension (docs/mcp.md#what-masters-see)
            extensions["mcp_servers"] = self.mapper.mcp_servers
        caps = gateway_capabilities(
            self.config.features,
            max_frame_size=self.config.max_frame_size,
            extensions=extensions or None,
        )
        self.capabilities_frame = self._make(caps)
        return caps

    def replay(
        self, agent_session_id: str, turns: list[ReplayedTurn], problem: str | None = None
    ) -> list[F.Frame]:
        """A new session that continues the agent's saved conversation ``agent_session_id``
        (called before ``start``, whose spawn then resumes it): its earlier ``turns``, translated
        by the agent's parser, as the frames they gave live, each marked
        ``metadata.rawp_replayed: true``. Each turn's prompt comes first as the
        ``control.prompt.request`` a master's prompt is relayed as (cut to a quarter of a frame,
        then ``metadata.rawp_prompt_truncated``). ``problem``: the transcript is partial, said
        by an ``agent.error`` warning ``CONVERSATION_PARTIAL`` in the first turn. The frames are
        for the history alone (no master is attached yet)."""
        self._know_agent_session(agent_session_id)
        replayed = {"rawp_replayed": True}
        frames: list[F.Frame] = []
        for n, turn in enumerate(turns):
            if turn.prompt is not None:
                limit = min(MAX_REPLAYED_PROMPT_CHARS, self.config.max_frame_size // 4)
                text = turn.prompt[:limit]
                meta = (
                    replayed if text == turn.prompt else {**replayed, "rawp_prompt_truncated": True}
                )
                frames.append(self._make(F.PromptRequest(prompt_text=text), metadata=meta))
            actions = self._open_turn()
            events = list(turn.events)
            if problem is not None and n == 0:
                partial = ev.Notice(
                    severity="warning", code="CONVERSATION_PARTIAL", message=problem
                )
                events.insert(0, partial)
            ended: ev.TurnEnded | None = None
            for event in events:
                if isinstance(event, ev.TurnEnded):
                    ended = event
                else:
                    actions += self._agent_event(event)
            if self.turn is not None:  # (None: the input raised answering it, which ended it)
                actions += self._end_turn(ended.stop_reason if ended else "end_turn", ended)
            frames += [
                msgspec.structs.replace(a.frame, metadata={**(a.frame.metadata or {}), **replayed})
                for a in actions
                if isinstance(a, Emit) and a.to is None  # not the timers of a running turn
            ]
        return frames

    def close_interrupted_turn(self, items: recovery.OpenItems) -> list[Action]:
        """Close a turn that was open when the gateway stopped, in the §7.5.3 order (see
        ``recovery``); every frame carries the turn's id."""
        return [
            Emit(self.factory.frame(payload, turn_id=items.turn_id, metadata=metadata))
            for payload, metadata in recovery.closing_payloads(items)
        ]

    def greeting(self) -> list[F.Frame]:
        """What a newly attached connection gets first (docs/http-api.md): capabilities, the latest
        catalog and commands, then any interaction still waiting for an answer."""
        frames = [self.capabilities_frame]
        frames += [f for f in (self.mapper.catalog, self.mapper.commands) if f is not None]
        frames += [i.frame for i in self.interactions.values()]
        return frames

    # --- the agent's side ----------------------------------------------------------------------

    def agent_line(self, line: bytes) -> list[Action]:
        if self.process is ProcessState.STOPPING_FOR_PLUGIN:
            return []  # the parser raised: the stopped agent's last lines are nobody's
        try:
            events = self.parser.feed(line)
        except Exception as err:
            return self.plugin_failed(err, "feed")
        return self.agent_events(events)

    def agent_stdout_closed(self) -> list[Action]:
        if self.process is ProcessState.STOPPING_FOR_PLUGIN:
            return []  # a parser that raised is not asked anything again
        try:
            events = self.parser.end()
        except Exception as err:
            return self.plugin_failed(err, "end")
        return self.agent_events(events)

    def agent_events(self, events: list[ev.AgentEvent]) -> list[Action]:
        self._activity += 1
        if len(events) == 1 and type(events[0]) in _DELTAS and self.turn is not None:
            # Most lines: a text or thinking delta inside a turn, which none of the checks of
            # _agent_event concern.
            return [Emit(frame) for frame in self.mapper.map(events[0])]
        out: list[Action] = []
        for event in events:
            out += self._agent_event(event)
        return out

    def _agent_event(self, event: ev.AgentEvent) -> list[Action]:
        if self.lifecycle is Lifecycle.TERMINATED:
            return []  # session.deleted was sent: nothing follows it
        if type(event) is ev.ToolResult:
            event = self._cut_short(event)
        own = self._OWN_EVENTS.get(type(event))
        if own is not None:
            return own(self, event)
        return self._mapped_event(event)

    def _cut_short(self, event: ev.ToolResult) -> ev.ToolResult:
        """A failed result that is really a cancelled one."""
        if not event.is_error or event.cancelled:
            return event
        if self.lifecycle is Lifecycle.TERMINATING:
            # DPS-7.5.3-cleanup: the session is ending and the gateway stopped the agent, so a call
            # it now reports failed was cut short by that (Claude Code: "Exit code 137").
            return msgspec.structs.replace(event, cancelled=True)
        if self.turn is not None and event.call_id in self.turn.cancel_denied:
            # DPS-6.1.2-cancel: the cancel denied this call's permission and interrupted the
            # agent; whether the agent then calls the call refused or interrupted depends on which
            # of the two it read first (Claude Code: either), and the master asked for neither.
            return msgspec.structs.replace(event, cancelled=True)
        return event

    def _turn_ended(self, event: ev.TurnEnded) -> list[Action]:
        if self.turn is None:
            # e.g. Claude Code's second result line after a background task's own turn
            return [Emit(self.mapper.usage_frame(event))]
        return self._end_turn(event.stop_reason, event)

    def _parse_error(self, event: ev.ParseError) -> list[Action]:
        return [Log("warning", "agent line is not valid", {"error": event.message})]

    def _odd_numbers(self, event: ev.OddNumbers) -> list[Action]:
        fields = {"kind": event.kind, "fields": event.fields}
        return [Log("warning", "agent numbers dropped as unusable", fields)]

    def _stdin_write(self, event: ev.StdinWrite) -> list[Action]:
        # The parser's answer to the agent (ACP): for the process that asked, if it still runs.
        return [WriteStdin(event.data)] if self.process is not ProcessState.NONE else []

    def _mapped_event(self, event: ev.AgentEvent) -> list[Action]:
        """An event that gives frames: what the machine decides about it (a turn it opens, a call
        refused for the mode), then the mapper, called once with that ``Note``."""
        out: list[Action] = []
        note: Note | None = None
        if self.turn is None and not (
            isinstance(event, _TURNLESS) or (isinstance(event, ev.Notice) and event.turnless)
        ):
            out += self._open_turn(tell_mapper=False)
            note = Note(opens=cast(_Turn, self.turn).turn_id)
        if isinstance(event, ev.PermissionRequest):
            return out + self._permission_request(event, note or Note())
        if isinstance(event, ev.Unknown):
            out.append(Log("info", "agent line of unknown kind", {"kind": event.kind}))
        elif isinstance(event, ev.SessionStarted):
            out += self._session_started(event)
        elif (
            isinstance(event, ev.Notice)
            and event.code == "PERMISSION_DENIED"
            and event.call_id
            and self.mode in ("plan", "review")
            and lookup(event.tool_name or "").writes
        ):
            # DPS-6.3.2-block: the agent refused the call itself in its own plan mode (a single-turn
            # Claude Code has no permission prompt tool to ask the gateway): the DPS block result.
            note = note or Note()
            note.blocked = True
        frames = self.mapper.map(event) if note is None else self.mapper.map_noted(event, note)
        return out + self._emit_all(frames)

    def _session_started(self, event: ev.SessionStarted) -> list[Action]:
        if event.model:
            self.model = event.model
        out: list[Action] = []
        if self.config.mcp_servers or event.mcp_servers:
            out += self._mcp_reported_now(event.mcp_servers)
        if event.agent_session_id and event.agent_session_id != self.agent_session_id:
            out.append(Emit(self._announce_agent_session(event.agent_session_id)))
        return out

    # --- MCP servers (docs/mcp.md#what-masters-see) ----------------------------------------------

    def _mcp_report(self) -> list[dict[str, Any]]:
        config = self.config
        if not config.mcp_servers and not self._mcp_reported:
            return []
        return mcp_report(
            config.mcp_servers, config.mcp_kinds, self._mcp_reported, self._mcp_reasons
        )

    def _mcp_reported_now(self, servers: list[ev.McpServer]) -> list[Action]:
        """The agent said what became of its MCP servers (Claude Code's ``init``, at every
        start): the catalog the mapper publishes next carries it; the failures it gives no reason
        for are looked up by the shell."""
        self._mcp_reported = list(servers)
        self.mapper.mcp_servers = self._mcp_report()
        self._capabilities(self.agent_session_id)
        unexplained = tuple(
            s["name"]
            for s in self.mapper.mcp_servers
            if s["status"] == "failed" and "reason" not in s and s["origin"] != "agent"
        )
        return [ReadMcpReasons(unexplained)] if unexplained else []

    def mcp_reasons(self, reasons: dict[str, str]) -> list[Action]:
        """Why MCP servers failed, found by the shell (``ReadMcpReasons``): the catalog again,
        with them, when that changes it (never after the session ended)."""
        if not reasons or self.lifecycle is Lifecycle.TERMINATED:
            return []
        self._mcp_reasons.update(reasons)
        self.mapper.mcp_servers = self._mcp_report()
        self._capabilities(self.agent_session_id)
        frame = self.mapper.catalog_again()
        return self._emit_all([frame]) if frame is not None else []

    def _agent_mode(self, event: ev.ModeChanged) -> list[Action]:
        """The agent changed its own mode (ACP ``current_mode_update``): the masters see it as a
        mode switch does (the agent's own mode id in ``metadata.agent_mode``)."""
        previous, self.mode = self.mode, event.mode
        state = self.mapper.agent_state
        change = F.StateChanged(previous_state=state, current_state=state, reason="mode_switch")
        metadata = {"mode": event.mode, "previous_mode": previous, "agent_mode": event.agent_mode}
        turn_id = self.turn.turn_id if self.turn is not None else None
        return [Emit(self.factory.frame(change, turn_id=turn_id, metadata=metadata))]

    def _features_declared(self, event: ev.FeaturesDeclared) -> list[Action]:
        """What the agent itself declared narrows (or widens) the profile's features; masters get
        ``session.capabilities`` again when that changes anything."""
        # Off is absent, as in every announcement of features.
        known = {
            k: (True if v else None)
            for k, v in event.features.items()
            if k in F.Features.__struct_fields__ and k != "adapter_type"
        }
        features = msgspec.structs.replace(self.config.features, **known)
        if features == self.config.features:
            return []
        self.config = replace(self.config, features=features)
        caps = self._capabilities(self.agent_session_id)
        return [Emit(self._make(caps, turn=True))]

    def _opening(self, resume_id: str | None) -> list[Action]:
        """What a conversing agent (ACP) is told each time its process starts: the handshake,
        resuming ``resume_id`` where the agent can."""
        opening = self.plugin.opening
        if opening is None:
            return []
        try:
            data = opening(resume_id)
        except Exception as err:
            return self.plugin_failed(err, "opening")
        out: list[Action] = [WriteStdin(data)] if data else []
        if self.mode == "plan":
            # The session's mode outlives the process (a restart, a restored session): the agent
            # is told again once its session exists.
            try:
                again = self.input.set_mode(self._next_request_id("set_mode"), "plan")
            except Exception as err:
                return out + self.plugin_failed(err, "set_mode")
            out += [WriteStdin(again)] if again else []
        return out

    def _announce_agent_session(self, agent_session_id: str) -> F.Frame:
        """§18.3: the agent's own session id, kept as ``extensions.agent_session_id`` of the
        gateway's ``session.capabilities``, announced again to every master when it is learnt or
        changes (newly attached masters get it in their greeting)."""
        self.agent_session_id = agent_session_id
        caps = self._capabilities(agent_session_id)
        # Broadcast inside a turn, it carries the turn's id (DPS-2.1-turn-id); the greeting's does not.
        return self._make(caps, turn=True)

    def _open_turn(
        self,
        overrides: F.ConfigOverrides | None = None,
        *,
        compaction: bool = False,
        tell_mapper: bool = True,
    ) -> list[Action]:
        """``session.turn.start`` and the stall watchdog's first tick. ``tell_mapper``: the turn
        begins for the mapper here, not with the agent event that opened it (its ``Note``)."""
        turn_id = self.factory.new_id()
        self.turn = _Turn(turn_id=turn_id, index=self.turn_count)
        if overrides is not None:
            self.turn.allowed = frozenset(overrides.allowed_tools or ())
            self.turn.denied = frozenset(overrides.denied_tools or ())
        self.turn_count += 1
        self._step(LifecycleStep.TURN_OPENED)
        if tell_mapper:
            self.mapper.begin_turn(turn_id, requested_compaction=compaction)
        start = F.TurnStart(turn_id=turn_id, turn_index=self.turn.index, mode=self.mode)
        out: list[Action] = [Emit(self.factory.frame(start, turn_id=turn_id))]
        tick = self.config.stall_tick_sec
        if tick > 0:
            self._activity_seen, self._silent_sec, self._stall_warned = self._activity, 0.0, False
            out.append(StartTimer(STALL_TIMER, tick))
        return out

    def _end_turn(self, stop_reason: str, ended: ev.TurnEnded | None = None) -> list[Action]:
        turn = self.turn
        assert turn is not None
        if turn.cancel_requested and stop_reason != "error":
            stop_reason = "cancelled"
        out: list[Action] = [CancelTimer(CANCEL_SIGINT_TIMER), CancelTimer(CANCEL_STOP_TIMER)]
        if self.config.stall_tick_sec > 0:
            out.append(CancelTimer(STALL_TIMER))
        out += self._deny_all_interactions("the turn ended")
        out += self._emit_all(self.mapper.end_turn(stop_reason, ended))
        self.turn = None
        self._step(LifecycleStep.TURN_ENDED)
        return out

    def agent_exited(
        self,
        kind: Literal["ok", "error", "signal"],
        returncode: int | None,
        signum: int | None = None,
        stderr_tail: str = "",
        *,
        start_error: str | None = None,
        limit: str | None = None,
    ) -> list[Action]:
        """The agent process ended: DPS-17.2.2 (and §18.2 for single-turn agents). A parser that
        names its agent's exit codes (``describe_exit``) gives the fatal ``agent.error`` its code.
        ``limit``: the sandbox's limit the agent most likely ran into, said in the message.
        ``start_error``: there was no process, it could not start (exit 127 as a shell says it):
        ``AGENT_START_FAILED``, the same code ``POST /v1/session`` answers with, and the reason.
        What the exit means is the process state's: ``_EXITS``."""
        exit = AgentExit(kind, returncode, signum, stderr_tail, start_error, limit)
        stopping = self.process
        waiting, self._waiting = self._waiting, None
        self._process_step(ProcessStep.EXITED)
        if self.lifecycle is Lifecycle.TERMINATED:
            return []
        return self._EXITS[stopping](self, exit, waiting)

    def _exited(self, exit: AgentExit, waiting: _Waiting | None) -> list[Action]:
        """ALIVE (or no process known): exit 0 leaves the session idle with no process, and the
        next prompt respawns (DPS-18-respawn); any other exit is fatal, unless it is the cancel's."""
        out, ok = self._cancel_exit(exit)
        if not ok:
            return out + self._fatal_exit(exit)
        if self.turn is not None:
            out += self._end_turn("end_turn")
        return out

    def _exited_before_respawn(self, exit: AgentExit, waiting: _Waiting | None) -> list[Action]:
        """EXITING_BEFORE_RESPAWN: the previous process is gone, the waiting prompt's starts now
        (unless that exit was a failure, or the prompt's turn ended meanwhile)."""
        out, ok = self._cancel_exit(exit)
        if not ok:
            return out + self._fatal_exit(exit)
        if waiting is not None and self.turn is not None:
            out += self._respawn(*waiting)
        return out

    def _exited_on_cancel(self, exit: AgentExit, waiting: _Waiting | None) -> list[Action]:
        """STOPPING_FOR_CANCEL: the exit is the cancel working, whatever its code: the turn ends
        cancelled (or a prompt that came meanwhile gets its process) and the session goes on."""
        out, _ = self._cancel_exit(exit, stopped=True)
        if waiting is not None and self.turn is not None:
            return out + self._respawn(*waiting)
        if self.turn is not None:
            out += self._end_turn("end_turn")
        return out

    def _exited_on_stall(self, exit: AgentExit, waiting: _Waiting | None) -> list[Action]:
        """STOPPING_FOR_STALL: the agent the watchdog stopped has exited: its turn ends with error;
        a long-lived agent starts again, resuming its session where the profile can (a single-turn
        one starts at the next prompt, as after any turn)."""
        out: list[Action] = []
        if self.turn is not None:
            out += self._end_turn("error")
        if not self.config.single_turn_process:
            self._process_step(ProcessStep.SPAWNED)
            out.append(Spawn(resume_id=self.agent_session_id, mode=self.mode))
            out += self._opening(self.agent_session_id)
        return out

    def _exited_on_delete(self, exit: AgentExit, waiting: _Waiting | None) -> list[Action]:
        """STOPPING_FOR_DELETE: the cleanup frames, ``session.deleted`` and the close follow."""
        out, _ = self._cancel_exit(exit)
        return out + self._turn_cut_by_delete() + self._finish_delete()

    def _exited_on_plugin(self, exit: AgentExit, waiting: _Waiting | None) -> list[Action]:
        """STOPPING_FOR_PLUGIN: the agent stopped after its parser or input raised. Its exit says
        nothing more, whatever its code (``PARSER_FAILED`` said why); a fresh parser and input
        take over, and the session goes on idle with no process, or a prompt that came meanwhile
        gets its process now."""
        out = self._renew_plugin()
        if self._ending:
            return out  # no fresh parser could be made: the session ended
        if waiting is not None and self.turn is not None:
            return out + self._respawn(*waiting)
        if self.turn is not None:
            out += self._end_turn("error")
        return out

    _EXITS: ClassVar[dict[ProcessState, Callable[..., list[Action]]]] = {
        ProcessState.NONE: _exited,
        ProcessState.ALIVE: _exited,
        ProcessState.EXITING_BEFORE_RESPAWN: _exited_before_respawn,
        ProcessState.STOPPING_FOR_CANCEL: _exited_on_cancel,
        ProcessState.STOPPING_FOR_STALL: _exited_on_stall,
        ProcessState.STOPPING_FOR_DELETE: _exited_on_delete,
        ProcessState.STOPPING_FOR_PLUGIN: _exited_on_plugin,
    }

    def _cancel_exit(self, exit: AgentExit, *, stopped: bool = False) -> tuple[list[Action], bool]:
        """Whether the exit is fine (0, or the cancel's), and the log saying it was the cancel's.
        An agent that exits while its turn is cancelled was ended by the cancel: SIGINT (codex exec
        exits 1 on it) or the stop of one that ignored the cancel. That exit is the cancel working,
        not a failure: the turn ends cancelled, the session goes on idle with no process, and the
        next prompt starts the agent again resumed with its session id, as after any exit between
        turns (DPS-6.1.2-cancel, DPS-18-respawn)."""
        if exit.kind == "ok":
            return [], True
        if stopped or (self.turn is not None and self.turn.cancel_requested):
            exit_fields = {"returncode": exit.returncode, "signal": exit.signal}
            return [Log("info", "the agent exited on a cancel", exit_fields)], True
        return [], False

    def _respawn(
        self, text: str, overrides: F.ConfigOverrides | None, images: list[ev.StoredFile]
    ) -> list[Action]:
        """The previous process is gone: the waiting prompt's process starts now."""
        self._process_step(ProcessStep.SPAWNED)
        return self._spawn(text, overrides, images)

    def _fatal_exit(self, exit: AgentExit) -> list[Action]:
        """A fatal agent error ends the session (DPS-4.4-error, §18.2: TERMINATED)."""
        out: list[Action] = []
        named: ExitDescription | None = None
        if exit.start_error is None:
            try:
                named = self._describe_exit(exit.returncode)
            except Exception as err:  # a plugin's bug: the generic error is said instead
                out.append(self._plugin_log(err, "describe_exit"))
        out.append(Emit(self._make(self._exit_error(exit, named), turn=True)))
        if self.turn is not None:
            out += self._end_turn("error")
        self._delete_reason = ("error", "client")
        return out + self._finish_delete()

    def _exit_error(self, exit: AgentExit, named: ExitDescription | None) -> F.AgentError:
        """The fatal ``agent.error`` of an exit; ``named``: the parser's name for its code."""
        returncode, signum, stderr_tail = exit.returncode, exit.signal, exit.stderr_tail
        code = "SIGNAL_EXIT" if exit.kind == "signal" else "AGENT_EXIT"
        how = f"signal {signum}" if exit.kind == "signal" else f"exit code {returncode}"
        message = f"the agent process ended with {how}"
        if exit.start_error is not None:
            code = "AGENT_START_FAILED"
            message = f"the {self.config.agent} agent could not start: {exit.start_error}"
            returncode, stderr_tail = None, exit.start_error
        elif named is not None:
            # The agent's own meaning of the code wins over 128+N: Gemini's 144 is HTTP 400,
            # not signal 16. The exit code stays in details; the guessed signal does not.
            code, message = named
            signum = None
        if exit.limit is not None and exit.start_error is None:
            message = f"{message}: {exit.limit}"
        details = F.ErrorDetails(
            module="process",
            exit_code=returncode,
            signal=signum,
            stderr=stderr_tail or None,
            hint=self.mapper.hint(code, message, stderr_tail) or exit.limit,
        )
        return F.AgentError(
            error_code=code, message=message, severity="fatal", recoverable=False, details=details
        )

    def _stall_tick(self, key: TimerKey) -> list[Action]:
        turn = self.turn
        if turn is None or self.process not in _WATCHED or self._ending:
            return []  # nothing to watch, or the agent is being stopped already
        tick = self.config.stall_tick_sec
        out: list[Action] = [StartTimer(STALL_TIMER, tick)]
        if self._activity != self._activity_seen or self.interactions or turn.cancel_requested:
            # Output came, or the silence is a master's (a pending question) or the cancel's own
            # timers' business.
            self._activity_seen, self._silent_sec, self._stall_warned = self._activity, 0.0, False
            return out
        self._silent_sec += tick
        silent = self._silent_sec
        timeout, warning = self.config.stall_timeout_sec, self.config.stall_warning_sec
        if timeout > 0 and silent >= timeout:
            self._process_step(ProcessStep.STOP_FOR_STALL)
            message = (
                f"the agent printed nothing for {silent:g} s (stall_timeout_sec); "
                "the turn ends and the agent is restarted"
            )
            return [
                self._stall_error(message, "error"),
                Log("warning", "agent stalled; restarting it", {"silent_sec": silent}),
                Terminate(),
            ]
        if warning > 0 and silent >= warning and not self._stall_warned:
            self._stall_warned = True
            message = f"the agent has printed nothing for {silent:g} s (stall_warning_sec)"
            out.append(self._stall_error(message, "warning"))
        return out

    def _stall_error(self, message: str, severity: str) -> Emit:
        """``agent.error`` ``AGENT_STALLED`` in the turn: a warning, or the error that ends it."""
        error = F.AgentError(
            error_code="AGENT_STALLED",
            message=message,
            severity=severity,  # type: ignore[arg-type]
            recoverable=True,
            details=F.ErrorDetails(module="process"),
        )
        return Emit(self._make(error, turn=True))

    def file_not_placed(self, name: str, reason: str) -> list[Action]:
        """An attached file the shell could not write into the workspace (``PlaceFile``):
        ``agent.error`` warning ``UPLOAD_NOT_PLACED`` in the turn, so the master knows the agent
        will not find it where the prompt says."""
        error = F.AgentError(
            error_code=UPLOAD_NOT_PLACED,
            message=f"{UPLOADS_DIR}/{name[:200]} was not written into the workspace: {reason}",
            severity="warning",
            recoverable=True,
            details=F.ErrorDetails(module="files"),
        )
        return [Emit(self._make(error, turn=True))]

    def _describe_exit(self, returncode: int | None) -> ExitDescription | None:
        """The parser's name for a positive exit code (``parsers.base.DescribesExit``), if any."""
        describe = self.plugin.describe_exit
        if describe is None or returncode is None or returncode <= 0:
            return None  # no code to explain: killed by a signal, or no parser opinion
        return describe(returncode)

    # --- the masters' side ---------------------------------------------------------------------

    def attached(self, conn_id: str) -> list[Action]:
        """A master's connection attached: its greeting; the first one closes the reattach window."""
        out: list[Action] = []
        if not self.masters:
            self._attach_step(AttachmentStep.FIRST_MASTER)
            if self.config.reattach_window_sec is not None:
                out.append(CancelTimer(REATTACH_WINDOW_TIMER))
        self.masters.add(conn_id)
        return out + [Emit(f, to=conn_id) for f in self.greeting()]

    def detached(self, conn_id: str) -> list[Action]:
        """A master's connection is gone; when it was the last, the reattach window opens."""
        if conn_id not in self.masters:
            return []
        self.masters.discard(conn_id)
        if self.masters:
            return []
        self._attach_step(AttachmentStep.LAST_MASTER_LEFT)
        return self._window_opens()

    def _window_opens(self) -> list[Action]:
        """DETACHED: the session lives ``reattach_window_sec`` more unless a master attaches."""
        window = self.config.reattach_window_sec
        if (
            window is None
            or self.attachment is Attachment.ATTACHED
            or self.lifecycle is Lifecycle.TERMINATED
        ):
            return []
        return [StartTimer(REATTACH_WINDOW_TIMER, window)]

    def receive(self, conn_id: str, data: bytes | str, user: str | None = None) -> list[Action]:
        """A frame from a master's connection. Never raises. ``user``: who sent it; a relayed
        ``control.*`` frame then carries it as ``metadata.rawp_user`` (whatever the master put
        there), and so does the state change that records a permission it answered."""
        got = codec.decode(data)
        if isinstance(got, codec.Rejected):
            return [
                self._error(got.error.error_code, got.error.message, conn_id, got.message_id),
                Log("info", "frame rejected", {"conn": conn_id, "error": got.error.message}),
            ]
        if isinstance(got, codec.Ignored):
            return [Log("info", "frame of unknown type ignored", {"type": got.frame_type})]
        frame = got.frame
        if not self._seen.first_time(frame.message_id):
            return [Log("debug", "duplicate frame ignored", {"message_id": frame.message_id})]
        if frame.session_id != self.session_id:
            return [
                self._error(
                    "INVALID_FRAME",
                    f"session_id {frame.session_id!r} is not this session's",
                    conn_id,
                    frame.message_id,
                )
            ]
        out: list[Action] = []
        if user is not None and frame.TYPE.startswith("control."):
            frame = msgspec.structs.replace(
                frame, metadata={**(frame.metadata or {}), USER_KEY: user}
            )
        if frame.TYPE.startswith("control."):
            if len(codec.encode(frame)) <= self.config.max_frame_size:
                out.append(Emit(frame, exclude=conn_id))  # DPS-2.4-relay, never echoed
            else:
                # Re-encoding can grow a frame that arrived within the limit (1e9 becomes
                # 1000000000.0): no frame the gateway sends exceeds the size it announced.
                out.append(Log("warning", "control frame too large to relay", {"type": frame.TYPE}))
        self._sender = user
        try:
            return out + self._control(conn_id, frame)
        finally:
            self._sender = None

    def _control(self, conn_id: str, frame: F.Frame) -> list[Action]:
        payload = frame.payload
        mid = frame.message_id
        if self._ending:
            if frame.TYPE.startswith("control."):
                return [self._error("SESSION_TERMINATED", "the session is ending", conn_id, mid)]
            return []
        match payload:
            case F.PromptRequest():
                return self._prompt(conn_id, payload, mid)
            case F.PromptCancel():
                return self._cancel(conn_id, payload, mid)
            case F.InteractionResponse():
                return self._interaction_response(conn_id, payload, mid)
            case F.InteractionTimeout():
                return self._interaction_timeout(conn_id, payload.interaction_id, mid)
            case F.ModeSwitch():
                return self._mode_switch(conn_id, payload, mid)
            case F.SessionCompact():
                return self._compact(conn_id, payload, mid)
            case F.Capabilities():
                return self._master_capabilities(conn_id, payload, mid)
            case F.Renamed():
                return self.rename(payload.name, renamed_by=payload.renamed_by)
            case F.FileSearch() | F.FileSearchCancel():
                return [
                    self._error(
                        "FILE_SEARCH_NOT_SUPPORTED",
                        "this gateway does not announce file_search_fuzzy",
                        conn_id,
                        mid,
                    )
                ]
        return [Log("info", "frame not acted on", {"type": frame.TYPE})]

    def _master_capabilities(self, conn_id: str, caps: F.Capabilities, mid: str) -> list[Action]:
        if caps.protocol_version != F.PROTOCOL_VERSION:
            # DPS-1.3-legacy: only rawp-dps-1.0 is spoken.
            return [
                self._error(
                    "UNSUPPORTED_PROTOCOL",
                    f"protocol_version {caps.protocol_version!r} is not supported; "
                    f"this gateway speaks {F.PROTOCOL_VERSION} only",
                    conn_id,
                    mid,
                )
            ]
        return [SetFeatures(conn_id, agreed_features(caps.features, self.config.features))]

    # prompts ---------------------------------------------------------------------------------

    def _prompt(self, conn_id: str, prompt: F.PromptRequest, mid: str) -> list[Action]:
        if self.lifecycle is Lifecycle.RUNNING:
            # DPS-17.3.2-one-prompt: refused, not delivered.
            return [
                self._error(
                    "PROMPT_IN_PROGRESS",
                    "a turn is already running; cancel it or wait for session.turn.end",
                    conn_id,
                    mid,
                )
            ]
        if (gated := self._gated(conn_id, mid)) is not None:
            return [gated]
        files = context_files(
            prompt.context_files or [],
            self.files,
            session_id=self.session_id,
            accepts_images=self.config.accepts_images,
        )
        if isinstance(files, str):
            return [self._error("INVALID_FRAME", files, conn_id, mid)]
        images, uploads = files
        try:
            text = prompt_text_for_agent(
                prompt, self.config.max_frame_size, attached=attachments_text(images, uploads)
            )
        except PromptRefused as refused:
            return [self._error(refused.code, str(refused), conn_id, mid)]
        limit = self.config.prompt_argv_max
        if limit is not None and len(text.encode()) > limit:
            # Refused before anything starts: exec would fail (E2BIG) and end the session.
            return [
                self._error(
                    "PROMPT_TOO_LONG",
                    f"the prompt is {len(text.encode())} bytes; the {self.config.agent} agent "
                    f"takes its prompt on the command line, which holds at most {limit}",
                    conn_id,
                    mid,
                )
            ]
        out: list[Action] = [PlaceFile(f.transfer_id, name) for f, name in uploads]
        return out + self._start_prompt(text, prompt.config_overrides, images=images)

    def _start_prompt(
        self,
        text: str,
        overrides: F.ConfigOverrides | None,
        *,
        compaction: bool = False,
        images: list[ev.StoredFile] | None = None,
    ) -> list[Action]:
        images = images or []
        out = self._open_turn(overrides, compaction=compaction)
        process = self.process
        if process is ProcessState.NONE:
            self._process_step(ProcessStep.SPAWNED)
            return out + self._spawn(text, overrides, images)
        # A long-lived agent takes the prompt on stdin, unless the gateway is stopping it.
        if self.config.single_turn_process or process in _PROMPTS_WAIT:
            # The previous turn ended but its process is still exiting (codex exec writes its
            # thread after turn.completed; an agent stopped for a cancel, or after its parser or
            # input raised): a second process must not resume the session beside it, so this
            # one starts when that exit is reported.
            self._waiting = (text, overrides, images)
            self._process_step(ProcessStep.PROMPT_WAITS)
            return out
        if images:
            return out + [WritePrompt(text, images)]
        try:
            data = self.input.prompt(text)
        except Exception as err:
            return out + self.plugin_failed(err, "prompt")
        if data is None:  # cannot happen for a long-lived profile with stdin prompts
            return out + [Log("error", "agent cannot take prompts on stdin")]
        return out + [WriteStdin(data)]

    def _spawn(
        self, text: str, overrides: F.ConfigOverrides | None, images: list[ev.StoredFile]
    ) -> list[Action]:
        """A process for this prompt, resuming the agent's session; a long-lived agent (a
        restored session, or one that exited) is told its opening too."""
        spawn = Spawn(
            prompt=text,
            resume_id=self.agent_session_id,
            mode=self.mode,
            overrides=overrides,
            images=images,
        )
        if self.config.single_turn_process:
            return [spawn]
        return [spawn, *self._opening(self.agent_session_id)]

    def _cancel(self, conn_id: str, cancel: F.PromptCancel, mid: str) -> list[Action]:
        if self.turn is None or cancel.target_turn_id != self.turn.turn_id:
            return [
                self._error(
                    "TURN_NOT_FOUND",
                    f"no running turn {cancel.target_turn_id!r} to cancel",
                    conn_id,
                    mid,
                )
            ]
        if self.turn.cancel_requested:
            return []
        self.turn.cancel_requested = True
        self.mapper.cancel_open_blocks()
        self.turn.cancel_denied = frozenset(
            i.call_id for i in self.interactions.values() if i.call_id is not None
        )
        out = self._deny_all_interactions("the turn was cancelled")
        if self._waiting is not None:
            # Its process never started: nothing to interrupt, the turn ends here.
            self._waiting = None
            self._process_step(ProcessStep.PROMPT_WITHDRAWN)
            return out + self._end_turn("cancelled")
        # A single-turn process has no stdin stream to take an interrupt on (its prompt came in
        # argv and stdin is closed): interrupt it as a terminal would, at once, not after the grace.
        data = None
        if not self.config.single_turn_process:
            try:
                data = self.input.interrupt(self._next_request_id("interrupt"))
            except Exception as err:
                return out + self.plugin_failed(err, "interrupt")
        if data is not None:
            out.append(WriteStdin(data))
            if self.plugin.sigint_on_cancel:
                out.append(StartTimer(CANCEL_SIGINT_TIMER, self.config.cancel_sigint_sec))
        else:
            out.append(Signal(_signal.SIGINT))
        out.append(StartTimer(CANCEL_STOP_TIMER, self.config.cancel_stop_sec))
        return out

    def _gated(self, conn_id: str, mid: str) -> Emit | None:
        """A prompt or compaction the budgets refuse (``BUDGET_EXCEEDED``), to its sender."""
        refused = self.prompt_gate() if self.prompt_gate is not None else None
        return None if refused is None else self._error(*refused, conn_id, mid)

    def budget_notice(
        self, code: str, message: str, budget: dict[str, Any], *, cancel: bool
    ) -> list[Action]:
        """A budget the agents' cost reached (the shell keeps the ledger): every master is told
        with a session.error that is not fatal, and, ``cancel``, the running turn is cancelled as
        a master's cancel would be (nothing else stops)."""
        error = F.SessionError(error_code=code, message=message, fatal=False)
        out: list[Action] = [Emit(self._make(error, turn=True, metadata={BUDGET_KEY: budget}))]
        if cancel and self.turn is not None and not self.turn.cancel_requested:
            stop = F.PromptCancel(target_turn_id=self.turn.turn_id, reason="quota_exceeded")
            out += self._cancel("", stop, "")
        return out

    # permissions -------------------------------------------------------------------------------

    def _permission_request(self, req: ev.PermissionRequest, note: Note) -> list[Action]:
        """Who answers: the mode (a write refused), the prompt's denied tools, the permission
        rules, ``auto_allow`` and the prompt's allowed tools, else the masters are asked. The mapper
        is told once, with what was decided about the call (``note``)."""
        spec = lookup(req.tool_name)
        turn = self.turn
        options, choices = interaction_options(req, spec)
        if self.mode in ("plan", "review") and spec.writes:
            # DPS-6.3.2-block: the gateway enforces the mode; the CLI does not when it asks us.
            note.blocked = True
            return self._told(req, note) + self._answer_permission(
                req.request_id, False, BLOCKED_OUTPUT, option=chosen_option(choices, False)
            )
        if turn is not None and req.tool_name in turn.denied:
            return self._told(req, note) + self._answer_permission(
                req.request_id,
                False,
                f"{req.tool_name} is denied for this prompt",
                option=chosen_option(choices, False),
            )
        if self.policy:
            ruled = decide(
                self.policy,
                tool=req.tool_name,
                tool_input=req.input,
                agent=self.config.agent,
                role=self.owner_role,
                workspace=self.config.workspace,
                title=req.title,
                kind=req.kind,
                locations=req.affected_paths,
                paths=req.resolved_paths,
            )
            if ruled is not None and ruled.decision != "ask":
                allow = ruled.decision == ALLOW
                return self._policy_answer(
                    req, ruled.name, allow, ruled.rule.message, choices, note
                )
            if ruled is not None:
                asked = PolicyDecided(ruled.name, "ask", req.tool_name, req.input)
                return [asked, *self._ask_permission(req, options, choices, spec, note, ruled.name)]
        if req.tool_name in self.config.auto_allow or (
            turn is not None and req.tool_name in turn.allowed
        ):
            return self._told(req, note) + self._answer_permission(
                req.request_id, True, updated_input=req.input, option=chosen_option(choices, True)
            )
        return self._ask_permission(req, options, choices, spec, note)

    def _told(self, event: ev.AgentEvent, note: Note) -> list[Action]:
        """The mapper's one call for an event the machine answered itself."""
        return self._emit_all(self.mapper.map_noted(event, note))

    def _policy_answer(
        self,
        req: ev.PermissionRequest,
        rule: str,
        allow: bool,
        message: str,
        choices: dict[str, tuple[str, bool]],
        note: Note,
    ) -> list[Action]:
        """A rule answered (docs/policies.md): the agent at once, the call's later frames say
        which rule (``metadata.rawp_policy``), the shell audits it. A question read back from a
        transcript is answered by nobody (no process runs): nothing is audited."""
        said = ALLOW if allow else DENY
        note.tags = {POLICY_KEY: rule, POLICY_DECISION_KEY: said}
        told = self._told(req, note)
        if not allow and not message:
            message = f"Denied by the gateway's policy {rule}."
        out = self._answer_permission(
            req.request_id,
            allow,
            "" if allow else message,
            updated_input=req.input if allow else None,
            option=chosen_option(choices, allow),
        )
        if not out:
            return told
        return [*told, PolicyDecided(rule, said, req.tool_name, req.input), *out]

    def _ask_permission(
        self,
        req: ev.PermissionRequest,
        options: list[F.InteractionOption],
        choices: dict[str, tuple[str, bool]],
        spec: Any,
        note: Note,
        rule: str | None = None,
    ) -> list[Action]:
        interaction_id = self.factory.new_id()
        context = F.InteractionContext(
            tool_name=req.tool_name,
            tool_input=req.input,
            affected_paths=list(req.affected_paths) or None,
        )
        note.asks = F.InteractionRequest(
            interaction_id=interaction_id,
            interaction_type="PERMISSION",
            question_text=permission_question(req),
            timeout_sec=self.config.permission_timeout_sec,
            options=options,
            context=context,
            default_value=DENY,
        )
        if rule is not None:  # a rule said ask, whatever auto_allow says
            note.ask_metadata = {POLICY_KEY: rule}
        frames = self.mapper.map_noted(req, note)  # the question first
        self.interactions[interaction_id] = _Interaction(
            interaction_id,
            req.request_id,
            req.tool_name,
            req.input,
            frames[0],
            choices,
            req.call_id,
        )
        out = self._emit_all(frames)
        out.append(
            StartTimer(interaction_timer(interaction_id), self.config.permission_timeout_sec)
        )
        return out

    def _answer_permission(
        self,
        request_id: str,
        allow: bool,
        message: str = "",
        updated_input: dict[str, Any] | None = None,
        option: str | NoOption | None = NO_OPTION,
    ) -> list[Action]:
        # ``option``: the agent's own option chosen (None: no choice, ACP's "cancelled"); only
        # for an agent that offered options.
        extra: dict[str, Any] = {} if isinstance(option, NoOption) else {"option": option}
        if self.process is ProcessState.STOPPING_FOR_PLUGIN:
            return []  # its input raised: nothing more is asked of it, the agent is being stopped
        try:
            data = self.input.permission(
                request_id, allow=allow, message=message, updated_input=updated_input, **extra
            )
        except Exception as err:
            return self.plugin_failed(err, "permission")
        return [WriteStdin(data)] if data is not None and self.process is not _NO_PROCESS else []

    def _settle(
        self,
        interaction: _Interaction,
        allow: bool,
        message: str,
        outcome: str,
        value: str | None = None,
    ) -> list[Action]:
        self.last_decision = ALLOW if allow else DENY
        out: list[Action] = [
            CancelTimer(interaction_timer(interaction.interaction_id)),
            Settled("PERMISSION", outcome),
        ]
        option: str | NoOption | None = NO_OPTION
        if interaction.choices:
            # The master's choice; a timeout or a cancel chooses nothing (ACP: "cancelled").
            chosen = interaction.choices.get(value) if value is not None else None
            option = chosen[0] if chosen is not None else None
        out += self._answer_permission(
            interaction.request_id,
            allow,
            message,
            updated_input=interaction.input if allow else None,
            option=option,
        )
        if not self.interactions and self.turn is not None:
            frames = self.mapper.set_agent_state("tool_calling", "permission_answered")
            if self._sender is not None:  # who answered, for every master (and the history)
                by = {USER_KEY: self._sender, "interaction_id": interaction.interaction_id}
                frames = [
                    msgspec.structs.replace(f, metadata={**(f.metadata or {}), **by})
                    for f in frames
                ]
            out += self._emit_all(frames)
        return out

    def _interaction_response(
        self, conn_id: str, resp: F.InteractionResponse, mid: str
    ) -> list[Action]:
        interaction = self.interactions.pop(resp.interaction_id, None)
        if interaction is None:
            return [
                self._error(
                    "INTERACTION_NOT_FOUND",
                    f"no pending interaction {resp.interaction_id!r}",
                    conn_id,
                    mid,
                )
            ]
        allow, value = decision(interaction.choices, resp.selected_value)
        message = resp.text_input or ("" if allow else "The user denied this tool use.")
        return self._settle(interaction, allow, message, "allowed" if allow else "denied", value)

    def _interaction_timeout(self, conn_id: str | None, interaction_id: str, mid: str | None):
        interaction = self.interactions.pop(interaction_id, None)
        if interaction is None:
            if conn_id is None:
                return []
            return [
                self._error(
                    "INTERACTION_NOT_FOUND",
                    f"no pending interaction {interaction_id!r}",
                    conn_id,
                    mid,
                )
            ]
        # DPS-6.2-interaction: a timeout denies a PERMISSION.
        return self._settle(interaction, False, "The permission request timed out.", "timed_out")

    def _answered_in_transcript(self, event: ev.PermissionAnswered) -> list[Action]:
        """A replayed transcript says how a permission was answered: the interaction ends there,
        as a master's answer would have ended it (nothing is written: no process runs)."""
        found = next(
            (i for i in self.interactions.values() if i.request_id == event.request_id), None
        )
        if found is None:
            return []
        del self.interactions[found.interaction_id]
        outcome = "allowed" if event.allow else "denied"
        return self._settle(found, event.allow, "", outcome)

    def _deny_all_interactions(self, why: str) -> list[Action]:
        out: list[Action] = []
        while self.interactions:
            _, interaction = self.interactions.popitem()
            out += self._settle(interaction, False, f"Denied: {why}.", "cancelled")
        return out

    # modes and compaction ----------------------------------------------------------------------

    def _mode_switch(self, conn_id: str, switch: F.ModeSwitch, mid: str) -> list[Action]:
        if not self.config.features.plan_mode:
            return [
                self._error(
                    "MODE_NOT_SUPPORTED",
                    f"the {self.config.agent} agent does not support mode switching",
                    conn_id,
                    mid,
                )
            ]
        if self.lifecycle is Lifecycle.RUNNING:
            return [
                self._error(
                    "MODE_SWITCH_DURING_TURN",
                    "the mode cannot change while a turn is running",
                    conn_id,
                    mid,
                )
            ]
        previous, self.mode = self.mode, switch.mode
        out: list[Action] = []
        if self.process not in _NO_INPUT and not self.config.single_turn_process:
            # review is enforced by the gateway; the CLI itself runs in default mode then.
            cli_mode = "plan" if switch.mode == "plan" else "default"
            try:
                data = self.input.set_mode(self._next_request_id("set_mode"), cli_mode)
            except Exception as err:
                # The mode is the session's all the same: the next process starts in it.
                data = None
                out += self.plugin_failed(err, "set_mode")
            if data is not None:
                out.append(WriteStdin(data))
        state = self.mapper.agent_state
        change = F.StateChanged(previous_state=state, current_state=state, reason="mode_switch")
        frame = self.factory.frame(
            change, metadata={"mode": switch.mode, "previous_mode": previous}
        )
        out.append(Emit(frame))
        return out

    def _compact(self, conn_id: str, compact: F.SessionCompact, mid: str) -> list[Action]:
        if not self.config.features.context_compaction:
            return [
                self._error(
                    "COMPACTION_NOT_SUPPORTED",
                    f"the {self.config.agent} agent does not support context compaction",
                    conn_id,
                    mid,
                )
            ]
        if self.lifecycle is Lifecycle.RUNNING:
            return [
                self._error(
                    "PROMPT_IN_PROGRESS", "compaction must wait for the running turn", conn_id, mid
                )
            ]
        if (gated := self._gated(conn_id, mid)) is not None:
            return [gated]
        text = "/compact" + (f" {compact.instruction}" if compact.instruction else "")
        if "\0" in text:
            return [self._error(nul_refused().code, str(nul_refused()), conn_id, mid)]
        return self._start_prompt(text, None, compaction=True)

    def _control_ack(self, ack: ev.ControlAck) -> list[Action]:
        what = self._pending_controls.pop(ack.request_id, None)
        if ack.ok or what is None:
            return []
        return [Log("warning", f"agent refused the {what} request", {"error": ack.error})]

    # The agent events the machine handles alone (no frame of the mapper's).
    _OWN_EVENTS: ClassVar[dict[type, Callable[[SessionMachine, Any], list[Action]]]] = {
        ev.TurnEnded: _turn_ended,
        ev.ControlAck: _control_ack,
        ev.ParseError: _parse_error,
        ev.OddNumbers: _odd_numbers,
        ev.StdinWrite: _stdin_write,
        ev.ModeChanged: _agent_mode,
        ev.PermissionAnswered: _answered_in_transcript,
        ev.FeaturesDeclared: _features_declared,
    }

    # timers and the control plane ----------------------------------------------------------------

    def timer_fired(self, key: TimerKey) -> list[Action]:
        return self._TIMERS[key.kind](self, key)

    def _cancel_sigint(self, key: TimerKey) -> list[Action]:
        if self.turn is not None and self.process is not ProcessState.NONE:
            return [Signal(_signal.SIGINT)]
        return []

    def _cancel_stop(self, key: TimerKey) -> list[Action]:
        if self.turn is None or self.process is not ProcessState.ALIVE:
            return []  # the turn ended, or the agent exits or is stopped already
        self._process_step(ProcessStep.STOP_FOR_CANCEL)
        return [Log("warning", "the agent ignored the cancel; stopping it"), Terminate()]

    def _interaction_timer(self, key: TimerKey) -> list[Action]:
        return self._interaction_timeout(None, key.interaction_id or "", None)

    def _reattach_window(self, key: TimerKey) -> list[Action]:
        """No master came back in time: the session ends (DPS-7.7-deleted, ``timeout``)."""
        if self.attachment is Attachment.ATTACHED:
            return []
        return self.delete("timeout", "system")

    _TIMERS: ClassVar[dict[TimerKind, Callable[[SessionMachine, TimerKey], list[Action]]]] = {
        TimerKind.CANCEL_SIGINT: _cancel_sigint,
        TimerKind.CANCEL_STOP: _cancel_stop,
        TimerKind.STALL: _stall_tick,
        TimerKind.INTERACTION: _interaction_timer,
        TimerKind.REATTACH_WINDOW: _reattach_window,
    }

    def rename(self, name: str, *, renamed_by: F.RenamedBy = "master") -> list[Action]:
        previous, self.name = self.name, name
        payload = F.Renamed(
            session_id=self.session_id, name=name, renamed_by=renamed_by, previous_name=previous
        )
        return [Emit(self._make(payload))]  # DPS-7.6-renamed: to every connection

    def delete(
        self,
        reason: F.DeleteReason = "master_request",
        deleted_by: F.DeletedBy = "master",
        *,
        shutdown: bool = False,
    ) -> list[Action]:
        """End the session: deny what waits, stop the agent, then the cleanup frames (DPS-7.5.3),
        ``session.deleted`` (DPS-7.7) and close. With no process the cleanup happens at once.
        ``shutdown``: the gateway stops and keeps no sessions; the frame says it in DPS's words
        (``reason``, ``deleted_by``), the log and the close reason in plain ones."""
        if self._ending:
            return []
        self._delete_reason = (reason, deleted_by)
        self._shutdown = shutdown
        out = self._deny_all_interactions("the session is ending")
        if self.process is not ProcessState.NONE:
            self._waiting = None  # its prompt's turn ends with the session
            self._process_step(ProcessStep.STOP_FOR_DELETE)
            self._step(LifecycleStep.STOPPING)
            return out + [Terminate()]
        return out + self._finish_delete()

    def _turn_cut_by_delete(self) -> list[Action]:
        """The open turn ends ``error`` with its session; a shutdown's says why first (DPS's
        stop reason cannot)."""
        if self.turn is None:
            return []
        out: list[Action] = [Emit(self._make(SHUTDOWN_ERROR, turn=True))] if self._shutdown else []
        return out + self._end_turn("error")

    def _finish_delete(self) -> list[Action]:
        assert self._delete_reason is not None
        reason, deleted_by = self._delete_reason
        out = self._turn_cut_by_delete()
        self._step(LifecycleStep.DELETED)
        deleted = F.Deleted(session_id=self.session_id, reason=reason, deleted_by=deleted_by)
        out.append(Emit(self._make(deleted)))
        # Said in the log too: with no master attached (a reattach window that ran out) the
        # frame reaches nobody, and the log is where an operator learns why a session ended.
        if self._shutdown:
            out.append(
                Log("info", "session deleted", {"reason": "shutdown", "deleted_by": "gateway"})
            )
            out.append(CloseAll(SHUTDOWN_CLOSE))
            return out
        out.append(Log("info", "session deleted", {"reason": reason, "deleted_by": deleted_by}))
        out.append(CloseAll(f"session deleted ({reason})"))
        return out

    # --- a plugin that raised ---------------------------------------------------------------------

    def plugin_failed(self, err: Exception, where: str) -> list[Action]:
        """The session's parser or input (a plugin: ``parsers/base.py``) raised in ``where`` (its
        method's name), which the protocols forbid: a bug, after which nothing it says or writes
        can be trusted. It ends the turn, not the session: ``agent.error`` ``PARSER_FAILED``
        (severity error, recoverable) to every master with the exception's type and message, never
        its traceback (the log's); the open turn ends ``error`` (its open calls cancelled first,
        as for any turn cut short); the agent is stopped (``STOPPING_FOR_PLUGIN``) and its exit
        says nothing more. The session goes on idle, its masters attached: the next prompt starts
        the agent again (resumed with its session id where the profile can, DPS-18-respawn) with
        a fresh parser and input. A plugin that raises again meanwhile, or while the session is
        deleted, is only logged."""
        logged = self._plugin_log(err, where)
        if self._ending or self._plugin_failing or self.process is ProcessState.STOPPING_FOR_PLUGIN:
            return [logged]
        self._plugin_failing = True
        try:
            return self._plugin_failed(err, where, logged)
        finally:
            self._plugin_failing = False

    def _plugin_failed(self, err: Exception, where: str, logged: Log) -> list[Action]:
        out: list[Action] = [Emit(self._make(self._plugin_error(err, where), turn=True)), logged]
        process = self.process
        if process is not ProcessState.NONE:
            self._waiting = None  # the prompt waiting for the exit: its turn ends here
            self._process_step(ProcessStep.STOP_FOR_PLUGIN)
        if self.turn is not None:
            out += self._end_turn("error")
        if process is ProcessState.NONE:
            return out + self._renew_plugin()  # no process to stop: the fresh one now
        return out if process in _STOPPING else [*out, Terminate()]

    def _plugin_error(self, err: Exception, where: str) -> F.AgentError:
        """``PARSER_FAILED``: the plugin's method, the exception's type and its bounded message."""
        part = "parser" if where in ("feed", "end") else "input"
        said = str(err)
        if len(said) > MAX_PLUGIN_ERROR_CHARS:
            said = said[: MAX_PLUGIN_ERROR_CHARS - 1] + "…"
        kind = type(err).__qualname__
        if type(err).__module__ not in ("builtins", "__main__"):
            kind = f"{type(err).__module__}.{kind}"[-MAX_PLUGIN_ERROR_CHARS:]
        message = f"the {self.config.agent} agent's {part} raised {kind} in {where}"
        if said:
            message = f"{message}: {said}"[:MAX_ERROR_MESSAGE]
        return F.AgentError(
            error_code=PARSER_FAILED,
            message=message,
            severity="error",
            recoverable=True,
            details=F.ErrorDetails(module=part),
        )

    def _renew_plugin(self) -> list[Action]:
        """A fresh parser and input in place of the ones that raised (``plugins``). One that
        cannot be made ends the session: nothing could read its agent."""
        if self._plugins is None:
            return []
        try:
            plugin = self._plugins()
        except Exception as err:
            return [self._plugin_log(err, "a new parser"), *self.delete("error", "client")]
        self.plugin, self.parser, self.input = plugin, plugin.parser, plugin.input
        return []

    def _plugin_log(self, err: Exception, where: str) -> Log:
        fields = {"agent": self.config.agent, "method": where, "error": repr(err)[:512]}
        return Log("error", "agent plugin raised", fields, exc=err)
