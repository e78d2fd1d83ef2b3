"""The gateway server of docs/http-api.md with the embedded demo agent: real server, real agent
process, real WebSocket clients."""

from __future__ import annotations

import asyncio
import json
import uuid

import aiohttp
import msgspec
import pytest

from gateway.agent.profiles import builtin_profiles
from gateway.protocol.frames import Features
from gateway.server import SESSIONS
from tests.support.gateway_peer import (
    SUBPROTOCOL,
    UPGRADE,
    Master,
    create_session,
    demo_config,
    fast_demo,
    greeting,
    make_config,
    prompt_and_wait,
    prompted,
    start_gateway,
)
from tests.support.logs import deletions, watch_sessions
from tests.support.waiting import eventually


async def test_healthz_agents_and_sessions(gw):
    assert (await (await gw.get("/healthz")).json()) == {"status": "ok"}
    agents = (await (await gw.get("/v1/agents")).json())["agents"]
    names = {a["name"] for a in agents}
    assert {"claude-code", "claude-code-oneshot", "demo"} <= names
    oneshot = next(a for a in agents if a["name"] == "claude-code-oneshot")
    assert oneshot["single_turn_process"] is True
    assert oneshot["resume_flag"] == "--resume {session_id}"
    assert oneshot["adapter_type"] == "process"
    session = await create_session(gw, name="first")
    assert uuid.UUID(session["session_id"]).version == 4
    assert session["state"] == "DETACHED" and session["name"] == "first"
    assert session["ws_path"] == f"/v1/session/{session['session_id']}/ws"
    listed = (await (await gw.get("/v1/sessions")).json())["sessions"]
    assert [s["session_id"] for s in listed] == [session["session_id"]]
    missing = await gw.get(f"/v1/session/{uuid.uuid4()}")
    assert missing.status == 404
    assert (await missing.json())["error_code"] == "SESSION_NOT_FOUND"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"agent": "nope"}, 404, "AGENT_NOT_FOUND"),
        ({}, 400, "INVALID_REQUEST"),
        ({"agent": "demo", "workspace_path": "../outside"}, 403, "WORKSPACE_FORBIDDEN"),
        ({"agent": "demo", "workspace_path": "/etc"}, 403, "WORKSPACE_FORBIDDEN"),
        ({"agent": "demo", "buffer": {"policy": "LOSSY"}}, 400, "INVALID_REQUEST"),
    ],
)
async def test_create_session_errors_are_json(gw, body, status, code):
    resp = await gw.post("/v1/session", json=body)
    assert resp.status == status
    err = await resp.json()
    assert err["error_code"] == code and err["message"]


async def test_a_missing_workspace_is_not_created(gw, tmp_path):
    """A workspace_path that does not exist is 404 WORKSPACE_NOT_FOUND, and nothing is created (a
    typo must not give the agent an empty directory); one that exists is used as it is."""
    resp = await gw.post("/v1/session", json={"agent": "demo", "workspace_path": "repo/sub"})
    assert resp.status == 404
    err = await resp.json()
    assert err["error_code"] == "WORKSPACE_NOT_FOUND" and "repo/sub" in err["message"]
    assert not (tmp_path / "repo").exists()
    assert (await (await gw.get("/v1/sessions")).json())["sessions"] == []
    (tmp_path / "repo" / "sub").mkdir(parents=True)
    session = await create_session(gw, workspace_path="repo/sub")
    assert session["workspace_path"] == str(tmp_path.resolve() / "repo" / "sub")


async def test_bad_json_and_huge_body_are_clear_errors(gw):
    resp = await gw.post("/v1/session", data=b"{nope", headers={"Content-Type": "application/json"})
    assert (resp.status, (await resp.json())["error_code"]) == (400, "INVALID_JSON")
    resp = await gw.post("/v1/session", data=b"x" * (2 * 1024 * 1024))
    assert resp.status == 413
    assert (await resp.json())["error_code"] == "REQUEST_TOO_LARGE"


async def test_websocket_needs_the_subprotocol(gw):
    session = await create_session(gw)
    resp = await gw.get(
        session["ws_path"],
        headers=UPGRADE,
    )
    assert resp.status == 400
    assert (await resp.json())["error_code"] == "SUBPROTOCOL_REQUIRED"


