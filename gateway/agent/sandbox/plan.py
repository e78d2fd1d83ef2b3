"""The sandbox's decisions, pure: ``[isolation]``'s settings (``Isolation``), the bubblewrap argv
that runs one agent command (``bwrap_argv``), the environment it gets inside (``sandbox_environment``)
and which limit an agent that ended badly most likely hit (``limit_named``). What is on disk (which
system directories exist, where a link points, which secret files are there) is found by the shell
(``gateway/agent/sandbox/spawn.py``) and comes in as a ``Layout``; nothing here reads a file or
starts a process, so every choice below is tested with paths in and argv out.

How the argv is made
--------------------
Namespaces: a new user, PID, IPC and UTS namespace always, a network one with ``network =
"none"``; ``--die-with-parent`` (the sandbox dies with the gateway) and ``--new-session`` (no
terminal to push keystrokes into, even if one were inherited). The mounts are one list sorted by
depth, since a mount hides what an earlier one put below it: the system read-only (``/usr``,
``/etc``... as they exist; a top-level link such as ``/bin -> usr/bin`` stays a link), a fresh
``/proc`` and a minimal ``/dev``, a private ``/tmp`` (a tmpfs of at most ``max_memory_mb``),
``bind_ro`` and ``bind_rw``, what the gateway's own Python needs when the agent runs on it (its venv and
installation, the package ``-m`` names: the built-in demo and plain profiles), the session's workspace and its HOME read-write at their own paths,
then the masks: each directory or file the gateway keeps to itself (state dir, workspace root,
other sessions' workspaces, config, token, users, secret and audit files) that a bind would show is
covered (an empty tmpfs over a directory, an empty read-only file over a file); one nothing shows
is left alone. Last, a file the command is given (an uploaded image in its argv, kept in the
session's file store inside the hidden state dir) is bound read-only at its own path. The command then runs under ``prlimit``, inside the namespaces: RLIMIT_NPROC set there
counts the processes of the sandbox's own user namespace (set before ``bwrap`` it would also bound
the namespace's parent level, i.e. every process of the gateway's user), RLIMIT_DATA bounds each
process's private writable memory (docs/isolation.md says what each guarantees).

A team's system (``system_root``): the system's binds come from that directory (its links as it
has them), and none of them shows a file of the gateway's, so no mask is made there. What the
gateway shows over it (its network files, a passwd that knows the agent's uid) and binds whose
place the read-only image lacks need a directory rebuilt (``Layout.spliced``): a tmpfs, each of
the team's entries bound again, the gateway's on top, then ``--remount-ro`` once everything inside
is mounted. ``prlimit`` is then the team's, and ``PATH`` the agent's in that system.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from gateway.setting import setting

__all__ = [
    "DEFAULT_MAX_MEMORY_MB",
    "DEFAULT_MAX_PROCESSES",
    "DEFAULT_PATH",
    "MASK_TMPFS_BYTES",
    "MAX_BINDS",
    "MAX_BIND_CHARS",
    "SYSTEM_DIRS",
    "Isolation",
    "Layout",
    "Mask",
    "bwrap_argv",
    "check_binds",
    "check_path",
    "check_system_root",
    "group_with",
    "is_visible",
    "limit_named",
    "module_run",
    "passwd_with",
    "sandbox_environment",
]

DEFAULT_MAX_PROCESSES: Final = 512
DEFAULT_MAX_MEMORY_MB: Final = 4096
# Bounds of the limits: below them no agent starts (node alone has a few threads and a heap of
# some hundred MiB); above them the setting bounds nothing a pod could give.
MIN_PROCESSES: Final = 16
MAX_PROCESSES: Final = 1 << 20
MIN_MEMORY_MB: Final = 256
MAX_MEMORY_MB: Final = 1 << 24
MAX_BINDS: Final = 64  # entries of bind_ro and of bind_rw, each
MAX_BIND_CHARS: Final = 1024  # one path's length
_BINDS: Final = f"a list of at most {MAX_BINDS} paths"
# What the agent sees of the system, read-only, when it exists (a link is kept as a link).
SYSTEM_DIRS: Final = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
)
# The agent's PATH in a team's system (``system_root``) without ``path``: Debian's default.
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_PATH_CHARS: Final = 4096  # ``path`` as written
# The gateway's files for the network, shown over the team's: what its runtime gave its container.
NETWORK_FILES: Final = ("/etc/resolv.conf", "/etc/hosts")
# A name for an agent's uid that the team's /etc/passwd does not know, when the gateway's own name
# is taken there (or unknown).
AGENT_USER: Final = "rawp-agent"
# An empty tmpfs over a masked directory: only mount points go in, so it may stay tiny.
MASK_TMPFS_BYTES: Final = 64 * 1024
# Variables naming a directory the agent writes to: one the sandbox does not show is dropped (the
# agent then uses its default under HOME) rather than left to fail every write.
_DIR_VARIABLES: Final = (
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
)

Mode = Literal["none", "sandbox"]
Network = Literal["host", "none"]


def check_binds(value: list[Any], name: str) -> tuple[str, ...]:
    """``bind_ro`` or ``bind_rw`` as written: at most MAX_BINDS absolute paths, each short. That
    each exists and is not ``/`` is gateway/config/isolation.py's to check: it looks at the disk."""
    if len(value) > MAX_BINDS:
        raise ValueError(f"{name} must be {_BINDS}")
    for path in value:
        if not _absolute(path):
            raise ValueError(
                f"{name} entries must be absolute paths of at most {MAX_BIND_CHARS} characters, "
                f"got {str(path)[:100]!r}"
            )
    return tuple(value)


