"""Permission rules in the in-process gateway with the demo agent (docs/policies.md): a rule that
allows runs the tool with no master attached, one that denies tells the agent why, one that asks
still asks; ``GET /v1/policy/decide`` (admin only) and SIGHUP's reload keeping the old rules when
the new ones cannot be used."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from gateway.config.policy import read_policy
from gateway.server import AUDIT, CONFIG, reload
from tests.support.auth import bearer, users_config, users_toml
from tests.support.gateway_peer import Master, fast_demo, of, start_gateway
from tests.support.serve_process import reload_refused, serve, sighup_until

ADMIN, OPERATOR = "admin-token", "operator-token"

RULES = """
[[policy.rules]]
name = "no-secrets"
tools = ["Write"]
match = { file_path = "*secret*" }
decision = "deny"
message = "secrets are written by people"

[[policy.rules]]
name = "ask-notes"
tools = ["Write"]
match = { file_path = "*notes*" }
decision = "ask"

[[policy.rules]]
name = "writes"
tools = ["Write"]
decision = "allow"
"""


@pytest.fixture
async def gw(tmp_path):
    path = tmp_path / "gateway.toml"
    path.write_text(RULES)
    config = users_config(
        tmp_path,
        {"ann": ("admin", ADMIN), "olga": ("operator", OPERATOR)},
        agents={"demo": fast_demo()},
        policy=read_policy(path),
        config_file=path,
    )
    config = replace(config, auth=replace(config.auth, audit_log=tmp_path / "audit.jsonl"))
    client = await start_gateway(config)
    yield client
    await client.close()


async def session(gw, token: str = OPERATOR) -> str:
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer(token))
    assert resp.status == 201, await resp.text()
    return (await resp.json())["session_id"]


async def attach(gw, sid: str, token: str = OPERATOR) -> Master:
    return await Master.attach(gw, sid, headers=bearer(token))


async def audit(gw) -> list[dict]:
    await gw.app[AUDIT].flush()
    path = gw.app[AUDIT].path
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


async def test_an_allowed_write_runs_with_no_master_attached(gw, tmp_path):
    sid = await session(gw)
    master = await attach(gw, sid)
    await master.send("control.prompt.request", {"prompt_text": "write hello.txt"})
    await master.ws.close()  # nobody is left to answer: the rule does
    for _ in range(200):
        if (tmp_path / "hello.txt").exists():
            break
        await asyncio.sleep(0.05)
    assert (tmp_path / "hello.txt").exists()
    frames = await history_of(gw, sid)
    assert of(frames, "agent.interaction.request") == []
    (result,) = of(frames, "tool.invoke.result")
    assert result["payload"]["status"] == "success"
    assert result["metadata"]["rawp_policy"] == "writes"
    (record,) = [r for r in await audit(gw) if r["action"] == "permission"]
    assert record["detail"]["decided_by"] == "policy:writes"
    assert (record["user"], record["detail"]["decision"]) == (None, "allow")


async def test_a_denied_write_tells_the_agent_the_rules_message(gw, tmp_path):
    master = await attach(gw, await session(gw))
    await master.send("control.prompt.request", {"prompt_text": "write secret.txt"})
    result = await master.until("tool.invoke.result")
    assert result["payload"]["status"] == "error"
    assert "secrets are written by people" in json.dumps(result["payload"]["output"])
    assert result["metadata"]["rawp_policy"] == "no-secrets"
    assert "agent.interaction.request" not in master.types()
    assert not (tmp_path / "secret.txt").exists()
    (record,) = [r for r in await audit(gw) if r["action"] == "permission"]
    assert record["detail"]["decided_by"] == "policy:no-secrets"


async def test_an_ask_still_asks(gw, tmp_path):
    master = await attach(gw, await session(gw))
    await master.send("control.prompt.request", {"prompt_text": "write notes.txt"})
    ask = await master.until("agent.interaction.request")
    assert ask["metadata"]["rawp_policy"] == "ask-notes"
    await master.send(
        "control.interaction.response",
        {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
    )
    result = await master.until("tool.invoke.result")
    assert result["payload"]["status"] == "success"
    assert (tmp_path / "notes.txt").exists()


async def decide(gw, token: str = ADMIN, **query: str):
    resp = await gw.get("/v1/policy/decide", params=query, headers=bearer(token))
    return resp.status, await resp.json()


async def test_decide_explains_without_running_anything(gw, tmp_path):
    write = json.dumps({"file_path": "a/secret.key", "content": "x"})
    assert await decide(gw, agent="demo", tool="Write", input=write) == (
        200,
        {"decision": "deny", "rule": "no-secrets"},
    )
    assert await decide(gw, agent="demo", tool="Read", input="{}") == (
        200,
        {"decision": None, "rule": None},
    )
    sid = await session(gw)
    status, body = await decide(gw, agent="demo", tool="Write", session=sid)
    assert (status, body["rule"]) == (200, "writes")
    assert not list(tmp_path.glob("a"))


@pytest.mark.parametrize(
    ("query", "status", "code"),
    [
        ({"tool": "Write"}, 400, "INVALID_POLICY_QUERY"),
        ({"agent": "demo"}, 400, "INVALID_POLICY_QUERY"),
        ({"agent": "nope", "tool": "Write"}, 404, "AGENT_NOT_FOUND"),
        ({"agent": "demo", "tool": "Write", "input": "{"}, 400, "INVALID_JSON"),
        ({"agent": "demo", "tool": "Write", "input": "[1]"}, 400, "INVALID_POLICY_QUERY"),
        ({"agent": "demo", "tool": "Write", "input": "[" * 200 + "]" * 200}, 400, "INVALID_JSON"),
        ({"agent": "demo", "tool": "Write", "session": "gone"}, 404, "SESSION_NOT_FOUND"),
    ],
)
async def test_decide_refuses_bad_queries(gw, query, status, code):
    got, body = await decide(gw, **query)
    assert (got, body["error_code"]) == (status, code)


async def test_decide_is_for_admins(gw):
    status, body = await decide(gw, OPERATOR, agent="demo", tool="Write")
    assert (status, body["error_code"]) == (403, "FORBIDDEN")


async def test_reload_takes_new_rules_and_keeps_the_old_ones_on_an_error(gw, tmp_path, caplog):
    path = tmp_path / "gateway.toml"
    sid = await session(gw)
    path.write_text('[[policy.rules]]\nname = "no-writes"\ntools = ["Write"]\ndecision = "deny"\n')
    reload(gw.app)
    assert (await decide(gw, agent="demo", tool="Write", session=sid))[1]["rule"] == "no-writes"
    # The live session got them too.
    master = await attach(gw, sid)
    await master.send("control.prompt.request", {"prompt_text": "write x.txt"})
    result = await master.until("tool.invoke.result")
    assert result["metadata"]["rawp_policy"] == "no-writes"

    path.write_text('[[policy.rules]]\nname = "bad"\ndecision = "perhaps"\n')
    with caplog.at_level(logging.ERROR, logger="rawp_gateway.server"):
        reload(gw.app)
    (line,) = [r.getMessage() for r in caplog.records if "policy rules" in r.getMessage()]
    assert line.startswith("policy rules not reloaded, the 1 rules before stay: ")
    assert "gateway.toml [[policy.rules]] 1 (bad)" in line and "decision must be" in line
    assert (await decide(gw, agent="demo", tool="Write"))[1]["rule"] == "no-writes"


async def history_of(gw, sid: str) -> list[dict]:
    """The session's whole history, as its owner attaching now is sent it."""
    master = await Master.attach(gw, sid, history="all", headers=bearer(OPERATOR))
    await master.next()
    frames = (await master.until("session.history"))["payload"]["frames"]
    await master.ws.close()
    return frames


