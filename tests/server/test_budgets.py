"""Budgets in the gateway with the demo agent, whose ``spend N`` prompts report a cost as a model's
would (docs/budgets.md): the warning and the budget spent told to every master and to a webhook,
later prompts refused with BUDGET_EXCEEDED while the masters and the history stay, an admin's
``PATCH {"budget_usd"}`` letting the session go on, the owner's daily budget covering all their
sessions, the ledger surviving a restart and a SIGKILL of ``rawp-gateway serve``, unbudgeted
agents named, and the metrics."""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config.notify import Webhook
from gateway.protocol.budget import Limits
from tests.support.auth import bearer, users_config, users_toml
from tests.support.gateway_peer import Master, fast_demo, prompt_and_wait, start_gateway
from tests.support.hostile.acp_client import RawAcp
from tests.support.serve_process import serve
from tests.support.webhooks import Receiver

ADMIN, OPERATOR, OTHER = "admin-token", "operator-token", "other-token"
USERS = {"ann": ("admin", ADMIN), "olga": ("operator", OPERATOR), "otto": ("operator", OTHER)}


def config(tmp_path: Path, limits: Limits, **kw: Any):
    return users_config(tmp_path, USERS, agents={"demo": fast_demo()}, budgets=limits, **kw)


async def session(gw, token: str = OPERATOR) -> str:
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer(token))
    assert resp.status == 201, await resp.text()
    return (await resp.json())["session_id"]


async def attach(gw, sid: str, token: str = OPERATOR) -> Master:
    master = await Master.attach(gw, sid, headers=bearer(token))
    assert (await master.next())["type"] == "session.capabilities"
    return master


async def spend(master: Master, usd: float) -> list[dict[str, Any]]:
    """A turn that reports ``usd`` more; its frames up to the agent idle again."""
    return await prompt_and_wait(master, f"spend {usd}", idle=True)


async def refused(master: Master, text: str = "hello") -> dict[str, Any]:
    sent = await master.send("control.prompt.request", {"prompt_text": text})
    error = await master.until("session.error")
    assert error["parent_id"] == sent["message_id"]
    return error["payload"]


async def info(gw, sid: str, token: str = OPERATOR) -> dict[str, Any]:
    return await (await gw.get(f"/v1/session/{sid}", headers=bearer(token))).json()


async def patch(gw, sid: str, token: str, body: dict[str, Any]):
    resp = await gw.patch(f"/v1/session/{sid}", json=body, headers=bearer(token))
    return resp.status, await resp.json()


async def metric(gw, name: str, **labels: str) -> float:
    text = await (await gw.get("/metrics", headers=bearer(ADMIN))).text()
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", text, re.M)
    assert found, f"{name}{{{wanted}}} is not exposed"
    return float(found[1])


async def test_a_spent_session_budget_refuses_prompts_until_an_admin_raises_it(tmp_path):
    async with Receiver() as hooks:
        hook = Webhook(hooks.url, events=frozenset({"budget.warning", "budget.exceeded"}))
        gw = await start_gateway(config(tmp_path, Limits(session_usd=1.0), webhooks=(hook,)))
        try:
            sid = await session(gw)
            master = await attach(gw, sid)
            watcher = await attach(gw, sid, ADMIN)  # another master: told too
            await spend(master, 0.5)
            assert "session.error" not in master.types()
            await spend(master, 0.35)  # 0.85: past warn_at (0.8)
            warning = await master.until("session.error")
            assert warning["payload"] == {
                "error_code": "BUDGET_WARNING",
                "message": "$0.85 of this session's budget of $1.00 is spent",
                "fatal": False,
            }
            assert warning["metadata"]["rawp_budget"] == {
                "scope": "session",
                "spent_usd": 0.85,
                "limit_usd": 1.0,
            }
            body = json.loads((await hooks.next("budget.warning"))[1])
            assert body["owner"] == "olga" and body["session_id"] == sid
            assert body["budget"]["scope"] == "session"

            await spend(master, 0.25)  # 1.10: spent
            exceeded = await master.until("session.error")
            assert exceeded["payload"]["error_code"] == "BUDGET_EXCEEDED"
            assert "refused until an admin raises it" in exceeded["payload"]["message"]
            assert (await watcher.until("session.error", error_code="BUDGET_EXCEEDED"))["payload"]
            body = json.loads((await hooks.next("budget.exceeded"))[1])
            assert body["budget"]["spent_usd"] == pytest.approx(1.1)

            # Refused, recoverably: no turn starts, the masters stay, the history stays.
            start = len(master.frames)
            error = await refused(master)
            assert (error["error_code"], error["fatal"]) == ("BUDGET_EXCEEDED", False)
            assert "session.turn.start" not in master.types()[start:]
            shown = await info(gw, sid)
            assert shown["state"] == "IDLE" and shown["connections"] == 2
            assert shown["budget"] == {"limit_usd": 1.0, "spent_usd": pytest.approx(1.1)}
            assert await metric(gw, "rawp_gateway_budget_reached", scope="session") == 1
            assert (
                await metric(
                    gw, "rawp_gateway_budget_events_total", event="budget.exceeded", scope="session"
                )
                == 1
            )

            # Only an admin of the gateway raises it (the owner cannot lift their own cap).
            status, answer = await patch(gw, sid, OPERATOR, {"budget_usd": 100})
            assert (status, answer["error_code"]) == (403, "FORBIDDEN")
            status, answer = await patch(gw, sid, ADMIN, {"budget_usd": -1})
            assert (status, answer["error_code"]) == (400, "INVALID_REQUEST")
            status, answer = await patch(gw, sid, ADMIN, {"budget_usd": 5})
            assert status == 200 and answer["budget"]["limit_usd"] == 5.0
            frames = await prompt_and_wait(master, "hello", idle=True)
            assert "session.turn.start" in [f["type"] for f in frames]
            assert await metric(gw, "rawp_gateway_budget_reached", scope="session") == 0
            assert await metric(gw, "rawp_gateway_budget_remaining_usd", scope="session") == (
                pytest.approx(3.9)
            )
        finally:
            await gw.close()


