"""Saved conversations read from a hostile store (no CLI needed): the listing endpoint and
``resume_conversation`` against files on disk in the shapes Claude Code 2.1.328 writes
(``parsers/claude_code/saved.py``; the real CLI's own files: ``test_conversations_realcli.py``).

Nothing outside the workspace's store is read: links are not followed, only regular files are
opened (a FIFO never blocks), size bounds cut a listing or a history and say so, and a truncated
or garbled file gives a partial, marked history, never an error of the gateway."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.agent import conversations
from gateway.agent.conversations import on_disk
from gateway.agent.profiles import builtin_profiles
from gateway.chat import run_chat
from tests.support.auth import users_config
from tests.support.gateway_peer import history, make_config, start_gateway
from tests.support.saved import Store, conversation, line

AGENT = "claude-code-oneshot"  # single-turn: nothing is spawned before a prompt


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path)


@pytest.fixture
async def gw(store: Store):
    base = builtin_profiles(claude="/nonexistent/claude")[AGENT]
    profile = replace(base, env={"HOME": str(store.home)})
    client = await start_gateway(make_config(store.workspace.parent, agents={AGENT: profile}))
    yield client
    await client.close()


async def listing(gw: TestClient, store: Store, **query: Any) -> tuple[int, Any]:
    params = {"workspace": str(store.workspace), **{k: str(v) for k, v in query.items()}}
    resp = await gw.get(f"/v1/agents/{AGENT}/conversations", params=params)
    return resp.status, await resp.json()


async def resume(
    gw: TestClient, store: Store, conversation_id: str, agent: str = AGENT
) -> tuple[int, Any]:
    body = {
        "agent": agent,
        "workspace_path": str(store.workspace),
        "resume_conversation": conversation_id,
    }
    resp = await gw.post("/v1/session", json=body)
    return resp.status, await resp.json()


async def test_listed_newest_first_with_title_and_turns(gw, store) -> None:
    old = store.put(conversation(store.workspace, "The old one."), age=100)
    new = store.put(conversation(store.workspace, "The new one.\n  With two lines."))
    status, body = await listing(gw, store)
    assert status == 200
    assert body["complete"] is True
    assert [(c["id"], c["title"], c["turns"]) for c in body["conversations"]] == [
        (new, "The new one. With two lines.", 1),
        (old, "The old one.", 1),
    ]
    status, body = await listing(gw, store, limit=1)
    assert [c["id"] for c in body["conversations"]] == [new]
    assert body["complete"] is False  # the limit cut it


async def test_the_users_own_title_wins(gw, store) -> None:
    data = conversation(store.workspace) + line(type="custom-title", customTitle="Taxes")
    store.put(data)
    _, body = await listing(gw, store)
    assert body["conversations"][0]["title"] == "Taxes"


async def test_another_workspace_with_the_same_slug_is_not_listed(gw, store) -> None:
    # work.space and work-space share a slug: the file's own cwd decides.
    twin = store.workspace.parent / "work-space"
    store.put(conversation(twin))
    status, body = await listing(gw, store)
    assert (status, body) == (200, {"conversations": [], "complete": True})


async def test_links_are_not_followed(gw, store, tmp_path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(conversation(store.workspace))
    linked = str(uuid.uuid4())
    (store.dir / f"{linked}.jsonl").symlink_to(outside)
    status, body = await listing(gw, store)
    assert (status, body["conversations"]) == (200, [])
    status, body = await resume(gw, store, linked)
    assert (status, body["error_code"]) == (404, "CONVERSATION_NOT_FOUND")


async def test_a_store_directory_that_leads_out_of_the_agents_home_is_not_read(
    gw, store, tmp_path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    conversation_id = str(uuid.uuid4())
    (elsewhere / f"{conversation_id}.jsonl").write_bytes(conversation(store.workspace))
    store.dir.rmdir()
    store.dir.symlink_to(elsewhere)
    _, body = await listing(gw, store)
    assert body["conversations"] == []
    status, _ = await resume(gw, store, conversation_id)
    assert status == 404


async def test_a_fifo_never_blocks(gw, store) -> None:
    fifo_id = str(uuid.uuid4())
    os.mkfifo(store.dir / f"{fifo_id}.jsonl")
    good = store.put(conversation(store.workspace))
    async with asyncio.timeout(10):
        _, body = await listing(gw, store)
        status, _ = await resume(gw, store, fifo_id)
    assert [c["id"] for c in body["conversations"]] == [good]
    assert status == 404


async def test_names_that_are_not_conversation_ids(gw, store) -> None:
    (store.dir / "notes.jsonl").write_bytes(conversation(store.workspace))
    (store.dir / "memory").mkdir()
    _, body = await listing(gw, store)
    assert body["conversations"] == []
    for bad in ("../../etc/passwd", "notes", "x" * 300, ""):
        status, body = await resume(gw, store, bad)
        assert status in (400, 404), (bad, body)
        assert body["error_code"] in ("INVALID_REQUEST", "CONVERSATION_NOT_FOUND")


async def test_resumed_history_is_marked_replayed_before_anything_live(gw, store) -> None:
    conversation_id = store.put(conversation(store.workspace))
    status, session = await resume(gw, store, conversation_id)
    assert status == 201, session
    assert session["agent_session_id"] == conversation_id
    frames = await history(gw, session["session_id"])
    types = [f["type"] for f in frames]
    assert types[:2] == ["control.prompt.request", "session.turn.start"]
    turn = frames[: types.index("session.usage") + 1]
    assert all(f["metadata"]["rawp_replayed"] is True for f in turn)
    assert frames[0]["payload"]["prompt_text"] == "Remember 42."
    texts = [f["payload"]["text"] for f in turn if f["type"] == "agent.text.delta"]
    assert texts == ["Noted."]
    usage = turn[-1]["payload"]["token_usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (10, 3)


async def test_truncated_and_garbled_files_give_a_partial_marked_history(gw, store) -> None:
    data = conversation(store.workspace, "First.") + conversation(store.workspace, "Second.")
    garbage = b"not json\n" + b"[" * 5000 + b"\n" + b'{"type":"user","message":{"content":7}}\n'
    conversation_id = store.put(garbage + data[:-20])  # the last line cut mid-way
    _, body = await listing(gw, store)
    assert body["conversations"][0]["turns"] == 2
    status, session = await resume(gw, store, conversation_id)
    assert status == 201, session
    frames = await history(gw, session["session_id"])
    (warning,) = [f for f in frames if f["type"] == "agent.error"]
    assert warning["payload"]["error_code"] == "CONVERSATION_PARTIAL"
    assert warning["metadata"]["rawp_replayed"] is True
    prompts = [f["payload"]["prompt_text"] for f in frames if f["type"] == "control.prompt.request"]
    assert prompts == ["First.", "Second."]


async def test_a_file_too_large_is_listed_without_turns_and_replayed_from_its_end(
    gw, store
) -> None:
    filler = line(type="attachment", cwd=str(store.workspace), pad="x" * 60_000)
    count = on_disk.TRANSCRIPT_BYTES // len(filler) + 1
    data = conversation(store.workspace, "Oldest.") + filler * count
    data += conversation(store.workspace, "Newest.")
    conversation_id = store.put(data)
    _, body = await listing(gw, store)
    (listed,) = body["conversations"]
    assert listed["turns"] is None  # not read whole: unknown
    assert listed["title"] == "Oldest."
    status, session = await resume(gw, store, conversation_id)
    assert status == 201, session
    frames = await history(gw, session["session_id"])
    prompts = [f["payload"]["prompt_text"] for f in frames if f["type"] == "control.prompt.request"]
    assert prompts == ["Newest."]
    (warning,) = [f for f in frames if f["type"] == "agent.error"]
    assert "larger than the gateway reads" in warning["payload"]["message"]


async def test_bad_requests(gw, store) -> None:
    for limit in ("0", "-1", "x", "²", str(conversations.MAX_LIST_LIMIT + 1)):
        status, body = await listing(gw, store, limit=limit)
        assert (status, body["error_code"]) == (400, "INVALID_REQUEST"), limit
    resp = await gw.get(f"/v1/agents/{AGENT}/conversations", params={"workspace": "/"})
    assert (resp.status, (await resp.json())["error_code"]) == (403, "WORKSPACE_FORBIDDEN")
    resp = await gw.get("/v1/agents/nobody/conversations")
    assert (resp.status, (await resp.json())["error_code"]) == (404, "AGENT_NOT_FOUND")
    status, body = await resume(gw, store, 42)  # type: ignore[arg-type]
    assert (status, body["error_code"]) == (400, "INVALID_REQUEST")


async def test_agents_whose_store_cannot_be_read_answer_501(gw, store) -> None:
    agents = {a["name"]: a for a in (await (await gw.get("/v1/agents")).json())["agents"]}
    assert agents[AGENT]["conversations"] is True
    for agent in ("plain", "demo"):  # ACP agents are asked: tests/agent/test_acp_conversations.py
        assert agents[agent]["conversations"] is False
        resp = await gw.get(f"/v1/agents/{agent}/conversations")
        body = await resp.json()
        assert (resp.status, body["error_code"]) == (501, "CONVERSATIONS_NOT_SUPPORTED"), agent
        resp = await gw.post(
            "/v1/session", json={"agent": agent, "resume_conversation": str(uuid.uuid4())}
        )
        assert (resp.status, (await resp.json())["error_code"]) == (
            501,
            "CONVERSATIONS_NOT_SUPPORTED",
        )
    assert (await (await gw.get("/v1/sessions")).json())["sessions"] == []


# --- rawp-gateway chat --resume ----------------------------------------------------------------


async def chat(gw: TestClient, store: Store, stdin: str, resume: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = await asyncio.wait_for(
        run_chat(
            str(gw.make_url("")),
            agent=AGENT,
            workspace=str(store.workspace),
            stdin=io.StringIO(stdin),
            stdout=out,
            resume=resume,
        ),
        timeout=20,
    )
    return rc, out.getvalue()


async def test_chat_resume_lists_the_workspaces_conversations_and_continues_the_chosen_one(
    gw, store
) -> None:
    store.put(conversation(store.workspace, "The old one.", "Old answer."), age=100)
    new = store.put(conversation(store.workspace, "Remember 42.", "Noted."))
    rc, text = await chat(gw, store, "1\n", resume="")
    assert rc == 0, text
    listed, _, shown = text.partition("continue which?")
    assert listed.index("Remember 42.") < listed.index("The old one.")  # newest first
    assert new in listed
    assert f"agent {AGENT}" in shown
    assert "» Remember 42." in shown and "Noted." in shown  # the earlier turn, replayed
    assert "Old answer." not in shown
    # The chat created the session and deleted it on the way out.
    assert (await (await gw.get("/v1/sessions")).json())["sessions"][0]["state"] == "TERMINATED"


async def test_chat_resume_by_id_and_an_unknown_one(gw, store) -> None:
    known = store.put(conversation(store.workspace, "Remember 42.", "Noted."))
    rc, text = await chat(gw, store, "", resume=known)
    assert rc == 0, text
    assert "» Remember 42." in text and "Noted." in text
    rc, text = await chat(gw, store, "", resume=str(uuid.uuid4()))
    assert rc == 1
    assert "CONVERSATION_NOT_FOUND" in text or "no saved conversation" in text
    rc, text = await chat(gw, store, "\n", resume="")
    assert rc == 1  # nothing chosen


# --- files and restarts, as for any session -------------------------------------------------------

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGP4z8AARww4OQD1MQv1NXv7ggAAAABJRU5ErkJggg=="
)


def image_read(workspace: Path) -> bytes:
    """A turn whose Read returned an image (the shapes of the CLI's own tool-read-image run)."""
    cwd, path = str(workspace), str(workspace / "dot.png")
    data = base64.b64encode(PNG).decode()
    block = {"type": "image", "source": {"type": "base64", "data": data, "media_type": "image/png"}}
    return b"".join(
        [
            line(type="user", cwd=cwd, message={"role": "user", "content": "Look at dot.png."}),
            line(
                type="assistant",
                cwd=cwd,
                message={
                    "id": "msg_1",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "Read",
                            "input": {"file_path": path},
                        }
                    ],
                },
            ),
            line(
                type="user",
                cwd=cwd,
                message={
                    "role": "user",
                    "content": [
                        {"tool_use_id": "toolu_1", "type": "tool_result", "content": [block]}
                    ],
                },
                toolUseResult={"type": "image", "file": {"base64": data, "type": "image/png"}},
            ),
        ]
    )