def _absolute(path: Any) -> bool:
    """An absolute path of at most MAX_BIND_CHARS characters, without NUL."""
    return (
        isinstance(path, str)
        and path.startswith("/")
        and len(path) <= MAX_BIND_CHARS
        and "\0" not in path
    )


def check_system_root(value: Any, name: str) -> str:
    """``system_root`` as written: one absolute path, normalised, never ``/`` (the gateway's own
    system is what is shown without it). That it holds ``/usr`` is checked when ``serve`` starts."""
    if not _absolute(value):
        raise ValueError(
            f"{name} must be an absolute path of at most {MAX_BIND_CHARS} characters, "
            f"got {str(value)[:100]!r}"
        )
    normal = posixpath.normpath(value)
    if not normal.strip("/"):  # (normpath keeps a leading "//")
        raise ValueError(f"{name} must be a team's system directory, not /")
    return normal


def check_path(value: Any, name: str) -> str:
    """``path`` as written: absolute directories joined with ``:``, at most MAX_PATH_CHARS."""
    if not isinstance(value, str) or len(value) > MAX_PATH_CHARS or "\0" in value:
        raise ValueError(f"{name} must be a string of at most {MAX_PATH_CHARS} characters")
    for part in value.split(":"):
        if not part.startswith("/"):
            raise ValueError(
                f"{name} must be absolute directories joined with ':', got {part[:100]!r}"
            )
    return value


@dataclass(frozen=True, slots=True)
class Isolation:
    """``[isolation]`` (docs/configuration.md): each field declares its key (gateway/setting.py);
    gateway/config/isolation.py reads the table into one."""

    mode: Mode = setting(
        "none",
        toml=str,
        choices=get_args(Mode),
        doc="sandbox: each agent under bubblewrap, seeing nothing of the gateway",
    )
    network: Network = setting(
        "host",
        toml=str,
        choices=get_args(Network),
        doc="none: a network namespace of the agent's own, loopback only",
    )
    bind_ro: tuple[str, ...] = setting(
        (), toml=list, expected=_BINDS, check=check_binds, doc="more paths the agent may read"
    )
    bind_rw: tuple[str, ...] = setting(
        (), toml=list, expected=_BINDS, check=check_binds, doc="more paths the agent may write"
    )
    max_processes: int = setting(
        DEFAULT_MAX_PROCESSES,
        low=MIN_PROCESSES,
        high=MAX_PROCESSES,
        doc="processes of one agent's sandbox, threads included (RLIMIT_NPROC)",
    )
    max_memory_mb: int = setting(
        DEFAULT_MAX_MEMORY_MB,
        low=MIN_MEMORY_MB,
        high=MAX_MEMORY_MB,
        doc="private writable memory of each process (RLIMIT_DATA), and of /tmp",
    )
    system_root: str | None = setting(
        None,
        toml=str,
        check=check_system_root,
        doc="the agent's system (/usr, /etc, /opt, /lib*, /bin) from this directory",
    )
    path: str | None = setting(
        None, toml=str, check=check_path, doc="the agent's PATH in system_root's system"
    )

    @property
    def sandboxed(self) -> bool:
        return self.mode == "sandbox"

    @property
    def system(self) -> str:
        """The system the agent sees, as the API says it: ``system_root``, or ``"gateway"``."""
        return self.system_root or "gateway"

    @property
    def agent_path(self) -> str | None:
        """The agent's PATH in a team's system; None: the gateway's environment's, as without."""
        if self.system_root is None:
            return None
        return self.path or DEFAULT_PATH


