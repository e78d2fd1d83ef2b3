"""An ACP agent's saved sessions through the real gateway, asked of a scripted agent
(``tests/support/hostile/acp_agent.py``; ``HOSTILE_ACP_LIST`` says how it answers ``session/list``):
listed through ``session/list`` page after page, continued through ``session/load`` with the
replay as history; and an agent that declares no listing, hangs, writes garbage, a huge answer,
pages without end or ends, each a clear error with its process gone."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from gateway.agent import descendants
from gateway.agent.conversations.ask_acp import MAX_RUNNING
from gateway.agent.profiles import AgentProfile, parser_features
from tests.support.gateway_peer import Master, history, make_config, start_gateway
from tests.support.paths import HOSTILE

AGENT = str(HOSTILE / "acp_agent.py")


def profile(lists: str | None = "ok") -> AgentProfile:
    env = {"HOSTILE_ACP_LIST": lists} if lists else {}
    return AgentProfile(
        name="scripted-acp",
        parser="acp",
        command=(sys.executable, AGENT),
        env=env,
        features=parser_features("acp"),
        stall_warning_sec=0,
    )


async def gateway(tmp_path: Path, lists: str | None = "ok", **config: Any) -> TestClient:
    return await start_gateway(
        make_config(tmp_path, agents={"scripted-acp": profile(lists)}, **config)
    )


async def listing(gw: TestClient, **query: Any) -> tuple[int, Any]:
    params = {k: str(v) for k, v in query.items()}
    resp = await gw.get("/v1/agents/scripted-acp/conversations", params=params)
    return resp.status, await resp.json()


async def test_listed_from_session_list_newest_first_of_the_workspace_only(tmp_path) -> None:
    gw = await gateway(tmp_path)
    try:
        status, body = await listing(gw)
        assert status == 200, body
        assert body == {
            "conversations": [
                {
                    "id": "hostile-1",
                    "title": "Newer second line",
                    "updated_at": "2026-02-03T04:05:06Z",
                    "turns": None,
                },
                {
                    "id": "older",
                    "title": "Older",
                    "updated_at": "2026-01-02T03:04:05Z",
                    "turns": None,
                },
            ],
            "complete": True,  # both pages read; "elsewhere" is another cwd's
        }
        status, body = await listing(gw, limit=1)
        assert (status, [c["id"] for c in body["conversations"]], body["complete"]) == (
            200,
            ["hostile-1"],
            False,
        )
        assert descendants.live_groups() == []  # each asked agent was ended
        agents = {a["name"]: a for a in (await (await gw.get("/v1/agents")).json())["agents"]}
        assert agents["scripted-acp"]["conversations"] is True
    finally:
        await gw.close()


async def test_an_agent_without_session_list_answers_501(tmp_path) -> None:
    gw = await gateway(tmp_path, lists=None)
    try:
        status, body = await listing(gw)
        assert (status, body["error_code"]) == (501, "CONVERSATIONS_NOT_SUPPORTED")
        assert "sessionCapabilities.list" in body["message"]
    finally:
        await gw.close()


async def test_a_profile_with_conversations_off_is_not_asked(tmp_path) -> None:
    off = replace(profile(), conversations=False)
    gw = await start_gateway(make_config(tmp_path, agents={"scripted-acp": off}))
    try:
        status, body = await listing(gw)
        assert (status, body["error_code"]) == (501, "CONVERSATIONS_NOT_SUPPORTED")
        assert not (tmp_path / "acp-starts.log").exists()  # no agent was started
    finally:
        await gw.close()


async def test_a_hanging_agent_is_a_timeout_and_is_ended(tmp_path) -> None:
    gw = await gateway(tmp_path, lists="hang", conversations_timeout_sec=1.0)
    try:
        status, body = await listing(gw)
        assert (status, body["error_code"]) == (504, "CONVERSATIONS_TIMEOUT")
        assert "session/list" in body["message"] and "1 s" in body["message"]
        assert descendants.live_groups() == []
    finally:
        await gw.close()


async def test_garbage_a_huge_answer_and_an_early_end_are_agent_errors(tmp_path) -> None:
    for lists, said in (
        ("garbage", "wrong shape"),
        ("huge", "bytes"),
        ("exit", "ended before it answered session/list"),
    ):
        gw = await gateway(tmp_path, lists=lists)
        try:
            status, body = await listing(gw)
            assert (status, body["error_code"]) == (502, "CONVERSATIONS_AGENT_ERROR"), lists
            assert said in body["message"], (lists, body)
            assert descendants.live_groups() == []
        finally:
            await gw.close()


async def test_pages_without_end_are_cut_and_said_incomplete(tmp_path) -> None:
    """One process is asked ``MAX_LIST_PAGES`` pages, then the listing says it is not complete."""
    gw = await gateway(tmp_path, lists="endless")
    try:
        status, body = await listing(gw)
        assert (status, body) == (200, {"conversations": [], "complete": False})
        assert (tmp_path / "acp-starts.log").read_text().splitlines() == ["start"]
    finally:
        await gw.close()


async def test_resumed_through_session_load_with_the_replay_as_history(tmp_path) -> None:
    """The replay of ``session/load`` becomes the session's first frames, marked
    ``metadata.rawp_replayed``; the session's own agent loads the session again (without a
    second replay) and the live turn follows."""
    gw = await gateway(tmp_path)
    try:
        resp = await gw.post(
            "/v1/session", json={"agent": "scripted-acp", "resume_conversation": "hostile-1"}
        )
        session = await resp.json()
        assert resp.status == 201, session
        sid = session["session_id"]
        assert session["agent_session_id"] == "hostile-1"
        master = await Master.attach(gw, sid)
        await master.send("control.prompt.request", {"prompt_text": "next"})
        await master.until("session.turn.end", timeout=30)
        await master.ws.close()
        frames = await history(gw, sid)
        replayed = [f for f in frames if (f.get("metadata") or {}).get("rawp_replayed")]
        types = [f["type"] for f in replayed]
        assert types[:2] == ["control.prompt.request", "session.turn.start"]
        assert "session.turn.end" in types
        assert replayed[0]["payload"]["prompt_text"] == "before"
        assert (
            "".join(f["payload"]["text"] for f in replayed if f["type"] == "agent.text.delta")
            == "replayed"
        )
        assert replayed == frames[: len(replayed)]  # before anything live
        live = frames[len(replayed) :]
        said = "".join(f["payload"]["text"] for f in live if f["type"] == "agent.text.delta")
        assert said == "ok: next"
        log = (tmp_path / "acp-starts.log").read_text().splitlines()
        assert log == ["start", "load hostile-1", "start", "load hostile-1"]
        codes = [f["payload"]["error_code"] for f in frames if f["type"] == "agent.error"]
        assert "ACP_SESSION_NOT_RESUMED" not in codes
    finally:
        await gw.close()


async def test_a_session_the_agent_does_not_know_is_404_and_nothing_is_created(tmp_path) -> None:
    gw = await gateway(tmp_path)
    try:
        resp = await gw.post(
            "/v1/session", json={"agent": "scripted-acp", "resume_conversation": "unknown"}
        )
        body = await resp.json()
        assert (resp.status, body["error_code"]) == (404, "CONVERSATION_NOT_FOUND")
        assert "Resource not found" in body["message"]  # the agent's own words
        assert (await (await gw.get("/v1/sessions")).json())["sessions"] == []
        assert descendants.live_groups() == []
    finally:
        await gw.close()


async def test_a_load_never_answered_is_a_timeout_and_nothing_is_created(tmp_path) -> None:
    gw = await gateway(tmp_path, conversations_timeout_sec=1.0)
    try:
        resp = await gw.post(
            "/v1/session", json={"agent": "scripted-acp", "resume_conversation": "hang"}
        )
        body = await resp.json()
        assert (resp.status, body["error_code"]) == (504, "CONVERSATIONS_TIMEOUT")
        assert "session/load" in body["message"]
        assert (await (await gw.get("/v1/sessions")).json())["sessions"] == []
        assert descendants.live_groups() == []
    finally:
        await gw.close()


async def test_more_agents_asked_at_once_than_the_bound_is_503(tmp_path) -> None:
    gw = await gateway(tmp_path, lists="hang", conversations_timeout_sec=5.0)
    try:
        hanging = [asyncio.ensure_future(listing(gw)) for _ in range(MAX_RUNNING)]
        log = tmp_path / "acp-starts.log"
        async with asyncio.timeout(30):  # until each of them has started its agent
            while not log.exists() or len(log.read_text().splitlines()) < MAX_RUNNING:
                await asyncio.sleep(0.05)
        status, body = await listing(gw)
        assert (status, body["error_code"]) == (503, "CONVERSATIONS_BUSY")
        for status, body in await asyncio.gather(*hanging):
            assert (status, body["error_code"]) == (504, "CONVERSATIONS_TIMEOUT")
        assert len(log.read_text().splitlines()) == MAX_RUNNING  # the refused one started none
        assert descendants.live_groups() == []
    finally:
        await gw.close()
