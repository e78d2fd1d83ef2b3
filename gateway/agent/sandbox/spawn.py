"""The sandbox's shell: finding ``bwrap`` and ``prlimit``, proving once that bubblewrap can make a
sandbox here (``probe``), looking at the disk for what ``plan.bwrap_argv`` needs (``layout``), the
HOME each session keeps, and ``SpawnSandbox``, which ``AgentProcess.start`` asks to wrap every
agent command it runs in sandbox mode.

A probe really runs ``bwrap`` with the very options an agent gets (``true`` as the command), so
whatever keeps it from working (no ``bwrap``, user namespaces refused by the kernel, by AppArmor or
by the container runtime's seccomp profile) is found where it happens and said in one line. A
success is remembered for the process; a failure is not, so a fix takes effect without a restart.

Each session's HOME is ``<state_dir>/sessions/<id>/home`` with a state dir (it is kept, and removed,
with the session's other files, so the agent's saved conversations survive a restart of the
gateway), else a directory of a per-gateway temporary root, removed when the session ends.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Final

from gateway.agent.exit import AgentStartError, missing_executable
from gateway.agent.sandbox import system
from gateway.agent.sandbox.plan import (
    NETWORK_FILES,
    Isolation,
    Layout,
    Mask,
    bwrap_argv,
    module_run,
    sandbox_environment,
)
from gateway.agent.sandbox.system import system_entries
from gateway.storage import nofollow

__all__ = [
    "HOME_DIR",
    "MAX_COPY_BYTES",
    "MAX_COPY_ENTRIES",
    "HomeTooLarge",
    "SpawnSandbox",
    "copy_home",
    "forget_workspace",
    "layout",
    "missing_command",
    "probe",
    "register_workspace",
    "remove_temp_home",
    "runtime",
    "session_home",
    "usable",
]

HOME_DIR: Final = "home"  # a session's HOME, in its state-dir directory
PROBE_TIMEOUT_SEC: Final = 10.0
# A HOME copied into a session that continues a conversation saved in it, at most.
MAX_COPY_BYTES: Final = 256 << 20
MAX_COPY_ENTRIES: Final = 20_000
_MAX_COPY_DEPTH: Final = 32
_INSTALL_HINT: Final = (
    "install Debian's bubblewrap (apt-get install bubblewrap; scripts/install-bubblewrap.sh) "
    'or set [isolation] mode = "none"'
)
# Files a system link may point to outside the system directories, needed by most agents
# (/etc/resolv.conf -> /run/systemd/resolve/stub-resolv.conf: no name lookups without it).
_LINKED_FILES: Final = ("/etc/resolv.conf",)

# (bwrap, network, system_root) proven to work in this process
_usable: set[tuple[str, str, str | None]] = set()
# Workspaces of the sessions of this process (id -> path): one inside another session's workspace
# is masked from that session's agent.
_workspaces: dict[str, str] = {}
_temp_root: str | None = None


def register_workspace(session_id: str, workspace: str) -> None:
    _workspaces[session_id] = os.path.abspath(workspace)


def forget_workspace(session_id: str) -> None:
    _workspaces.pop(session_id, None)


def _tools(env: Mapping[str, str], settings: Isolation | None = None) -> tuple[str, str]:
    """``bwrap`` on the gateway's PATH and ``prlimit`` (which runs inside the sandbox: the
    gateway's, or a team's system's own on the agent's PATH there), or ``AgentStartError`` saying
    which is missing and how to get it."""
    path = env.get("PATH", os.defpath)
    bwrap = shutil.which("bwrap", path=path)
    if bwrap is None:
        raise AgentStartError(f'[isolation] mode = "sandbox" needs bwrap on PATH: {_INSTALL_HINT}')
    if settings is not None and settings.system_root is not None:
        root = settings.system_root
        problem = system.missing(root)
        if problem is not None:
            raise AgentStartError(problem)
        agent_path = settings.agent_path or ""
        found = system.find(root, "prlimit", f"{agent_path}:/usr/bin:/bin")
        if found is None:
            # The limits are set inside the sandbox's user namespace, after bwrap made it, by a
            # program of the system the agent runs on: its loader and libc are the team's.
            raise AgentStartError(
                f"[isolation] system_root {root} has no prlimit (util-linux) on the agent's PATH, "
                "which sets the sandbox's limits: install util-linux in the team's image"
            )
        return bwrap, found[0]
    prlimit = shutil.which("prlimit", path=path)
    if prlimit is None:
        raise AgentStartError(
            '[isolation] mode = "sandbox" needs prlimit on PATH (util-linux; '
            "apt-get install util-linux)"
        )
    return bwrap, os.path.realpath(prlimit)


def runtime(command: Sequence[str]) -> tuple[str, ...]:
    """What ``command`` needs visible when it runs the gateway's own Python (the built-in demo and
    plain profiles; docs/isolation.md): the venv (``sys.prefix``: its ``pyvenv.cfg`` and
    site-packages), the installation (``sys.base_prefix``: the interpreter and the standard
    library) and the directory the interpreter really is in, and for ``-m PACKAGE...`` that
    package's directories, where they are (an editable install's are in its checkout, and only
    they are shown of it). Nothing for any other command."""
    top = module_run(command, sys.executable)
    if top is None:
        return ()
    paths = [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    if top:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            paths += spec.submodule_search_locations or ()
            if spec.origin and spec.submodule_search_locations is None:
                paths.append(spec.origin)  # a single-file module
    return tuple(os.path.abspath(p) for p in paths if os.path.isabs(p))


def layout(
    settings: Isolation,
    *,
    bwrap: str,
    prlimit: str,
    workspace: str,
    home: str,
    hidden: Iterable[str],
    command: Sequence[str] = (),
    given: Sequence[str] = (),
) -> Layout:
    """What is on disk for one agent: the system directories that exist (links kept as links),
    the files their links point to, and a ``Mask`` for each hidden path that exists (and for
    where it really is, when a link leads there). With ``system_root``: the team's system's
    (``team_layout``)."""
    masks: dict[str, Mask] = {}
    for path in hidden:
        for where in {os.path.abspath(path), os.path.realpath(path)}:
            try:
                st = os.stat(where)
            except OSError:
                continue
            masks[where] = Mask(where, stat.S_ISDIR(st.st_mode))
    plan = Layout(
        bwrap=bwrap,
        prlimit=prlimit,
        workspace=os.path.abspath(workspace),
        home=os.path.abspath(home),
        # Made only when some file is to be covered with it (never for the probe).
        empty=_empty_file() if any(not m.is_dir for m in masks.values()) else os.devnull,
        masks=tuple(masks.values()),
        given=tuple(os.path.abspath(path) for path in given),
    )
    if settings.system_root is not None:
        return team_layout(settings, plan, settings.system_root)
    return _gateway_layout(plan, command)


def _gateway_layout(plan: Layout, command: Sequence[str]) -> Layout:
    """The gateway's own system: its directories, the files its links lead to elsewhere, and its
    own Python when the command runs on it."""
    system = system_entries("")  # the gateway's own: "" is its root
    tops = tuple(p for p, _ in system)
    extra = []
    for path in _LINKED_FILES:
        real = os.path.realpath(path)
        if (
            real != path
            and os.path.isfile(real)
            and not real.startswith(tuple(t + "/" for t in tops))
        ):
            extra.append(real)
    return replace(plan, system=system, extra_ro=tuple(extra), runtime=runtime(command))


def team_layout(settings: Isolation, plan: Layout, root: str) -> Layout:
    """A team's system under ``root``: its directories, the gateway's network files over its
    own, a passwd and group that know the agent's uid, and the directories to rebuild where any
    of these or a bind has no mount point in the image. The gateway's own Python is not shown:
    it would bring the gateway's system back (its ``/usr``)."""
    over: list[tuple[str, str]] = [
        (os.path.realpath(path), path) for path in NETWORK_FILES if os.path.isfile(path)
    ]
    users, user = system.users(root, plan.home, _temp())
    over += users
    binds = [
        *((p, os.path.isdir(p)) for p in (*settings.bind_ro, *settings.bind_rw)),
        (plan.workspace, True),
        (plan.home, True),
        *((p, False) for p in plan.given),
    ]
    spliced, landed = system.splices(root, [*((w, False) for _, w in over), *binds])
    for path, _ in binds:
        if landed[path] != path:
            raise AgentStartError(
                f"{path} lies under a link of system_root {root}'s system ({landed[path]}): "
                "it cannot be shown at its own path there"
            )
    return replace(
        plan,
        root=root,
        system=system.system_entries(root),
        over=tuple((source, landed[where]) for source, where in over),
        spliced=spliced,
        user=user,
    )