@dataclass(frozen=True, slots=True)
class Mask:
    """A path the agent must not see: a directory (covered with an empty tmpfs) or a file
    (covered with an empty read-only file)."""

    path: str
    is_dir: bool


@dataclass(frozen=True, slots=True)
class Layout:
    """What the shell found for one agent: the tools, what of ``SYSTEM_DIRS`` exists (a link with
    its target), the session's workspace and HOME (absolute, existing), the masks, and an empty
    read-only file to cover a masked file with (``/dev/null`` would not do: a bind is ``nodev``,
    and opening a device on it fails, which tells the agent something is there)."""

    bwrap: str
    prlimit: str
    workspace: str
    home: str
    empty: str
    system: tuple[tuple[str, str | None], ...] = ()
    extra_ro: tuple[str, ...] = ()  # files a system link points to outside SYSTEM_DIRS
    masks: tuple[Mask, ...] = field(default=())
    # What the gateway's own Python needs, for an agent it runs (the built-in demo and plain
    # profiles): its venv, its installation, the package ``-m`` names. Bound read-only, each only
    # where nothing else shows it already.
    runtime: tuple[str, ...] = ()
    # Files of the gateway's this one command is given (an uploaded image named in its argv):
    # each shown read-only at its own path, over any mask, and nothing else of where it is kept.
    given: tuple[str, ...] = ()
    # A team's system (``system_root``): ``system`` then names what exists under it, bound from
    # there; none of it shows the gateway's files. ``over``: files of the gateway's shown over
    # the team's, (source, where): its network files, a generated passwd and group.
    root: str | None = None
    over: tuple[tuple[str, str], ...] = ()
    # Directories of the team's system rebuilt so that something can be mounted where the team's
    # has no file to mount it on (its read-only image cannot be written): an empty tmpfs with each
    # of its entries bound again from the team's (a link as a link), made read-only once done.
    spliced: tuple[tuple[str, tuple[tuple[str, str | None], ...]], ...] = ()
    user: str | None = None  # the agent's user name in a team's system ($USER, $LOGNAME)


# One mount: (path, order at equal depth, bwrap arguments). Binds show the host's path; the
# others (tmpfs, /proc, /dev, a link, a mask) show nothing of it.
_Op = tuple[str, int, tuple[str, ...], bool]


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")


def _within(path: str, top: str) -> bool:
    """``path`` is ``top`` or below it (both normalised absolute paths)."""
    return path == top or top == "/" or path.startswith(top + "/")


def _system(layout: Layout) -> list[_Op]:
    """The system's mounts: the gateway's own, or a team's from ``root`` (which shows none of the
    gateway's files: no mask is needed there), with its spliced directories and what is shown over
    it."""
    ops: list[_Op] = []
    root = layout.root
    rebuilt = {top for top, _ in layout.spliced}
    for path, target in layout.system:
        if path in rebuilt:
            continue  # made below, entry by entry
        if target is not None:
            ops.append((path, 0, ("--symlink", target, path), False))
        elif root is None:
            ops.append((path, 0, ("--ro-bind", path, path), True))
        else:
            ops.append((path, 0, ("--ro-bind", root + path, path), False))
    if root is None:
        return ops
    over = {where for _, where in layout.over}
    for top, entries in layout.spliced:
        ops.append((top, 0, ("--tmpfs", top), False))
        for name, target in entries:
            path = posixpath.join(top, name)
            if path in over:
                continue
            if target is not None:
                ops.append((path, 0, ("--symlink", target, path), False))
            else:
                ops.append((path, 0, ("--ro-bind", root + path, path), False))
    for source, where in layout.over:
        ops.append((where, 1, ("--ro-bind", source, where), False))
    return ops