async def test_token_guards_everything_but_healthz(tmp_path):
    """docs/http-api.md Security: 401 UNAUTHORIZED without the bearer token."""
    client = await start_gateway(
        make_config(tmp_path, token="s3cret", agents={"demo": fast_demo()})
    )
    try:
        assert (await client.get("/healthz")).status == 200
        for path in ("/v1/agents", "/v1/sessions", "/metrics"):
            resp = await client.get(path)
            assert resp.status == 401
            assert (await resp.json())["error_code"] == "UNAUTHORIZED"
        wrong = await client.get("/v1/agents", headers={"Authorization": "Bearer nope"})
        assert wrong.status == 401
        ok = await client.get("/v1/agents", headers={"Authorization": "Bearer s3cret"})
        assert ok.status == 200
    finally:
        await client.close()


async def test_greeting_prompt_turn_and_usage(gw):
    """DPS-12.2-caps first, then the catalog (DPS-5.4-catalog) and the commands (DPS-12.1-commands)
    before any prompt (docs/http-api.md), then DPS-7.5.1-start, DPS-4.1-text, DPS-7.5.2-end and
    -usage; the agent's own init, naming the same tools and commands, publishes nothing again."""
    session = await create_session(gw)
    master = await Master.attach(gw, session["session_id"])
    tools, commands = await greeting(master)  # the commands: the demo agent's answer to initialize
    assert tools == ["Glob", "Read", "Write"]
    assert "compact" in [c["name"] for c in commands]
    frames = await prompt_and_wait(master, "hello there", idle=True)
    types = [f["type"] for f in frames]
    assert types[0] == "session.turn.start"
    turn_id = frames[0]["payload"]["turn_id"]
    assert frames[0]["payload"]["turn_index"] == 0
    assert types[-3:] == ["session.turn.end", "session.usage", "agent.state.changed"]
    assert frames[-3]["payload"]["stop_reason"] == "end_turn"
    deltas = "".join(f["payload"]["text"] for f in frames if f["type"] == "agent.text.delta")
    done = [f for f in frames if f["type"] == "agent.text.done"]
    assert done and done[-1]["payload"]["full_text"] == deltas
    assert all(f.get("turn_id") == turn_id for f in frames)  # DPS-2.1-turn-id
    assert "tool.catalog.publish" not in types and "agent.commands.publish" not in types
    second = await prompt_and_wait(master, "and again", idle=True)
    start = next(f for f in second if f["type"] == "session.turn.start")
    assert start["payload"]["turn_index"] == 1


async def test_DPS_17_3_2_one_prompt_at_a_time(gw):
    """DPS-17.3.2-one-prompt: PROMPT_IN_PROGRESS, fatal false, and the prompt is not delivered."""
    master = await prompted(gw, "tell me a long story " * 5)
    await master.until("session.turn.start")
    second = await master.send("control.prompt.request", {"prompt_text": "second"})
    err = await master.until("session.error")
    assert err["payload"]["error_code"] == "PROMPT_IN_PROGRESS"
    assert err["payload"]["fatal"] is False
    assert err["parent_id"] == second["message_id"]
    await master.until("session.usage")
    starts = [f for f in master.frames if f["type"] == "session.turn.start"]
    assert len(starts) == 1


async def test_DPS_2_1_v_and_DPS_2_2_unknown_type_over_the_wire(gw):
    """DPS-2.1-v: answered with session.error; DPS-2.2-unknown-type: ignored, connection stays."""
    session = await create_session(gw)
    master = await Master.attach(gw, session["session_id"])
    await master.send("x-acme.custom", {"a": 1})
    await master.send("control.prompt.request", {"prompt_text": "x"}, v=2)
    err = await master.until("session.error")
    assert err["payload"]["error_code"] == "UNSUPPORTED_VERSION"
    await master.ws.send_str("{not json")
    err = await master.until("session.error")
    assert err["payload"]["error_code"] == "INVALID_FRAME"
    frames = await prompt_and_wait(master, "still here?", idle=True)
    assert "session.usage" in [f["type"] for f in frames]
    assert not [
        f for f in master.frames if f["type"] == "session.error" and "x-acme" in json.dumps(f)
    ]


