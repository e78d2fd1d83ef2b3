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
  `FOLD_INTERVAL_S` (a timer `start()` sets; sooner while observations come fast, so that no fold
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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from functools import partial
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
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from gateway.config.notify import EVENTS as WEBHOOK_EVENTS
from gateway.protocol.frames import PAYLOAD_CLASSES, VENDOR_PREFIX
from gateway.protocol.tools import BUILTIN_TOOLS
from gateway.protocol.usage import Counted

__all__ = [
    "AGENT_LINE_KIND_LIMIT",
    "FRAME_TYPES",
    "LATENCY_BUCKETS",
    "AgentLineMetrics",
    "GatewayMetrics",
    "frame_type_label",
    "tool_label",
]

PREFIX: Final = "rawp_gateway_"

# The clock every hot-path duration is measured with, in integer nanoseconds: the one
# gateway.agent.process stamps each stdout line with (`StdoutLine.t_ns`), so the server subtracts that
# stamp from a fresh reading when the frame is written. Integers all the way: no float conversion on
# the hot path; the histograms convert to seconds at scrape time.
clock_ns: Final = time.perf_counter_ns

# 50 µs to 5 s, roughly 1-2.5-5 per decade: fine enough to tell a healthy sub-millisecond hop from a
# slow consumer, and only 16 buckets so the exposition stays small.
LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

# A turn lasts from a second (a short answer) to tens of minutes (a long refactor).
TURN_BUCKETS: Final[tuple[float, ...]] = (
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)

TO_MASTER: Final = "to_master"
FROM_MASTER: Final = "from_master"

# DPS 1.0.1 appendix B: every frame type. Any of them may travel either way as far as counting
# goes: masters' control.* frames are relayed to the other masters (DPS 2.4), and a master may send
# a type meant for the other direction (counted, then refused), so each type is counted under
# both directions.
FRAME_TYPES: Final[tuple[str, ...]] = (
    "agent.text.delta",
    "agent.text.done",
    "agent.thinking.delta",
    "agent.thinking.done",
    "agent.interaction.request",
    "agent.error",
    "agent.file.transfer",
    "agent.state.changed",
    "agent.commands.publish",
    "agent.subagent.started",
    "agent.subagent.ended",
    "tool.invoke.request",
    "tool.invoke.result",
    "tool.invoke.stream",
    "tool.catalog.publish",
    "control.prompt.request",
    "control.prompt.cancel",
    "control.interaction.response",
    "control.interaction.timeout",
    "control.session.compact",
    "control.mode.switch",
    "control.file.search",
    "control.file.search.cancel",
    "session.history",
    "session.compacted",
    "session.usage",
    "session.error",
    "session.turn.start",
    "session.turn.end",
    "session.capabilities",
    "session.file.candidates",
    "session.renamed",
    "session.deleted",
    # The gateway's own extension events (DPS 3.1.1, `x-rawp-gateway.*`, e.g. an agent line
    # passed through raw): a fixed set defined in code, so they get their own label values.
    *sorted(t for t in PAYLOAD_CLASSES if t.startswith(VENDOR_PREFIX)),
)
OTHER: Final = "other"

SESSION_STATES: Final = ("IDLE", "RUNNING", "DETACHED", "TERMINATED")
CONNECTION_ROLES: Final = ("master", "local_ui")
STOP_REASONS: Final = (
    "end_turn",
    "max_tokens",
    "cancelled",
    "error",
    "tool_use",
    "awaiting_input",
    "disconnected",
)
TOOL_STATUSES: Final = ("success", "error", "timeout", "cancelled")
INTERACTION_TYPES: Final = ("YN", "SELECT", "MULTI_SELECT", "TEXT_INPUT", "PERMISSION")
# allowed/denied answer a PERMISSION; answered is any other type's reply; timed_out when nobody
# answered in time; cancelled when the turn or session ended with the question still open.
INTERACTION_OUTCOMES: Final = ("allowed", "denied", "answered", "timed_out", "cancelled")
EXIT_CLASSES: Final = ("ok", "error", "signal")
RESTORE_FAILURES: Final = ("unreadable", "corrupt", "version", "agent", "workspace")
NOTIFY_EVENTS: Final = WEBHOOK_EVENTS
DEFAULT_AGENTS: Final = ("claude-code", "codex", "gemini")

# Usage and cost: `model` is the agent's own name for it and `user` the session's owner, both free
# text, so each takes at most this many distinct values per gateway (then `other`), none longer
# than LABEL_VALUE_MAX characters (a longer one is `other` too); UNKNOWN when not told.
MODEL_LABEL_LIMIT: Final = 32
USER_LABEL_LIMIT: Final = 32
LABEL_VALUE_MAX: Final = 128
UNKNOWN: Final = "unknown"
TOKEN_KINDS: Final = ("input", "output", "cache_read", "cache_write")
COMPACTION_TRIGGERS: Final = ("auto", "manual", "requested")
# The latest context fill of live sessions, in bands (a label value each): the lower bound of the
# band, so a session at 0.83 is in band "0.8". 0.8 and 0.95 are DPS §7.3's "should" and "must"
# compact thresholds.
CONTEXT_BANDS: Final = (0.0, 0.5, 0.8, 0.95)

# Tool names of the three agents' built-in catalogs (one catalog: gateway/protocol/tools.py). Anything
# else is a user's MCP server or plug-in and must not mint a new label value.
KNOWN_TOOLS: Final = frozenset(BUILTIN_TOOLS)

# A parser reports a kind per line (e.g. "stream_event", "system/init"); a misbehaving parser or
# agent must not be able to grow the series count without bound.
AGENT_LINE_KIND_LIMIT: Final = 64
KIND_INVALID: Final = "invalid"  # the line was not valid JSON
KIND_UNKNOWN: Final = "unknown"  # valid JSON of a kind the parser does not know


def frame_type_label(type_: str) -> str:
    """The `type` label value for a frame type: the DPS type itself, or `other`."""
    return type_ if type_ in FRAME_TYPES else OTHER


def tool_label(name: str) -> str:
    """The `tool` label value: a known catalog name, `mcp` for any MCP tool, else `other`."""
    if name in KNOWN_TOOLS:
        return name
    # Claude Code and Codex name MCP tools mcp__<server>__<tool>, Gemini mcp_<server>_<tool>.
    if name.startswith("mcp_"):
        return "mcp"
    return OTHER


def _bounded(value: str, allowed: Iterable[str]) -> str:
    return value if value in allowed else OTHER


def _context_band(fill: float) -> float:
    """The band of a context fill (0.0-1.0): its lower bound, the `band` label value."""
    return CONTEXT_BANDS[max(bisect_right(CONTEXT_BANDS, fill) - 1, 0)]


class _CappedLabel:
    """Free-text label values (a model name, a user name), at most `limit` distinct ones, then
    `other`; UNKNOWN for a missing value."""

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if not value:
            return UNKNOWN
        if value in self.seen:
            return value
        if len(self.seen) >= self.limit or len(value) > LABEL_VALUE_MAX or value == OTHER:
            return OTHER
        self.seen.add(value)
        return value


class _Tally:
    """A frame count and byte count for one (type, direction)."""

    __slots__ = ("frames", "nbytes")

    def __init__(self) -> None:
        self.frames = 0
        self.nbytes = 0


class _Histogram:
    """A histogram for the event-loop thread, in integer nanoseconds, exported in seconds.

    `observe` is the bound `append` of an `array('q')`: a call into C, with no Python frame, which
    is the whole of its hot-path cost. `fold()` later sorts the pending observations into bucket
    counts and the sum, also in C (`Counter(map(partial(bisect_left, bounds), pending))`).
    """

    __slots__ = ("_bucket_of", "bounds", "counts", "le", "observe", "pending", "sum")

    def __init__(self, bounds_seconds: tuple[float, ...]) -> None:
        self.bounds = tuple(round(b * 1e9) for b in bounds_seconds)
        self.le = [floatToGoString(b) for b in bounds_seconds]
        self.counts = [0] * (len(bounds_seconds) + 1)  # the last one is +Inf
        self.sum = 0
        self.pending = array("q")
        self.observe = self.pending.append
        # bisect_left finds the first bound >= ns, i.e. the smallest `le` bucket ns falls in.
        self._bucket_of = partial(bisect_left, self.bounds)

    def fold(self) -> None:
        pending = self.pending
        if not pending:
            return
        counts = self.counts
        for i, n in collections.Counter(map(self._bucket_of, pending)).items():
            counts[i] += n
        self.sum += sum(pending)
        del pending[:]  # in place: `observe` stays bound to this array

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        total = 0
        for le, count in zip(self.le, self.counts, strict=False):
            total += count
            out.append((le, total))
        total += self.counts[-1]
        out.append(("+Inf", total))
        return out

    def sum_seconds(self) -> float:
        return self.sum / 1e9


class AgentLineMetrics:
    """Hot-path counters for one agent's stdout: get one from `GatewayMetrics.agent_lines(agent)`
    when a session starts, then call `line(kind, parse_ns)` for every line that session's process
    prints (or `parse_error()` / `unknown_kind()` for a line that was not JSON / of an unknown
    kind). `line` only appends to a list and an array, in C; the kind limit is applied when
    folding.
    """

    __slots__ = ("_append_kind", "_append_parse", "_pending_kinds", "agent", "kinds", "parse")

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self.kinds: dict[str, int] = {KIND_INVALID: 0, KIND_UNKNOWN: 0}
        self._pending_kinds: list[str] = []
        self._append_kind = self._pending_kinds.append
        self.parse = _Histogram(LATENCY_BUCKETS)
        self._append_parse = self.parse.observe

    def line(self, kind: str, parse_ns: int) -> None:
        """A line the parser understood: its `kind` (e.g. "stream_event", "system/init") and the
        nanoseconds parse + map took for it."""
        self._append_kind(kind)
        self._append_parse(parse_ns)

    def parse_error(self) -> None:
        """A line that was not valid JSON (counted as kind `invalid`)."""
        self.kinds[KIND_INVALID] += 1

    def unknown_kind(self) -> None:
        """A JSON line of a kind the parser does not know, skipped (counted as kind `unknown`)."""
        self.kinds[KIND_UNKNOWN] += 1

    def fold(self) -> None:
        pending = self._pending_kinds
        if pending:
            kinds = self.kinds
            for kind, n in collections.Counter(pending).items():
                if kind not in kinds and len(kinds) >= AGENT_LINE_KIND_LIMIT:
                    kind = OTHER
                kinds[kind] = kinds.get(kind, 0) + n
            del pending[:]  # in place: `kind` stays bound to this list
        self.parse.fold()


class _HotPathCollector:
    """Turns the plain ints of the hot path into metric families at scrape time."""

    def __init__(self, owner: GatewayMetrics) -> None:
        self._owner = owner

    def describe(self) -> Iterator[Metric]:
        # Families without samples: enough for the registry to see the names (and refuse a clash).
        yield from self._families(with_samples=False)

    def collect(self) -> Iterator[Metric]:
        self._owner.fold()
        yield from self._families(with_samples=True)

    def _families(self, *, with_samples: bool) -> Iterator[Metric]:
        o = self._owner
        frames = CounterMetricFamily(
            PREFIX + "frames",
            "DPS frames by type and direction: to_master counts each frame the gateway produced "
            "for masters once (before fan-out; relayed control frames included), from_master "
            "each frame a master sent.",
            labels=("type", "direction"),
        )
        nbytes = CounterMetricFamily(
            PREFIX + "frame_bytes",
            "Encoded size of the frames in rawp_gateway_frames_total, in bytes.",
            labels=("type", "direction"),
        )
        latency = HistogramMetricFamily(
            PREFIX + "frame_latency_seconds",
            "From reading the agent's stdout line to writing the frame made from it to a WebSocket; "
            "one observation per frame and connection, so _count is the number of such writes "
            "(fan-out included).",
        )
        lines = CounterMetricFamily(
            PREFIX + "agent_lines",
            "Lines read from agents' stdout, by agent and kind as the parser saw it "
            "(invalid: not JSON; unknown: a kind the parser does not know; other: past the "
            "per-agent kind limit).",
            labels=("agent", "kind"),
        )
        errors = CounterMetricFamily(
            PREFIX + "agent_parse_errors",
            "Agent stdout lines that were not valid JSON.",
            labels=("agent",),
        )
        unknown = CounterMetricFamily(
            PREFIX + "agent_unknown_kinds",
            "Agent stdout lines of a kind the parser does not know; they are counted and skipped.",
            labels=("agent",),
        )
        parse = HistogramMetricFamily(
            PREFIX + "parse_seconds",
            "Time to parse one agent stdout line and map it to DPS frames.",
            labels=("agent",),
        )
        history = GaugeMetricFamily(
            PREFIX + "history_buffer_bytes",
            "Bytes of frames held in the sessions' reattach history buffers, all sessions together.",
        )
        evicted = CounterMetricFamily(
            PREFIX + "history_evicted_frames",
            "Frames dropped from history buffers to stay within their size limit.",
        )
        if with_samples:
            for (type_, direction), tally in o._tallies.items():
                frames.add_metric((type_, direction), tally.frames)
                nbytes.add_metric((type_, direction), tally.nbytes)
            latency.add_metric((), o._latency.buckets(), o._latency.sum_seconds())
            for agent, am in o._agents.items():
                for kind, n in am.kinds.items():
                    lines.add_metric((agent, kind), n)
                errors.add_metric((agent,), am.kinds[KIND_INVALID])
                unknown.add_metric((agent,), am.kinds[KIND_UNKNOWN])
                parse.add_metric((agent,), am.parse.buckets(), am.parse.sum_seconds())
            history.add_metric((), o._history_bytes)
            evicted.add_metric((), o._history_evicted)
        yield from (frames, nbytes, latency, lines, errors, unknown, parse)
        yield from (history, evicted)


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
    server need not) folds every FOLD_INTERVAL_S; `close()` stops it.
    """

    #: How often the pending hot-path observations are folded into counts (see `start`), and how
    #: often while they come fast (more than FOLD_BUSY_SAMPLES latencies in one interval): a fold
    #: holds the event loop for about 0.1 µs per observation, so 16 masters at 10,000 frames/s
    #: would make a 4 ms pause of every quarter second.
    FOLD_INTERVAL_S: Final = 0.25
    FOLD_BUSY_INTERVAL_S: Final = 0.02
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

        # --- hot path: plain ints, exported by _HotPathCollector -------------------------------
        self._tallies: dict[tuple[str, str], _Tally] = {}
        self._out: dict[str, _Tally] = {}
        self._in: dict[str, _Tally] = {}
        for type_ in FRAME_TYPES:
            self._out[type_] = self._tallies[(type_, TO_MASTER)] = _Tally()
            self._in[type_] = self._tallies[(type_, FROM_MASTER)] = _Tally()
        self._out_other = self._tallies[(OTHER, TO_MASTER)] = _Tally()
        self._in_other = self._tallies[(OTHER, FROM_MASTER)] = _Tally()
        self._latency = _Histogram(LATENCY_BUCKETS)
        # The array's own bound append: a call into C, no Python frame (see _Histogram).
        self.observe_latency_ns = self._latency.observe
        self._fold_timer: asyncio.TimerHandle | None = None
        self._agent_names = tuple(dict.fromkeys(agents))
        self._agents: dict[str, AgentLineMetrics] = {
            a: AgentLineMetrics(a) for a in (*self._agent_names, OTHER)
        }
        self._history_bytes = 0
        self._history_evicted = 0
        r.register(_HotPathCollector(self))

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
        self._model_label = _CappedLabel(MODEL_LABEL_LIMIT)
        self._user_label = _CappedLabel(USER_LABEL_LIMIT)

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
        `start()` also does it every FOLD_INTERVAL_S so that memory stays bounded by the rate
        times that interval (8 bytes per observation) between scrapes."""
        self._latency.fold()
        for agent in self._agents.values():
            agent.fold()

    def start(self) -> None:
        """Fold periodically on the running event loop, until `close()`."""
        if self._fold_timer is None:
            self._fold_timer = asyncio.get_running_loop().call_later(
                self.FOLD_INTERVAL_S, self._fold_tick
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
        interval = self.FOLD_BUSY_INTERVAL_S if busy else self.FOLD_INTERVAL_S
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
        key = (tool_label(tool_name), _bounded(status, TOOL_STATUSES))
        child = self._tool_children.get(key)
        if child is None:
            child = self._tool_children[key] = self._tools.labels(*key)
        child.inc()

    def interaction(self, type_: str, outcome: str) -> None:
        """An interaction was resolved: `type_` is its interaction_type, `outcome` one of
        allowed, denied, answered, timed_out, cancelled."""
        key = (_bounded(type_, INTERACTION_TYPES), _bounded(outcome, INTERACTION_OUTCOMES))
        self._interaction_children[key].inc()

    def session_restored(self) -> None:
        """A session was read back from the state directory at start."""
        self._restored.labels("restored").inc()

    def session_restore_failed(self, reason: str) -> None:
        """A saved session could not be read back (`reason`: unreadable, corrupt, version,
        agent, workspace) and was skipped."""
        self._restored.labels(_bounded(reason, RESTORE_FAILURES)).inc()

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
            _bounded(direction, ("download", "upload")), _bounded(outcome, ("stored", "refused"))
        ).inc()

    def process_started(self, agent: str) -> None:
        """An agent process was spawned (first start and every respawn)."""
        self._process_starts.labels(self._agent_label(agent)).inc()

    def process_exited(self, agent: str, exit_kind: str) -> None:
        """An agent process exited; `exit_kind` is `gateway.agent.process.classify_exit(rc).kind`
        (ok, error, signal), so the metric and the DPS frames classify exits the same way."""
        self._process_exits.labels(
            self._agent_label(agent), _bounded(exit_kind, EXIT_CLASSES)
        ).inc()

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
            self._agent_label(agent), _bounded(trigger, COMPACTION_TRIGGERS)
        ).inc()

    def context_fill(self, old: float | None, new: float | None) -> None:
        """A live session's latest context fill went from `old` to `new` (None: unknown, e.g. a
        new session, or a session that ended)."""
        if old is not None:
            self._fill_bands[_context_band(old)].dec()
        if new is not None:
            self._fill_bands[_context_band(new)].inc()

    def notification(self, event: str, result: str) -> None:
        """A webhook delivery of `event` (one of NOTIFY_EVENTS) was sent, retried or dropped."""
        self._notifications.labels(
            _bounded(event, NOTIFY_EVENTS), _bounded(result, ("sent", "retried", "dropped"))
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
