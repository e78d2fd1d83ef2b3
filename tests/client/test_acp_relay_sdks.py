"""``rawp-gateway acp`` launched over stdio by editors no one here wrote: the official ACP Python
SDK (``spawn_agent_process``) and the official TypeScript SDK (in Node), against the real gateway's
``/acp`` on 127.0.0.1 with the demo agent behind it (docs/acp-masters.md). Each runs a turn with a
permission, a cancel, the load of a session a DPS master started, a viewer refused, and a drop of
the connection mid-turn (a loopback hop cut, held shut while a DPS master answers the question and
the turn ends) after which the editor has every update once and its prompt answered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from acp import PROTOCOL_VERSION, connect_to_agent
from acp.schema import ClientCapabilities
from acp.ws.client import create_websocket_stream

from tests.server.test_acp_master_sdk import ROLES, TOKENS  # an operator and a viewer
from tests.support.acp_editors import (
    TURN,
    CutProxy,
    Editor,
    a_dps_masters_session,
    a_turn_with_a_permission_then_a_cancel,
    a_viewer_loads_but_may_not_prompt,
    asked,
    load_it_and_prompt_across,
    node_ready,
    prompt,
    python_editor,
    relay_argv,
    relay_env,
    shared_with_a_viewer,
    ts_editor,
)
from tests.support.auth import bearer, users_config
from tests.support.gateway_peer import (
    Master,
    fast_demo,
    start_gateway,
)
from tests.support.waiting import eventually


@pytest.fixture(params=["python", pytest.param("typescript", marks=pytest.mark.realcli)])
def sdk(request) -> str:
    if request.param == "typescript" and (why := node_ready()):
        pytest.fail(why)
    return request.param


@pytest.fixture
async def gw(tmp_path):
    users = {name: (ROLES[name], TOKENS[name]) for name in TOKENS}
    config = users_config(tmp_path, users, agents={"demo": fast_demo(5)}, acp_default_agent="demo")
    client = await start_gateway(config)
    yield client
    await client.close()


@pytest.fixture
async def hop(gw):
    """The cuttable hop in front of the gateway; the relay is given its URL."""
    proxy = CutProxy(gw.server.port)
    await proxy.start()
    yield proxy
    await proxy.close()


@contextlib.asynccontextmanager
async def editor(
    sdk: str, hop: CutProxy, tmp_path: Path, user: str = "alice"
) -> AsyncIterator[Editor]:
    """An editor of that SDK running ``rawp-gateway acp`` as ``user``, initialized. The Python one
    reads the token from a file, the TypeScript one from the environment."""
    url = f"http://127.0.0.1:{hop.port}"
    if sdk == "python":
        token_file = tmp_path / f"{user}.token"
        token_file.write_text(TOKENS[user] + "\n")
        opened = python_editor(relay_argv(url, token_file=token_file), relay_env(), tmp_path)
    else:
        opened = ts_editor(relay_argv(url), relay_env(TOKENS[user]), tmp_path)
    async with opened as ed:
        init = await ed.request(
            "initialize", {"protocolVersion": PROTOCOL_VERSION, "clientCapabilities": {}}
        )
        assert init["protocolVersion"] == 1
        assert init["agentCapabilities"]["loadSession"] is True
        yield ed


async def waiting_on_a_question(ed: Editor, cwd: Path, name: str) -> tuple[str, asyncio.Future]:
    """A new session whose first turn (``write <name>``) waits for its permission question: the
    session, and the prompt's answer to come."""
    sid = (await ed.request("session/new", {"cwd": str(cwd)}))["sessionId"]
    turn = asyncio.ensure_future(ed.request("session/prompt", prompt(sid, f"write {name}")))
    await asked(ed, 0)
    return sid, turn


async def test_a_turn_with_a_permission_then_a_cancel(sdk, hop, tmp_path):
    async with editor(sdk, hop, tmp_path) as ed:
        await a_turn_with_a_permission_then_a_cancel(ed, tmp_path)
        # Never disconnected: the relay said where it relays and nothing else.
        assert "reconnect" not in ed.stderr()


async def test_a_turns_usage_update_comes_before_its_answer(sdk, hop, tmp_path):
    """The turn's usage_update reaches the editor before the answer to its session/prompt (the
    gateway sends it so, DPS-7.5.2-usage being a turn's end then its usage)."""
    async with editor(sdk, hop, tmp_path) as ed:
        sid = (await ed.request("session/new", {"cwd": str(tmp_path)}))["sessionId"]
        for turns, text in enumerate(("hello", "hello again"), start=1):
            done = await asyncio.wait_for(ed.request("session/prompt", prompt(sid, text)), TURN)
            assert done["stopReason"] == "end_turn"
            kinds = [u["update"]["sessionUpdate"] for u in ed.updates if u["sessionId"] == sid]
            assert kinds.count("usage_update") == turns, "the usage came after the answer"


async def test_an_editor_loads_a_session_a_dps_master_started(sdk, gw, hop, tmp_path):
    sid, master = await a_dps_masters_session(gw, TOKENS["alice"])
    async with editor(sdk, hop, tmp_path) as ed:
        await load_it_and_prompt_across(ed, sid, master, tmp_path)
    await master.ws.close()


