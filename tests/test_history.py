"""The reattach buffer (gateway/history.py): policies, byte bound, exact lost counts (DPS-7.1-history)."""

from __future__ import annotations

import pytest

from gateway.history import History


def fill(history: History, n: int, size: int = 10) -> list[str]:
    ids = [f"m{i}" for i in range(n)]
    for mid in ids:
        history.append(mid, f"t{mid}", b"x" * size)
    return ids


def test_DPS_7_1_history_ring_keeps_the_newest_within_max_bytes():
    h = History("RING", max_bytes=50)
    fill(h, 8)
    assert h.bytes == 50 and len(h) == 5 and h.evicted_frames == 3
    replay = h.since("m4")
    assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (3, False, 0)
    replay = h.since("m1")  # m2 was evicted: one lost, m3..m7 replayed
    assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (5, True, 1)
    assert (replay.last_message_id, replay.last_timestamp) == ("m7", "tm7")
    assert h.high_watermark == 50


def test_DPS_7_1_history_drop_keeps_the_oldest():
    h = History("DROP", max_bytes=30)
    fill(h, 5)
    replay = h.since("m0")
    assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (2, True, 2)


def test_DPS_7_1_history_none_keeps_nothing_but_counts():
    h = History("NONE")
    fill(h, 3)
    replay = h.since("m0")
    assert (replay.frames, replay.truncated, replay.lost_frame_count) == ([], True, 2)
    replay = h.since("m2")
    assert (replay.frames, replay.truncated, replay.lost_frame_count) == ([], False, 0)


def test_everything_is_every_buffered_frame_with_the_exact_count_of_those_gone():
    """?history=all (a first attach): truncated only when frames produced since the session began
    are gone, with their exact number, whatever the policy."""
    h = History("RING", max_bytes=100)
    fill(h, 3, size=10)
    h.mark("greeting")  # a frame to one connection is not a lost one
    replay = h.everything()
    assert (replay.frames, replay.truncated, replay.lost_frame_count) == ([b"x" * 10] * 3, False, 0)
    assert (replay.last_message_id, replay.last_timestamp) == ("m2", "tm2")
    for policy, kept in (("RING", 5), ("DROP", 5), ("NONE", 0)):
        h = History(policy, max_bytes=50)
        fill(h, 8)
        replay = h.everything()
        assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (
            kept,
            True,
            8 - kept,
        )
    empty = History().everything()
    assert (empty.frames, empty.truncated, empty.lost_frame_count) == ([], False, 0)
    assert empty.last_message_id is None


def test_unknown_id_gets_everything_and_truncated():
    h = History("RING", max_bytes=100)
    fill(h, 3)
    replay = h.since("never-seen")
    assert (len(replay.frames), replay.truncated, replay.lost_frame_count) == (3, True, None)


def test_a_frame_sent_to_one_connection_stands_where_it_was_sent():
    h = History("RING", max_bytes=100)
    fill(h, 2)
    h.mark("greeting")
    h.append("m2", "t", b"x")
    replay = h.since("greeting")
    assert (replay.frames, replay.truncated, replay.lost_frame_count) == ([b"x"], False, 0)
    h.mark("m0")  # known ids keep their first place
    assert len(h.since("m0").frames) == 2


def test_a_frame_larger_than_the_buffer_is_not_kept():
    h = History("RING", max_bytes=5)
    kept, evicted, _ = h.append("big", "t", b"x" * 6)
    assert (kept, evicted, len(h)) == (False, 0, 0)
    assert h.since("big").lost_frame_count == 0


def test_bad_policy():
    with pytest.raises(ValueError, match="RING, DROP, NONE"):
        History("LOSSY")  # type: ignore[arg-type]


def test_clear_releases_the_frames_and_the_id_index():
    """A deleted session's buffer keeps nothing: the index of sent ids (up to ``id_memory``
    entries, ~12 MB when full) goes with the frames."""
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        h = History("RING", max_bytes=1024)
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
    h = History("RING", max_bytes=10, id_memory=10_000)  # keeps one frame
    ids = fill(h, 30_000, size=10)
    for mid in ids[-10_000:]:
        replay = h.since(mid)
        assert replay.lost_frame_count == 30_000 - 1 - int(mid[1:]) - len(replay.frames)
    forgotten = ids[: 30_000 - 10_000 - 4096]
    assert all(h.since(mid).lost_frame_count is None for mid in forgotten[-100:])


def test_the_id_index_never_grows_one_dict_past_a_generation():
    """One dict of 65,536 ids with one in and one out per frame rehashed all of them every
    ~100,000 frames, holding the event loop for 8-9 ms: no dict of the index outgrows 4,096."""
    h = History("RING", max_bytes=10)
    fill(h, 150_000, size=1)
    gens = h._seq_of._gens
    assert max(map(len, gens)) <= 4096
    assert 65_536 <= len(h._seq_of) <= 65_536 + 4096
