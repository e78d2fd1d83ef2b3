"""What the agents used, watched end to end: the real CLIs (Claude Code, Codex, Gemini) and the
real ACP agents (claude-agent-acp, ``gemini --acp``, codex-acp) against the rig's scripted model
servers, which report distinctive token counts, the real gateway, and a real
Prometheus scraping its ``/metrics``.

Each test scripts the model's usage per call, runs turns through a real WebSocket master, and checks
that the main ``session.usage`` frames say the scripted amounts (DPS-7.5.2-usage) and that
Prometheus sees ``rawp_gateway_tokens_total`` move by exactly those amounts, kind by kind, under the
agent's own model name; Claude Code's reported cost and context window, and its compaction, too.
The same tokens and cost by the session's owner, for two named users of a users file. What
"once" means per agent: docs/usage.md. An ACP agent's prompt answer and ``usage_update`` become the
same ``session.usage`` frames and are counted by the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from gateway.agent.profiles import builtin_profiles
from gateway.config.auth import AuthSettings
from gateway.server import SESSIONS
from tests.support.auth import bearer, users_toml
from tests.support.dashboard import all_panels, load_dashboard, substitute
from tests.support.gateway_peer import Master, create_session, make_config, start_gateway
from tests.support.prometheus import prometheus_binary, query, run_prometheus, wait_for_value
from tests.support.rig.env import require_cli
from tests.support.rig.run import CliSetup, scripted_cli
from tests.support.rig.scenario import parse_scenario

pytestmark = [pytest.mark.realcli, pytest.mark.prometheus]

TOKEN = "usage-test-token"
GEMINI_MODEL = "gemini-2.5-flash"  # without -m the CLI first makes a routing call ("auto")
DEADLINE_SEC = 90.0  # CLI turns plus scrapes, on a busy machine
KINDS = ("input", "output", "cache_read", "cache_write")


@dataclass
class Watched:
    """A gateway running the real ``agent`` CLI, a master on one session, and a Prometheus."""

    agent: str
    cli: CliSetup
    gw: TestClient
    session_id: str
    master: Master
    prometheus: str  # base URL
    http: aiohttp.ClientSession
    deadline: float = 0.0  # time.monotonic() by which every wait on Prometheus is over

    async def turn(self, text: str, timeout: float = 60) -> list[dict[str, Any]]:
        """Send a prompt, read up to the session.usage after its session.turn.end. The waits on
        Prometheus that follow get DEADLINE_SEC from here."""
        start = len(self.master.frames)
        await self.master.send("control.prompt.request", {"prompt_text": text})
        await self.master.until("session.turn.end", timeout=timeout)
        assert (await self.master.next(timeout=10))["type"] == "session.usage"  # DPS-7.5.2-usage
        self.deadline = max(self.deadline, time.monotonic() + DEADLINE_SEC)
        return self.master.frames[start:]

    async def turns(self, *texts: str) -> list[dict[str, Any]]:
        """``turn`` for each prompt in order, their frames together; the model server was asked
        nothing it had no answer for."""
        frames = [f for text in texts for f in await self.turn(text)]
        assert not self.cli.server.unexpected
        return frames

    async def equals(self, promql: str, expected: float) -> None:
        await wait_for_value(self.http, self.prometheus, promql, expected, self.deadline)

    async def scraped(self, promql: str) -> float:
        """The single value of ``promql`` once Prometheus has one other than 0."""
        while time.monotonic() < self.deadline:
            result = await query(self.http, self.prometheus, promql)
            if len(result) == 1 and float(result[0]["value"][1]) != 0:
                return float(result[0]["value"][1])
            await asyncio.sleep(0.25)
        pytest.fail(f"{promql} has no value in time")


@contextlib.asynccontextmanager
async def watched(
    agent: str,
    calls: list[dict[str, Any]],
    tmp_path,
    settings: dict[str, Any] | None = None,
    **changes: Any,
):
    """The scripted model server answering ``calls``, a gateway (token required; ``settings``:
    more of its config) whose built-in ``agent`` profile runs the real CLI against it
    (``changes``: profile fields), a master attached to a new session (the token holder's), and a
    Prometheus scraping the gateway every second."""
    settings = settings or {}
    cli_name = "gemini" if agent == "gemini-acp" else agent  # Gemini speaks ACP itself
    binary = str(require_cli(cli_name))
    prometheus_binary()
    scenario = parse_scenario({"run": {}, "calls": calls}, name=f"usage-{agent}", agent=cli_name)
    async with scripted_cli(scenario) as cli:
        names = ("claude", "codex", "gemini", "claude_acp", "codex_acp")
        base = builtin_profiles(**dict.fromkeys(names, binary))[agent]
        profile = replace(base, env=cli.env, **changes)
        if cli_name == "gemini":
            profile = replace(profile, command=(binary, "-m", GEMINI_MODEL, *base.command[1:]))
        config = make_config(cli.cwd, agents={agent: profile}, token=TOKEN, **settings)
        client = await start_gateway(config)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        client.session.headers.update(auth)
        try:
            session = await create_session(client, agent)
            master = await Master.attach(client, session["session_id"], headers=auth)
            assert (await master.next())["type"] == "session.capabilities"
            address = f"{client.server.host}:{client.server.port}"
            async with (
                run_prometheus(tmp_path, TOKEN, [{"targets": [address]}]) as prometheus,
                aiohttp.ClientSession() as http,
            ):
                w = Watched(agent, cli, client, session["session_id"], master, prometheus, http)
                w.deadline = time.monotonic() + DEADLINE_SEC
                # Scraped before any turn: no token was counted yet.
                await w.equals('count(up{job="rawp-gateway"} == 1)', 1)
                assert await query(http, prometheus, "rawp_gateway_tokens_total") == []
                yield w
        finally:
            await client.close()


def answers(field: str, *usages: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's answers to "The first prompt." (and "The second prompt."), each "The first
    answer." ("The second answer.") with its ``usages`` entry; ``field``: where the agent's API
    puts the text ("content" Anthropic, "output" OpenAI, "parts" Gemini)."""
    assert 1 <= len(usages) <= 2
    shapes = {
        "content": lambda text: [{"type": "text", "text": text}],
        "output": lambda text: [{"type": "message", "text": text}],
        "parts": lambda text: [{"text": text}],
    }
    return [
        {
            "match": {"last_user_contains": word},
            "usage": usage,
            field: shapes[field](f"The {word} answer."),
        }
        for word, usage in zip(("first", "second"), usages, strict=False)
    ]


def main_usages(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        f["payload"]
        for f in frames
        if f["type"] == "session.usage" and "subagent_context" not in (f.get("metadata") or {})
    ]


def token_sums(usages: list[dict[str, Any]]) -> dict[str, int]:
    keys = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return {
        kind: sum(u["token_usage"].get(key) or 0 for u in usages)
        for kind, key in zip(KINDS, keys, strict=True)
    }


async def check_tokens(w: Watched, model: str, expected: dict[str, int]) -> None:
    """Prometheus sees exactly ``expected`` tokens of each kind for the agent and model."""
    for kind, n in expected.items():
        promql = (
            f'sum(rawp_gateway_tokens_total{{job="rawp-gateway", agent="{w.agent}", '
            f'model="{model}", kind="{kind}"}})'
        )
        if n:
            await w.equals(promql, n)
        else:
            assert await query(w.http, w.prometheus, promql) == [], kind
    # By the session's owner: its user name where sessions have one, else "none".
    owner = getattr(w.gw.server.app[SESSIONS][w.session_id], "owner", None) or "none"
    by_user = f'sum(rawp_gateway_user_tokens_total{{job="rawp-gateway", user="{owner}"}})'
    await w.equals(by_user, sum(expected.values()))


# --- Claude Code ----------------------------------------------------------------------------------


async def test_claude_code_tokens_cost_and_context_reach_prometheus(tmp_path):
    """DPS-7.5.2-usage, DPS-10.5-usage: two turns, the second with a foreground subagent. Each main
    session.usage carries the main agent's scripted tokens (the result's usage, summed over the
    turn's API calls); the subagent's own usage is its own frame and is not counted again.
    Prometheus sees exactly the main tokens, the cost Claude Code reported (its running total), the
    context fill of the last usage (850,517 of 1,000,000: band 0.8), no context-limit turn."""
    first = {"input_tokens": 1234, "output_tokens": 567, "cache_read_input_tokens": 89}
    first["cache_creation_input_tokens"] = 45
    delegate = {"input_tokens": 2001, "output_tokens": 33, "cache_read_input_tokens": 400}
    delegate["cache_creation_input_tokens"] = 7
    sub = {"input_tokens": 777, "output_tokens": 11}
    last = {"input_tokens": 850_000, "output_tokens": 44, "cache_read_input_tokens": 500}
    last["cache_creation_input_tokens"] = 8
    calls = [
        {
            "match": {"last_user_contains": "first"},
            "usage": first,
            "content": [{"type": "text", "text": "The first answer."}],
        },
        {
            "match": {"subagent": False, "tool_result": False},
            "usage": delegate,
            "content": [
                {
                    "type": "tool_use",
                    "name": "Agent",
                    "input": {
                        "description": "Say hi",
                        "prompt": "Answer hi.",
                        "subagent_type": "general-purpose",
                        "run_in_background": False,
                    },
                }
            ],
        },
        {
            "match": {"subagent": True},
            "usage": sub,
            "content": [{"type": "text", "text": "hi"}],
        },
        {
            "match": {"subagent": False, "tool_result": True},
            "usage": last,
            "content": [{"type": "text", "text": "The subagent said hi."}],
        },
    ]
    auto = frozenset({"Agent", "Task"})
    async with watched("claude-code", calls, tmp_path, auto_allow=auto) as w:
        frames = await w.turns("The first prompt.", "Delegate a greeting.")
        usages = main_usages(frames)
        assert len(usages) == 2
        assert [f for f in frames if f["type"] == "agent.subagent.ended"]
        own = [f["payload"] for f in frames if f["type"] == "session.usage"]
        own = [u for u in own if u not in usages]  # the subagent's own report (DPS-10.5-usage)
        assert [u["token_usage"]["input_tokens"] for u in own] == [777]
        expected = {
            "input": 1234 + 2001 + 850_000,
            "output": 567 + 33 + 44,
            "cache_read": 89 + 400 + 500,
            "cache_write": 45 + 7 + 8,
        }
        assert token_sums(usages) == expected
        model = w.cli.server.requests[0].body["model"]  # the name the CLI gave its model
        await check_tokens(w, model, expected)

        cost = usages[-1]["cost_usage"]["used"]  # the CLI's running total, subagent included
        assert cost > usages[0]["cost_usage"]["used"] > 0
        promql = f'sum(rawp_gateway_cost_usd_total{{agent="claude-code", model="{model}"}})'
        assert await w.scraped(promql) == pytest.approx(cost, rel=1e-9)
        assert await query(w.http, w.prometheus, "rawp_gateway_user_cost_usd_total") != []

        window = usages[-1]["context_window"]
        # The last main API message's input + cache + output tokens (its first output token).
        assert window["capacity"] == 1_000_000 and window["used"] == 850_000 + 500 + 8 + 1
        await w.equals('rawp_gateway_sessions_context_fill{band="0.8"}', 1)
        await w.equals('sum(rawp_gateway_sessions_context_fill{band!="0.8"})', 0)
        await w.equals('sum(rawp_gateway_context_limit_turns_total{agent="claude-code"})', 0)
        await check_dashboard_row(w, model)


async def check_dashboard_row(w: Watched, model: str) -> None:
    """The dashboard's "Usage and cost" queries run on the real Prometheus, and the tokens and cost
    ones find this agent and model."""
    dashboard = load_dashboard()
    row = [p["title"] for p in dashboard["panels"]]
    start = row.index("Usage and cost")
    end = next(i for i in range(start + 1, len(row)) if dashboard["panels"][i]["type"] == "row")
    panels = {p["title"]: p for p in all_panels(dashboard)[start + 1 : end]}
    assert len(panels) >= 5
    for title, panel in panels.items():
        for target in panel["targets"]:
            expr = substitute(target["expr"])
            result = await query(w.http, w.prometheus, expr)
            if title.startswith(("Tokens /s by agent", "Cost per hour")):
                while not result and time.monotonic() < w.deadline:  # rate() needs two scrapes
                    await asyncio.sleep(0.25)
                    result = await query(w.http, w.prometheus, expr)
                labels = [(r["metric"]["agent"], r["metric"]["model"]) for r in result]
                assert labels == [(w.agent, model)], title


async def test_claude_code_compaction_and_a_full_context(tmp_path):
    """DPS-7.2-compacted: the first answer reports 990,000 input tokens of a 1,000,000 window, so
    that turn hit the context limit (>= 95%) and before the second prompt Claude Code compacts on
    its own (trigger auto). Prometheus sees one context-limit turn, one auto compaction, and the
    session back in the lowest context band once the second turn reports a small context."""
    calls = [
        {
            "match": {"last_user_contains": "First message"},
            "usage": {"input_tokens": 990_000, "output_tokens": 500},
            "content": [{"type": "text", "text": "A long conversation so far."}],
        },
        {
            "match": {"compaction": True},
            "usage": {"input_tokens": 3000, "output_tokens": 300},
            "content": [{"type": "text", "text": "<summary>1. The user sent a message.</summary>"}],
        },
        {
            "match": {"last_user_contains": "Second message"},
            "usage": {"input_tokens": 4321, "output_tokens": 21},
            "content": [{"type": "text", "text": "Answer after compaction."}],
        },
    ]
    async with watched("claude-code", calls, tmp_path) as w:
        first = await w.turn("First message.")
        assert main_usages(first)[-1]["context_window"]["utilization"] >= 0.95
        await w.equals('rawp_gateway_sessions_context_fill{band="0.95"}', 1)
        await w.equals('sum(rawp_gateway_context_limit_turns_total{agent="claude-code"})', 1)
        frames = await w.turn("Second message.")
        compacted = [f["payload"] for f in frames if f["type"] == "session.compacted"]
        assert [c["trigger"] for c in compacted] == ["auto"]
        await w.equals('rawp_gateway_compactions_total{agent="claude-code", trigger="auto"}', 1)
        await w.equals('sum(rawp_gateway_compactions_total{trigger!="auto"})', 0)
        await w.equals('rawp_gateway_sessions_context_fill{band="0.0"}', 1)
        await w.equals('sum(rawp_gateway_context_limit_turns_total{agent="claude-code"})', 1)
        assert not w.cli.server.unexpected


async def test_tokens_and_cost_by_the_sessions_owner(tmp_path):
    """Two users of a users file (docs/identities.md) each create a Claude Code session and run
    a turn with their own scripted usage: Prometheus sees rawp_gateway_user_tokens_total and
    rawp_gateway_user_cost_usd_total move for each user by exactly that user's turn, and nothing
    for the token holder (admin), whose session ran no turn."""
    tokens = {"alice": "alice-usage-token", "bob": "bob-usage-token"}
    users = tmp_path / "users.toml"
    users.write_text(users_toml({name: ("operator", token) for name, token in tokens.items()}))
    scripted = {
        "alice": {"input_tokens": 3001, "output_tokens": 301, "cache_read_input_tokens": 31},
        "bob": {"input_tokens": 5002, "output_tokens": 502, "cache_read_input_tokens": 52},
    }
    scripted["alice"]["cache_creation_input_tokens"] = 3
    scripted["bob"]["cache_creation_input_tokens"] = 5
    calls = [
        {
            "match": {"last_user_contains": f"{name}'s prompt"},
            "usage": usage,
            "content": [{"type": "text", "text": f"An answer for {name}."}],
        }
        for name, usage in scripted.items()
    ]
    settings = {"auth": AuthSettings(users_file=users)}
    async with watched("claude-code", calls, tmp_path, settings) as w:
        for name, token in tokens.items():
            created = await w.gw.post(
                "/v1/session", json={"agent": "claude-code"}, headers=bearer(token)
            )
            assert created.status == 201, await created.text()
            sid = (await created.json())["session_id"]
            assert w.gw.server.app[SESSIONS][sid].owner == name
            master = await Master.attach(w.gw, sid, headers=bearer(token))
            assert (await master.next())["type"] == "session.capabilities"
            mine = replace(w, session_id=sid, master=master)
            (usage,) = main_usages(await mine.turn(f"This is {name}'s prompt."))
            u = scripted[name]
            expected = {
                "input": u["input_tokens"],
                "output": u["output_tokens"],
                "cache_read": u["cache_read_input_tokens"],
                "cache_write": u["cache_creation_input_tokens"],
            }
            assert token_sums([usage]) == expected
            for kind, n in expected.items():
                promql = f'rawp_gateway_user_tokens_total{{user="{name}", kind="{kind}"}}'
                await mine.equals(promql, n)
            cost = usage["cost_usage"]["used"]  # the first figure of this user's own CLI
            promql = f'rawp_gateway_user_cost_usd_total{{user="{name}"}}'
            assert cost > 0 and await mine.scraped(promql) == pytest.approx(cost, rel=1e-9)
        assert not w.cli.server.unexpected
        by_user = await query(w.http, w.prometheus, "rawp_gateway_user_tokens_total")
        assert {r["metric"]["user"] for r in by_user} == set(tokens)


# --- Codex ----------------------------------------------------------------------------------------


async def test_codex_turn_shares_of_the_thread_total_reach_prometheus(tmp_path):
    """Codex reports usage as a running total over its thread (across the resume of the second
    prompt): each turn's session.usage is that turn's share, uncached input apart from cached, and
    Prometheus sees exactly the two turns' scripted tokens under model "unknown" (Codex does not
    print its model). No cost is reported, so none is counted."""
    calls = answers(
        "output",
        {"input_tokens": 1500, "cached_tokens": 300, "output_tokens": 70},
        {"input_tokens": 2600, "cached_tokens": 400, "output_tokens": 81},
    )
    async with watched("codex", calls, tmp_path) as w:
        frames = await w.turns("The first prompt.", "The second prompt.")
        expected = {"input": 1200 + 2200, "output": 70 + 81, "cache_read": 300 + 400}
        expected["cache_write"] = 0
        assert token_sums(main_usages(frames)) == expected
        await check_tokens(w, "unknown", expected)
        assert await query(w.http, w.prometheus, "rawp_gateway_cost_usd_total") == []
        await w.equals("sum(rawp_gateway_sessions_context_fill)", 0)  # no window reported


# --- Gemini ---------------------------------------------------------------------------------------


async def test_gemini_run_stats_reach_prometheus(tmp_path):
    """Gemini reports its stats once per run (one run per prompt): each turn's session.usage has
    them, cached apart from uncached input, and Prometheus sees exactly the scripted tokens under
    the model the CLI names in its init line."""
    calls = answers(
        "parts",
        {"prompt": 1700, "candidates": 90, "cached": 200},
        {"prompt": 2900, "candidates": 61, "cached": 0},
    )
    async with watched("gemini", calls, tmp_path) as w:
        frames = await w.turns("The first prompt.", "The second prompt.")
        expected = {"input": 1500 + 2900, "output": 90 + 61, "cache_read": 200, "cache_write": 0}
        assert token_sums(main_usages(frames)) == expected
        await check_tokens(w, GEMINI_MODEL, expected)
        assert await query(w.http, w.prometheus, "rawp_gateway_cost_usd_total") == []


# --- ACP agents -----------------------------------------------------------------------------------

ACP_STARTUP = 120.0  # the first turn includes the agent's start (tens of seconds under load)


async def test_claude_acp_prompt_usage_and_running_cost_reach_prometheus(tmp_path):
    """DPS-7.5.2-usage through ACP: claude-agent-acp answers each session/prompt with the turn's
    usage (Claude Code's result usage: inputTokens without the cached reads, as Anthropic counts
    them) and sends a usage_update whose cost is Claude Code's running total over the session.
    The second turn is scripted to use exactly twice the first's tokens, so its running cost is
    three times the first turn's: Prometheus sees the two turns' tokens once each and the cost
    counted as that running total (not summed as if each figure were the turn's own)."""
    first = {"input_tokens": 1311, "output_tokens": 217, "cache_read_input_tokens": 4099}
    first["cache_creation_input_tokens"] = 61
    second = {k: 2 * v for k, v in first.items()}
    calls = answers("content", first, second)
    async with watched("claude-acp", calls, tmp_path) as w:
        frames = await w.turn("The first prompt.", timeout=ACP_STARTUP)
        frames += await w.turn("The second prompt.")
        # Every model call was scripted (under the adapter Claude Code also probes HEAD /).
        assert [r for r in w.cli.server.unexpected if r.method != "HEAD"] == []
        usages = main_usages(frames)
        assert len(usages) == 2
        expected = {"input": 3 * 1311, "output": 3 * 217, "cache_read": 3 * 4099}
        expected["cache_write"] = 3 * 61
        assert token_sums(usages) == expected
        # The model as session/new names it (models.currentModelId): the adapter's "default".
        await check_tokens(w, "default", expected)

        costs = [u["cost_usage"]["used"] for u in usages]
        assert costs[0] > 0 and costs[1] == pytest.approx(3 * costs[0], rel=1e-6)
        promql = 'sum(rawp_gateway_cost_usd_total{agent="claude-acp", model="default"})'
        assert await w.scraped(promql) == pytest.approx(costs[1], rel=1e-9)
        window = usages[-1]["context_window"]  # the usage_update's used / size
        assert window["used"] == 2 * (1311 + 4099 + 61) + 1 and window["capacity"] > 0


async def test_gemini_acp_quota_token_count_reaches_prometheus(tmp_path):
    """DPS-7.5.2-usage through ACP: Gemini's session/prompt answer carries the turn's tokens as
    ``_meta.quota.token_count`` (summed over the turn's model calls), input and output only.
    Its input is Gemini's prompt token count, which includes the cached tokens, and the answer
    does not say how many were cached: so for gemini-acp the cached tokens are in ``input`` and
    none is counted as ``cache_read`` (docs/usage.md). No cost is reported, so none is counted."""
    calls = answers(
        "parts",
        {"prompt": 1723, "candidates": 93, "cached": 300},
        {"prompt": 2917, "candidates": 67, "cached": 0},
    )
    async with watched("gemini-acp", calls, tmp_path) as w:
        frames = await w.turn("The first prompt.", timeout=ACP_STARTUP)
        frames += await w.turn("The second prompt.")
        assert not w.cli.server.unexpected
        expected = {"input": 1723 + 2917, "output": 93 + 67, "cache_read": 0, "cache_write": 0}
        assert token_sums(main_usages(frames)) == expected
        await check_tokens(w, GEMINI_MODEL, expected)
        assert await query(w.http, w.prometheus, "rawp_gateway_cost_usd_total") == []


async def test_codex_acp_reports_only_its_context_window(tmp_path):
    """codex-acp answers session/prompt without usage and sends usage_update with only the
    context window (used: the last call's input, cached included, plus its output): the
    session.usage has no tokens and no cost, so Prometheus counts none for it, and the session's
    context fill is the window's (docs/usage.md)."""
    calls = answers("output", {"input_tokens": 1500, "cached_tokens": 300, "output_tokens": 70})
    async with watched("codex-acp", calls, tmp_path) as w:
        frames = await w.turn("The first prompt.", timeout=ACP_STARTUP)
        assert not w.cli.server.unexpected
        (usage,) = main_usages(frames)
        assert usage["token_usage"] == {"input_tokens": 0, "output_tokens": 0}
        assert usage["context_window"]["used"] == 1500 + 70
        await w.equals('rawp_gateway_sessions_context_fill{band="0.0"}', 1)
        assert await query(w.http, w.prometheus, "rawp_gateway_tokens_total") == []
        assert await query(w.http, w.prometheus, "rawp_gateway_cost_usd_total") == []
