"""A team's system as the agent's (``[isolation] system_root``, docs/isolation.md): what the shell
finds under that directory for ``plan.bwrap_argv``. The team's image is read-only and its own
(Debian trixie beside the gateway's bookworm, say): nothing of it is changed, and every path below
is looked up in it as the agent will see it, its links followed inside it, never into the
gateway's system.

- ``system_entries``: which of ``SYSTEM_DIRS`` it has (a link kept as a link, as the image has it).
- ``find``: a program on the agent's PATH there (the profile's command, ``prlimit``), or a path the
  sandbox shows through a bind (``bind_ro`` of the gateway's own Claude Code).
- ``splices``: the directories of the team's system that must be rebuilt so that something of the
  gateway's can be mounted where the image has no file to mount it on (the gateway's
  ``/etc/hosts`` over an image that has none, a ``bind_ro`` under ``/usr``).
- ``users``: a passwd and group that know the agent's uid, when the team's do not (the image's
  uid 10001 in a team's image that never heard of it), written where the agent cannot write.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import pwd
import stat
from collections.abc import Iterable, Sequence
from typing import Final

from gateway.agent.exit import AgentStartError
from gateway.agent.sandbox.plan import SYSTEM_DIRS, group_with, passwd_with

__all__ = [
    "MAX_SPLICE_ENTRIES",
    "find",
    "in_root",
    "missing",
    "splices",
    "system_entries",
    "users",
]

# Entries of one directory rebuilt (each a mount): a bind into /usr/bin of a large image would
# be thousands; past this the agent does not start, with a message that says to bind elsewhere.
MAX_SPLICE_ENTRIES: Final = 4096
_MAX_LINKS: Final = 40  # links followed resolving one path, as the kernel's own bound
_MAX_USERS_BYTES: Final = 1 << 20  # the team's /etc/passwd or /etc/group read, at most
# Generated passwd/group files kept in the gateway's temporary root: each is mounted when its agent
# starts, so only the newest few are ever needed again.
_MAX_USER_FILES: Final = 256


def missing(root: str) -> str | None:
    """Why ``root`` cannot be an agent's system (one line), or None."""
    if not os.path.isdir(root):
        return f"[isolation] system_root {root} is not a directory"
    if not os.path.isdir(os.path.join(root, "usr")):
        return (
            f"[isolation] system_root {root} has no /usr: it must hold a system (a team's image "
            "mounted there, or an unpacked one)"
        )
    return None


def in_root(root: str, path: str) -> str | None:
    """``path`` (absolute, as the agent sees it) with the links of the team's system followed
    inside ``root`` (an absolute link means the image's own root, as it does in the agent), the
    result again as the agent sees it; None on a loop. The last component need not exist."""
    parts = [p for p in path.split("/") if p and p != "."]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = root + "/" + "/".join([*done, part])
        try:
            st = os.lstat(here)
        except OSError:
            done.append(part)
            done += [p for p in parts if p not in ("", ".")]
            return posixpath.normpath("/" + "/".join(done))
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p and p != "."] + parts
            continue
        done.append(part)
    return "/" + "/".join(done)