async def test_the_owners_daily_budget_covers_all_their_sessions(tmp_path):
    gw = await start_gateway(config(tmp_path, Limits(user_daily_usd=1.0)))
    try:
        first, second = await session(gw), await session(gw)
        a, b = await attach(gw, first), await attach(gw, second)
        theirs = await attach(gw, await session(gw, OTHER), OTHER)
        await spend(a, 0.6)
        await spend(b, 0.6)
        told = await a.until("session.error", error_code="BUDGET_EXCEEDED")
        assert told["metadata"]["rawp_budget"]["scope"] == "user_daily"
        await b.until("session.error", error_code="BUDGET_EXCEEDED")
        for master in (a, b):
            error = await refused(master)
            assert error["error_code"] == "BUDGET_EXCEEDED"
            assert "until the UTC day turns" in error["message"]
        # Another owner's sessions go on.
        assert "session.turn.start" in [f["type"] for f in await spend(theirs, 0.1)]
        daily = (await info(gw, first))["budget"]["user_daily"]
        assert daily["limit_usd"] == 1.0 and daily["spent_usd"] == pytest.approx(1.2)
    finally:
        await gw.close()


async def test_the_ledger_survives_a_restart(tmp_path):
    state = tmp_path / "state"
    limits = Limits(session_usd=1.0)
    gw = await start_gateway(config(tmp_path, limits, state_dir=state))
    sid = await session(gw)
    await spend(await attach(gw, sid), 1.25)
    await gw.close()  # a graceful stop: the session is suspended

    gw = await start_gateway(config(tmp_path, limits, state_dir=state))
    try:
        assert (await info(gw, sid))["budget"]["spent_usd"] == pytest.approx(1.25)
        master = await attach(gw, sid)
        assert (await refused(master))["error_code"] == "BUDGET_EXCEEDED"
        assert (await patch(gw, sid, ADMIN, {"budget_usd": 2}))[0] == 200
        # The demo agent started again counts from 0: its new total is all new cost.
        await spend(master, 0.25)
        assert (await info(gw, sid))["budget"]["spent_usd"] == pytest.approx(1.5)
    finally:
        await gw.close()