async def test_DPS_2_1_idempotent_duplicate_prompt_runs_once(gw):
    """DPS-2.1-idempotent: the same message_id twice is acted on once."""
    session = await create_session(gw)
    master = await Master.attach(gw, session["session_id"])
    frame = await master.send("control.prompt.request", {"prompt_text": "once"})
    await master.ws.send_str(json.dumps(frame))
    await master.until("session.usage")
    await asyncio.sleep(0.2)
    assert master.types().count("session.turn.start") == 1
    assert "session.error" not in master.types()


async def test_DPS_2_4_fan_out_relay_and_no_echo(gw):
    """DPS-2.4-broadcast and DPS-2.4-relay: both masters see the turn; the prompt is relayed to
    the other master and never echoed to its sender."""
    session = await create_session(gw)
    a = await Master.attach(gw, session["session_id"])
    b = await Master.attach(gw, session["session_id"])
    prompt = await a.send("control.prompt.request", {"prompt_text": "hi both"})
    await a.until("session.usage")
    await b.until("session.usage")
    relayed = [f for f in b.frames if f["type"] == "control.prompt.request"]
    assert [f["message_id"] for f in relayed] == [prompt["message_id"]]
    assert "control.prompt.request" not in a.types()
    a_turn = [f["message_id"] for f in a.frames if f["type"].startswith(("agent.", "session.turn"))]
    b_turn = [f["message_id"] for f in b.frames if f["type"].startswith(("agent.", "session.turn"))]
    assert a_turn == b_turn


async def test_DPS_12_2_filter_per_connection(gw):
    """DPS-12.2-filter: a master without thinking_stream gets no agent.thinking.* frames."""
    session = await create_session(gw)
    full = await Master.attach(gw, session["session_id"])
    plain = await Master.attach(gw, session["session_id"], features=Features())
    await full.send("control.prompt.request", {"prompt_text": "think about it"})
    await full.until("session.usage")
    await plain.until("session.usage")
    assert "agent.thinking.delta" in full.types()
    assert not [t for t in plain.types() if t.startswith("agent.thinking")]


async def test_DPS_12_2_filter_a_profile_without_thinking_sends_none(tmp_path):
    """DPS-12.2-filter: a profile whose features say thinking_stream = false announces it false,
    and a master that announced every feature gets no agent.thinking.* either."""
    features = msgspec.structs.replace(builtin_profiles()["demo"].features, thinking_stream=False)
    demo = fast_demo(features=features)
    gw = await start_gateway(make_config(tmp_path, agents={"demo": demo}))
    try:
        full = await prompted(gw, "think about it")
        await full.until("session.usage")
        caps = next(f for f in full.frames if f["type"] == "session.capabilities")
        assert caps["payload"]["features"]["thinking_stream"] is False
        assert not [t for t in full.types() if t.startswith("agent.thinking")]
        assert "agent.text.done" in full.types()
    finally:
        await gw.close()


async def one_leaves_after_a_turn(gw, sid: str) -> tuple[Master, str]:
    """Two masters on the session; one prompts, sees its turn through to idle, and leaves: the
    master that stays, and the message_id of the last frame the one that left got."""
    stays = await Master.attach(gw, sid)
    leaver = await Master.attach(gw, sid)
    await prompt_and_wait(leaver, "first", idle=True)
    last_seen = leaver.frames[-1]["message_id"]
    await leaver.ws.close()
    return stays, last_seen


