"""The per-session buffer for reattach (§7.1), bounded in bytes.

Theory of operation
-------------------
Every frame broadcast to a session's connections is appended as the bytes that were sent, with a
sequence number. A master that reattaches says the last ``message_id`` it saw; ``since(id)`` returns
every buffered frame after it and an exact count of the frames after it that are gone.

Policies (``POST /v1/session`` ``buffer.policy``):

* ``RING``: past ``max_bytes`` the oldest frames are evicted;
* ``DROP``: past ``max_bytes`` new frames are not kept (the oldest history survives);
* ``NONE``: nothing is kept; a reattach gets an empty history, truncated if it missed anything.

To count lost frames exactly, the sequence number of recently sent ids is remembered (bounded by
``id_memory``) even after their frames are evicted. An id the buffer has never heard of (or forgot)
gets everything buffered, ``truncated: true`` and no count. A master attaching for the first time may
ask for ``everything()``: every buffered frame, truncated (with the exact count) only when frames
produced since the session began are gone. The buffer is sans-IO: the server owns it and metrics
read its counters.

The frames are kept where the garbage collector does not look (``_FrameStore``: their bytes in one
``bytearray``, their ids in another, sequence numbers and lengths in arrays). Kept as a tuple
each, every buffered frame was an object that each full collection walked: with hundreds of busy
sessions that walk held the event loop for hundreds of milliseconds, growing with the buffers.

A buffer can be saved and loaded again (``entries``/``load``, see ``gateway/storage/state_dir.py``). One
loaded after a crash of the gateway may lack the last frames it had sent: a reattach from before the
restart is then ``truncated`` (with no count), and an id it never wrote down (most likely one of
those last frames) gets only what was produced since the restart, so no frame comes twice.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

BufferPolicy = Literal["RING", "DROP", "NONE"]
BUFFER_POLICIES: Final = ("RING", "DROP", "NONE")

__all__ = ["BUFFER_POLICIES", "Backlog", "FrameBuffer"]


@dataclass(frozen=True, slots=True)
class Backlog:
    frames: list[bytes]
    truncated: bool
    lost_frame_count: int | None
    last_message_id: str | None  # of the newest frame the session produced
    last_timestamp: str | None


_ID_GENERATION: Final = 4096


class _IdIndex:
    """Sent message id → seq for at least the last ``capacity`` ids (at most one generation more).

    The ids are kept in dicts of up to ``_ID_GENERATION`` each, newest last; past ``capacity`` the
    oldest dict is dropped whole. One dict of 65,536 ids with one in and one out per frame had to
    rehash all of them every ~100,000 frames (8-9 ms of the event loop, each time); a dict that
    only ever grows to 4,096 ids never holds the loop for long, and adding an id is one store.
    """

    __slots__ = ("_current", "_gens", "_max_gens", "_size")

    def __init__(self, capacity: int) -> None:
        self._size = max(1, min(_ID_GENERATION, capacity))
        # Full generations that cover ``capacity``, and the one being filled.
        self._max_gens = -(-capacity // self._size) + 1
        self._current: dict[str, int] = {}
        self._gens: deque[dict[str, int]] = deque([self._current])

    def add(self, message_id: str, seq: int) -> None:
        current = self._current
        current[message_id] = seq
        if len(current) >= self._size:
            self._current = {}
            self._gens.append(self._current)
            if len(self._gens) > self._max_gens:
                self._gens.popleft()

    def get(self, message_id: str) -> int | None:
        for gen in reversed(self._gens):
            seq = gen.get(message_id)
            if seq is not None:
                return seq
        return None

    def items(self) -> list[tuple[str, int]]:
        """Every remembered (id, seq), oldest first (an id in two dicts: its newest seq)."""
        merged: dict[str, int] = {}
        for gen in self._gens:
            merged.update(gen)
        return list(merged.items())

    def __len__(self) -> int:
        return sum(map(len, self._gens))

    def clear(self) -> None:
        self._current = {}
        self._gens = deque([self._current])


class _FrameStore:
    """The buffered frames, oldest first: ``append``, ``popleft``, ``after(seq)``, iteration as
    ``(seq, message_id, data)``. Nothing in it is an object the garbage collector tracks (see the
    module docstring). Frames leave the front by moving a start offset; the space they held is
    given back once it is a quarter of what is live (one memmove, amortised over the frames that
    left), so the buffer holds at most a quarter more than its frames."""

    __slots__ = ("_data", "_head", "_id_lens", "_id_start", "_ids", "_lens", "_seqs", "_start")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Every frame gone, and the memory that held them let go."""
        self._data = bytearray()
        self._lens = array("q")  # each frame's length in _data
        self._seqs = array("q")
        self._ids = bytearray()  # each frame's message id, UTF-8, _id_lens long
        self._id_lens = array("q")
        self._head = 0  # the index of the oldest live frame
        self._start = 0  # its offset in _data
        self._id_start = 0  # its id's offset in _ids

    def __len__(self) -> int:
        return len(self._seqs) - self._head

    def append(self, seq: int, message_id: str, data: bytes) -> None:
        mid = message_id.encode("utf-8", "surrogatepass")  # an id from a saved state is any str
        self._data += data
        self._lens.append(len(data))
        self._seqs.append(seq)
        self._ids += mid
        self._id_lens.append(len(mid))

    def popleft(self) -> int:
        """Drop the oldest frame; returns its length in bytes."""
        head = self._head
        size = self._lens[head]
        self._start += size
        self._id_start += self._id_lens[head]
        self._head = head + 1
        if self._start > 65536 and self._start * 4 > len(self._data) - self._start:
            self._compact()
        return size

    def _compact(self) -> None:
        head = self._head
        del self._data[: self._start]
        del self._ids[: self._id_start]
        del self._lens[:head]
        del self._seqs[:head]
        del self._id_lens[:head]
        self._head = self._start = self._id_start = 0

    def __iter__(self) -> Iterator[tuple[int, str, bytes]]:
        data, ids, lens, id_lens = self._data, self._ids, self._lens, self._id_lens
        pos, id_pos = self._start, self._id_start
        for i in range(self._head, len(self._seqs)):
            end, id_end = pos + lens[i], id_pos + id_lens[i]
            yield (
                self._seqs[i],
                ids[id_pos:id_end].decode("utf-8", "surrogatepass"),
                bytes(data[pos:end]),
            )
            pos, id_pos = end, id_end

    def after(self, seq: int | None) -> list[bytes]:
        """The data of every frame whose seq is over ``seq`` (seqs only grow; ``None``: every
        frame): a backlog, which needs no ids."""
        index = self._head if seq is None else bisect_right(self._seqs, seq, self._head)
        pos = self._start + sum(self._lens[self._head : index])
        data, out = self._data, []
        for size in self._lens[index:]:
            out.append(bytes(data[pos : pos + size]))
            pos += size
        return out