async def probe(settings: Isolation, env: Mapping[str, str] | None = None) -> str | None:
    """``None`` when bubblewrap makes this sandbox here, else one line: what is missing and how to
    fix it. Runs ``bwrap`` once, with an agent's options, on a scratch workspace and HOME."""
    env = os.environ if env is None else env
    try:
        bwrap, prlimit = _tools(env, settings)
    except AgentStartError as err:
        return str(err)
    if (bwrap, settings.network, settings.system_root) in _usable:
        return None
    with tempfile.TemporaryDirectory(prefix="rawp-sandbox-probe-") as scratch:
        workspace, home = os.path.join(scratch, "w"), os.path.join(scratch, "h")
        os.mkdir(workspace)
        os.mkdir(home)
        try:
            plan = layout(
                settings, bwrap=bwrap, prlimit=prlimit, workspace=workspace, home=home, hidden=()
            )
        except (AgentStartError, OSError) as err:
            return str(err)
        # In a team's system its own prlimit proves its loader and libc run there.
        true = (
            [prlimit, "--version"]
            if settings.system_root is not None
            else [shutil.which("true", path="/usr/bin:/bin") or "/bin/true"]
        )
        argv = bwrap_argv(settings, plan, true, workspace)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env={"PATH": env.get("PATH", os.defpath)},
            )
            async with asyncio.timeout(PROBE_TIMEOUT_SEC):
                _, said_bytes = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return f"bwrap did not make a sandbox within {PROBE_TIMEOUT_SEC:g} s ({bwrap})"
        except OSError as exc:
            return f"cannot run {bwrap}: {exc.strerror or exc}; {_INSTALL_HINT}"
    if proc.returncode != 0:
        said = (
            " ".join(said_bytes.decode(errors="replace").split())[:300] or f"exit {proc.returncode}"
        )
        return (
            f"bubblewrap cannot make the agent sandbox here ({said}): user namespaces are "
            "likely refused (kernel.unprivileged_userns_clone, user.max_user_namespaces, "
            "AppArmor's apparmor_restrict_unprivileged_userns, or a container's seccomp/AppArmor "
            'profile: docs/isolation.md), or set [isolation] mode = "none"'
        )
    _usable.add((bwrap, settings.network, settings.system_root))
    return None