async def test_DPS_7_1_history_reattach_gets_exactly_the_missed_frames(gw):
    """DPS-7.1-history: session.history first (after capabilities) with the missed frames."""
    session = await create_session(gw)
    sid = session["session_id"]
    watcher, last_seen = await one_leaves_after_a_turn(gw, sid)
    await watcher.until("agent.state.changed", current_state="idle")  # the first turn's end
    await prompt_and_wait(watcher, "second while the other is away", idle=True)
    idx = next(i for i, f in enumerate(watcher.frames) if f["message_id"] == last_seen)
    missed = [f for f in watcher.frames[idx + 1 :] if f["type"] != "control.prompt.request"]
    back = await Master.attach(gw, sid, last_message_id=last_seen, announce=False)
    caps = await back.next()
    assert caps["type"] == "session.capabilities"
    history = await back.next()
    assert history["type"] == "session.history"
    replayed = [f for f in history["payload"]["frames"] if f["type"] != "control.prompt.request"]
    assert [f["message_id"] for f in replayed] == [f["message_id"] for f in missed]
    status = history["payload"]["buffer_status"]
    assert status == {
        "policy_applied": "RING",
        "truncated": False,
        "lost_frame_count": 0,
        "buffer_high_watermark": status["buffer_high_watermark"],
    }
    assert history["payload"]["last_message_id"] == watcher.frames[-1]["message_id"]


async def test_DPS_7_1_history_counts_evicted_frames(gw):
    """A small RING buffer: truncated true with the exact lost_frame_count."""
    session = await create_session(gw, buffer={"policy": "RING", "max_bytes": 1000})
    sid = session["session_id"]
    stay, last_seen = await one_leaves_after_a_turn(gw, sid)
    await stay.until("agent.state.changed", current_state="idle")
    await prompt_and_wait(
        stay, "a reply long enough to push earlier frames out of the buffer", idle=True
    )
    idx = next(i for i, f in enumerate(stay.frames) if f["message_id"] == last_seen)
    produced = len(stay.frames[idx + 1 :]) + 1  # + the relayed prompt the stayer did not get
    back = await Master.attach(gw, sid, last_message_id=last_seen, announce=False)
    await back.next()
    history = (await back.next())["payload"]
    assert history["buffer_status"]["truncated"] is True
    assert history["buffer_status"]["lost_frame_count"] == produced - len(history["frames"])
    assert history["buffer_status"]["lost_frame_count"] > 0


async def first_history(master: Master) -> dict:
    """The ``session.history`` right after the capabilities, its parts joined."""
    assert (await master.next())["type"] == "session.capabilities"
    history = await master.next()
    assert history["type"] == "session.history"
    parts = (history.get("metadata") or {}).get("history_parts", 1)
    payload = history["payload"]
    for _ in range(parts - 1):
        more = (await master.next())["payload"]
        payload = {**more, "frames": payload["frames"] + more["frames"]}
    return payload


async def test_DPS_7_1_history_all_gives_a_new_master_the_whole_conversation(gw):
    """?history=all (a first attach, e.g. a new browser tab): session.history right after the
    capabilities with every frame of the session's two finished turns, not truncated."""
    session = await create_session(gw)
    sid = session["session_id"]
    talker = await Master.attach(gw, sid)
    await prompt_and_wait(talker, "first question", idle=True)
    await prompt_and_wait(talker, "second question", idle=True)
    produced = [f for f in talker.frames if f["type"] != "session.capabilities"]
    newcomer = await Master.attach(gw, sid, history="all", announce=False)
    history = await first_history(newcomer)
    got = history["frames"]
    prompts = [f["payload"]["prompt_text"] for f in got if f["type"] == "control.prompt.request"]
    assert prompts == ["first question", "second question"]
    ids = [f["message_id"] for f in got]
    # Every frame the talker got from its first turn on, in the order it got them (the history
    # has its prompts too, which are not echoed to it).
    first_start = next(i for i, f in enumerate(produced) if f["type"] == "session.turn.start")
    turns = [f["message_id"] for f in produced[first_start:]]
    assert [i for i in ids if i in set(turns)] == turns
    turn_ends = [f for f in got if f["type"] == "session.turn.end"]
    assert len(turn_ends) == 2
    assert history["buffer_status"]["truncated"] is False
    assert history["buffer_status"]["lost_frame_count"] == 0
    assert history["last_message_id"] == talker.frames[-1]["message_id"]
    # From there on the newcomer is an ordinary master: a reattach after it misses nothing.
    back = await Master.attach(gw, sid, last_message_id=history["last_message_id"])
    again = await first_history(back)
    assert again["frames"] == [] and again["buffer_status"]["truncated"] is False