def system_entries(root: str) -> tuple[tuple[str, str | None], ...]:
    """Which of ``SYSTEM_DIRS`` the team's system has: a directory (None), or a link with its
    target, as the image has it (``/bin -> usr/bin``)."""
    out: list[tuple[str, str | None]] = []
    for path in SYSTEM_DIRS:
        try:
            st = os.lstat(root + path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            out.append((path, os.readlink(root + path)))
        elif stat.S_ISDIR(st.st_mode):
            out.append((path, None))
    return tuple(out)


def _system_path(path: str) -> bool:
    """``path`` lies in one of the system directories, i.e. in the team's image."""
    return any(path == top or path.startswith(top + "/") for top in SYSTEM_DIRS)


def find(
    root: str, name: str, agent_path: str, shown: Sequence[str] = ()
) -> tuple[str, str] | None:
    """Where the agent finds program ``name``: on ``agent_path`` (a name), or at itself (an
    absolute path), in the team's system or in one of ``shown`` (binds of the gateway's paths,
    at their own paths). (the path the agent runs, the file on this machine), or None."""
    if name.startswith("/"):
        candidates = [name]
    elif "/" in name:
        return None  # relative to the working directory: nothing a system is asked for
    else:
        candidates = [posixpath.join(d, name) for d in agent_path.split(":") if d.startswith("/")]
    for path in candidates:
        where = _host_file(root, path, shown)
        if where is not None and os.path.isfile(where) and os.access(where, os.X_OK):
            return path, where
    return None


def _host_file(root: str, path: str, shown: Sequence[str]) -> str | None:
    """The file on this machine that the agent sees at ``path``."""
    normal = posixpath.normpath(path)
    for top in sorted(shown, key=len, reverse=True):
        if normal == top or normal.startswith(top.rstrip("/") + "/"):
            return os.path.realpath(normal)
    inside = in_root(root, normal)
    if inside is None or not _system_path(inside):
        return None
    real = root + inside
    # A last link left (the loop bound aside, in_root follows every one): followed in the root.
    return real if not os.path.islink(real) else None


def splices(
    root: str, mounts: Iterable[tuple[str, bool]]
) -> tuple[tuple[tuple[str, tuple[tuple[str, str | None], ...]], ...], dict[str, str]]:
    """For things of the gateway's mounted in the team's system (each a path as the agent sees
    it, and whether it is a directory): the directories to rebuild so that each has a mount point,
    with their entries, and where each lands once the team's links are followed (its mount
    there). A path whose place in the image is already of its kind needs nothing."""
    rebuilt: dict[str, set[str]] = {}
    landed: dict[str, str] = {}
    for path, is_dir in mounts:
        inside = in_root(root, path)
        if inside is None:
            raise AgentStartError(f"{path} in system_root {root}: too many links")
        landed[path] = inside
        if not _system_path(inside):
            continue  # the sandbox's own root, which bwrap makes
        try:
            st = os.lstat(root + inside)
            if stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode):
                continue
        except OSError:
            pass
        top = posixpath.dirname(inside)
        while not os.path.isdir(root + top) or os.path.islink(root + top):
            top = posixpath.dirname(top)
        if top == "/":
            continue  # a system directory the image lacks: bwrap makes the path on its own root
        below = inside[len(top) :].lstrip("/").split("/")[0]
        rebuilt.setdefault(top, set()).add(below)
    out = []
    for top in sorted(rebuilt, key=lambda p: (p.count("/"), p)):
        entries: list[tuple[str, str | None]] = []
        with os.scandir(root + top) as listing:
            for entry in listing:
                if entry.name in rebuilt[top]:
                    continue
                if len(entries) >= MAX_SPLICE_ENTRIES:
                    raise AgentStartError(
                        f"{top} of system_root {root} has more than {MAX_SPLICE_ENTRIES} entries: "
                        "bind the gateway's paths outside it"
                    )
                target = os.readlink(entry.path) if entry.is_symlink() else None
                entries.append((entry.name, target))
        out.append((top, tuple(sorted(entries))))
    return tuple(out), landed


def users(root: str, home: str, temp: str) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """A passwd and group that know this process's uid and gid when the team's do not, written
    into ``temp`` (the gateway's own temporary root, which no agent sees), as (file, where) to show
    over the team's, and the agent's user name (None: the team's own for the uid)."""
    uid, gid = os.getuid(), os.getgid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = ""
    over: list[tuple[str, str]] = []
    passwd = passwd_with(_read(root, "/etc/passwd"), uid, gid, name, home)
    user = None
    if passwd is not None:
        over.append((_kept(temp, passwd), "/etc/passwd"))
        user = passwd.rstrip("\n").rsplit("\n", 1)[-1].split(":")[0]
    group = group_with(_read(root, "/etc/group"), gid, user or name)
    if group is not None:
        over.append((_kept(temp, group), "/etc/group"))
    return tuple(over), user


def _read(root: str, path: str) -> str:
    """A text file of the team's system (its links followed inside it); empty when it has none."""
    inside = in_root(root, path)
    if inside is None:
        return ""
    with contextlib.suppress(OSError), open(root + inside, "rb") as f:
        return f.read(_MAX_USERS_BYTES).decode(errors="replace")
    return ""


def _kept(temp: str, text: str) -> str:
    """``text`` in a read-only file of ``temp`` named by its digest (the same users share one),
    the oldest removed past ``_MAX_USER_FILES``: a started agent keeps what it mounted."""
    folder = os.path.join(temp, "users")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    data = text.encode()
    path = os.path.join(folder, hashlib.sha256(data).hexdigest()[:32])
    if not os.path.isfile(path):
        partial = path + ".part"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o444)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(partial, path)
        kept = sorted(
            (e for e in os.scandir(folder) if not e.name.endswith(".part")),
            key=lambda e: e.stat().st_mtime,
        )
        for old in kept[: max(0, len(kept) - _MAX_USER_FILES)]:
            if old.path != path:
                with contextlib.suppress(OSError):
                    os.unlink(old.path)
    return path