async def test_an_image_a_replayed_tool_read_is_a_file_of_the_session(gw, store) -> None:
    conversation_id = store.put(image_read(store.workspace))
    status, session = await resume(gw, store, conversation_id)
    assert status == 201, session
    frames = await history(gw, session["session_id"])
    (transfer,) = [f for f in frames if f["type"] == "agent.file.transfer"]
    assert transfer["metadata"]["rawp_replayed"] is True
    (result,) = [f for f in frames if f["type"] == "tool.invoke.result"]
    assert result["payload"]["output_type"] == "binary_ref"
    resp = await gw.get(transfer["payload"]["file_url"])
    assert (resp.status, await resp.read()) == (200, PNG)


async def test_a_continued_session_survives_a_restart_with_its_replayed_history(store) -> None:
    base = builtin_profiles(claude="/nonexistent/claude")[AGENT]
    profile = replace(base, env={"HOME": str(store.home)})
    config = make_config(
        store.workspace.parent, agents={AGENT: profile}, state_dir=store.home / "state"
    )
    conversation_id = store.put(conversation(store.workspace, "Remember 42.", "Noted."))
    gw = await start_gateway(config)
    try:
        status, session = await resume(gw, store, conversation_id)
        assert status == 201, session
        before = await history(gw, session["session_id"])
    finally:
        await gw.close()
    gw = await start_gateway(config)
    try:
        restored = await (await gw.get(f"/v1/session/{session['session_id']}")).json()
        assert restored["agent_session_id"] == conversation_id
        after = await history(gw, session["session_id"])
        replayed = [f for f in after if (f.get("metadata") or {}).get("rawp_replayed")]
        assert [f["message_id"] for f in replayed] == [
            f["message_id"] for f in before if (f.get("metadata") or {}).get("rawp_replayed")
        ]
        assert replayed[0]["payload"]["prompt_text"] == "Remember 42."
    finally:
        await gw.close()