async def test_the_real_command_reloads_the_rules_on_sighup(tmp_path):
    """``rawp-gateway serve``: SIGHUP reads the rules again; a bad set then keeps the rules in
    force and says why in one log line."""
    users = tmp_path / "users.toml"
    users.write_text(users_toml({"ann": ("admin", ADMIN)}))
    cfg = tmp_path / "gw.toml"
    head = f'[server]\nworkspace_root = "{tmp_path}"\n[auth]\nusers_file = "{users}"\n'
    rule = '[[policy.rules]]\nname = "{}"\ntools = ["Bash"]\ndecision = "{}"\n'
    cfg.write_text(head + rule.format("first", "ask"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")}

    async def ruled(http, url: str) -> str | None:
        query = {"agent": "claude-code", "tool": "Bash"}
        async with http.get(url + "/v1/policy/decide", params=query, headers=bearer(ADMIN)) as r:
            return (await r.json())["rule"]

    args = ("--config", str(cfg), "--log-format", "json")
    async with serve(*args, env=env) as (proc, url), aiohttp.ClientSession() as http:
        assert await ruled(http, url) == "first"
        cfg.write_text(head + rule.format("second", "deny"))

        async def second() -> bool:
            return await ruled(http, url) == "second"

        await sighup_until(proc, second)
        cfg.write_text(head + rule.format("second", "deny") * 2)  # a duplicate name
        why = reload_refused(proc, "policy rules")
    assert why.startswith("policy rules not reloaded, the 1 rules before stay: ")
    assert "gw.toml [[policy.rules]] 2 (second)" in why


async def test_decide_takes_an_acp_calls_title_and_kind_from_the_input(gw):
    path = Path(gw.app[CONFIG].config_file)
    path.write_text('[[policy.rules]]\nname = "edits"\ntools = ["edit"]\ndecision = "ask"\n')
    reload(gw.app)
    query = {"agent": "demo", "tool": "tool", "input": json.dumps({"kind": "edit"})}
    assert (await decide(gw, **query))[1] == {"decision": "ask", "rule": "edits"}


async def test_decide_with_a_session_judges_a_path_where_it_leads(gw, tmp_path):
    """With ``session``, the paths are read in its workspace as a permission question's are: a
    link to a secret is judged as the secret."""
    (tmp_path / "plain.txt").symlink_to(tmp_path / "secret.txt")
    sid = await session(gw)
    write = json.dumps({"file_path": "plain.txt", "content": "x"})
    assert await decide(gw, agent="demo", tool="Write", input=write, session=sid) == (
        200,
        {"decision": "deny", "rule": "no-secrets"},
    )
    # Without a session, nobody reads a disk: the path as written.
    assert await decide(gw, agent="demo", tool="Write", input=write) == (
        200,
        {"decision": "allow", "rule": "writes"},
    )
