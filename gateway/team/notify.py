"""Webhook notifications of docs/identities.md: tell people when an agent waits for them, a turn
ended, an agent failed or stalled, a session ended, or a budget is nearly or wholly spent
(docs/budgets.md).

Theory of operation
-------------------
``[[notify.webhooks]]`` entries each name a URL, the events they want, a body format (``json``,
``slack``: ``{"text": ...}``, ``ntfy``: plain text with a ``Title`` header) and optionally a secret
that signs each body: ``X-Rawp-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." +
body)>``, so a receiver can check the sender and refuse old bodies replayed later.

A session calls ``Notifier.event(...)`` from its frame observers; that only builds the body and puts
one delivery per interested webhook on a bounded queue (``MAX_QUEUE`` for the whole gateway); a full
queue drops the delivery and counts it. Nothing a session does ever waits on a receiver.
``WORKERS`` tasks deliver with one aiohttp client: ``timeout_sec`` (5 s) per attempt, redirects not
followed, a 2xx answer is ``sent``; anything else is ``retried`` after a backoff that doubles from
``FIRST_BACKOFF_SEC`` while the next attempt still starts within ``retry_for_sec`` (60 s) of the
first, then ``dropped``. ``rawp_gateway_notifications_total{event,result}`` counts all three.

A permission still unanswered ``remind_after_sec`` after it was asked is sent once more (with
``"reminder": true``). The console link is ``<public_url>/ui#session=<id>`` when ``[server]
public_url`` says where the gateway is reached; without it the body has no ``console_url``.

The settings (``Webhook``, read from ``[notify]``) are gateway/config/notify.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
import msgspec

from gateway.config.notify import Webhook
from gateway.metrics import GatewayMetrics
from gateway.protocol import frames as F
from gateway.team.audit import cut_input

__all__ = ["Notifier", "sign"]

log = logging.getLogger("rawp_gateway.notify")

MAX_QUEUE: Final = 1000  # deliveries waiting, for the whole gateway
WORKERS: Final = 4  # deliveries in flight at once
FIRST_BACKOFF_SEC: Final = 0.5
MAX_BACKOFF_SEC: Final = 15.0
CLOSE_GRACE_SEC: Final = 2.0  # at shutdown, for what is still queued
MAX_TEXT_CHARS: Final = 2000  # of a question or an error message in a body
SIGNATURE_HEADER: Final = "X-Rawp-Signature"

_encoder = msgspec.json.Encoder()


def sign(secret: bytes, body: bytes, now: int) -> str:
    """The ``X-Rawp-Signature`` value for ``body`` sent at ``now`` (unix seconds)."""
    mac = hmac.new(secret, f"{now}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={now},v1={mac}"


@dataclass(frozen=True, slots=True)
class _Delivery:
    hook: Webhook
    event: str
    body: dict[str, Any]


class Notifier:
    def __init__(
        self,
        webhooks: tuple[Webhook, ...],
        metrics: GatewayMetrics,
        *,
        public_url: str | None = None,
    ) -> None:
        self.webhooks = webhooks
        self.metrics = metrics
        self.public_url = public_url.rstrip("/") if public_url else None
        self._queue: asyncio.Queue[_Delivery] = asyncio.Queue(MAX_QUEUE)
        self._workers: list[asyncio.Task[None]] = []
        self._client: aiohttp.ClientSession | None = None
        self._reminders: dict[str, list[asyncio.TimerHandle]] = {}  # by session id
        self._turns: dict[str, dict[str, Any]] = {}  # a turn that ended, until its usage is in

    @property
    def enabled(self) -> bool:
        return bool(self.webhooks)

    def wants(self, event: str) -> bool:
        return any(event in hook.events for hook in self.webhooks)

    async def start(self) -> None:
        if not self.webhooks or self._client is not None:
            return
        # Each attempt has its own timeout (the hook's); no cookies are kept between receivers.
        self._client = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        self._workers = [asyncio.create_task(self._worker()) for _ in range(WORKERS)]

    async def close(self) -> None:
        """Stop; what is queued (the sessions' ends at shutdown) gets ``CLOSE_GRACE_SEC`` to go
        out, what is left then is counted as dropped."""
        for handles in self._reminders.values():
            for handle in handles:
                handle.cancel()
        self._reminders.clear()
        if self._workers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), CLOSE_GRACE_SEC)
        while not self._queue.empty():
            self.metrics.notification(self._queue.get_nowait().event, "dropped")
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers = []
        if self._client is not None:
            await self._client.close()
            self._client = None

    # --- what sessions call ---------------------------------------------------------------------

    def event(self, event: str, session: Any, fields: dict[str, Any]) -> None:
        """Queue ``event`` of ``session`` for every webhook that wants it; never waits."""
        hooks = [h for h in self.webhooks if event in h.events]
        if not hooks:
            return
        body = self._body(event, session, fields)
        for hook in hooks:
            self._put(_Delivery(hook, event, body))
            if event == "permission.pending" and hook.remind_after_sec > 0:
                self._remind_later(hook, session, body)

    def frame(self, session: Any, frame: Any) -> None:
        """A frame a session broadcast: the event it means, if a webhook wants it."""
        payload = frame.payload
        kind = type(payload)
        if kind is F.InteractionRequest:
            if payload.interaction_type != "PERMISSION" or not self.wants("permission.pending"):
                return
            context = payload.context
            self.event(
                "permission.pending",
                session,
                {
                    "permission": {
                        "interaction_id": payload.interaction_id,
                        "tool_name": context.tool_name if context else None,
                        "question_text": cut(payload.question_text),
                        "input": cut_input(context.tool_input if context else None),
                    }
                },
            )
        elif kind is F.TurnEnd:
            if self.wants("turn.ended"):
                # session.usage follows in the same batch of frames: sent once that is through.
                turn = {
                    "turn_id": payload.turn_id,
                    "turn_index": session.machine.turn_count,
                    "stop_reason": payload.stop_reason,
                }
                self._turns[session.id] = turn
                asyncio.get_running_loop().call_soon(self._turn_ended, session)
        elif kind is F.Usage:
            ended = self._turns.get(session.id)
            if ended is not None and payload.turn_id in (None, ended["turn_id"]):
                ended["usage"] = msgspec.to_builtins(payload.token_usage)
        elif kind is F.AgentError:
            stalled = payload.error_code == "AGENT_STALLED"
            if not stalled and payload.severity == "warning":
                return
            error = {"error_code": payload.error_code, "message": cut(payload.message)}
            self.event("session.stalled" if stalled else "agent.error", session, {"error": error})
        elif kind is F.Deleted:
            # Nothing of the session is kept past its end, whoever wants the event.
            for handle in self._reminders.pop(session.id, []):
                handle.cancel()
            self._turn_ended(session)  # a turn the deletion ended goes first
            self.event("session.ended", session, {"reason": payload.reason})

    def _turn_ended(self, session: Any) -> None:
        turn = self._turns.pop(session.id, None)
        if turn is not None:
            turn.pop("turn_id")
            self.event("turn.ended", session, {"turn": turn})

    def _put(self, delivery: _Delivery) -> None:
        try:
            self._queue.put_nowait(delivery)
        except asyncio.QueueFull:
            self.metrics.notification(delivery.event, "dropped")
            log.warning("notification dropped: the queue is full", extra={"event": delivery.event})

    def _body(self, event: str, session: Any, fields: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "event": event,
            "time": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "session_id": session.id,
            "session_name": session.machine.name,
            "agent": session.profile.name,
            "owner": session.owner,
        }
        if self.public_url:
            body["console_url"] = f"{self.public_url}/ui#session={session.id}"
        body.update(fields)
        return body

    def _remind_later(self, hook: Webhook, session: Any, body: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        handles = self._reminders.setdefault(session.id, [])
        handles[:] = [h for h in handles if not h.cancelled() and h.when() > loop.time()]

        def remind() -> None:
            interaction_id = body["permission"]["interaction_id"]
            if session.state != "TERMINATED" and interaction_id in session.machine.interactions:
                self._put(_Delivery(hook, "permission.pending", {**body, "reminder": True}))

        handles.append(loop.call_later(hook.remind_after_sec, remind))

    # --- delivery -------------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            delivery = await self._queue.get()
            try:
                await self._deliver(delivery)
            except asyncio.CancelledError:  # the gateway stops with it in flight
                self.metrics.notification(delivery.event, "dropped")
                raise
            except Exception:  # a bug here must not stop the worker
                log.exception("notification failed", extra={"event": delivery.event})
            finally:
                self._queue.task_done()

    async def _deliver(self, d: _Delivery) -> None:
        loop = asyncio.get_running_loop()
        hook = d.hook
        payload, headers = render(hook.format, d.body)
        first = loop.time()
        backoff = FIRST_BACKOFF_SEC
        while True:
            error = await self._attempt(hook, payload, headers)
            if error is None:
                self.metrics.notification(d.event, "sent")
                return
            if loop.time() + backoff - first > hook.retry_for_sec:
                self.metrics.notification(d.event, "dropped")
                log.warning(
                    "notification dropped after retries",
                    extra={"event": d.event, "url": hook.url, "error": error},
                )
                return
            self.metrics.notification(d.event, "retried")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SEC)

    async def _attempt(self, hook: Webhook, payload: bytes, headers: dict[str, str]) -> str | None:
        """One POST; None when the receiver took it (2xx), else why not."""
        assert self._client is not None
        if hook.secret is not None:
            headers = {**headers, SIGNATURE_HEADER: sign(hook.secret, payload, int(time.time()))}
        try:
            async with self._client.post(
                hook.url,
                data=payload,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=hook.timeout_sec),
            ) as resp:
                if 200 <= resp.status < 300:
                    return None
                return f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            return type(err).__name__


def render(fmt: str, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """The request body and headers of ``body`` in a webhook's ``format``."""
    if fmt == "json":
        return _encoder.encode(body), {"Content-Type": "application/json"}
    title, text = summary(body)
    if fmt == "slack":
        return _encoder.encode({"text": f"*{title}*\n{text}"}), {"Content-Type": "application/json"}
    headers = {"Content-Type": "text/plain; charset=utf-8", "Title": _header_safe(title)}
    if "console_url" in body:
        headers["Click"] = body["console_url"]
    return text.encode(), headers


def _header_safe(text: str) -> str:
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)[:200]


def summary(body: dict[str, Any]) -> tuple[str, str]:
    """A title and a few lines of text for people (the slack and ntfy formats)."""
    name = body.get("session_name") or body["session_id"][:8]
    event = body["event"]
    lines: list[str] = []
    if event == "permission.pending":
        p = body["permission"]
        title = f"{name}: {body['agent']} waits for permission ({p['tool_name']})"
        lines.append(p["question_text"])
    elif event == "turn.ended":
        title = f"{name}: turn ended ({body['turn']['stop_reason']})"
    elif event in ("budget.warning", "budget.exceeded"):
        b = body["budget"]
        reached = "reached" if event == "budget.exceeded" else "nearly reached"
        title = f"{name}: {'session' if b['scope'] == 'session' else 'daily'} budget {reached}"
        lines.append(b["message"])
    elif event in ("agent.error", "session.stalled"):
        e = body["error"]
        title = f"{name}: {'agent stalled' if event == 'session.stalled' else 'agent error'}"
        lines.append(f"{e['error_code']}: {e['message']}")
    else:
        title = f"{name}: session ended"
    if body.get("reminder"):
        title = "Reminder: " + title
    if "console_url" in body:
        lines.append(body["console_url"])
    return title, "\n".join(lines) or title


def cut(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