def _binds(settings: Isolation, layout: Layout) -> list[_Op]:
    ops = _system(layout)
    for path in layout.extra_ro:
        ops.append((path, 0, ("--ro-bind", path, path), True))
    # Widest first, so a path inside one already bound (the venv inside its checkout's package
    # directory, the interpreter's directory inside its installation) adds no mount of its own.
    for path in sorted({posixpath.normpath(p) for p in layout.runtime}, key=_depth):
        if not is_visible(path, ops):
            ops.append((path, 0, ("--ro-bind", path, path), True))
    ops.append(("/proc", 0, ("--proc", "/proc"), False))
    ops.append(("/dev", 0, ("--dev", "/dev"), False))
    tmp_bytes = str(settings.max_memory_mb << 20)
    ops.append(("/tmp", 0, ("--size", tmp_bytes, "--tmpfs", "/tmp"), False))
    for path in settings.bind_ro:
        ops.append((path, 1, ("--ro-bind", path, path), True))
    for path in settings.bind_rw:
        ops.append((path, 1, ("--bind", path, path), True))
    ops.append((layout.workspace, 2, ("--bind", layout.workspace, layout.workspace), True))
    ops.append((layout.home, 2, ("--bind", layout.home, layout.home), True))
    return ops


def is_visible(path: str, ops: Sequence[_Op]) -> bool:
    """Whether the host's ``path`` shows in the sandbox: the deepest mount at or above it is a
    bind (then the host's files are there), not a tmpfs, a link or a mask."""
    best: _Op | None = None
    for op in ops:
        if _within(path, op[0]) and (
            best is None
            or (_depth(op[0]), op[1])
            >= (
                _depth(best[0]),
                best[1],
            )
        ):
            best = op
    return best is not None and best[3]


def module_run(command: Sequence[str], executable: str) -> str | None:
    """The top-level package ``command`` runs with ``-m`` when it runs the gateway's own Python
    (``executable``): ``gateway`` for the demo profile's ``python -m gateway.demo_agent``; ``""``
    for that Python running anything else (``-c``, a script); ``None`` for another program."""
    if not command or command[0] != executable:
        return None
    if len(command) > 2 and command[1] == "-m":
        return command[2].partition(".")[0]
    return ""


def bwrap_argv(settings: Isolation, layout: Layout, command: Sequence[str], cwd: str) -> list[str]:
    """The argv that runs ``command`` (an agent's, no shell) in the sandbox, in ``cwd``."""
    argv = [
        layout.bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
    ]
    if settings.network == "none":
        argv.append("--unshare-net")
    argv += ["--die-with-parent", "--new-session", "--hostname", "rawp-agent"]
    ops = _binds(settings, layout)
    keep = (layout.workspace, layout.home)
    for mask in sorted(layout.masks, key=lambda m: (_depth(m.path), m.path)):
        # Never over the session's own workspace or HOME (a workspace root that is the session's
        # own workspace); what is above them is covered, and they are bound again on top.
        if mask.path in keep or not is_visible(mask.path, ops):
            continue
        cover: tuple[str, ...] = (
            ("--size", str(MASK_TMPFS_BYTES), "--tmpfs", mask.path)
            if mask.is_dir
            else ("--ro-bind", layout.empty, mask.path)
        )
        ops.append((mask.path, 3, cover, False))
    for path in layout.given:
        ops.append((path, 4, ("--ro-bind", path, path), True))
    for op in sorted(ops, key=lambda op: (_depth(op[0]), op[1])):
        argv += op[2]
    # Once everything inside is mounted: a spliced directory is as read-only as the image.
    for top, _ in layout.spliced:
        argv += ["--remount-ro", top]
    argv += ["--chdir", cwd, "--", layout.prlimit]
    argv += [
        f"--nproc={settings.max_processes}",
        f"--data={settings.max_memory_mb << 20}",
        "--",
        *command,
    ]
    return argv


