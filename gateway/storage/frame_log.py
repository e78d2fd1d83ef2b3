"""The frame log's lines (``frames.log``, gateway/storage/state_dir.py): ``<seq> <message_id>
<frame JSON>`` or ``<seq> <message_id> -``, one a line; read back checking every line, written
with writev and told how far a write got (a full disk)."""

from __future__ import annotations

import os
from typing import Final

import msgspec

__all__ = ["Entry", "log_lines", "parse_log", "write_all"]

_IOV_MAX: Final = 1024  # the buffers one writev takes on Linux

Entry = tuple[int, str, bytes | None]  # (seq, message_id, frame bytes or None for an id only)


def parse_log(data: bytes) -> tuple[list[Entry], int | None]:
    """The log's entries in order, up to the first line that is cut short or not ours, and that
    line's offset (None: every line is whole). Every line is checked, not only the last: a write
    cut short by a full disk, then a later one, fuse into a line that is no frame."""
    entries: list[Entry] = []
    last_seq = -2
    pos, size = 0, len(data)
    while pos < size:
        end = data.find(b"\n", pos)
        if end < 0:
            return entries, pos  # the last write was cut short: that line is not a frame
        entry = _entry(data[pos:end], last_seq)
        if entry is None:
            return entries, pos
        entries.append(entry)
        last_seq = entry[0]
        pos = end + 1
    return entries, None


def _entry(line: bytes, last_seq: int) -> Entry | None:
    """One line of the log, or None when it is not one we wrote whole."""
    parts = line.split(b" ", 2)
    if len(parts) != 3 or not parts[1] or not parts[0].lstrip(b"-").isdigit():
        return None
    seq = int(parts[0])  # -1: an id marked before the first frame
    body = parts[2]
    if seq < last_seq:
        return None
    if body == b"-":
        return (seq, parts[1].decode("ascii", "replace"), None)
    if not body.startswith(b"{") or not _whole_json(body):
        return None
    return (seq, parts[1].decode("ascii", "replace"), body)


def _whole_json(body: bytes) -> bool:
    try:
        msgspec.json.decode(body, type=msgspec.Raw)  # checked whole, nothing built
    except msgspec.DecodeError:
        return False
    return True


def log_lines(records: list[Entry]) -> tuple[list[bytes], list[int]]:
    """The log lines of ``records`` as parts for writev (a frame's own bytes, not a copy), and
    where each record ends, counted from the first."""
    parts: list[bytes] = []
    ends: list[int] = []
    total = 0
    for seq, mid, data in records:
        if data is None:
            line = b"%d %s -\n" % (seq, mid.encode())
            parts.append(line)
            total += len(line)
        else:
            head = b"%d %s " % (seq, mid.encode())
            parts += (head, data, b"\n")
            total += len(head) + len(data) + 1
        ends.append(total)
    return parts, ends


def write_all(fd: int, parts: list[bytes]) -> tuple[int, OSError | None]:
    """Write every part, in order, with as few system calls as writev allows: the bytes written,
    and the error that stopped it (a full disk) or None."""
    total = 0
    try:
        for i in range(0, len(parts), _IOV_MAX):
            chunk = parts[i : i + _IOV_MAX]
            size = sum(map(len, chunk))
            done = os.writev(fd, chunk)
            total += done
            if done < size:  # a short write (a full disk, a signal): the rest, byte by byte exact
                rest = memoryview(b"".join(chunk))[done:]
                while rest:
                    n = os.write(fd, rest)
                    total += n
                    rest = rest[n:]
    except OSError as err:
        return total, err
    return total, None