async def test_DPS_7_1_history_all_counts_frames_evicted_since_the_session_began(gw):
    """A tiny RING buffer: ?history=all is truncated with the exact number of frames gone."""
    session = await create_session(gw, buffer={"policy": "RING", "max_bytes": 1000})
    sid = session["session_id"]
    talker = await Master.attach(gw, sid, history="all")
    start = await first_history(talker)  # what the session produced before anyone attached
    before = len(start["frames"]) + start["buffer_status"]["lost_frame_count"]
    await talker.until("tool.catalog.publish")  # the greeting's, to this connection only
    frames = await prompt_and_wait(talker, "first", idle=True)
    frames += await prompt_and_wait(
        talker, "a reply long enough to push earlier frames out of the buffer", idle=True
    )
    produced = before + len(frames) + 2  # + its own two prompts, buffered but not echoed
    newcomer = await Master.attach(gw, sid, history="all", announce=False)
    history = await first_history(newcomer)
    status = history["buffer_status"]
    assert status["truncated"] is True
    assert status["lost_frame_count"] == produced - len(history["frames"]) > 0


async def test_history_all_comes_in_parts_within_max_frame_size(tmp_path):
    """DPS-7.1-history: a whole history larger than ``max_frame_size`` comes in parts as on a
    reattach, each within the size, together every frame, not truncated."""
    config = demo_config(tmp_path, max_frame_size=4096)
    client = await start_gateway(config)
    try:
        sid = (await create_session(client))["session_id"]
        talker = await Master.attach(client, sid)
        await prompt_and_wait(talker, "first question", idle=True)
        await prompt_and_wait(talker, "second question", idle=True)
        newcomer = await Master.attach(client, sid, history="all", announce=False)
        await newcomer.next()
        parts = []
        while True:
            msg = await newcomer.ws.receive(timeout=10)
            assert len(msg.data.encode()) <= 4096
            parts.append(json.loads(msg.data))
            meta = parts[-1]["metadata"]
            if meta["history_part"] == meta["history_parts"]:
                break
        assert len(parts) > 1
        assert {p["type"] for p in parts} == {"session.history"}
        got = [f for p in parts for f in p["payload"]["frames"]]
        prompts = [
            f["payload"]["prompt_text"] for f in got if f["type"] == "control.prompt.request"
        ]
        assert prompts == ["first question", "second question"]
        assert len([f for f in got if f["type"] == "session.turn.end"]) == 2
        for p in parts:
            assert p["payload"]["buffer_status"]["truncated"] is False
            assert p["payload"]["buffer_status"]["lost_frame_count"] == 0
    finally:
        await client.close()


async def test_history_all_is_refused_with_a_last_message_id_or_another_value(gw):
    """last_message_id and history=all together, or history=<anything else>: 400
    INVALID_REQUEST before the upgrade."""
    sid = (await create_session(gw))["session_id"]
    url = f"/v1/session/{sid}/ws"
    for params in ({"history": "all", "last_message_id": "x"}, {"history": "some"}):
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await gw.ws_connect(url, protocols=("rawp-dps-1.0",), params=params)
        assert err.value.status == 400
        resp = await gw.get(url, params=params, headers={"Sec-WebSocket-Protocol": "rawp-dps-1.0"})
        assert (await resp.json())["error_code"] == "INVALID_REQUEST"


async def test_DPS_6_2_permission_allow_and_deny(gw, tmp_path):
    """DPS-4.3-interaction + DPS-6.2-interaction: PERMISSION asked, answered, the tool runs or not."""
    (tmp_path / "perm").mkdir()
    master = await prompted(gw, "write hello.txt", workspace_path="perm")
    ask = await master.until("agent.interaction.request")
    p = ask["payload"]
    assert p["interaction_type"] == "PERMISSION"
    assert p["context"]["tool_name"] == "Write"
    assert uuid.UUID(p["interaction_id"]).version == 4
    assert p["default_value"] == "deny" and p["timeout_sec"] > 0
    await master.send(
        "control.interaction.response",
        {"interaction_id": p["interaction_id"], "selected_value": "allow"},
    )
    result = await master.until("tool.invoke.result")
    assert result["payload"]["status"] == "success"
    await master.until("session.usage")
    assert (tmp_path / "perm" / "hello.txt").exists()

    await master.send("control.prompt.request", {"prompt_text": "write nope.txt"})
    ask = await master.until("agent.interaction.request")
    await master.send(
        "control.interaction.response",
        {"interaction_id": ask["payload"]["interaction_id"], "selected_value": "deny"},
    )
    result = await master.until("tool.invoke.result")
    assert result["payload"]["status"] == "error"
    await master.until("session.usage")
    assert not (tmp_path / "perm" / "nope.txt").exists()