# --- Codex's and Gemini's stores ----------------------------------------------------------------


def rollout(workspace: Path, thread_id: str, prompt: str) -> bytes:
    item = {"type": "UserMessage", "id": "u1", "content": [{"type": "text", "text": prompt}]}
    answer = {"type": "AgentMessage", "id": "m1", "content": [{"type": "Text", "text": "Noted."}]}
    return b"".join(
        [
            line(type="session_meta", payload={"id": thread_id, "cwd": str(workspace)}),
            line(type="event_msg", payload={"type": "task_started"}),
            line(type="event_msg", payload={"type": "item_completed", "item": item}),
            line(type="event_msg", payload={"type": "item_completed", "item": answer}),
            line(type="event_msg", payload={"type": "task_complete"}),
        ]
    )


async def test_codex_threads_of_this_workspace_only_and_no_linked_day(store, tmp_path) -> None:
    base = builtin_profiles(codex="/nonexistent/codex")["codex"]
    profile = replace(base, env={"HOME": str(store.home)})
    gw = await start_gateway(make_config(store.workspace.parent, agents={"codex": profile}))
    try:
        day = store.home / ".codex" / "sessions" / "2026" / "12" / "01"
        day.mkdir(parents=True)
        ours, theirs, linked = (str(uuid.uuid4()) for _ in range(3))
        name = "rollout-2026-12-01T10-00-00-{}.jsonl"
        (day / name.format(ours)).write_bytes(rollout(store.workspace, ours, "Ours."))
        (day / name.format(theirs)).write_bytes(rollout(tmp_path, theirs, "Theirs."))
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / name.format(linked)).write_bytes(rollout(store.workspace, linked, "Linked."))
        (day.parent / "02").symlink_to(elsewhere)  # a day that is a link: not followed
        resp = await gw.get("/v1/agents/codex/conversations", params={"workspace": "work.space"})
        body = await resp.json()
        assert [(c["id"], c["title"]) for c in body["conversations"]] == [(ours, "Ours.")]
        for other in (theirs, linked):
            status, _ = await resume(gw, store, other, agent="codex")
            assert status == 404
    finally:
        await gw.close()


