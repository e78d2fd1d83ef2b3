"""Prometheus metrics of the gateway: one `GatewayMetrics` per server, served on `GET /metrics`.

Theory of operation
-------------------
Operators ask three questions of a sidecar: is it flowing, how fast, where does it hurt. The
instruments here answer them, and split in two kinds by how often the server touches them.

*Hot path* — every agent stdout line, every frame, every WebSocket write. A prometheus-client
`Counter.inc()` takes a lock and costs about as much as decoding a whole JSON line with msgspec, so
instrumenting the hot path with it would halve throughput. So the hot path never touches a
prometheus-client object:

- counters are plain ints in `__slots__` objects, pre-resolved per label value (a dict lookup by
  frame type; one `AgentLineMetrics` handle per agent, resolved once per session);
- histogram observations and line kinds are *appended* to an `array('q')` / a list, through the
  container's own bound `append` handed out as the method: a call straight into C, no Python
  frame. `fold()` sorts them into bucket counts, also in C, on every scrape and every
  `FOLD_INTERVAL_SEC` (a timer `start()` sets; sooner while observations come fast, so that no fold
  holds the loop long), so pending memory stays bounded.

A custom collector turns all this into metric families when `/metrics` is scraped. The gateway
runs on one asyncio event loop and `render()` is called from that same loop, so the numbers need
no lock and a scrape sees a consistent snapshot. **Hot-path methods must be called from the event
loop thread.** `bench/bench_metrics.py` measures what they cost.

*Cold path* — session transitions, connections, turns, tool results, interactions, process starts and
exits, usage and compactions: at most a few per turn. These use ordinary prometheus-client instruments (children are still
pre-resolved where the label set is small and fixed).

Label values are bounded by construction, never copied from the wire: frame types come from the
DPS 1.0.1 list (appendix B) and the gateway's own `x-rawp-gateway.*` events, plus `other`; tool names pass only if they are in the known catalogs of
the three agents, `mcp_*` tools collapse to `mcp`, anything else is `other`; stop reasons, statuses,
interaction types and outcomes come from fixed enums; agent names from the configured profiles; agent
line kinds from what the parser reports, capped per agent. Two labels are names from outside, so
each keeps at most 32 values (then `other`): the model as the agent names it, and the session's
owner. No session id, invocation id or other free text ever becomes a label value.

Every metric is listed, with its labels and meaning, in `deploy/README.md` ("Metrics").

The rooms: `GatewayMetrics` here (every instrument, the hot-path methods kept on it so a call is
one attribute hop), the hot path's plain-int instruments and their collector in `hot_path.py`,
the buckets and label value sets in `labels.py`, the permission rules' and budgets' instruments in
`decisions.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from gateway.metrics.decisions import DecisionMetrics
from gateway.metrics.hot_path import (
    AgentLineMetrics,
    HotPathCollector,
    NsHistogram,
    Tally,
    clock_ns,
)
from gateway.metrics.labels import (
    AGENT_LINE_KIND_LIMIT,
    COMPACTION_TRIGGERS,
    CONNECTION_ROLES,
    CONTEXT_BANDS,
    DEFAULT_AGENTS,
    EXIT_CLASSES,
    FRAME_TYPES,
    FROM_MASTER,
    INTERACTION_OUTCOMES,
    INTERACTION_TYPES,
    LABEL_VALUE_MAX,
    LATENCY_BUCKETS,
    MODEL_LABEL_LIMIT,
    NOTIFY_EVENTS,
    OTHER,
    PREFIX,
    RESTORE_FAILURES,
    SESSION_STATES,
    STATE_FILES,
    STOP_REASONS,
    TO_MASTER,
    TOKEN_KINDS,
    TOOL_STATUSES,
    TURN_BUCKETS,
    USER_LABEL_LIMIT,
    CappedLabel,
    bounded,
    context_band,
    frame_type_label,
    tool_label,
)
from gateway.protocol.usage import Counted

# The names tests, benches and docs name through the package.
__all__ = [
    "AGENT_LINE_KIND_LIMIT",
    "FRAME_TYPES",
    "LABEL_VALUE_MAX",
    "LATENCY_BUCKETS",
    "MODEL_LABEL_LIMIT",
    "USER_LABEL_LIMIT",
    "AgentLineMetrics",
    "GatewayMetrics",
    "clock_ns",
    "frame_type_label",
    "tool_label",
]


class GatewayMetrics:
    """Every instrument of one gateway server, in a registry of its own.

    A registry per instance (not prometheus-client's global one) lets tests and several servers
    live in one process. Serve `render()` on `GET /metrics`.

    Hot path (event-loop thread only; see the module docstring):
      `agent_lines(agent)` once per session, then `.line(kind, parse_ns)` (or `.parse_error()`,
      `.unknown_kind()`) per stdout line; `frame_out(type_, nbytes)` per frame produced;
      `frame_in(type_, nbytes)` per frame received; `observe_latency_ns(clock_ns() - t_ns)` per
      frame written to each WebSocket; `history_appended(nbytes)` / `history_evicted(...)`.
    Cold path: `session_state`, `ws_connected`, `ws_disconnected`, `reattached`, `turn_ended`,
    `tool_result`, `interaction`, `process_started`, `process_exited`, `history_released`,
    `usage`, `context_limit_turn`, `compacted`, `context_fill`.
    Folding: `start()` (called by the first `agent_lines()` made inside a running loop, so the
    server need not) folds every FOLD_INTERVAL_SEC; `close()` stops it.
    """

    #: How often the pending hot-path observations are folded into counts (see `start`), and how
    #: often while they come fast (more than FOLD_BUSY_SAMPLES latencies in one interval): a fold
    #: holds the event loop for about 0.1 µs per observation, so 16 masters at 10,000 frames/s
    #: would make a 4 ms pause of every quarter second.
    FOLD_INTERVAL_SEC: Final = 0.25
    FOLD_BUSY_INTERVAL_SEC: Final = 0.02
    FOLD_BUSY_SAMPLES: Final = 2048

    clock_ns: Final = staticmethod(clock_ns)

    #: Nanoseconds from reading the agent's stdout line (`StdoutLine.t_ns`) to writing a frame made
    #: from it on one WebSocket: `observe_latency_ns(clock_ns() - line.t_ns)`. Set per instance.
    observe_latency_ns: Callable[[int], None]

    def __init__(
        self,
        *,
        agents: Iterable[str] = DEFAULT_AGENTS,
        version: str | None = None,
        process_collectors: bool = True,
    ) -> None:
        """`agents`: the configured profile names, the only values the `agent` label takes (any
        other name is counted as `other`). `version`: reported by `rawp_gateway_build_info`.
        `process_collectors`: add the standard `process_*` and `python_info` series.
        """
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if process_collectors:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)

        # --- hot path: plain ints, exported by HotPathCollector -------------------------------
        self._tallies: dict[tuple[str, str], Tally] = {}
        self._out: dict[str, Tally] = {}
        self._in: dict[str, Tally] = {}
        for type_ in FRAME_TYPES:
            self._out[type_] = self._tallies[(type_, TO_MASTER)] = Tally()
            self._in[type_] = self._tallies[(type_, FROM_MASTER)] = Tally()
        self._out_other = self._tallies[(OTHER, TO_MASTER)] = Tally()
        self._in_other = self._tallies[(OTHER, FROM_MASTER)] = Tally()
        self._latency = NsHistogram(LATENCY_BUCKETS)
        # The array's own bound append: a call into C, no Python frame (see NsHistogram).
        self.observe_latency_ns = self._latency.observe
        self._fold_timer: asyncio.TimerHandle | None = None
        self._agent_names = tuple(dict.fromkeys(agents))
        self._agents: dict[str, AgentLineMetrics] = {
            a: AgentLineMetrics(a) for a in (*self._agent_names, OTHER)
        }
        self._history_bytes = 0
        self._history_evicted = 0
        r.register(HotPathCollector(self))

        # --- cold path: ordinary instruments ---------------------------------------------------
        Gauge(
            PREFIX + "build_info",
            "Always 1; the gateway's version as a label.",
            ("version",),
            registry=r,
        ).labels(version or _package_version()).set(1)
        self._draining = Gauge(
            PREFIX + "draining",
            "1 while an operator drains the gateway (SIGUSR1 until SIGUSR2: no new sessions).",
            registry=r,
        )
        self._sessions = Gauge(
            PREFIX + "sessions",
            "Sessions held by the gateway, by state (IDLE, RUNNING, DETACHED, TERMINATED).",
            ("state",),
            registry=r,
        )
        self._session_gauges = {s: self._sessions.labels(s) for s in SESSION_STATES}
        self._sessions_created = Counter(
            PREFIX + "sessions_started",
            "Sessions created, by agent profile.",
            ("agent",),
            registry=r,
        )
        self._connections = Gauge(
            PREFIX + "ws_connections",
            "Open WebSocket connections, by role (master, local_ui).",
            ("role",),
            registry=r,
        )
        self._connection_gauges = {c: self._connections.labels(c) for c in CONNECTION_ROLES}
        self._connections_total = Counter(
            PREFIX + "ws_connections_opened",
            "WebSocket connections accepted, by role.",
            ("role",),
            registry=r,
        )
        self._reattaches = Counter(
            PREFIX + "reattaches",
            "WebSocket reattaches with last_message_id, by result: complete (every missed frame "
            "replayed) or truncated (some were already evicted).",
            ("result",),
            registry=r,
        )
        self._reattach_lost = Counter(
            PREFIX + "reattach_lost_frames",
            "Frames a reattaching master missed because they had been evicted from history.",
            registry=r,
        )
        self._turns = Counter(
            PREFIX + "turns",
            "Turns ended, by stop_reason.",
            ("stop_reason",),
            registry=r,
        )
        self._turn_duration = Histogram(
            PREFIX + "turn_duration_seconds",
            "Wall time of a turn, from session.turn.start to session.turn.end.",
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self._tools = Counter(
            PREFIX + "tool_invocations",
            "Tool invocations finished (tool.invoke.result), by tool (catalog name, mcp or "
            "other) and status.",
            ("tool", "status"),
            registry=r,
        )
        self._interactions = Counter(
            PREFIX + "interactions",
            "Interactions asked of masters (agent.interaction.request), by type and outcome "
            "(allowed, denied, answered, timed_out, cancelled).",
            ("type", "outcome"),
            registry=r,
        )
        self._restored = Counter(
            PREFIX + "sessions_restored",
            "Saved sessions read back from the state directory at start: restored, or the "
            "reason one was skipped (unreadable, corrupt, version, agent, workspace).",
            ("result",),
            registry=r,
        )
        # The state directory (gateway/storage/state_dir.py): writes that fail (a full disk).
        self._state_dir_errors = Counter(
            PREFIX + "state_dir_write_errors",
            "Writes to the state directory that failed (a full disk, an I/O error), by file: "
            "create (a new session's directory), record (session.json), log (frames.log).",
            ("file",),
            registry=r,
        )
        self._state_dir_failing = Gauge(
            PREFIX + "state_dir_failing_sessions",
            "Sessions whose record or frames could not be written and are held in memory, tried "
            "again every second; 0 when the state directory takes every write.",
            registry=r,
        )
        self._history_gap = Counter(
            PREFIX + "saved_history_gap_frames",
            "Frames that never reached a session's frame log (held past the bound while the "
            "disk was full): after a restart, a reattach across them is truncated.",
            registry=r,
        )
        self._saved_logs_torn = Counter(
            PREFIX + "saved_logs_torn",
            "Frame logs read back at start that held a torn line: read up to it, cut there, and "
            "a reattach from before the restart told frames may be missing.",
            registry=r,
        )
        # Files of sessions (gateway/storage/files.py): what is held on disk, and what was offered.
        self._file_bytes = Gauge(
            PREFIX + "session_file_bytes",
            "Bytes of files held in the sessions' file stores (tool output and uploads, on disk).",
            registry=r,
        )
        self._files = Counter(
            PREFIX + "session_files",
            "Files offered to a session's file store, by direction (download: binary tool "
            "output; upload: a master's PUT) and outcome (stored, refused).",
            ("direction", "outcome"),
            registry=r,
        )
        self._process_starts = Counter(
            PREFIX + "agent_process_starts",
            "Agent processes started, by agent.",
            ("agent",),
            registry=r,
        )
        self._process_exits = Counter(
            PREFIX + "agent_process_exits",
            "Agent processes exited, by agent and exit class (DPS 17.2.2: ok is 0, signal is "
            "killed by a signal or 128+N, error is any other code).",
            ("agent", "exit_class"),
            registry=r,
        )
        self._notifications = Counter(
            PREFIX + "notifications",
            "Webhook notifications (gateway/team/notify.py), by event and result: sent, retried (an "
            "attempt failed and another follows) or dropped (the queue was full, or retries ran "
            "out).",
            ("event", "result"),
            registry=r,
        )

        # Usage and cost (gateway/protocol/usage.py says what one session.usage adds): counted once per
        # main-agent session.usage, a few per turn, so ordinary instruments.
        self._tokens = Counter(
            PREFIX + "tokens",
            "Tokens the agents reported in their main session.usage, once per turn, by agent, "
            "model (the agent's own name, at most 32 then other; unknown when it does not say) "
            "and kind (input: uncached input, output, cache_read, cache_write).",
            ("agent", "model", "kind"),
            registry=r,
        )
        self._cost = Counter(
            PREFIX + "cost_usd",
            "Cost in USD as the agents report it (the increase of their own running total), by "
            "agent and model; agents that report no cost add nothing, never an estimate.",
            ("agent", "model"),
            registry=r,
        )
        self._user_tokens = Counter(
            PREFIX + "user_tokens",
            "The tokens of rawp_gateway_tokens_total by the session's owner (at most 32 users "
            "then other; local on a gateway without credentials) and kind.",
            ("user", "kind"),
            registry=r,
        )
        self._user_cost = Counter(
            PREFIX + "user_cost_usd",
            "The cost of rawp_gateway_cost_usd_total by the session's owner.",
            ("user",),
            registry=r,
        )
        self._context_limit_turns = Counter(
            PREFIX + "context_limit_turns",
            "Turns whose usage reported the context window at least 95% full (DPS 7.3: compaction "
            "is then a must), by agent.",
            ("agent",),
            registry=r,
        )
        self._compactions = Counter(
            PREFIX + "compactions",
            "Compactions of the main agent's context (session.compacted), by agent and trigger "
            "(auto, manual, requested).",
            ("agent", "trigger"),
            registry=r,
        )
        self._context_fill = Gauge(
            PREFIX + "sessions_context_fill",
            "Live sessions by how full their context window was at their last usage, in bands "
            "named by their lower bound (0.0, 0.5, 0.8, 0.95); sessions whose agent reports no "
            "context window are not counted.",
            ("band",),
            registry=r,
        )
        self._fill_bands = {b: self._context_fill.labels(str(b)) for b in CONTEXT_BANDS}
        self._model_label = CappedLabel(MODEL_LABEL_LIMIT)
        self._user_label = CappedLabel(USER_LABEL_LIMIT)
        # Permission rules and budgets (decisions.py).
        self.decisions = DecisionMetrics(r)

        # Pre-resolve and pre-create the small fixed label sets, so every series exists (at 0)
        # from the first scrape: rate() and absent() then behave, and dashboards show zeros.
        self._turn_children = {s: self._turns.labels(s) for s in (*STOP_REASONS, OTHER)}
        self._interaction_children = {
            (t, o): self._interactions.labels(t, o)
            for t in (*INTERACTION_TYPES, OTHER)
            for o in (*INTERACTION_OUTCOMES, OTHER)
        }
        self._tool_children: dict[tuple[str, str], Counter] = {}
        for agent in self._agents:
            self._context_limit_turns.labels(agent)
            for trigger in COMPACTION_TRIGGERS:
                self._compactions.labels(agent, trigger)
            self._sessions_created.labels(agent)
            self._process_starts.labels(agent)
            for cls in EXIT_CLASSES:
                self._process_exits.labels(agent, cls)
        for role in CONNECTION_ROLES:
            self._connections_total.labels(role)
        for result in ("complete", "truncated"):
            self._reattaches.labels(result)
        for result in ("restored", *RESTORE_FAILURES, OTHER):
            self._restored.labels(result)
        for file in (*STATE_FILES, OTHER):
            self._state_dir_errors.labels(file)
        for event in NOTIFY_EVENTS:
            for result in ("sent", "retried", "dropped"):
                self._notifications.labels(event, result)

    # --- hot path ---------------------------------------------------------------------------

    def agent_lines(self, agent: str) -> AgentLineMetrics:
        """The line counters of `agent` (a configured profile name, else `other`). Resolve once
        per session and keep the handle: its methods are the per-line calls. Inside a running event
        loop this also starts the periodic fold (see `start`)."""
        if self._fold_timer is None:
            with contextlib.suppress(RuntimeError):  # no running loop: scrapes still fold
                self.start()
        return self._agents.get(agent) or self._agents[OTHER]

    def frame_out(self, type_: str, nbytes: int) -> None:
        """A frame the gateway produced for masters, a relayed control.* frame included (once per
        frame, before fan-out)."""
        t = self._out.get(type_) or self._out_other
        t.frames += 1
        t.nbytes += nbytes

    def frame_in(self, type_: str, nbytes: int) -> None:
        """A frame received from a master (valid or not; unknown types count as `other`)."""
        t = self._in.get(type_) or self._in_other
        t.frames += 1
        t.nbytes += nbytes

    # --- folding ----------------------------------------------------------------------------

    def fold(self) -> None:
        """Sort pending hot-path observations into their counts. Every scrape does it first;
        `start()` also does it every FOLD_INTERVAL_SEC so that memory stays bounded by the rate
        times that interval (8 bytes per observation) between scrapes."""
        self._latency.fold()
        for agent in self._agents.values():
            agent.fold()

    def start(self) -> None:
        """Fold periodically on the running event loop, until `close()`."""
        if self._fold_timer is None:
            self._fold_timer = asyncio.get_running_loop().call_later(
                self.FOLD_INTERVAL_SEC, self._fold_tick
            )

    def close(self) -> None:
        """Stop the periodic fold (and fold what is pending, for a last scrape)."""
        if self._fold_timer is not None:
            self._fold_timer.cancel()
            self._fold_timer = None
        self.fold()

    def _fold_tick(self) -> None:
        busy = len(self._latency.pending) > self.FOLD_BUSY_SAMPLES
        self.fold()
        interval = self.FOLD_BUSY_INTERVAL_SEC if busy else self.FOLD_INTERVAL_SEC
        self._fold_timer = asyncio.get_running_loop().call_later(interval, self._fold_tick)

    def history_appended(self, nbytes: int) -> None:
        """A frame of `nbytes` went into a session's history buffer."""
        self._history_bytes += nbytes

    def history_evicted(self, nframes: int, nbytes: int) -> None:
        """`nframes` frames totalling `nbytes` were evicted to keep a buffer within its limit."""
        self._history_evicted += nframes
        self._history_bytes -= nbytes

    def history_released(self, nbytes: int) -> None:
        """A session's buffer of `nbytes` was freed (the session was forgotten)."""
        self._history_bytes -= nbytes

    # --- cold path --------------------------------------------------------------------------

    def session_state(self, old: str | None, new: str | None, *, agent: str | None = None) -> None:
        """A session moved from state `old` to `new` (IDLE, RUNNING, DETACHED, TERMINATED).

        `old=None` when the session is created (pass `agent` then), `new=None` when the server
        forgets it. Unknown state names raise: they are a bug in the caller, not agent input.
        """
        if old is not None:
            self._session_gauges[old].dec()
        else:
            self._sessions_created.labels(self._agent_label(agent or OTHER)).inc()
        if new is not None:
            self._session_gauges[new].inc()

    def ws_connected(self, role: str = "master") -> None:
        """A WebSocket was accepted (`role` master or local_ui)."""
        self._connection_gauges[role].inc()
        self._connections_total.labels(role).inc()

    def ws_disconnected(self, role: str = "master") -> None:
        """A WebSocket closed, whatever the reason."""
        self._connection_gauges[role].dec()

    def reattached(self, *, lost_frames: int = 0) -> None:
        """A master reattached with last_message_id; `lost_frames` already evicted (0 if none)."""
        self._reattaches.labels("truncated" if lost_frames else "complete").inc()
        if lost_frames:
            self._reattach_lost.inc(lost_frames)

    def turn_ended(self, stop_reason: str, duration_seconds: float) -> None:
        """A turn ended (session.turn.end) with `stop_reason`, after `duration_seconds`."""
        child = self._turn_children.get(stop_reason) or self._turn_children[OTHER]
        child.inc()
        self._turn_duration.observe(duration_seconds)

    def tool_result(self, tool_name: str, status: str) -> None:
        """A tool invocation finished (tool.invoke.result) with `status`."""
        key = (tool_label(tool_name), bounded(status, TOOL_STATUSES))
        child = self._tool_children.get(key)
        if child is None:
            child = self._tool_children[key] = self._tools.labels(*key)
        child.inc()

    def interaction(self, type_: str, outcome: str) -> None:
        """An interaction was resolved: `type_` is its interaction_type, `outcome` one of
        allowed, denied, answered, timed_out, cancelled."""
        key = (bounded(type_, INTERACTION_TYPES), bounded(outcome, INTERACTION_OUTCOMES))
        self._interaction_children[key].inc()

    def session_restored(self) -> None:
        """A session was read back from the state directory at start."""
        self._restored.labels("restored").inc()

    def session_restore_failed(self, reason: str) -> None:
        """A saved session could not be read back (`reason`: unreadable, corrupt, version,
        agent, workspace) and was skipped."""
        self._restored.labels(bounded(reason, RESTORE_FAILURES)).inc()

    def state_dir_error(self, file: str) -> None:
        """A write of the state directory failed: `file` create, record or log."""
        self._state_dir_errors.labels(bounded(file, STATE_FILES)).inc()

    def state_dir_failing(self, sessions: int) -> None:
        """How many sessions hold what they could not write now."""
        self._state_dir_failing.set(sessions)

    def history_gap(self, frames: int) -> None:
        """`frames` frames will never be in a session's frame log (the disk did not take them)."""
        self._history_gap.inc(frames)

    def saved_log_torn(self) -> None:
        """A frame log read back at start held a torn line."""
        self._saved_logs_torn.inc()

    def draining(self, on: bool) -> None:
        """An operator's drain began (SIGUSR1) or ended (SIGUSR2)."""
        self._draining.set(1 if on else 0)

    def file_bytes(self, delta: int) -> None:
        """The bytes held by a session's file store changed by `delta`."""
        self._file_bytes.inc(delta)

    def file(self, direction: str, outcome: str) -> None:
        """A file was offered to a session's store: `direction` download or upload, `outcome`
        stored or refused."""
        self._files.labels(
            bounded(direction, ("download", "upload")), bounded(outcome, ("stored", "refused"))
        ).inc()

    def process_started(self, agent: str) -> None:
        """An agent process was spawned (first start and every respawn)."""
        self._process_starts.labels(self._agent_label(agent)).inc()

    def process_exited(self, agent: str, exit_kind: str) -> None:
        """An agent process exited; `exit_kind` is `gateway.agent.process.classify_exit(rc).kind`
        (ok, error, signal), so the metric and the DPS frames classify exits the same way."""
        self._process_exits.labels(self._agent_label(agent), bounded(exit_kind, EXIT_CLASSES)).inc()

    def usage(self, agent: str, model: str | None, user: str | None, counted: Counted) -> None:
        """A main-agent session.usage of a session of `agent` (profile), whose agent names its
        model `model` and whose owner is `user` (None: no owner), added `counted`."""
        agent = self._agent_label(agent)
        model = self._model_label(model)
        user = self._user_label(user) if user else "none"
        tokens = self._tokens
        user_tokens = self._user_tokens
        for kind, n in zip(TOKEN_KINDS, counted[:4], strict=True):
            if n:
                tokens.labels(agent, model, kind).inc(n)
                user_tokens.labels(user, kind).inc(n)
        if counted.cost_usd > 0:
            self._cost.labels(agent, model).inc(counted.cost_usd)
            self._user_cost.labels(user).inc(counted.cost_usd)

    def context_limit_turn(self, agent: str) -> None:
        """A turn ended with its context window at least 95% full (gateway.protocol.usage.CONTEXT_FULL)."""
        self._context_limit_turns.labels(self._agent_label(agent)).inc()

    def compacted(self, agent: str, trigger: str) -> None:
        """The main agent's context was compacted (session.compacted) with `trigger`."""
        self._compactions.labels(
            self._agent_label(agent), bounded(trigger, COMPACTION_TRIGGERS)
        ).inc()

    def context_fill(self, old: float | None, new: float | None) -> None:
        """A live session's latest context fill went from `old` to `new` (None: unknown, e.g. a
        new session, or a session that ended)."""
        if old is not None:
            self._fill_bands[context_band(old)].dec()
        if new is not None:
            self._fill_bands[context_band(new)].inc()

    def notification(self, event: str, result: str) -> None:
        """A webhook delivery of `event` (one of NOTIFY_EVENTS) was sent, retried or dropped."""
        self._notifications.labels(
            bounded(event, NOTIFY_EVENTS), bounded(result, ("sent", "retried", "dropped"))
        ).inc()

    # --- exposition -------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its Content-Type, for the `/metrics` handler."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _agent_label(self, agent: str) -> str:
        return agent if agent in self._agents else OTHER


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("rawp-gateway")
    except Exception:  # not installed (running from a source tree)
        return "unknown"
