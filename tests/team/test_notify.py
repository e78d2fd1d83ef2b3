"""Webhook notifications (docs/identities.md, Notifications): delivered to a receiver on
127.0.0.1, signed bodies checked here, and receivers that fail never slow a session."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.config.notify import Webhook
from tests.support.gateway_peer import (
    Master,
    create_session,
    fast_demo,
    make_config,
    prompted,
    start_gateway,
)
from tests.support.webhooks import Receiver

SECRET = b"hook-secret-1234"


def verify(headers: dict[str, str], body: bytes, secret: bytes) -> int:
    """Check ``X-Rawp-Signature`` as a receiver would; returns its timestamp."""
    match = re.fullmatch(r"t=(\d+),v1=([0-9a-f]{64})", headers["X-Rawp-Signature"])
    assert match, headers["X-Rawp-Signature"]
    t = int(match[1])
    expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, match[2])
    assert abs(time.time() - t) < 60  # a receiver refuses old bodies (replay)
    return t


async def metric(client, event: str, result: str) -> float:
    text = await (await client.get("/metrics")).text()
    pattern = (
        rf'rawp_gateway_notifications_total{{event="{re.escape(event)}",result="{result}"}} (\S+)'
    )
    found = re.search(pattern, text)
    return float(found[1]) if found else 0.0


async def until_metric(client, event: str, result: str, at_least: float = 1) -> float:
    """Poll /metrics (bounded) until the counter reaches ``at_least``."""
    async with asyncio.timeout(20):
        while (value := await metric(client, event, result)) < at_least:
            await asyncio.sleep(0.05)
    return value


@pytest.fixture
async def receiver():
    async with Receiver() as r:
        yield r


async def test_signed_json_bodies_for_a_permission_a_turn_and_the_end(tmp_path, receiver):
    config = make_config(
        tmp_path,
        agents={"demo": fast_demo()},
        webhooks=(Webhook(receiver.url, secret=SECRET),),
        public_url="https://gw.example/pods/a",
    )
    client = await start_gateway(config)
    try:
        master = await prompted(client, "write notified.txt", name="docs")
        sid = master.session_id
        ask = await master.until("agent.interaction.request")

        headers, raw = await receiver.next("permission.pending")
        verify(headers, raw, SECRET)
        assert headers["Content-Type"] == "application/json"
        body = json.loads(raw)
        assert body["session_id"] == sid and body["session_name"] == "docs"
        assert body["agent"] == "demo" and body["owner"] == "admin"
        assert body["console_url"] == f"https://gw.example/pods/a/ui#session={sid}"
        p = body["permission"]
        assert p["interaction_id"] == ask["payload"]["interaction_id"]
        assert p["tool_name"] == "Write" and p["question_text"]
        assert "notified.txt" in p["input"]

        await master.send(
            "control.interaction.response",
            {"interaction_id": p["interaction_id"], "selected_value": "allow"},
        )
        headers, raw = await receiver.next("turn.ended")
        verify(headers, raw, SECRET)
        turn = json.loads(raw)["turn"]
        assert turn["turn_index"] == 1 and turn["stop_reason"] == "end_turn"
        assert turn["usage"]["output_tokens"] > 0

        await client.delete(f"/v1/session/{sid}")
        headers, raw = await receiver.next("session.ended")
        verify(headers, raw, SECRET)
        # A body changed in transit no longer matches its signature.
        with pytest.raises(AssertionError):
            verify(headers, raw.replace(b"session.ended", b"session.endeX"), SECRET)
        assert await until_metric(client, "session.ended", "sent") == 1
        assert await metric(client, "permission.pending", "sent") == 1
    finally:
        await client.close()


async def test_slack_and_ntfy_formats_and_the_events_filter(tmp_path):
    async with Receiver() as slack, Receiver() as ntfy:
        hooks = (
            Webhook(slack.url, events=frozenset({"session.ended"}), format="slack"),
            Webhook(ntfy.url, events=frozenset({"session.ended"}), format="ntfy"),
        )
        config = make_config(tmp_path, agents={"demo": fast_demo()}, webhooks=hooks)
        client = await start_gateway(config)
        try:
            sid = (await create_session(client, name="build"))["session_id"]
            master = await Master.attach(client, sid)
            await master.send("control.prompt.request", {"prompt_text": "hello"})
            await master.until("session.usage")
            await client.delete(f"/v1/session/{sid}")
            headers, raw = await asyncio.wait_for(slack.got.get(), 15)
            assert json.loads(raw) == {"text": "*build: session ended*\nbuild: session ended"}
            headers, raw = await asyncio.wait_for(ntfy.got.get(), 15)
            assert headers["Title"] == "build: session ended"
            assert headers["Content-Type"].startswith("text/plain")
            assert raw == b"build: session ended"
            assert "X-Rawp-Signature" not in headers  # no secret, no signature
            # turn.ended was not asked for: only the end was delivered.
            assert slack.count == 1 and ntfy.count == 1
        finally:
            await client.close()


@contextlib.asynccontextmanager
async def hooked(tmp_path, hook: Webhook, demo=None) -> AsyncIterator[tuple[Any, Master]]:
    """The in-process gateway with the demo agent (``fast_demo()`` unless given) and one webhook,
    and a master on a new session of it; the gateway is closed afterwards."""
    agents = {"demo": demo or fast_demo()}
    client = await start_gateway(make_config(tmp_path, agents=agents, webhooks=(hook,)))
    try:
        sid = (await create_session(client))["session_id"]
        yield client, await Master.attach(client, sid)
    finally:
        await client.close()


async def test_an_unanswered_permission_is_sent_again(tmp_path, receiver):
    demo = fast_demo(permission_timeout_sec=60)
    hook = Webhook(receiver.url, events=frozenset({"permission.pending"}), remind_after_sec=0.2)
    async with hooked(tmp_path, hook, demo) as (_, master):
        await master.send("control.prompt.request", {"prompt_text": "write later.txt"})
        await master.until("agent.interaction.request")
        first = json.loads((await receiver.next("permission.pending"))[1])
        again = json.loads((await receiver.next("permission.pending"))[1])
        assert "reminder" not in first and again["reminder"] is True
        assert again["permission"] == first["permission"]


@pytest.mark.parametrize("mode", ["hang", "500"])
async def test_a_failing_receiver_never_slows_the_session(tmp_path, mode):
    """While the receiver hangs or answers 500, turns run to their end one after another (the
    frames flow; no assertion on time), and the deliveries end dropped, each attempt counted: as
    retried, or as dropped when it was its delivery's last. (How many attempts fit in the
    second of ``retry_for_sec`` depends on the machine's load, so no number of them is asserted;
    that a failed attempt is retried is the test after this one.)"""
    async with Receiver(mode) as bad:
        hook = Webhook(
            bad.url, events=frozenset({"turn.ended"}), timeout_sec=0.2, retry_for_sec=1.0
        )
        async with hooked(tmp_path, hook) as (client, master):
            await master.send("control.prompt.request", {"prompt_text": "hello 0"})
            await master.until("session.usage")
            await bad.got.get()  # the first delivery is at the receiver, which does not take it
            for i in range(1, 6):
                await master.send("control.prompt.request", {"prompt_text": f"hello {i}"})
                await master.until("session.usage")
            assert [f["type"] for f in master.frames].count("session.turn.end") == 6
            assert await until_metric(client, "turn.ended", "dropped", 6) == 6
            # Every attempt the receiver saw was counted (one can time out before it arrives).
            assert await metric(client, "turn.ended", "retried") >= bad.count - 6
            assert await metric(client, "turn.ended", "sent") == 0


async def test_a_failed_delivery_is_retried_after_a_backoff(tmp_path):
    """A receiver that answers 500 once gets the delivery on the next attempt, well within the
    default minute of ``retry_for_sec``."""
    async with Receiver("500-once") as flaky:
        hook = Webhook(flaky.url, events=frozenset({"turn.ended"}))
        async with hooked(tmp_path, hook) as (client, master):
            await master.send("control.prompt.request", {"prompt_text": "hello"})
            await master.until("session.usage")
            assert await until_metric(client, "turn.ended", "sent") == 1
            assert await metric(client, "turn.ended", "retried") == 1
            assert flaky.count == 2


async def test_a_full_queue_drops_and_counts_while_turns_go_on(tmp_path):
    """1,000 deliveries wait at most: with every worker held by a receiver that hangs, what comes
    past the queue is dropped and counted, and the session's turns still run to their end."""
    from gateway.config.notify import MAX_WEBHOOKS
    from gateway.team.notify import MAX_QUEUE, WORKERS

    async with Receiver("hang") as bad:
        hooks = tuple(
            Webhook(bad.url, events=frozenset({"turn.ended"})) for _ in range(MAX_WEBHOOKS)
        )
        client = await start_gateway(
            make_config(tmp_path, agents={"demo": fast_demo()}, webhooks=hooks)
        )
        try:
            sid = (await create_session(client))["session_id"]
            master = await Master.attach(client, sid)
            turns = MAX_QUEUE // MAX_WEBHOOKS + 2
            for i in range(turns):
                await master.send("control.prompt.request", {"prompt_text": f"hello {i}"})
                await master.until("session.usage")
            assert [f["type"] for f in master.frames].count("session.turn.end") == turns
            expected = turns * MAX_WEBHOOKS - MAX_QUEUE - WORKERS
            assert await until_metric(client, "turn.ended", "dropped", expected) == expected
        finally:
            await client.close()


async def test_the_sessions_ended_by_a_shutdown_are_still_sent(tmp_path, receiver):
    hook = Webhook(receiver.url, events=frozenset({"session.ended"}))
    client = await start_gateway(
        make_config(tmp_path, agents={"demo": fast_demo()}, webhooks=(hook,))
    )
    sid = (await create_session(client))["session_id"]
    await client.close()  # the gateway stops: its sessions end, and the notifier with them
    body = json.loads((await receiver.next("session.ended"))[1])
    assert body["session_id"] == sid and body["reason"] == "error"