def usable(settings: Isolation, env: Mapping[str, str] | None = None) -> bool:
    """A probe of these tools and network mode succeeded in this process."""
    try:
        bwrap, _ = _tools(os.environ if env is None else env, settings)
    except AgentStartError:
        return False
    return (bwrap, settings.network, settings.system_root) in _usable


def _temp() -> str:
    """This gateway's temporary root (HOMEs without a state dir, the empty file), made once."""
    global _temp_root
    if _temp_root is None or not os.path.isdir(_temp_root):
        _temp_root = tempfile.mkdtemp(prefix="rawp-gateway-homes-")
        # Its sessions' HOMEs go as they end; the root and its empty file with the gateway.
        atexit.register(shutil.rmtree, _temp_root, True)
    return _temp_root


def _empty_file() -> str:
    """An empty file nobody may write, to cover a masked file with."""
    path = os.path.join(_temp(), ".empty")
    if not os.path.isfile(path) or os.path.getsize(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o444)
        os.close(fd)
    return path


def session_home(session_id: str, saved: tuple[int, str] | None) -> str:
    """The session's HOME, made if new: ``home`` in its state-dir directory (``saved``: its
    descriptor and path), else in this gateway's temporary root."""
    if saved is not None:
        dir_fd, path = saved
        with contextlib.suppress(FileExistsError):
            os.mkdir(HOME_DIR, 0o700, dir_fd=dir_fd)
        # Never through a link the agent may have left in place of its HOME.
        os.close(nofollow.open_dir(HOME_DIR, dir_fd=dir_fd))
        return os.path.join(path, HOME_DIR)
    home = os.path.join(_temp(), session_id)
    with contextlib.suppress(FileExistsError):
        os.mkdir(home, 0o700)
    return home


def remove_temp_home(session_id: str) -> None:
    """The session ended: a HOME outside the state dir goes (one in it goes with its directory)."""
    if _temp_root is not None:
        with contextlib.suppress(OSError):
            fd = nofollow.open_dir(_temp_root)
            try:
                nofollow.remove_tree(fd, session_id)
            finally:
                os.close(fd)


class HomeTooLarge(Exception):
    """A HOME over ``MAX_COPY_BYTES`` or ``MAX_COPY_ENTRIES``: not copied."""


def copy_home(source: str, target: str) -> None:
    """``source``'s directories and regular files into ``target`` (a new session's HOME, which
    continues a conversation ``source``'s agent saved), never through a link: an agent's HOME is
    untrusted, links, FIFOs and devices are left out. ``HomeTooLarge`` past the bounds (blocking
    I/O: run it in a worker thread)."""
    budget = [MAX_COPY_BYTES, MAX_COPY_ENTRIES]
    src = nofollow.open_dir(source)
    dst = nofollow.open_dir(target, create=True)
    try:
        _copy_dir(src, dst, budget, 0)
    finally:
        os.close(src)
        os.close(dst)


