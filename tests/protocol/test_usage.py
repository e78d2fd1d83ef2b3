"""What a session.usage adds (gateway/protocol/usage.py) and how the usage metrics label it
(gateway/metrics/): tokens once, cost as the increase of the agent's running total, label caps."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import LABEL_VALUE_MAX, MODEL_LABEL_LIMIT, USER_LABEL_LIMIT, GatewayMetrics
from gateway.protocol import frames as F
from gateway.protocol.usage import Counted, UsageTally, context_fill
from gateway.server import SESSIONS
from parsers import events as ev
from parsers.claude_code import ClaudeCodeParser
from tests.support.gateway_peer import (
    Master,
    create_session,
    demo_config,
    prompt_and_wait,
    start_gateway,
)
from tests.support.paths import FIXTURES

CLAUDE_CODE = FIXTURES / "claude-code"


def usage(
    inp: int = 0,
    out: int = 0,
    cr: int | None = None,
    cw: int | None = None,
    cost: float = 0.0,
    window: F.ContextWindow | None = None,
    turn_id: str | None = "t1",
) -> F.Usage:
    return F.Usage(
        turn_id=turn_id,
        token_usage=F.TokenUsage(
            input_tokens=inp, output_tokens=out, cache_read_tokens=cr, cache_write_tokens=cw
        ),
        cost_usage=F.Quota(limit=-1, used=cost, unit="USD"),
        message_usage=F.Quota(limit=-1, used=1, unit="COUNT"),
        time_to_reset="PT0S",
        context_window=window,
    )


def samples(m: GatewayMetrics) -> dict[tuple[str, frozenset], float]:
    body, _ = m.render()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def value(m: GatewayMetrics, name: str, **labels: str) -> float:
    return samples(m).get((name, frozenset(labels.items())), 0.0)


def test_tokens_of_every_frame_add_up_once():
    tally = UsageTally()
    first = tally.add(usage(1234, 567, 89, 45))
    assert first[:4] == (1234, 567, 89, 45)
    tally.add(usage(1000, 100))  # no cache figures: they count as 0
    assert (tally.input_tokens, tally.output_tokens) == (2234, 667)
    assert (tally.cache_read_tokens, tally.cache_write_tokens) == (89, 45)
    assert tally.turns == 2


def test_cost_is_the_increase_of_the_agents_running_total():
    """Claude Code's total_cost_usd (and ACP's usage_update cost) is cumulative over the agent's
    session: turns of 0.0016 then 0.0032 cost 0.0016 each."""
    tally = UsageTally()
    assert tally.add(usage(cost=0.0016)).cost_usd == 0.0016
    assert abs(tally.add(usage(cost=0.0032)).cost_usd - 0.0016) < 1e-12
    assert tally.add(usage(cost=0.0032)).cost_usd == 0.0  # a frame that adds nothing
    assert abs(tally.cost_usd - 0.0032) < 1e-12


def test_a_running_total_that_went_down_started_again():
    tally = UsageTally()
    tally.add(usage(cost=0.5))
    assert tally.add(usage(cost=0.2)).cost_usd == 0.2
    assert abs(tally.cost_usd - 0.7) < 1e-12


def test_no_cost_reported_adds_nothing_and_nonsense_is_ignored():
    tally = UsageTally()
    assert tally.add(usage(5, 5, cost=0.0)).cost_usd == 0.0
    assert tally.add(usage(-5, -1, cost=float("nan"))) == Counted(0, 0, 0, 0, 0.0, None)
    assert tally.add(usage(cost=float("inf"))).cost_usd == 0.0
    assert tally.cost_usd == 0.0 and tally.input_tokens == 5


def test_context_fill_from_utilization_or_used_over_capacity():
    assert context_fill(None) is None
    assert context_fill(F.ContextWindow(capacity=1000, used=250)) == 0.25
    assert context_fill(F.ContextWindow(utilization=0.5, capacity=1000, used=1)) == 0.5
    assert context_fill(F.ContextWindow(capacity=1000, used=5000)) == 1.0
    assert context_fill(F.ContextWindow(used=10)) is None


def test_compaction_sets_the_fill_from_the_last_known_window():
    tally = UsageTally()
    compacted = F.Compacted(
        summary="s", previous_token_count=990_000, current_token_count=12_000, trigger="auto"
    )
    assert tally.compacted(compacted) is None  # no window known yet
    tally.add(usage(window=F.ContextWindow(capacity=1_000_000, used=990_000)))
    assert tally.fill == 0.99
    assert tally.compacted(compacted) == 0.012 == tally.fill


def test_totals_survive_the_saved_record():
    tally = UsageTally()
    tally.add(usage(10, 20, 30, 40, cost=1.5))
    again = UsageTally()
    again.restore(tally.to_json())
    assert again.to_json() == tally.to_json()
    assert again.add(usage(cost=2.0)).cost_usd == 0.5  # the running total goes on
    old = UsageTally()
    old.restore({"input_tokens": 7, "cost_usd": "x", "turns": True})  # an older or broken record
    assert (old.input_tokens, old.cost_usd, old.turns) == (7, 0.0, 0)


def test_usage_metrics_by_agent_model_kind_and_user():
    m = GatewayMetrics(process_collectors=False)
    m.usage("claude-code", "claude-opus-5-5", "alice", Counted(1234, 567, 89, 45, 0.25, 0.3))
    m.usage("claude-code", "claude-opus-5-5", None, Counted(1, 2, 0, 0, 0.0, None))
    m.usage("codex", None, None, Counted(100, 10, 0, 0, 0.0, None))
    kinds = {"input": 1235, "output": 569, "cache_read": 89, "cache_write": 45}
    for kind, n in kinds.items():
        got = value(
            m, "rawp_gateway_tokens_total", agent="claude-code", model="claude-opus-5-5", kind=kind
        )
        assert got == n, kind
    assert (
        value(m, "rawp_gateway_tokens_total", agent="codex", model="unknown", kind="input") == 100
    )
    assert (
        value(m, "rawp_gateway_cost_usd_total", agent="claude-code", model="claude-opus-5-5")
        == 0.25
    )
    # Nothing reported, nothing exported: Codex has no cost series at all.
    assert (
        "rawp_gateway_cost_usd_total",
        frozenset({("agent", "codex"), ("model", "unknown")}),
    ) not in samples(m)
    assert value(m, "rawp_gateway_user_tokens_total", user="alice", kind="input") == 1234
    assert value(m, "rawp_gateway_user_tokens_total", user="none", kind="input") == 101
    assert value(m, "rawp_gateway_user_cost_usd_total", user="alice") == 0.25


def test_model_and_user_labels_are_capped():
    m = GatewayMetrics(process_collectors=False)
    one = Counted(1, 0, 0, 0, 0.0, None)
    for i in range(MODEL_LABEL_LIMIT + 5):
        m.usage("gemini", f"model-{i}", f"user-{i}", one)
    m.usage("gemini", "x" * (LABEL_VALUE_MAX + 1), "y" * (LABEL_VALUE_MAX + 1), one)
    m.usage("gemini", "model-0", "user-0", one)  # a value seen before keeps its own series
    s = samples(m)
    models = {dict(k)["model"] for (name, k) in s if name == "rawp_gateway_tokens_total"}
    users = {dict(k)["user"] for (name, k) in s if name == "rawp_gateway_user_tokens_total"}
    assert len(models) == MODEL_LABEL_LIMIT + 1 and "other" in models
    assert len(users) == USER_LABEL_LIMIT + 1 and "other" in users
    assert value(m, "rawp_gateway_tokens_total", agent="gemini", model="other", kind="input") == 6
    assert value(m, "rawp_gateway_tokens_total", agent="gemini", model="model-0", kind="input") == 2


def test_context_fill_bands_follow_live_sessions():
    m = GatewayMetrics(process_collectors=False)

    def bands() -> dict[str, float]:
        return {
            dict(k)["band"]: v
            for (name, k), v in samples(m).items()
            if name == "rawp_gateway_sessions_context_fill"
        }

    assert bands() == {"0.0": 0, "0.5": 0, "0.8": 0, "0.95": 0}
    m.context_fill(None, 0.1)  # session a
    m.context_fill(None, 0.85)  # session b
    m.context_fill(0.1, 0.5)  # a grows
    assert bands() == {"0.0": 0, "0.5": 1, "0.8": 1, "0.95": 0}
    m.context_fill(0.85, 1.0)  # b is full
    m.context_fill(0.5, None)  # a ended
    assert bands() == {"0.0": 0, "0.5": 0, "0.8": 0, "0.95": 1}


def test_compactions_and_context_limit_turns():
    m = GatewayMetrics(process_collectors=False)
    m.compacted("claude-code", "auto")
    m.compacted("claude-code", "requested")
    m.compacted("claude-code", "bogus")
    m.context_limit_turn("claude-code")
    assert value(m, "rawp_gateway_compactions_total", agent="claude-code", trigger="auto") == 1
    assert value(m, "rawp_gateway_compactions_total", agent="claude-code", trigger="other") == 1
    assert value(m, "rawp_gateway_context_limit_turns_total", agent="claude-code") == 1
    assert value(m, "rawp_gateway_context_limit_turns_total", agent="codex") == 0


def test_claude_code_compaction_turn_reports_the_compacted_context():
    """The recorded /compact (tests/fixtures/claude-code/compact-manual): the result that ends the
    compaction's turn says the context is what compact_boundary left (post_tokens), not what the
    last message before it used."""
    parser = ClaudeCodeParser()
    events = []
    for line in (CLAUDE_CODE / "compact-manual.jsonl").read_bytes().splitlines():
        events += parser.feed(line)
    ends = [e for e in events if isinstance(e, ev.TurnEnded)]
    [compacted] = [e for e in events if isinstance(e, ev.Compacted)]
    assert ends[-1].context_used == compacted.post_tokens == 2586
    assert ends[0].context_used != compacted.post_tokens


async def test_totals_survive_a_gateway_restart(tmp_path):
    """With a state directory the session's totals come back with it (the saved record), so its
    next usage adds to them: the demo agent's turns, before and after a restart."""
    config = demo_config(tmp_path, state_dir=tmp_path / "state")
    gw = await start_gateway(config)
    sid = (await create_session(gw))["session_id"]
    master = await Master.attach(gw, sid)
    await master.next()
    first = await prompt_and_wait(master, "hello there", idle=True)
    before = gw.server.app[SESSIONS][sid].usage.to_json()
    await gw.close()
    [u1] = [f["payload"]["token_usage"] for f in first if f["type"] == "session.usage"]
    assert before["input_tokens"] == u1["input_tokens"] > 0 and before["turns"] == 1

    gw = await start_gateway(config)
    try:
        tally = gw.server.app[SESSIONS][sid].usage
        assert tally.to_json() == before
        again = await Master.attach(gw, sid)
        await again.next()
        second = await prompt_and_wait(again, "and again", idle=True)
        [u2] = [f["payload"]["token_usage"] for f in second if f["type"] == "session.usage"]
        assert tally.input_tokens == u1["input_tokens"] + u2["input_tokens"]
        assert tally.output_tokens == u1["output_tokens"] + u2["output_tokens"]
        assert tally.turns == 2
    finally:
        await gw.close()