def sandbox_environment(
    env: Mapping[str, str], settings: Isolation, layout: Layout, template: str | None = None
) -> dict[str, str]:
    """The agent's environment inside: ``env`` (already without the gateway's settings) with
    ``HOME`` the session's own, a variable naming a path in ``template`` (the profile's own
    ``HOME``, which the session's was copied from) naming the same path in the session's HOME,
    ``TMPDIR`` the private ``/tmp`` unless it names a directory the agent writes to, and the XDG
    directories it cannot see dropped."""
    out = dict(env)
    if template:
        top = posixpath.normpath(template)
        for name, value in env.items():
            if value.startswith("/") and _within(posixpath.normpath(value), top):
                out[name] = layout.home + posixpath.normpath(value)[len(top) :]
    out["HOME"] = layout.home
    if settings.agent_path is not None:  # a team's system: an image volume carries no ENV
        out["PATH"] = settings.agent_path
    if layout.user is not None:
        out["USER"] = out["LOGNAME"] = layout.user
    writable = ("/tmp", layout.workspace, layout.home, *settings.bind_rw)

    def shown(value: str) -> bool:
        path = posixpath.normpath(value) if value.startswith("/") else ""
        return bool(path) and any(_within(path, top) for top in writable)

    if not shown(out.get("TMPDIR", "/tmp")):
        out["TMPDIR"] = "/tmp"
    for name in _DIR_VARIABLES:
        if name in out and not shown(out[name]):
            del out[name]
    return out


def _entries(text: str) -> list[list[str]]:
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def passwd_with(text: str, uid: int, gid: int, name: str, home: str) -> str | None:
    """A team's ``/etc/passwd`` (``text``) with a line for ``uid`` when it has none (``None`` when
    it has one: the team's file is shown as it is): named ``name``, or ``AGENT_USER`` when the team
    uses that name for another uid, with ``home``, so that ``id -un``, ``whoami`` and what looks
    up its HOME in passwd work in the agent."""
    lines = _entries(text)
    if any(len(f) > 2 and f[2] == str(uid) for f in lines):
        return None
    taken = {f[0] for f in lines}
    user = name if name and name not in taken and _plain(name) else AGENT_USER
    shell = "/bin/sh"
    return (
        text.rstrip("\n")
        + ("\n" if text.strip() else "")
        + (f"{user}:x:{uid}:{gid}::{home}:{shell}\n")
    )


def group_with(text: str, gid: int, name: str) -> str | None:
    """A team's ``/etc/group`` with a group for ``gid`` when it has none (``None`` when it has)."""
    lines = _entries(text)
    if any(len(f) > 2 and f[2] == str(gid) for f in lines):
        return None
    taken = {f[0] for f in lines}
    group = name if name and name not in taken and _plain(name) else AGENT_USER
    return text.rstrip("\n") + ("\n" if text.strip() else "") + f"{group}:x:{gid}:\n"


def _plain(name: str) -> bool:
    """A name that can stand in a passwd line as it is."""
    return len(name) <= 32 and all(c.isalnum() or c in "._-" for c in name)


# What a process says when a limit stopped it: (words in its stderr, the limit's name).
_LIMIT_SIGNS: Final = (
    (
        (
            "Resource temporarily unavailable",
            "fork: retry",
            "EAGAIN",
            "can't fork",
            "Cannot fork",
            "BlockingIOError",
        ),
        "max_processes",
    ),
    (
        (
            "Cannot allocate memory",
            "MemoryError",
            "out of memory",
            "ENOMEM",
            "Allocation failed",
            "std::bad_alloc",
        ),
        "max_memory_mb",
    ),
)


def limit_named(settings: Isolation, stderr: str) -> str | None:
    """For an agent that ended badly in the sandbox: the limit its last words point at, as a
    sentence for ``agent.error`` (``None`` when they point at none). Read once, at its exit."""
    if not settings.sandboxed:
        return None
    for signs, name in _LIMIT_SIGNS:
        if any(sign in stderr for sign in signs):
            value = settings.max_processes if name == "max_processes" else settings.max_memory_mb
            return f"the sandbox's {name} ({value}) was likely reached ([isolation] {name})"
    return None
