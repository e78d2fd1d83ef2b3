"""The reattach buffer (gateway/protocol/buffer.py): policies, byte bound, exact lost counts
(DPS-7.1-history)."""

from __future__ import annotations

import pytest

from gateway.protocol.buffer import FrameBuffer


def fill(buffer: FrameBuffer, n: int, size: int = 10) -> list[str]:
    ids = [f"m{i}" for i in range(n)]
    for mid in ids:
        buffer.append(mid, f"t{mid}", b"x" * size)
    return ids


def test_DPS_7_1_history_ring_keeps_the_newest_within_max_bytes():
    h = FrameBuffer("RING", max_bytes=50)
    fill(h, 8)
    assert h.bytes == 50 and len(h) == 5 and h.evicted_frames == 3
    replay = h.since("m4")
    assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (3, False, 0)
    replay = h.since("m1")  # m2 was evicted: one lost, m3..m7 replayed
    assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (5, True, 1)
    assert (replay.last_message_id, replay.last_timestamp) == ("m7", "tm7")
    assert h.high_watermark == 50


def test_DPS_7_1_history_drop_keeps_the_oldest():
    h = FrameBuffer("DROP", max_bytes=30)
    fill(h, 5)
    replay = h.since("m0")
    assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (2, True, 2)


def test_DPS_7_1_history_none_keeps_nothing_but_counts():
    h = FrameBuffer("NONE")
    fill(h, 3)
    replay = h.since("m0")
    assert (replay.frames, replay.truncated, replay.lost_frame_count) == ([], True, 2)
    replay = h.since("m2")
    assert (replay.frames, replay.truncated, replay.lost_frame_count) == ([], False, 0)


def test_everything_is_every_buffered_frame_with_the_exact_count_of_those_gone():
    """?history=all (a first attach): truncated only when frames produced since the session began
    are gone, with their exact number, whatever the policy."""
    h = FrameBuffer("RING", max_bytes=100)
    fill(h, 3, size=10)
    h.mark("greeting")  # a frame to one connection is not a lost one
    replay = h.everything()
    assert (replay.frames, replay.truncated, replay.lost_frame_count) == ([b"x" * 10] * 3, False, 0)
    assert (replay.last_message_id, replay.last_timestamp) == ("m2", "tm2")
    for policy, kept in (("RING", 5), ("DROP", 5), ("NONE", 0)):
        h = FrameBuffer(policy, max_bytes=50)
        fill(h, 8)
        replay = h.everything()
        assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (
            kept,
            True,
            8 - kept,
        )
    empty = FrameBuffer().everything()
    assert (empty.frames, empty.truncated, empty.lost_frame_count) == ([], False, 0)
    assert empty.last_message_id is None


def test_unknown_id_gets_everything_and_truncated():
    h = FrameBuffer("RING", max_bytes=100)
    fill(h, 3)
    replay = h.since("never-seen")
    assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (3, True, None)


def test_a_frame_sent_to_one_connection_stands_where_it_was_sent():
    h = FrameBuffer("RING", max_bytes=100)
    fill(h, 2)
    h.mark("greeting")
    h.append("m2", "t", b"x")
    replay = h.since("greeting")
    assert (replay.frames, replay.truncated, replay.lost_frame_count) == ([b"x"], False, 0)
    h.mark("m0")  # known ids keep their first place
    assert len(h.since("m0").frames) == 2


def test_a_frame_larger_than_the_buffer_is_not_kept():
    h = FrameBuffer("RING", max_bytes=5)
    kept, evicted, _ = h.append("big", "t", b"x" * 6)
    assert (kept, evicted, len(h)) == (False, 0, 0)
    assert h.since("big").lost_frame_count == 0


def test_bad_policy():
    with pytest.raises(ValueError, match="RING, DROP, NONE"):
        FrameBuffer("LOSSY")  # type: ignore[arg-type]


def test_clear_releases_the_frames_and_the_id_index():
    """A deleted session's buffer keeps nothing: the index of sent ids (up to ``id_memory``
    entries, ~12 MB when full) goes with the frames."""
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        h = FrameBuffer("RING", max_bytes=1024)
        fill(h, 65536, size=1)
        assert tracemalloc.get_traced_memory()[0] - before > 5_000_000
        h.clear()
        assert tracemalloc.get_traced_memory()[0] - before < 100_000
        assert (h.bytes, len(h)) == (0, 0)
        assert h.since("m65535").lost_frame_count is None  # the id is forgotten too
    finally:
        tracemalloc.stop()