def gemini_chat(workspace: Path, session_id: str, prompt: str) -> bytes:
    project = hashlib.sha256(str(workspace).encode()).hexdigest()
    return b"".join(
        [
            line(sessionId=session_id, projectHash=project, kind="main"),
            line(id="u1", type="user", content=[{"text": prompt}]),
            line(id="g1", type="gemini", content="Noted.", tokens={"input": 5, "output": 2}),
        ]
    )


async def test_gemini_sessions_are_found_by_slug_and_checked_by_project_hash(store) -> None:
    base = builtin_profiles(gemini="/nonexistent/gemini")["gemini"]
    profile = replace(base, env={"HOME": str(store.home)})
    gw = await start_gateway(make_config(store.workspace.parent, agents={"gemini": profile}))
    try:
        ours, foreign = str(uuid.uuid4()), str(uuid.uuid4())
        # "work.space" is the slug work-space; a second project of that name took work-space-1.
        first = store.home / ".gemini" / "tmp" / "work-space" / "chats"
        second = store.home / ".gemini" / "tmp" / "work-space-1" / "chats"
        first.mkdir(parents=True)
        second.mkdir(parents=True)
        (first / f"session-2026-12-01T10-00-{foreign[:8]}.jsonl").write_bytes(
            gemini_chat(store.workspace.parent / "work-space", foreign, "Not ours.")
        )
        (second / f"session-2026-12-01T10-00-{ours[:8]}.jsonl").write_bytes(
            gemini_chat(store.workspace, ours, "Ours.")
        )
        resp = await gw.get("/v1/agents/gemini/conversations", params={"workspace": "work.space"})
        body = await resp.json()
        assert [(c["id"], c["title"], c["turns"]) for c in body["conversations"]] == [
            (ours, "Ours.", 1)
        ]
        status, body = await resume(gw, store, ours, agent="gemini")
        assert status == 201, body
        frames = await history(gw, body["session_id"])
        assert [f["payload"]["text"] for f in frames if f["type"] == "agent.text.delta"] == [
            "Noted."
        ]
        status, _ = await resume(gw, store, foreign, agent="gemini")
        assert status == 404
    finally:
        await gw.close()