class FrameBuffer:
    def __init__(
        self,
        buffer_policy: BufferPolicy = "RING",
        max_bytes: int = 8 * 1024 * 1024,
        id_memory: int = 65536,
    ) -> None:
        if buffer_policy not in BUFFER_POLICIES:
            raise ValueError(
                f"buffer policy must be one of {', '.join(BUFFER_POLICIES)}, not {buffer_policy!r}"
            )
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.buffer_policy: BufferPolicy = buffer_policy
        self.max_bytes = max_bytes if buffer_policy != "NONE" else 0
        self._frames = _FrameStore()
        self._seq_of = _IdIndex(id_memory)
        self._next_seq = 0
        self.bytes = 0
        self.high_watermark = 0
        self.evicted_frames = 0
        self.last_message_id: str | None = None
        self.last_timestamp: str | None = None
        self._restart_seq: int | None = None  # the first seq after a load following a crash

    def __len__(self) -> int:
        return len(self._frames)

    def append(self, message_id: str, timestamp: str, data: bytes) -> tuple[bool, int, int]:
        """Keep a sent frame. Returns whether it was kept, and the (frames, bytes) evicted to make
        room for it. A frame that was not kept counts as lost too."""
        # Once per broadcast frame: _remember is written out here, and the policy is one compare.
        seq = self._next_seq
        self._next_seq = seq + 1
        self._seq_of.add(message_id, seq)
        self.last_message_id = message_id
        self.last_timestamp = timestamp
        size = len(data)
        total = self.bytes + size
        if total > self.max_bytes and (self.buffer_policy != "RING" or size > self.max_bytes):
            self.evicted_frames += 1  # NONE (max_bytes 0), DROP when full, or too big to keep
            return False, 0, 0
        self._frames.append(seq, message_id, data)
        gone = gone_bytes = 0
        if total > self.max_bytes:
            frames = self._frames
            while total > self.max_bytes:
                size = frames.popleft()
                total -= size
                gone += 1
                gone_bytes += size
            self.evicted_frames += gone
        self.bytes = total
        if total > self.high_watermark:
            self.high_watermark = total
        return True, gone, gone_bytes

    def mark(self, message_id: str) -> bool:
        """A frame sent to one connection only (a greeting, an error reply) is not kept, but a master
        may name it as the last frame it saw: it stands where it was sent. An id already known keeps
        its first place, so a reattach after it can replay too much (duplicates), never too little.
        Returns whether the id was new.
        """
        if self._seq_of.get(message_id) is not None:
            return False
        self._seq_of.add(message_id, self._next_seq - 1)
        return True

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest frame (the one ``append`` just took)."""
        return self._next_seq - 1

    def since(self, message_id: str) -> Backlog:
        """The frames after ``message_id`` that are still here, and how many are not."""
        seq = self._seq_of.get(message_id)
        restart = self._restart_seq
        if seq is None:
            after = -1 if restart is None else restart - 1
            frames = self._frames.after(after)
            return Backlog(frames, True, None, self.last_message_id, self.last_timestamp)
        frames = self._frames.after(seq)
        produced_after = self._next_seq - seq - 1
        lost = produced_after - len(frames)
        if restart is not None and seq < restart - 1:
            # Frames the gateway sent before its crash may never have reached the disk.
            return Backlog(frames, True, None, self.last_message_id, self.last_timestamp)
        return Backlog(frames, lost > 0, lost, self.last_message_id, self.last_timestamp)

    def everything(self) -> Backlog:
        """Every buffered frame, for a master that has seen none (``?history=all``), and how many
        of the frames produced since the session began are gone."""
        frames = self._frames.after(None)
        if self._restart_seq is not None:
            # Frames the gateway sent before its crash may never have reached the disk.
            return Backlog(frames, True, None, self.last_message_id, self.last_timestamp)
        lost = self._next_seq - len(frames)  # seqs count every broadcast frame from 0
        return Backlog(frames, lost > 0, lost, self.last_message_id, self.last_timestamp)

    def entries(self) -> list[tuple[int, str, bytes | None]]:
        """What a reattach can still get, in order, for saving: every buffered frame, and every
        remembered id whose frame is gone (``None``)."""
        frames = list(self._frames)
        buffered = {mid for _, mid, _ in frames}
        ids = [(seq, mid, None) for mid, seq in self._seq_of.items() if mid not in buffered]
        out: list[tuple[int, str, bytes | None]] = [*ids, *frames]
        out.sort(key=lambda entry: entry[0])
        return out

    def load(
        self,
        entries: list[tuple[int, str, bytes | None]],
        *,
        last_timestamp: str | None,
        crashed: bool,
        crash_boundary: int | None = None,
    ) -> None:
        """Fill an empty buffer with saved ``entries`` (see ``entries``); ``crashed``: the gateway
        that saved them did not stop cleanly, so their last frames may be missing;
        ``crash_boundary``: the ``crash_boundary`` of the buffer that was saved, if an earlier crash
        left one (ids from before it still replay as possibly incomplete)."""
        for seq, mid, data in entries:
            self._seq_of.add(mid, seq)  # in seq order: the oldest are forgotten past id_memory
            if data is not None and self.buffer_policy != "NONE" and len(data) <= self.max_bytes:
                self._frames.append(seq, mid, data)
                self.bytes += len(data)
            self._next_seq = max(self._next_seq, seq + 1)
            self.last_message_id = mid
        while self.bytes > self.max_bytes:
            self.bytes -= self._frames.popleft()
        self.high_watermark = self.bytes
        self.last_timestamp = last_timestamp
        self._restart_seq = crash_boundary
        if crashed:
            # One seq stands for the frames that may have been lost: ids from before it replay
            # truncated; a greeting marked after the restart takes it and replays exactly.
            self._next_seq += 1
            self._restart_seq = self._next_seq

    @property
    def crash_boundary(self) -> int | None:
        """The first seq after the last crash this buffer was restored from (None: never): saved
        with it, so later restarts still know which frames may be missing."""
        return self._restart_seq

    def clear(self) -> int:
        """Forget everything, the id index included (the session is gone); returns the frame bytes
        released."""
        released = self.bytes
        self._frames.clear()
        self._seq_of.clear()
        self.bytes = 0
        return released