async def test_DPS_6_2_permission_timeout_denies(tmp_path):
    """DPS-6.2-interaction: timeout_sec passing denies the PERMISSION."""
    demo = fast_demo(permission_timeout_sec=0.3)
    client = await start_gateway(make_config(tmp_path, agents={"demo": demo}))
    try:
        master = await prompted(client, "write late.txt")
        await master.until("agent.interaction.request")
        result = await master.until("tool.invoke.result")
        assert result["payload"]["status"] == "error"
        await master.until("session.usage")
        assert not (tmp_path / "late.txt").exists()
    finally:
        await client.close()


async def test_pending_interaction_is_sent_again_on_attach(gw):
    first = await prompted(gw, "write again.txt")
    ask = await first.until("agent.interaction.request")
    late = await Master.attach(gw, first.session_id)
    again = await late.until("agent.interaction.request")
    assert again["payload"]["interaction_id"] == ask["payload"]["interaction_id"]


async def test_DPS_6_1_2_cancel_mid_stream(tmp_path):
    """DPS-6.1.2-cancel: text.done is_cancelled, then turn.end cancelled."""
    client = await start_gateway(demo_config(tmp_path, delay_ms=50))
    try:
        master = await prompted(client, "a long answer " * 20)
        start = await master.until("session.turn.start")
        await master.until("agent.text.delta")
        await master.send("control.prompt.cancel", {"target_turn_id": start["payload"]["turn_id"]})
        end = await master.until("session.turn.end")
        assert end["payload"]["stop_reason"] == "cancelled"
        done = [f for f in master.frames if f["type"] == "agent.text.done"]
        assert done and done[-1]["payload"].get("is_cancelled") is True
        assert (await master.next())["type"] == "session.usage"
    finally:
        await client.close()


async def test_DPS_6_3_2_mode_switch_and_plan_blocks_writes(gw, tmp_path):
    """DPS-6.3.2-mode and DPS-6.3.2-block: state change, next turn carries mode, writes blocked."""
    session = await create_session(gw)
    master = await Master.attach(gw, session["session_id"])
    await master.send("control.mode.switch", {"mode": "plan"})
    change = await master.until("agent.state.changed", reason="mode_switch")
    assert change["metadata"]["mode"] == "plan"
    await master.send("control.prompt.request", {"prompt_text": "write blocked.txt"})
    start = await master.until("session.turn.start")
    assert start["payload"]["mode"] == "plan"
    result = await master.until("tool.invoke.result")
    assert result["payload"]["status"] == "error"
    assert result["payload"]["output"] == "Tool not allowed in current mode"
    await master.until("session.usage")
    assert not (tmp_path / "blocked.txt").exists()
    assert "agent.interaction.request" not in master.types()
    # during a turn
    await master.send("control.prompt.request", {"prompt_text": "a long answer " * 10})
    await master.until("session.turn.start")
    await master.send("control.mode.switch", {"mode": "default"})
    err = await master.until("session.error")
    assert (err["payload"]["error_code"], err["payload"]["fatal"]) == (
        "MODE_SWITCH_DURING_TURN",
        False,
    )


async def test_DPS_6_3_1_compaction_requested(gw):
    """DPS-6.3.1-compact: control.session.compact → session.compacted trigger requested."""
    session = await create_session(gw)
    master = await Master.attach(gw, session["session_id"])
    await prompt_and_wait(master, "remember this", idle=True)
    await master.send("control.session.compact", {"instruction": "keep the names"})
    compacted = await master.until("session.compacted")
    assert compacted["payload"]["trigger"] == "requested"
    assert compacted["payload"]["summary"]
    await master.until("session.usage")


