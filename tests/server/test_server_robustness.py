"""Bad input loses nothing and gets a clear error: a huge agent line, a malformed agent line, a dead
agent, a dropped master, a stuck master. Real server, real agent processes, real WebSockets."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import tracemalloc
from dataclasses import replace

import aiohttp
import pytest

from gateway.agent.stdout import DEFAULT_MAX_LINE_BYTES
from gateway.server import SESSIONS
from tests.support.gateway_peer import (
    Master,
    create_session,
    demo_config,
    fast_demo,
    make_config,
    prompt_and_wait,
    prompted,
    start_gateway,
)
from tests.support.paths import HOSTILE
from tests.support.waiting import eventually


async def test_a_large_agent_line_is_cut_to_max_frame_size_and_the_session_goes_on(tmp_path):
    """The demo agent reads an 8 MiB file: its tool_result line is ~17 MiB (the text and the file
    content), under the reader's line limit. The process adapter reads it whole, the result frame is
    cut under max_frame_size with truncated: true, and the session serves the next prompt."""
    (tmp_path / "big.txt").write_bytes(
        (b"0123456789abcdef" * 64 + b"\n") * (8 * 1024 * 1024 // 1025)
    )
    config = demo_config(tmp_path)
    client = await start_gateway(config)
    try:
        session = await create_session(client)
        master = await Master.attach(client, session["session_id"])
        frames = await prompt_and_wait(master, "read big.txt")
        result = next(f for f in frames if f["type"] == "tool.invoke.result")
        assert result["payload"]["status"] == "success"
        assert result["payload"]["truncated"] is True
        assert len(json.dumps(result).encode()) <= config.server.max_frame_size
        frames = await prompt_and_wait(master, "hello again")
        assert frames[-1]["type"] == "session.usage"
    finally:
        await client.close()


async def test_an_agent_line_over_the_line_limit_is_never_held_whole(tmp_path):
    """A hostile agent prints a 100 MiB line (a tool result). The reader holds it up to the line limit
    (32 MiB), then keeps its first KiB and drops the rest as it streams: the gateway's Python memory
    peaks near the limit, far under the line (tracemalloc), the masters get an agent.error warning AGENT_LINE_TOO_LONG, the call it belonged
    to is settled (cancelled), and the session serves the next prompt."""
    agent = replace(
        fast_demo(),
        name="long-line",
        command=(sys.executable, str(HOSTILE / "long_line.py")),
        env={},
    )
    client = await start_gateway(make_config(tmp_path, agents={"long-line": agent}))
    try:
        session = await create_session(client, agent="long-line")
        master = await Master.attach(client, session["session_id"])
        tracemalloc.start()
        try:
            frames = await prompt_and_wait(master, "long line 100")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        # What a line costs before it is known to be too long: the limit, and not a byte of the rest.
        assert peak < DEFAULT_MAX_LINE_BYTES + 8 * 1024 * 1024, f"peak {peak} bytes"
        warning = next(f for f in frames if f["type"] == "agent.error")
        assert warning["payload"]["error_code"] == "AGENT_LINE_TOO_LONG"
        assert warning["payload"]["severity"] == "warning"
        assert "104857" in warning["payload"]["message"]  # the line's size, 100 MiB and some
        result = next(f for f in frames if f["type"] == "tool.invoke.result")
        assert result["payload"]["status"] == "cancelled"
        frames = await prompt_and_wait(master, "hello again")
        assert frames[-1]["type"] == "session.usage"
        texts = [f["payload"]["text"] for f in frames if f["type"] == "agent.text.delta"]
        assert "".join(texts) == "done"
    finally:
        await client.close()


def noisy_demo():
    """The demo agent, with a malformed line and an unknown kind printed before it starts."""
    prelude = (
        "import os, sys; print('this is not json', flush=True);"
        'print(\'{"type": "brand_new_kind", "x": 1}\', flush=True);'
        "os.execv(sys.executable, [sys.executable, '-m', 'gateway.demo_agent', *sys.argv[1:]])"
    )
    demo = fast_demo()
    return replace(demo, command=(sys.executable, "-c", prelude, *demo.command[3:]))


async def test_malformed_and_unknown_agent_lines_are_counted_not_fatal(tmp_path):
    client = await start_gateway(make_config(tmp_path, agents={"demo": noisy_demo()}))
    try:
        session = await create_session(client)
        master = await Master.attach(client, session["session_id"])
        frames = await prompt_and_wait(master, "hello")
        assert frames[-1]["type"] == "session.usage"
        assert not [f for f in master.frames if f["type"] in ("agent.error", "session.error")]
        metrics = await (await client.get("/metrics")).text()
        assert 'rawp_gateway_agent_parse_errors_total{agent="demo"} 1.0' in metrics
        assert 'rawp_gateway_agent_unknown_kinds_total{agent="demo"} 1.0' in metrics
    finally:
        await client.close()


async def test_a_dead_agent_is_a_fatal_error_and_ends_the_session(tmp_path):
    """DPS-17.2.2-exit: killed by SIGKILL mid-turn → agent.error fatal SIGNAL_EXIT with the signal,
    then session.turn.end error, then session.deleted (reason error), then close."""
    client = await start_gateway(demo_config(tmp_path, delay_ms=100))
    try:
        master = await prompted(client, "a long answer " * 20)
        sid = master.session_id
        await master.until("agent.text.delta")
        live = client.server.app[SESSIONS][sid]
        live.process.send_signal(signal.SIGKILL)
        rest = await master.drain_until_closed()
        types = [f["type"] for f in rest]
        error = next(f for f in rest if f["type"] == "agent.error")["payload"]
        assert (error["severity"], error["error_code"], error["recoverable"]) == (
            "fatal", "SIGNAL_EXIT", False,
        )  # fmt: skip
        assert error["details"]["signal"] == signal.SIGKILL
        assert (
            types.index("agent.error")
            < types.index("session.turn.end")
            < types.index("session.deleted")
        )
        end = next(f for f in rest if f["type"] == "session.turn.end")
        assert end["payload"]["stop_reason"] == "error"
        assert rest[-1]["payload"]["reason"] == "error"
        state = (await (await client.get(f"/v1/session/{sid}")).json())["state"]
        assert state == "TERMINATED"
    finally:
        await client.close()


@pytest.mark.parametrize("single_turn", [False, True], ids=["long-lived", "single-turn"])
@pytest.mark.parametrize("program", ["/nonexistent/agent-cli", "rawp-no-such-agent-cli"])
async def test_an_agent_that_cannot_start_is_a_clear_http_error(tmp_path, program, single_turn):
    """Every profile whose CLI is missing (a path, or a name not on PATH) fails the POST the same
    way, naming the file once, and creates nothing: a single-turn one too, though its process
    would start only at the first prompt."""
    missing = replace(
        fast_demo(), command=(program, "-p", "{prompt}"), single_turn_process=single_turn
    )
    client = await start_gateway(make_config(tmp_path, agents={"demo": missing}))
    try:
        resp = await client.post("/v1/session", json={"agent": "demo"})
        assert resp.status == 502
        err = await resp.json()
        assert err["error_code"] == "AGENT_START_FAILED"
        assert err["message"] == (
            f"the demo agent could not start: agent executable not found: {program!r} "
            "(not installed, or not on PATH)"
        )
        assert (await (await client.get("/v1/sessions")).json())["sessions"] == []
    finally:
        await client.close()


async def test_a_single_turn_agent_that_cannot_start_reports_it_in_the_turn(tmp_path):
    """DPS-17.2.2-exit: the CLI was there when the session was created and is gone at the prompt:
    the spawn fails → agent.error fatal AGENT_START_FAILED (the reason in details.stderr),
    session.turn.end error, session.deleted."""
    cli = tmp_path / "agent-cli"
    cli.write_text("#!/bin/sh\necho hi\n")
    cli.chmod(0o755)
    missing = replace(fast_demo(), command=(str(cli), "{prompt}"), single_turn_process=True)
    client = await start_gateway(make_config(tmp_path, agents={"demo": missing}))
    try:
        session = await create_session(client)
        cli.unlink()  # uninstalled under the running gateway
        master = await Master.attach(client, session["session_id"])
        await master.send("control.prompt.request", {"prompt_text": "hi"})
        rest = await master.drain_until_closed()
        types = [f["type"] for f in rest]
        error = next(f for f in rest if f["type"] == "agent.error")["payload"]
        assert (error["severity"], error["error_code"]) == ("fatal", "AGENT_START_FAILED")
        assert error["message"].startswith("the demo agent could not start: ")
        assert str(cli) in error["details"]["stderr"]
        assert "exit_code" not in error["details"]  # no process ever ran
        assert types.index("agent.error") < types.index("session.turn.end")
        assert types[-1] == "session.deleted"
    finally:
        await client.close()


async def test_a_dropped_master_loses_nothing(tmp_path):
    """A master that drops mid-turn reattaches and gets every frame it missed, the turn goes on."""
    client = await start_gateway(demo_config(tmp_path, delay_ms=30))
    try:
        master = await prompted(client, "a long answer " * 10)
        sid = master.session_id
        await master.until("agent.text.delta")
        last = master.frames[-1]["message_id"]
        await master.ws.close()
        await asyncio.sleep(0.5)
        back = await Master.attach(client, sid, last_message_id=last, announce=False)
        assert (await back.next())["type"] == "session.capabilities"
        history = await back.next()
        assert history["type"] == "session.history"
        assert history["payload"]["buffer_status"]["truncated"] is False
        await back.send(
            "session.capabilities",
            {"protocol_version": "rawp-dps-1.0", "supported_namespaces": ["agent"], "features": {}},
        )
        seen = [f["type"] for f in history["payload"]["frames"]]
        if "session.usage" not in seen:
            await back.until("session.usage", timeout=30)
        everything = [*master.frames, *history["payload"]["frames"], *back.frames]
        deltas = [f["payload"]["text"] for f in everything if f["type"] == "agent.text.delta"]
        done = next(f for f in everything if f["type"] == "agent.text.done")
        assert "".join(deltas) == done["payload"]["full_text"]
    finally:
        await client.close()


async def test_a_stuck_master_is_closed_and_never_delays_the_others(tmp_path):
    """A connection that stops reading overflows its bounded queue and the gateway closes it with
    1013 (its close frame may never reach a peer that reads nothing: the gateway then drops the
    socket); the other master gets the whole turn."""
    # Room for two full frames per connection: a master that keeps reading never overflows.
    config = demo_config(tmp_path, send_queue_bytes=2_200_000)
    (tmp_path / "data.txt").write_text("line of text\n" * 120_000)  # ~1.5 MB: a ~1 MiB frame
    client = await start_gateway(config)
    try:
        session = await create_session(client)
        sid = session["session_id"]
        good = await Master.attach(client, sid)
        stuck = await client.ws_connect(
            f"/v1/session/{sid}/ws", protocols=("rawp-dps-1.0",), max_msg_size=0
        )
        live = client.server.app[SESSIONS][sid]
        _good, stuck_id = list(live.connections)
        stuck_conn = live.connections[stuck_id]
        # A peer that stops reading: its socket buffers fill (kept small here so that a few frames
        # do it), then the gateway's queue for it.
        client_side = stuck._response.connection.transport
        client_side.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client_side.pause_reading()
        server_side = live.connections[stuck_id].ws._req.transport
        server_side.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        for _ in range(12):
            await prompt_and_wait(good, "read data.txt")
        assert stuck_conn.overflowed
        assert stuck_conn.close_args[0] == 1013  # the close frame the gateway sends it
        assert stuck_conn.queued_bytes == 0  # what it held is dropped
        # It never read: the gateway dropped it (close frame or abort) and kept nothing for it.
        await eventually(lambda: stuck_id not in live.connections, "the stuck connection to go")
    finally:
        await client.close()


async def test_a_frame_over_max_frame_size_closes_with_1009(tmp_path):
    """Frames are size-limited (docs/http-api.md): a master's frame over max_frame_size is refused
    with the WebSocket's own 'message too big' close, and the session goes on for the others."""
    client = await start_gateway(demo_config(tmp_path))
    try:
        session = await create_session(client)
        sid = session["session_id"]
        big = await Master.attach(client, sid)
        other = await Master.attach(client, sid)
        await big.ws.send_str("x" * (2 * 1024 * 1024))
        msg = await big.ws.receive(timeout=10)
        while msg.type == aiohttp.WSMsgType.TEXT:
            msg = await big.ws.receive(timeout=10)
        assert big.ws.close_code == 1009
        frames = await prompt_and_wait(other, "still working?")
        assert frames[-1]["type"] == "session.usage"
    finally:
        await client.close()
