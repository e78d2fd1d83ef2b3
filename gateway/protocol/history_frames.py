"""The ``session.history`` of a reattach as frames that each fit ``max_frame_size``, sans-IO.

Theory of operation
-------------------
The gateway announces ``max_frame_size`` in its ``session.capabilities`` and never sends a larger
frame. A reattach may have more buffered frames than one frame can hold, so ``history_frames``
delivers them in as many ``session.history`` frames as needed (docs/protocol-notes.md):

* the buffered frames are packed in order, whole, each part as full as ``max_frame_size`` allows;
  with more than one part every part carries ``metadata.history_part`` (1-based) and
  ``metadata.history_parts``; a master that does not know them still gets valid histories;
* every part has the same ``buffer_status``: it describes the whole reattach (a master told of a
  loss by any part tells its user);
* ``last_message_id``/``last_sync_timestamp`` of a part are those of its own last frame, the last
  part's those of the session's newest frame: a master that loses the socket between parts
  reattaches after what it did receive;
* a buffered frame that cannot fit in a part on its own, and the oldest frames beyond
  ``max_total_bytes`` (what the connection's send queue can take at once), are not sent: they are
  lost frames like evicted ones, so ``truncated`` is true and ``lost_frame_count`` counts them
  exactly (when the buffer knew the count at all).
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from gateway.protocol import codec
from gateway.protocol import frames as F
from gateway.protocol.factory import FrameFactory

__all__ = ["history_frames"]

# Bytes a part's own fields may take beyond the estimate: its last frame's id and timestamp.
_SLACK: Final = 128


class _Stamp(msgspec.Struct):
    message_id: str = ""
    timestamp: str = ""


_stamp_decoder = msgspec.json.Decoder(_Stamp)


def history_frames(
    factory: FrameFactory,
    frames: list[bytes],
    *,
    truncated: bool,
    lost_frame_count: int | None,
    last_message_id: str,
    last_sync_timestamp: str,
    buffer_policy: Literal["RING", "DROP", "NONE"],
    buffer_high_watermark: int | None,
    max_frame_size: int,
    max_total_bytes: int | None = None,
) -> tuple[list[tuple[F.Frame, bytes]], int]:
    """The ``session.history`` frames for a reattach, each with its encoding, and how many
    buffered frames could not be sent (see the module docstring)."""

    def build(
        part: list[bytes], status: F.BufferStatus, mid: str, ts: str, meta: Any
    ) -> tuple[F.Frame, bytes]:
        payload = F.History(
            frames=[msgspec.Raw(data) for data in part],
            buffer_status=status,
            last_sync_timestamp=ts,
            last_message_id=mid,
        )
        frame = factory.frame(payload, metadata=meta)
        return frame, codec.encode(frame)

    n = len(frames)
    worst = F.BufferStatus(
        policy_applied=buffer_policy,
        truncated=True,
        lost_frame_count=(lost_frame_count or 0) + n,
        buffer_high_watermark=buffer_high_watermark,
    )
    widest = {"history_part": n + 1, "history_parts": n + 1}
    overhead = len(build([], worst, last_message_id, last_sync_timestamp, widest)[1]) + _SLACK
    room = max_frame_size - overhead
    sendable = [data for data in frames if len(data) <= room]
    if max_total_bytes is not None:
        # Newest first: what the queue cannot take is the oldest part of the history. Greedy
        # packing fills any two neighbouring parts past ``room``: at most 2*total/room + 1 parts.
        total = kept = 0
        for data in reversed(sendable):
            total += len(data) + 1
            if total + (2 * total // room + 1) * overhead > max_total_bytes:
                break
            kept += 1
        sendable = sendable[len(sendable) - kept :]
    unsent = n - len(sendable)
    if unsent:
        truncated = True
        if lost_frame_count is not None:
            lost_frame_count += unsent
    parts: list[list[bytes]] = [[]]
    size = 0
    for data in sendable:
        extra = len(data) + (1 if parts[-1] else 0)  # the comma between two frames
        if parts[-1] and size + extra > room:
            parts.append([])
            size, extra = 0, len(data)
        parts[-1].append(data)
        size += extra
    status = F.BufferStatus(
        policy_applied=buffer_policy,
        truncated=truncated,
        lost_frame_count=lost_frame_count,
        buffer_high_watermark=buffer_high_watermark,
    )
    out: list[tuple[F.Frame, bytes]] = []
    for index, part in enumerate(parts, 1):
        mid, ts = last_message_id, last_sync_timestamp
        if index < len(parts):
            try:
                stamp = _stamp_decoder.decode(part[-1])
                mid, ts = stamp.message_id or mid, stamp.timestamp or ts
            except msgspec.DecodeError:  # cannot happen: the buffer holds frames we encoded
                pass
        meta = {"history_part": index, "history_parts": len(parts)} if len(parts) > 1 else None
        out.append(build(part, status, mid, ts, meta))
    return out, unsent