def test_the_last_id_memory_ids_are_remembered_and_older_ones_forgotten():
    """A reattach naming any of the last ``id_memory`` ids gets an exact count; ids are forgotten
    a dict of 4,096 at a time, so at most that many more are remembered."""
    h = FrameBuffer("RING", max_bytes=10, id_memory=10_000)  # keeps one frame
    ids = fill(h, 30_000, size=10)
    for mid in ids[-10_000:]:
        replay = h.since(mid)
        assert replay.lost_frame_count == 30_000 - 1 - int(mid[1:]) - len(replay.frames)
    forgotten = ids[: 30_000 - 10_000 - 4096]
    assert all(h.since(mid).lost_frame_count is None for mid in forgotten[-100:])


def test_the_id_index_never_grows_one_dict_past_a_generation():
    """One dict of 65,536 ids with one in and one out per frame rehashed all of them every
    ~100,000 frames, holding the event loop for 8-9 ms: no dict of the index outgrows 4,096."""
    h = FrameBuffer("RING", max_bytes=10)
    fill(h, 150_000, size=1)
    gens = h._seq_of._gens
    assert max(map(len, gens)) <= 4096
    assert 65_536 <= len(h._seq_of) <= 65_536 + 4096


def walked(root: object) -> int:
    """How many objects a full collection visits under ``root``: what each tracked object's
    traverse reports, transitively (an object the collector does not track is visited, not
    walked; classes and modules are left out, they are the program's)."""
    import gc
    import types

    gc.collect()  # the collector stops tracking what can hold no cycle (a tuple of bytes)
    seen, todo = {id(root)}, [root]
    while todo:
        for ref in gc.get_referents(todo.pop()):
            if isinstance(ref, (type, types.ModuleType)) or id(ref) in seen:
                continue
            seen.add(id(ref))
            if gc.is_tracked(ref):
                todo.append(ref)
    return len(seen)


def test_buffered_frames_are_no_objects_the_garbage_collector_walks():
    """Every full collection visits what each tracked object holds; a buffer of 20,000 frames
    has it visit about as much as a buffer of 10 (a tuple a frame made hundreds of busy sessions
    hold the event loop for hundreds of milliseconds per collection), and still replays every
    byte."""
    small, big = FrameBuffer("RING"), FrameBuffer("RING")
    fill(small, 10, size=100)
    ids = fill(big, 20_000, size=100)
    # The id index keeps its ids in dicts of 4,096 (each one object the collector does not walk).
    assert walked(big) <= walked(small) + 20_000 // 4096
    assert big.everything().frames == [b"x" * 100] * 20_000
    assert big.since(ids[-3]).frames == [b"x" * 100] * 2


def test_the_frame_store_keeps_order_ids_and_bytes_through_evictions_and_compactions():
    """``_FrameStore`` against a deque of tuples, over random appends (ids of any str, seqs with
    gaps, sizes up to 3 KB) and evictions enough to compact it many times."""
    import random
    from collections import deque

    from gateway.protocol.buffer import _FrameStore

    frames, model = _FrameStore(), deque()
    rng = random.Random(7)
    seq = 0
    for step in range(60_000):
        if model and rng.random() < 0.45:
            assert frames.popleft() == len(model.popleft()[2])
        else:
            mid = f"m{seq}\ud800é" if step % 97 == 0 else f"m{seq}"
            data = rng.randbytes(rng.randrange(0, 3000))
            frames.append(seq, mid, data)
            model.append((seq, mid, data))
            seq += rng.choice((1, 1, 2))
        if step % 4000 == 0:
            assert list(frames) == list(model) and len(frames) == len(model)
            cut = rng.randrange(-1, seq + 1)
            assert frames.after(cut) == [d for s, _, d in model if s > cut]
    live = sum(len(d) for _, _, d in model)
    assert len(frames._data) <= live * 1.25 + 65536 + 3000  # what left is given back
    frames.clear()
    assert len(frames) == 0 and not frames._data