async def test_unsupported_mode_and_compaction(tmp_path):
    """MODE_NOT_SUPPORTED and COMPACTION_NOT_SUPPORTED (DPS-6.3.1-compact, DPS-6.3.2-mode)."""
    bare = fast_demo(features=Features(thinking_stream=True))
    client = await start_gateway(make_config(tmp_path, agents={"demo": bare}))
    try:
        session = await create_session(client)
        master = await Master.attach(client, session["session_id"])
        await master.send("control.mode.switch", {"mode": "plan"})
        err = await master.until("session.error")
        assert err["payload"]["error_code"] == "MODE_NOT_SUPPORTED"
        await master.send("control.session.compact", {})
        err = await master.until("session.error")
        assert (err["payload"]["error_code"], err["payload"]["fatal"]) == (
            "COMPACTION_NOT_SUPPORTED",
            False,
        )
    finally:
        await client.close()


async def test_own_profile_keeps_what_its_parser_supports(tmp_path):
    """A configured ``[agents.mine]`` with ``parser = "claude-code"`` and no ``features``: GET
    /v1/agents and session.capabilities (DPS-12.2-caps) announce the Claude Code features, and
    mode switch and compaction work (DPS-6.3.2-mode, DPS-6.3.1-compact) instead of answering
    *_NOT_SUPPORTED."""
    import sys

    from gateway.config import load_config

    command = [sys.executable, "-m", "gateway.demo_agent", "--permission-prompt-tool", "stdio"]
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(  # a JSON list of strings is a TOML array
        f"""[agents.mine]
parser = "claude-code"
command = {json.dumps(command)}
env = {{ RAWP_DEMO_DELAY_MS = "1" }}
"""
    )
    config = load_config(config_file, {"workspace_root": str(tmp_path)}, environ={})
    client = await start_gateway(config)
    try:
        agents = (await (await client.get("/v1/agents")).json())["agents"]
        mine = next(a for a in agents if a["name"] == "mine")
        for feature in ("thinking_stream", "tool_streaming", "context_compaction", "plan_mode"):
            assert mine["features"][feature] is True, feature
        session = await create_session(client, agent="mine")
        master = await Master.attach(client, session["session_id"])
        caps = await master.next()
        assert caps["payload"]["features"]["plan_mode"] is True
        assert caps["payload"]["features"]["thinking_stream"] is True
        await master.send("control.mode.switch", {"mode": "plan"})
        change = await master.until("agent.state.changed", reason="mode_switch")
        assert change["metadata"]["mode"] == "plan"
        await master.send("control.mode.switch", {"mode": "default"})
        await master.until("agent.state.changed", reason="mode_switch")
        await prompt_and_wait(master, "remember this", idle=True)
        await master.send("control.session.compact", {})
        compacted = await master.until("session.compacted")
        assert compacted["payload"]["trigger"] == "requested"
        assert "session.error" not in master.types()
    finally:
        await client.close()


async def test_DPS_7_7_delete_during_turn(tmp_path):
    """DPS-7.5.3-cleanup, DPS-7.7-deleted, DPS-17.2.3-signals: DELETE mid-turn → turn.end error,
    then session.deleted, then close; the agent process is gone."""
    client = await start_gateway(demo_config(tmp_path, delay_ms=50))
    try:
        master = await prompted(client, "a long answer " * 20)
        sid = master.session_id
        await master.until("agent.text.delta")
        resp = await client.delete(f"/v1/session/{sid}")
        assert resp.status == 200
        assert (await resp.json())["state"] == "TERMINATED"
        rest = await master.drain_until_closed()
        types = [f["type"] for f in rest]
        assert types[-1] == "session.deleted"
        assert "session.turn.end" in types
        end = next(f for f in rest if f["type"] == "session.turn.end")
        assert end["payload"]["stop_reason"] == "error"
        assert types.index("session.turn.end") < types.index("session.deleted")
        deleted = rest[-1]["payload"]
        assert deleted == {"session_id": sid, "reason": "master_request", "deleted_by": "master"}
        # a complete close handshake, with the gateway's code and reason
        assert master.ws.close_code == 1000
    finally:
        await client.close()