async def test_what_became_of_the_mcp_servers_reaches_either_editor(sdk, gw, hop, tmp_path):
    """docs/acp-masters.md#what-became-of-the-mcp-servers: both SDKs take the
    ``session_info_update`` with ``_meta.rawp.mcpServers`` as it is (the TypeScript one parses
    every update with its zod schema), through the relay."""
    servers = [{"name": "docs", "url": "http://127.0.0.1:9/mcp", "headers": {"X-Key": "k-91ab"}}]
    body = {"agent": "demo", "mcp_servers": servers}
    resp = await gw.post("/v1/session", json=body, headers=bearer(TOKENS["alice"]))
    assert resp.status == 201, await resp.text()
    sid = (await resp.json())["session_id"]
    async with editor(sdk, hop, tmp_path) as ed:
        await ed.request("session/load", {"sessionId": sid, "cwd": str(tmp_path)})
        [info] = [u for u in ed.updates if u["update"]["sessionUpdate"] == "session_info_update"]
        assert info["sessionId"] == sid
        [server] = info["update"]["_meta"]["rawp"]["mcpServers"]
        assert (server["name"], server["kind"], server["status"]) == ("docs", "http", "failed")
        assert server["headers"] == ["X-Key"] and "k-91ab" not in str(ed.updates)


async def test_a_viewer_may_load_and_watch_but_not_prompt(sdk, gw, hop, tmp_path):
    sid = await shared_with_a_viewer(gw, TOKENS["alice"], "bob")
    async with editor(sdk, hop, tmp_path, user="bob") as ed:
        await a_viewer_loads_but_may_not_prompt(ed, sid, tmp_path)


async def fresh_load_ids(gw, session_id: str) -> list[str]:
    """The ids of every update a client loading the session now gets (the Python SDK on /acp)."""
    got: list[str] = []

    class Watcher:
        async def session_update(self, session_id, update, **meta):
            got.append(meta["rawp"]["messageId"])

        async def request_permission(self, *args, **kwargs):  # pragma: no cover - none is open
            raise AssertionError("no question is open")

    url = f"ws://127.0.0.1:{gw.server.port}/acp"
    transport = await create_websocket_stream(url, headers=bearer(TOKENS["alice"]))
    conn = connect_to_agent(Watcher(), transport)
    try:
        await conn.initialize(
            protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
        )
        await conn.load_session(cwd="/", session_id=session_id)
    finally:
        await conn.close()
    return got


async def test_a_drop_mid_turn_loses_and_repeats_no_update(sdk, gw, hop, tmp_path):
    async with editor(sdk, hop, tmp_path) as ed:
        sid, turn = await waiting_on_a_question(ed, tmp_path, "dropped.txt")
        before = ed.ids(sid)
        # The network drops and stays down while another master answers and the turn ends.
        hop.cut(shut=True)
        await eventually(lambda: "connection to the gateway lost" in ed.stderr(), "the drop seen")
        master = await Master.attach(gw, sid, headers=bearer(TOKENS["alice"]))
        ask = await master.until("agent.interaction.request", timeout=TURN)
        await master.send(
            "control.interaction.response",
            {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "allow"},
        )
        await master.until("session.turn.end", timeout=TURN)
        assert not turn.done()
        hop.open()
        # The relay comes back, loads the session after the last update it passed on, and
        # answers the prompt from the turn's end.
        done = await asyncio.wait_for(turn, TURN)
        assert done["stopReason"] == "end_turn"
        assert (tmp_path / "dropped.txt").exists()
        assert "reconnected; loading 1 session(s) again" in ed.stderr()
        everything = await fresh_load_ids(gw, sid)
        # After the replay a load is sent the latest commands again (the same frame): not new.
        after = everything[everything.index(before[-1]) + 1 :]
        gap = [i for n, i in enumerate(after) if i not in before and i not in after[:n]]
        assert gap, "the turn went on while the relay was away"
        # What followed the turn's end (its usage) may still be on its way: wait for it, and a
        # lost update is a wait that never ends.
        await eventually(lambda: len(ed.ids(sid)) >= len(before) + len(gap), "the gap", TURN)
        ids = ed.ids(sid)
        assert len(ids) == len(set(ids)), "an update was repeated"
        assert ids == before + gap, "an update was lost"
        await master.ws.close()


async def test_a_question_open_across_a_drop_is_asked_once_and_its_answer_counts(
    sdk, hop, tmp_path
):
    async with editor(sdk, hop, tmp_path) as ed:
        sid, turn = await waiting_on_a_question(ed, tmp_path, "kept.txt")
        hop.cut()  # the relay reconnects at once; the gateway asks the open question again
        await eventually(lambda: "sessions loaded again" in ed.stderr(), "the reload", TURN)
        await ed.answer(0, "allow")  # the dialog the editor already had
        done = await asyncio.wait_for(turn, TURN)
        assert done["stopReason"] == "end_turn"
        assert (tmp_path / "kept.txt").exists()
        assert len(ed.questions) == 1
        ids = ed.ids(sid)
        assert len(ids) == len(set(ids))


async def test_a_cancel_written_while_the_connection_is_down_cancels_the_turn_after_it(
    sdk, hop, tmp_path
):
    async with editor(sdk, hop, tmp_path) as ed:
        sid, turn = await waiting_on_a_question(ed, tmp_path, "gone.txt")
        hop.cut(shut=True)
        await eventually(lambda: "connection to the gateway lost" in ed.stderr(), "the drop seen")
        # The user gives up while the network is down: a cancel, and the dialog answered so.
        await ed.notify("session/cancel", {"sessionId": sid})
        await ed.answer(0, None)
        hop.open()
        done = await asyncio.wait_for(turn, TURN)
        assert done["stopReason"] == "cancelled"
        assert not (tmp_path / "gone.txt").exists()
