"""The hot path's instruments: plain ints and C-level appends, no prometheus-client object, and the
collector that turns them into metric families when ``/metrics`` is scraped (why: the package's
docstring). **Their methods must be called from the event loop thread.**
"""

from __future__ import annotations

import collections
import time
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from functools import partial
from typing import Final, Protocol

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from gateway.metrics.labels import (
    AGENT_LINE_KIND_LIMIT,
    KIND_INVALID,
    KIND_UNKNOWN,
    LATENCY_BUCKETS,
    OTHER,
    PREFIX,
)

__all__ = [
    "AgentLineMetrics",
    "HotPathCollector",
    "HotPathCounters",
    "NsHistogram",
    "Tally",
    "clock_ns",
]

# The clock every hot-path duration is measured with, in integer nanoseconds: the one
# gateway.agent.process stamps each stdout line with (`StdoutLine.t_ns`), so the server subtracts that
# stamp from a fresh reading when the frame is written. Integers all the way: no float conversion on
# the hot path; the histograms convert to seconds at scrape time.
clock_ns: Final = time.perf_counter_ns


class Tally:
    """A frame count and byte count for one (type, direction)."""

    __slots__ = ("frames", "nbytes")

    def __init__(self) -> None:
        self.frames = 0
        self.nbytes = 0


class NsHistogram:
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
        self.parse = NsHistogram(LATENCY_BUCKETS)
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


class HotPathCounters(Protocol):
    """What the collector reads of its ``GatewayMetrics`` (which keeps these as its own attributes,
    so the per-line methods reach them in one hop)."""

    _tallies: dict[tuple[str, str], Tally]
    _latency: NsHistogram
    _agents: dict[str, AgentLineMetrics]
    _history_bytes: int
    _history_evicted: int

    def fold(self) -> None: ...


class HotPathCollector:
    """Turns the plain ints of the hot path into metric families at scrape time."""

    def __init__(self, owner: HotPathCounters) -> None:
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
