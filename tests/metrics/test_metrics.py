"""GatewayMetrics: what each call exports, and that label values stay bounded."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.agent.exit import classify_exit
from gateway.metrics import (
    AGENT_LINE_KIND_LIMIT,
    FRAME_TYPES,
    LATENCY_BUCKETS,
    GatewayMetrics,
    frame_type_label,
    tool_label,
)
from tests.support.paths import REPO
from tests.support.waiting import eventually


def samples(m: GatewayMetrics) -> dict[tuple[str, frozenset], float]:
    """Every sample of the text exposition, keyed by (name, labels): what a scraper would see."""
    body, _ = m.render()
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: GatewayMetrics, name: str, **labels: str) -> float:
    return samples(m)[(name, frozenset(labels.items()))]


def test_render_is_prometheus_text_with_process_collectors():
    body, content_type = GatewayMetrics().render()
    assert content_type.startswith("text/plain; version=")
    text = body.decode()
    assert "process_cpu_seconds_total" in text
    assert "python_info" in text
    assert "# HELP rawp_gateway_frames_total " in text


def test_registries_are_independent():
    a, b = GatewayMetrics(), GatewayMetrics()
    a.frame_out("agent.text.delta", 10)
    assert (
        value(a, "rawp_gateway_frames_total", type="agent.text.delta", direction="to_master") == 1
    )
    assert (
        value(b, "rawp_gateway_frames_total", type="agent.text.delta", direction="to_master") == 0
    )


def test_frames_counted_by_type_and_direction_with_bytes():
    m = GatewayMetrics()
    m.frame_out("agent.text.delta", 100)
    m.frame_out("agent.text.delta", 50)
    m.frame_in("control.prompt.request", 70)
    assert (
        value(m, "rawp_gateway_frames_total", type="agent.text.delta", direction="to_master") == 2
    )
    assert (
        value(m, "rawp_gateway_frame_bytes_total", type="agent.text.delta", direction="to_master")
        == 150
    )
    assert (
        value(
            m, "rawp_gateway_frames_total", type="control.prompt.request", direction="from_master"
        )
        == 1
    )


def test_frame_type_outside_the_spec_is_other():
    m = GatewayMetrics()
    m.frame_out("x-vendor.anything", 5)
    m.frame_in("not.a.type", 5)
    s = samples(m)
    assert s[
        (
            "rawp_gateway_frames_total",
            frozenset({"type": "other", "direction": "to_master"}.items()),
        )
    ]
    assert s[
        (
            "rawp_gateway_frames_total",
            frozenset({"type": "other", "direction": "from_master"}.items()),
        )
    ]
    assert not any(dict(k[1]).get("type") in ("x-vendor.anything", "not.a.type") for k in s)
    assert frame_type_label("session.turn.end") == "session.turn.end"
    assert frame_type_label("x-rawp-gateway.debug") == "other"


def test_every_spec_frame_type_is_preinitialised_at_zero():
    s = samples(GatewayMetrics())
    for type_ in FRAME_TYPES:
        for d in ("to_master", "from_master"):
            assert (
                s[("rawp_gateway_frames_total", frozenset({"type": type_, "direction": d}.items()))]
                == 0
            )


def test_latency_histogram_buckets_span_50us_to_5s():
    assert LATENCY_BUCKETS[0] == 0.00005
    assert LATENCY_BUCKETS[-1] == 5.0
    m = GatewayMetrics()
    for ns in (40_000, 50_000, 300_000, 7_000_000_000):
        m.observe_latency_ns(ns)
    s = samples(m)

    def bucket(le: str) -> float:
        return s[("rawp_gateway_frame_latency_seconds_bucket", frozenset({"le": le}.items()))]

    assert bucket("5e-05") == 2  # le is inclusive: 50 µs lands in the 50 µs bucket
    assert bucket("0.0005") == 3
    assert bucket("5.0") == 3
    assert bucket("+Inf") == 4
    assert s[("rawp_gateway_frame_latency_seconds_count", frozenset())] == 4
    assert s[("rawp_gateway_frame_latency_seconds_sum", frozenset())] == pytest.approx(7.00039)


def test_agent_lines_by_kind_parse_errors_and_unknown_kinds():
    m = GatewayMetrics()
    lines = m.agent_lines("claude-code")
    lines.line("stream_event", 20_000)
    lines.line("stream_event", 30_000)
    lines.parse_error()
    lines.unknown_kind()
    assert value(m, "rawp_gateway_agent_lines_total", agent="claude-code", kind="stream_event") == 2
    assert value(m, "rawp_gateway_agent_lines_total", agent="claude-code", kind="invalid") == 1
    assert value(m, "rawp_gateway_agent_lines_total", agent="claude-code", kind="unknown") == 1
    assert value(m, "rawp_gateway_agent_parse_errors_total", agent="claude-code") == 1
    assert value(m, "rawp_gateway_agent_unknown_kinds_total", agent="claude-code") == 1
    assert value(m, "rawp_gateway_parse_seconds_count", agent="claude-code") == 2


def test_unconfigured_agent_is_other():
    m = GatewayMetrics(agents=["claude-code"])
    assert m.agent_lines("my-secret-profile") is m.agent_lines("other")
    m.process_started("my-secret-profile")
    assert value(m, "rawp_gateway_agent_process_starts_total", agent="other") == 1


def test_line_kinds_are_capped_per_agent():
    m = GatewayMetrics()
    lines = m.agent_lines("codex")
    for i in range(AGENT_LINE_KIND_LIMIT * 3):
        lines.line(f"kind-{i}", 0)
    kinds = {
        dict(labels)["kind"]
        for (name, labels) in samples(m)
        if name == "rawp_gateway_agent_lines_total" and dict(labels)["agent"] == "codex"
    }
    assert len(kinds) <= AGENT_LINE_KIND_LIMIT + 1
    assert "other" in kinds


def test_sessions_by_state_follow_transitions():
    m = GatewayMetrics()
    m.session_state(None, "IDLE", agent="claude-code")
    m.session_state("IDLE", "RUNNING")
    m.session_state(None, "IDLE", agent="codex")
    assert value(m, "rawp_gateway_sessions", state="RUNNING") == 1
    assert value(m, "rawp_gateway_sessions", state="IDLE") == 1
    m.session_state("RUNNING", "TERMINATED")
    m.session_state("TERMINATED", None)
    assert value(m, "rawp_gateway_sessions", state="RUNNING") == 0
    assert value(m, "rawp_gateway_sessions", state="TERMINATED") == 0
    assert value(m, "rawp_gateway_sessions_started_total", agent="claude-code") == 1
    with pytest.raises(KeyError):
        m.session_state("IDLE", "BOGUS")


def test_connections_reattaches_and_history():
    m = GatewayMetrics()
    m.ws_connected()
    m.ws_connected("local_ui")
    m.ws_disconnected()
    m.reattached()
    m.reattached(lost_frames=7)
    m.history_appended(1000)
    m.history_evicted(3, 400)
    assert value(m, "rawp_gateway_ws_connections", role="master") == 0
    assert value(m, "rawp_gateway_ws_connections", role="local_ui") == 1
    assert value(m, "rawp_gateway_ws_connections_opened_total", role="master") == 1
    assert value(m, "rawp_gateway_reattaches_total", result="complete") == 1
    assert value(m, "rawp_gateway_reattaches_total", result="truncated") == 1
    assert value(m, "rawp_gateway_reattach_lost_frames_total") == 7
    assert value(m, "rawp_gateway_history_buffer_bytes") == 600
    assert value(m, "rawp_gateway_history_evicted_frames_total") == 3
    m.history_released(600)
    assert value(m, "rawp_gateway_history_buffer_bytes") == 0


def test_turns_by_stop_reason_and_duration():
    m = GatewayMetrics()
    m.turn_ended("end_turn", 3.0)
    m.turn_ended("free text from somewhere", 1.0)
    assert value(m, "rawp_gateway_turns_total", stop_reason="end_turn") == 1
    assert value(m, "rawp_gateway_turns_total", stop_reason="other") == 1
    assert value(m, "rawp_gateway_turns_total", stop_reason="max_tokens") == 0
    assert value(m, "rawp_gateway_turn_duration_seconds_count") == 2


def test_tool_names_are_bounded():
    assert tool_label("Bash") == "Bash"
    assert tool_label("run_shell_command") == "run_shell_command"
    assert tool_label("mcp__github__create_issue") == "mcp"
    assert tool_label("mcp_github_create_issue") == "mcp"
    assert tool_label("SomeUserPlugin") == "other"


@pytest.mark.parametrize(
    ("count", "metric", "calls", "labels"),
    [
        (
            "tool_result",
            "rawp_gateway_tool_invocations_total",
            [("Read", "success"), ("mcp__x__y", "error"), ("rm -rf /", "exploded")],
            [("Read", "success"), ("mcp", "error"), ("other", "other")],
        ),
        (
            "interaction",
            "rawp_gateway_interactions_total",
            [("PERMISSION", "allowed"), ("PERMISSION", "denied"), ("YN", "timed_out")]
            + [("WHATEVER", "maybe")],
            [("PERMISSION", "allowed"), ("PERMISSION", "denied"), ("YN", "timed_out")]
            + [("other", "other")],
        ),
    ],
    ids=["tools", "interactions"],
)
def test_counted_under_bounded_labels(count, metric, calls, labels):
    """Tools by name (MCP ones as one) and status, interactions by type and outcome: a value
    outside the known ones is counted as "other", so the label sets stay bounded."""
    m = GatewayMetrics()
    for call in calls:
        getattr(m, count)(*call)
    names = {"tool_result": ("tool", "status"), "interaction": ("type", "outcome")}[count]
    for label in labels:
        assert value(m, metric, **dict(zip(names, label, strict=True))) == 1


def test_process_starts_and_exits():
    m = GatewayMetrics()
    m.process_started("claude-code")
    m.process_exited("claude-code", classify_exit(0).kind)
    m.process_exited("claude-code", classify_exit(-15).kind)
    m.process_exited("claude-code", classify_exit(143).kind)
    m.process_exited("gemini", classify_exit(41).kind)
    m.process_exited("gemini", "nonsense")
    assert value(m, "rawp_gateway_agent_process_starts_total", agent="claude-code") == 1
    exits = "rawp_gateway_agent_process_exits_total"
    assert value(m, exits, agent="claude-code", exit_class="ok") == 1
    assert value(m, exits, agent="claude-code", exit_class="signal") == 2
    assert value(m, exits, agent="gemini", exit_class="error") == 1
    assert value(m, exits, agent="gemini", exit_class="other") == 1


def test_every_gateway_metric_has_help_and_the_prefix():
    body, _ = GatewayMetrics().render()
    for family in text_string_to_metric_families(body.decode()):
        if family.name.startswith(("process_", "python_")):
            continue
        assert family.name.startswith("rawp_gateway_"), family.name
        assert len(family.documentation) > 20, family.name


def test_no_label_value_is_unbounded_after_hostile_input():
    """Feed ids and free text everywhere a caller might; no series may carry them."""
    m = GatewayMetrics()
    hostile = "3f2b8c1e-9d4a-4b7e-a1c2-5e6f7a8b9c0d please run `rm -rf /`"
    m.frame_out(hostile, 1)
    m.frame_in(hostile, 1)
    m.turn_ended(hostile, 1)
    m.tool_result(hostile, hostile)
    m.interaction(hostile, hostile)
    m.process_started(hostile)
    m.process_exited(hostile, hostile)
    m.session_state(None, "IDLE", agent=hostile)
    m.agent_lines(hostile).line("stream_event", 0)
    for _name, labels in samples(m):
        assert all(hostile not in v for _, v in labels)


def test_every_gateway_metric_is_documented_in_deploy_readme():
    readme = (REPO / "deploy" / "README.md").read_text()
    for family in GatewayMetrics().registry.collect():
        if family.name.startswith("rawp_gateway_"):
            name = family.name + ("_total" if family.type == "counter" else "")
            assert f"`{name}`" in readme, name


async def test_start_folds_pending_observations_periodically():
    m = GatewayMetrics()
    m.start()
    try:
        m.observe_latency_ns(1_000)
        m.agent_lines("gemini").line("tool_use", 10)
        assert len(m._latency.pending) == 1
        # folded by the timer, not by a scrape
        await eventually(lambda: not m._latency.pending, "the fold timer")
        assert m._latency.counts[0] == 1
    finally:
        m.close()
    assert value(m, "rawp_gateway_agent_lines_total", agent="gemini", kind="tool_use") == 1


async def test_fast_observations_are_folded_sooner():
    """Many latencies in one interval: the next fold comes after FOLD_BUSY_INTERVAL_SEC, so that
    a fold never holds the event loop for a quarter second's worth; idle, the interval returns."""
    m = GatewayMetrics()  # not started: each _fold_tick arms the one timer
    try:
        loop = asyncio.get_running_loop()
        for _ in range(m.FOLD_BUSY_SAMPLES + 1):
            m.observe_latency_ns(1_000)
        m._fold_tick()  # what the timer calls
        assert len(m._latency.pending) == 0
        assert m._fold_timer is not None
        assert m._fold_timer.when() - loop.time() <= m.FOLD_BUSY_INTERVAL_SEC
        m.observe_latency_ns(1_000)
        m._fold_tick()  # quiet again
        assert m._fold_timer.when() - loop.time() > m.FOLD_BUSY_INTERVAL_SEC
    finally:
        m.close()


def test_scrape_folds_what_is_pending():
    m = GatewayMetrics()
    lines = m.agent_lines("claude-code")
    for _ in range(3):
        lines.line("assistant", 100_000)
    assert value(m, "rawp_gateway_agent_lines_total", agent="claude-code", kind="assistant") == 3
    lines.line("assistant", 0)
    assert value(m, "rawp_gateway_agent_lines_total", agent="claude-code", kind="assistant") == 4
    assert value(m, "rawp_gateway_parse_seconds_sum", agent="claude-code") == pytest.approx(0.0003)