async def test_another_workspaces_files_cost_a_listing_only_their_first_bytes(gw, store) -> None:
    """Files of another workspace (Codex keeps them all in one tree; here twins of the slug), each
    small enough to be read whole (1 MiB) and together more than a listing may read: only their
    first 64 KiB are, so this workspace's oldest conversation is still listed, the list complete."""
    twin = store.workspace.parent / "work-space"
    filler = line(type="attachment", cwd=str(twin), pad="x" * 60_000)
    big = conversation(twin) + filler * ((on_disk.LIST_FILE_BYTES - 2000) // len(filler))
    assert on_disk.LIST_FILE_BYTES - len(filler) < len(big) <= on_disk.LIST_FILE_BYTES
    for _ in range(on_disk.LIST_TOTAL_BYTES // len(big) + 2):
        store.put(big)
    ours = store.put(conversation(store.workspace, "Ours."), age=1000)  # the oldest: listed last
    _, body = await listing(gw, store)
    assert [c["id"] for c in body["conversations"]] == [ours]
    assert body["complete"] is True


async def test_listing_a_workspaces_conversations_needs_an_operator(store, tmp_path) -> None:
    """Titles are the user's prompts: a viewer may not list them (403, audited like any refusal),
    an operator may."""
    tokens = {"vera": ("viewer", "vera-token-vvvv"), "otto": ("operator", "otto-token-oooo")}
    base = builtin_profiles(claude="/nonexistent/claude")[AGENT]
    profile = replace(base, env={"HOME": str(store.home)})
    config = users_config(
        store.workspace.parent, tokens, token="admin-token-aaaa", agents={AGENT: profile}
    )
    gw = await start_gateway(config)
    try:
        conversation_id = store.put(conversation(store.workspace))
        for user, status in (("vera", 403), ("otto", 200)):
            resp = await gw.get(
                f"/v1/agents/{AGENT}/conversations",
                params={"workspace": "work.space"},
                headers={"Authorization": f"Bearer {tokens[user][1]}"},
            )
            body = await resp.json()
            assert resp.status == status, body
        assert body["conversations"][0]["id"] == conversation_id
    finally:
        await gw.close()