async def test_the_ledger_survives_a_sigkill_of_the_real_command(tmp_path):
    """``rawp-gateway serve`` killed with SIGKILL right after a turn that spent the budget: the
    gateway started again on the same state dir still refuses the next prompt, counts what was
    spent once, and lets the session go on once an admin raises its budget."""
    users = tmp_path / "users.toml"
    users.write_text(users_toml(USERS))
    cfg = tmp_path / "gw.toml"
    cfg.write_text(
        f'[server]\nworkspace_root = "{tmp_path}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[auth]\nusers_file = "{users}"\n[budgets]\nsession_usd = 1.0\n'
        '[agents.demo]\nenv = { RAWP_DEMO_DELAY_MS = "1" }\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")}
    auth = bearer(OPERATOR)
    async with aiohttp.ClientSession(headers=auth) as http:
        async with serve("--config", str(cfg), env=env) as (proc, url):
            async with http.post(url + "/v1/session", json={"agent": "demo"}) as resp:
                created = await resp.json()
            sid = created["session_id"]
            ws = await http.ws_connect(url + created["ws_path"], protocols=("rawp-dps-1.0",))
            master = Master(ws, sid)
            await spend(master, 1.5)
            await master.until("session.error", error_code="BUDGET_EXCEEDED")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        async with serve("--config", str(cfg), env=env) as (proc, url):
            async with http.get(f"{url}/v1/session/{sid}") as resp:
                assert (await resp.json())["budget"]["spent_usd"] == pytest.approx(1.5)
            ws = await http.ws_connect(f"{url}/v1/session/{sid}/ws", protocols=("rawp-dps-1.0",))
            master = Master(ws, sid)
            assert (await refused(master))["error_code"] == "BUDGET_EXCEEDED"
            raise_ = {"budget_usd": 3}
            async with http.patch(
                f"{url}/v1/session/{sid}", json=raise_, headers=bearer(ADMIN)
            ) as resp:
                assert resp.status == 200
            await spend(master, 0.5)
            async with http.get(f"{url}/v1/session/{sid}") as resp:
                assert (await resp.json())["budget"]["spent_usd"] == pytest.approx(2.0)


async def test_agents_that_report_no_cost_are_said_to_be_unbudgeted(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="rawp_gateway.server"):
        gw = await start_gateway(config(tmp_path, Limits(session_usd=5.0)))
    try:
        agents = (await (await gw.get("/v1/agents", headers=bearer(ADMIN))).json())["agents"]
        unbudgeted = {a["name"] for a in agents if a["unbudgeted"]}
        assert {"codex", "codex-acp", "gemini", "gemini-acp", "plain"} <= unbudgeted
        assert not {"claude-code", "claude-acp", "demo"} & unbudgeted
        assert all(a["reports_cost"] is not a["unbudgeted"] for a in agents)
        (line,) = [r.getMessage() for r in caplog.records if "unbudgeted" in r.getMessage()]
        assert "codex-acp" in line and "claude-code" not in line
    finally:
        await gw.close()


async def test_a_profile_says_whether_it_reports_cost(tmp_path):
    from gateway.config import load_config

    path = tmp_path / "gw.toml"
    path.write_text(
        '[agents.mine]\nparser = "acp"\ncommand = ["my-acp"]\n'
        '[agents.cc]\nparser = "claude-code"\ncommand = ["claude"]\n'
        "[agents.codex-acp]\nreports_cost = true\n"
    )
    agents = load_config(path, {"workspace_root": str(tmp_path)}, environ={}).agents
    assert (agents["mine"].reports_cost, agents["cc"].reports_cost) == (False, True)
    assert agents["codex-acp"].reports_cost is True
    assert replace(agents["cc"], reports_cost=False).public()["unbudgeted"] is True


@pytest.mark.parametrize("bad", ["not json", "link", "wrong"])
async def test_a_ledger_that_cannot_be_used_is_set_aside_and_counting_starts_anew(
    tmp_path, caplog, bad
):
    """The state dir is input: a ledger that is not JSON, is a link (never followed) or breaks
    the format is moved to budgets.json.bad with an error in the log; the gateway starts."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    ledger = state / "budgets.json"
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"format": "rawp-gateway-budgets"}')
    if bad == "link":
        ledger.symlink_to(elsewhere)
    elif bad == "wrong":
        ledger.write_text(json.dumps({"format": "rawp-gateway-budgets", "version": 1, "day": 5}))
    else:
        ledger.write_text("{not json")
    with caplog.at_level("ERROR", logger="rawp_gateway.budgets"):
        gw = await start_gateway(config(tmp_path, Limits(session_usd=1.0), state_dir=state))
    try:
        (line,) = [r.getMessage() for r in caplog.records if "ledger" in r.getMessage()]
        assert "set aside, counting anew" in line
        assert (state / "budgets.json.bad").exists() or (state / "budgets.json.bad").is_symlink()
        assert elsewhere.read_text() == '{"format": "rawp-gateway-budgets"}'  # not written through
        sid = await session(gw)
        await spend(await attach(gw, sid), 0.5)
        saved = json.loads(ledger.read_text())
        assert saved["sessions"][sid][1] == pytest.approx(0.5)
        assert not ledger.is_symlink()
    finally:
        await gw.close()


async def test_an_acp_client_gets_the_refusal_as_a_json_rpc_error(tmp_path):
    """On ``/acp`` (docs/acp-masters.md) a prompt a spent budget refuses answers ``session/prompt``
    with a JSON-RPC error whose ``data.error_code`` is BUDGET_EXCEEDED; the session goes on."""
    gw = await start_gateway(config(tmp_path, Limits(session_usd=1.0)))
    try:
        acp = await RawAcp.connect(gw, query="?agent=demo", headers=bearer(OPERATOR))
        await acp.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        sid = (await acp.call("session/new", {"cwd": str(tmp_path)}))["result"]["sessionId"]

        async def prompt(text: str) -> dict[str, Any]:
            params = {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}
            return await acp.call("session/prompt", params)

        assert (await prompt("spend 1.5"))["result"]["stopReason"] == "end_turn"
        refused = (await prompt("hello"))["error"]
        assert refused["data"]["error_code"] == "BUDGET_EXCEEDED"
        assert "refused until an admin raises it" in refused["message"]
        assert (await patch(gw, sid, ADMIN, {"budget_usd": 10}))[0] == 200
        assert (await prompt("hello"))["result"]["stopReason"] == "end_turn"
    finally:
        await gw.close()
