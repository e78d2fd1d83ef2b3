"""One attached WebSocket on a session's ``ws_path``, subprotocol ``rawp-dps-1.0``.

Right after the upgrade ``GatewayClient.attach`` sends our ``session.capabilities`` announcing
every feature (``ALL_FEATURES``): a terminal can render anything, and the gateway filters what a
master did not announce (DPS-12.2-filter), so announcing less would only hide things.
``Connection.receive()`` returns typed frames (``gateway.protocol.frames``) decoded by the codec;
unknown types are logged and skipped (DPS-2.2-unknown-type), a frame of another envelope version is
answered with ``session.error`` (DPS-2.1-v), duplicates are dropped (DPS-2.1-idempotent); a
``session.history`` the gateway split to fit its ``max_frame_size`` is returned once, joined.
``last_message_id`` names the newest frame received that the gateway's replay buffer surely holds
(a ``session.history`` moves it to the history's ``last_message_id``), so that
``GatewayClient.attach(..., last_message_id=conn.last_message_id)`` reattaches where this
connection stopped.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import AsyncIterator
from typing import Any, Final, Literal

import aiohttp
import msgspec

from gateway.client.view import payload_of, timestamp_key
from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.factory import FrameFactory

log = logging.getLogger(__name__)

SUBPROTOCOL: Final = "rawp-dps-1.0"
# The gateway's frames fit the max_frame_size it announces (1 MiB by default; a long history comes
# in several session.history parts): a margin for gateways configured larger.
DEFAULT_MAX_MESSAGE: Final = 16 * 1024 * 1024

# Frames a gateway may send to one connection only, outside its replay buffer.
_MAYBE_UNBUFFERED: Final = frozenset(
    {
        "session.capabilities",
        "session.history",
        "session.error",
        "tool.catalog.publish",
        "agent.commands.publish",
    }
)

InputType = Literal["text", "slash_command", "continuation", "piped_stdin"]
CancelReason = Literal["user_cancelled", "timeout", "quota_exceeded"]


class Connection:
    """One attached WebSocket: send control payloads, receive typed frames."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        session_id: str,
        *,
        last_message_id: str | None = None,
        factory: FrameFactory | None = None,
        seen_capacity: int = 4096,
    ) -> None:
        self.ws = ws
        self.session_id = session_id
        self.factory = factory or FrameFactory(session_id)
        self.last_message_id = last_message_id
        self.server_capabilities: F.Capabilities | None = None
        self._seen = codec.SeenWindow(seen_capacity)
        self._mark: _dt.datetime | None = None  # timestamp of last_message_id's frame
        self._history_parts: list[msgspec.Raw] | None = None  # a split history being joined

    @property
    def closed(self) -> bool:
        return self.ws.closed

    async def close(self) -> None:
        await self.ws.close()

    async def send(
        self,
        payload: F.Payload,
        *,
        turn_id: str | None = None,
        parent_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> F.Frame:
        """Send one frame carrying ``payload``; returns the frame (for ``MasterView.apply``)."""
        frame = self.factory.frame(payload, turn_id=turn_id, parent_id=parent_id, metadata=metadata)
        await self.send_frame(frame)
        return frame

    async def send_frame(self, frame: F.Frame) -> None:
        """Send a frame built beforehand (``self.factory.frame(...)``), when its id must be known
        before an answer to it can arrive."""
        # Text messages, one envelope each (docs/http-api.md: frames are text, never batched).
        await self.ws.send_str(codec.encode(frame).decode())

    # The §6 controls, spelled out so callers need not build payloads.

    async def prompt(
        self,
        text: str,
        *,
        input_type: InputType = "text",
        context_files: list[F.ContextFile] | None = None,
    ) -> F.Frame:
        payload = F.PromptRequest(
            prompt_text=text, input_type=input_type, context_files=context_files or None
        )
        return await self.send(payload)

    async def cancel(self, turn_id: str, *, reason: CancelReason = "user_cancelled") -> F.Frame:
        payload = F.PromptCancel(target_turn_id=turn_id, reason=reason)
        return await self.send(payload, turn_id=turn_id)

    async def answer(
        self,
        interaction_id: str,
        selected_value: str | list[str],
        *,
        text_input: str | None = None,
        turn_id: str | None = None,
    ) -> F.Frame:
        payload = F.InteractionResponse(
            interaction_id=interaction_id, selected_value=selected_value, text_input=text_input
        )
        return await self.send(payload, turn_id=turn_id)

    async def interaction_timeout(
        self, interaction_id: str, *, turn_id: str | None = None
    ) -> F.Frame:
        return await self.send(F.InteractionTimeout(interaction_id=interaction_id), turn_id=turn_id)

    async def switch_mode(self, mode: F.Mode) -> F.Frame:
        return await self.send(F.ModeSwitch(mode=mode))

    async def compact(self, instruction: str | None = None) -> F.Frame:
        return await self.send(F.SessionCompact(instruction=instruction or None))

    async def receive(self) -> F.Frame | None:
        """The next frame, or ``None`` once the WebSocket is closed (or failed)."""
        while True:
            msg = await self.ws.receive()
            if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                frame = await self._accept(msg.data)
                if frame is not None:
                    return frame
                continue
            if msg.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            ):
                return None
            # PING/PONG are answered by aiohttp itself; nothing else is expected.

    async def __aiter__(self) -> AsyncIterator[F.Frame]:
        while (frame := await self.receive()) is not None:
            yield frame

    async def _accept(self, data: str | bytes) -> F.Frame | None:
        result = codec.decode(data)
        if isinstance(result, codec.Ignored):
            log.info("ignoring frame of unknown type %s", result.frame_type)
            self.last_message_id = result.message_id  # an x-* frame is a broadcast, buffered
            return None
        if isinstance(result, codec.Rejected):
            log.warning("gateway sent an invalid frame: %s", result.error.message)
            if result.error.error_code == codec.UNSUPPORTED_VERSION:
                # DPS-2.1-v binds every receiver: ignore and answer with session.error.
                await self.send(result.error, parent_id=result.message_id)
            return None
        frame = result.frame
        if not self._seen.first_time(frame.message_id):
            return None
        payload = payload_of(frame)
        if isinstance(payload, F.Capabilities):
            self.server_capabilities = payload
        if isinstance(payload, F.History):
            joined = self._join_history(frame, payload)
            if joined is None:
                return None  # more parts to come
            frame, payload = joined, payload_of(joined)
            assert isinstance(payload, F.History)
            # What the gateway says we are now in sync with, even if the frames were cut.
            if payload.last_message_id:
                self.last_message_id = payload.last_message_id
                self._mark = timestamp_key(payload.last_sync_timestamp)
        else:
            self._advance(frame)
        return frame

    def _join_history(self, frame: F.Frame, payload: F.History) -> F.Frame | None:
        """A history the gateway split to fit its ``max_frame_size`` (``metadata.history_part``
        of ``history_parts``, docs/protocol-notes.md) comes back as one ``session.history``: the
        parts' frames in order, the last part's ids and status. None until the last part."""
        meta = frame.metadata or {}
        part, parts = meta.get("history_part"), meta.get("history_parts")
        if not (isinstance(part, int) and isinstance(parts, int) and parts > 1):
            return frame
        if part == 1 or self._history_parts is None:
            self._history_parts = []
        self._history_parts += payload.frames
        if part < parts:
            return None
        whole = msgspec.structs.replace(payload, frames=self._history_parts)
        self._history_parts = None
        return msgspec.structs.replace(frame, payload=whole)  # type: ignore[type-var]

    def _advance(self, frame: F.Frame) -> None:
        """Move ``last_message_id`` to ``frame`` if the gateway's buffer surely holds it.

        Reattaching after an id the buffer does not know makes the gateway call the history
        truncated, which keeps the finalisation (DPS-7.8-unfinalize); reattaching after an older
        id only replays frames we drop as duplicates. So when in doubt the mark stays: frames a
        gateway may send to one connection only (the greeting of an attach, answers to our own
        frames) and frames older than the mark (the greeting re-sends the latest catalog,
        commands and pending questions) do not move it.
        """
        if frame.TYPE in _MAYBE_UNBUFFERED:
            return
        at = timestamp_key(frame.timestamp)
        if self._mark is not None and at < self._mark:
            return
        self.last_message_id, self._mark = frame.message_id, at