def _copy_dir(src: int, dst: int, budget: list[int], depth: int) -> None:
    with os.scandir(src) as entries:
        for entry in entries:
            budget[1] -= 1
            if budget[1] < 0 or depth > _MAX_COPY_DEPTH:
                raise HomeTooLarge(f"more than {MAX_COPY_ENTRIES} entries")
            if entry.is_dir(follow_symlinks=False):
                inner = nofollow.open_dir(entry.name, dir_fd=src)
                try:
                    out = nofollow.open_dir(entry.name, dir_fd=dst, create=True)
                    try:
                        _copy_dir(inner, out, budget, depth + 1)
                    finally:
                        os.close(out)
                finally:
                    os.close(inner)
            elif entry.is_file(follow_symlinks=False):
                size = entry.stat(follow_symlinks=False).st_size
                budget[0] -= size
                if budget[0] < 0:
                    raise HomeTooLarge(f"more than {MAX_COPY_BYTES >> 20} MiB")
                try:
                    data = nofollow.read_file(src, entry.name, size)
                except OSError:  # changed while copied (grew, went): the agent's business
                    continue
                nofollow.replace_file(dst, entry.name, data, fsync=False)


def missing_command(
    settings: Isolation, program: str, env: Mapping[str, str]
) -> AgentStartError | None:
    """Why an agent's ``program`` cannot be started, told before anything is created: in a team's
    system (``system_root``), a program its PATH there does not find; else ``missing_executable``
    on ``env``'s PATH."""
    if settings.system_root is None or not settings.sandboxed or "{" in program:
        return missing_executable(program, env)
    try:
        _command(settings, settings.system_root, [program])
    except AgentStartError as err:
        return err
    return None


def _command(settings: Isolation, root: str, argv: Sequence[str]) -> str:
    """The program ``argv`` runs, as the agent finds it in a team's system: on its PATH there, or
    shown by a bind (the gateway's own Claude Code, read-only); else ``AgentStartError``."""
    path = settings.agent_path or ""
    shown = (*settings.bind_ro, *settings.bind_rw)
    found = system.find(root, argv[0], path, shown)
    if found is None:
        raise AgentStartError(
            f"{argv[0]!r} is not in system_root {root}'s system on the agent's PATH ({path}) nor "
            "in a bind_ro: install it in the team's image, set [isolation] path, or bind the "
            "gateway's own read-only (docs/isolation.md)"
        )
    return found[0]


class SpawnSandbox:
    """How one agent command is run in the sandbox: ``await wrap(argv, env, cwd)`` gives the
    ``bwrap`` argv and the environment to start it with (``env`` has no gateway setting already:
    ``bwrap``'s own environment is what the sandbox's ``/proc/1/environ`` shows)."""

    __slots__ = ("given", "hidden", "home", "settings", "template", "workspace")

    def __init__(
        self,
        settings: Isolation,
        *,
        workspace: str,
        home: str,
        hidden: Sequence[str],
        template: str | None = None,
        given: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.given = given  # files of the gateway's the command names (an uploaded image)
        self.workspace = os.path.abspath(workspace)
        self.home = home
        self.hidden = hidden
        # The profile's own HOME (its env's), if it names one: what a new HOME starts as.
        self.template = template if template and os.path.isabs(template) else None

    async def seed_home(self) -> None:
        """A new (empty) HOME gets the profile's HOME first, if it names one; before anything
        else is written into it (an agent's settings: gateway/agent/mcp_home.py)."""
        if self.template is not None and os.path.isdir(self.template) and not os.listdir(self.home):
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, copy_home, self.template, self.home)
            except (HomeTooLarge, OSError) as err:
                raise AgentStartError(
                    f"the profile's HOME {self.template} cannot be copied into the session's: {err}"
                ) from None

    async def wrap(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> tuple[list[str], dict[str, str]]:
        problem = await probe(self.settings, env)
        if problem is not None:
            raise AgentStartError(problem)
        bwrap, prlimit = _tools(env, self.settings)
        await self.seed_home()
        others = [
            path
            for path in _workspaces.values()
            if path != self.workspace and path.startswith(self.workspace + "/")
        ]
        plan = layout(
            self.settings,
            bwrap=bwrap,
            prlimit=prlimit,
            workspace=self.workspace,
            home=self.home,
            hidden=[*self.hidden, *others],
            command=argv,
            given=self.given,
        )
        if plan.root is not None:
            argv = [_command(self.settings, plan.root, argv), *argv[1:]]
        return (
            bwrap_argv(self.settings, plan, argv, cwd),
            sandbox_environment(env, self.settings, plan, self.template),
        )