async def test_DPS_7_6_rename_broadcast(gw):
    session = await create_session(gw, name="old")
    master = await Master.attach(gw, session["session_id"])
    resp = await gw.patch(f"/v1/session/{session['session_id']}", json={"name": "new"})
    assert (await resp.json())["name"] == "new"
    renamed = await master.until("session.renamed")
    assert renamed["payload"] == {
        "session_id": session["session_id"], "name": "new", "previous_name": "old",
        "renamed_by": "master",
    }  # fmt: skip


async def test_DPS_2_4_local_session_only_to_local_ui(gw):
    session = await create_session(gw, origin="local")
    refused = await gw.get(
        f"/v1/session/{session['session_id']}/ws",
        headers={**UPGRADE, "Sec-WebSocket-Protocol": SUBPROTOCOL},
    )
    assert refused.status == 403
    assert (await refused.json())["error_code"] == "LOCAL_SESSION"
    ui = await Master.attach(gw, session["session_id"], role="local-ui")
    assert (await ui.next())["type"] == "session.capabilities"


async def test_reattach_window_expiry_deletes_with_timeout(gw, caplog):
    """DPS-7.7-deleted: reason timeout, by the system, when the reattach window runs out."""
    watch_sessions(caplog)
    session = await create_session(gw, reattach_window_sec=0.3)
    sid = session["session_id"]
    master = await Master.attach(gw, sid)
    await master.next()
    await master.ws.close()
    await asyncio.wait_for(gw.server.app[SESSIONS][sid].terminated.wait(), 10)
    assert deletions(caplog, sid) == [("timeout", "system")]
    assert (await (await gw.get(f"/v1/session/{sid}")).json())["state"] == "TERMINATED"


async def test_DPS_7_1_history_reattach_through_the_last_message_id_header(gw):
    """docs/http-api.md: ``X-RAWP-Last-Message-Id`` instead of the query parameter: the same
    session.history of exactly the frames after that id."""
    session = await create_session(gw)
    sid = session["session_id"]
    master = await Master.attach(gw, sid)
    await prompt_and_wait(master, "first", idle=True)
    seen = master.frames[2]["message_id"]  # after capabilities and catalog: the greeting goes on
    missed = [f["message_id"] for f in master.frames[3:]]
    back = await Master.attach(gw, sid, announce=False, headers={"X-RAWP-Last-Message-Id": seen})
    assert (await back.next())["type"] == "session.capabilities"
    history = await back.next()
    assert history["type"] == "session.history"
    replayed = [f["message_id"] for f in history["payload"]["frames"]]
    assert [m for m in replayed if m in missed] == missed
    assert history["payload"]["buffer_status"]["truncated"] is False


async def test_the_websocket_heartbeat_pings_and_closes_a_peer_that_stops_answering(tmp_path):
    """docs/http-api.md: the gateway pings every 30 s (here 0.5 s) and closes a connection whose
    peer stops answering; a peer that answers (aiohttp answers while it reads) stays. A pong is
    awaited half a heartbeat: 0.25 s here, more than a loaded machine keeps this process (its
    gateway and its peers) from running."""
    heartbeat = 0.5
    config = demo_config(tmp_path, delay_ms=70)
    client = await start_gateway(config, heartbeat_sec=heartbeat)
    try:
        sid = (await create_session(client))["session_id"]
        live = client.server.app[SESSIONS][sid]
        silent = await client.ws_connect(
            f"/v1/session/{sid}/ws", protocols=("rawp-dps-1.0",), autoping=False
        )
        kinds = []
        while True:  # the silent peer sees the pings it does not answer, then the end
            msg = await silent.receive(timeout=10)
            kinds.append(msg.type)
            if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.PING):
                break
        assert aiohttp.WSMsgType.PING in kinds
        assert kinds[-1] in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await eventually(lambda: not live.connections, "the silent peer to be dropped")
        answering = await Master.attach(client, sid)
        loop = asyncio.get_running_loop()
        began = loop.time()
        frames = await prompt_and_wait(answering, "tell me a long story " * 3)
        assert loop.time() - began > 3 * heartbeat  # the turn outlasted several heartbeats
        assert frames[-1]["type"] == "session.usage"
        assert len(live.connections) == 1
    finally:
        await client.close()
