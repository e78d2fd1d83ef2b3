"""Run a real agent CLI against its scripted model server, as a scenario says.

Theory of operation
-------------------
``scripted_cli(scenario)`` is an async context manager that prepares everything *but* the CLI
process: a fresh directory with a throwaway ``home/`` and a ``workspace/`` (holding the scenario's
files), the agent's scripted server listening on 127.0.0.1 (a free port), the environment from
``env.agent_env`` and the argv. End-to-end tests use it when the gateway is to spawn the CLI
itself: they read ``cli.argv``, ``cli.env`` and ``cli.cwd`` and assert on ``cli.server.requests``.

``run_scenario(scenario)`` (or ``cli.run()``) also drives the CLI: it spawns it in a new process
group, writes the initial stdin lines, performs the scenario's actions when their trigger fires
(server progress, a stdout line, start), collects stdout lines, stderr and the exit status, and
kills the whole process group after the hard timeout or once the CLI has exited (so a tool's
child processes never outlive a run). The result is a ``RunResult``.

Both are plain asyncio and need no pytest: the recorder (record.py) uses them too.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import env as rigenv
from .scenario import (
    Action,
    RunSpec,
    Scenario,
    contains,
    expand,
    fill_from,
    find_scenario,
    load_scenario,
)
from .server import RecordedRequest, ScriptedServer

STREAM_LIMIT = 64 * 1024 * 1024  # one stdout line (e.g. a big tool result) may be large


def make_server(agent: str, calls: list[dict[str, Any]] | None = None) -> ScriptedServer:
    """The agent's scripted model server (not started), answering ``calls``."""
    module, cls = rigenv.spec(agent).server.split(":")
    return getattr(importlib.import_module(module), cls)(calls)


def resolve(scenario: Scenario | str | Path, agent: str | None = None) -> Scenario:
    """A Scenario from itself, a .toml path, or a scenario name of ``agent``."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, Path) or str(scenario).endswith(".toml"):
        return load_scenario(scenario)
    if not agent:
        raise ValueError("a scenario given by name needs agent=")
    return find_scenario(agent, str(scenario))


@dataclass
class RunResult:
    scenario: str
    variant: str | None
    agent: str
    argv: list[str]
    argv_normalised: list[str]
    stdin_lines: list[str]  # as written (normalised like argv)
    stdout_lines: list[str]  # decoded, without line ends
    stdout_bytes: bytes  # exactly as printed
    stdout_times: list[float]  # when each stdout line arrived, seconds after the spawn
    stdin_times: list[float]  # when each stdin line was written, seconds after the spawn
    stderr: str
    exit_code: int | None  # None when the process died of a signal
    signal: str | None  # e.g. "SIGKILL" when it died of one
    timed_out: bool
    duration: float
    base_url: str
    workspace: Path
    home: Path
    requests: list[RecordedRequest]
    unexpected: list[RecordedRequest]
    unused_calls: list[int]
    log: list[str] = field(default_factory=list)  # what the runner did, with times
    unfired_actions: list[str] = field(default_factory=list)  # actions whose trigger never came

    @property
    def events(self) -> list[dict[str, Any]]:
        """stdout lines parsed as JSON (lines that are not JSON are skipped)."""
        out = []
        for line in self.stdout_lines:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def of_type(self, type_: str, subtype: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("type") == type_ and (subtype is None or e.get("subtype") == subtype)
        ]

    def describe(self) -> str:
        """A short account for assertion messages."""
        return (
            f"{self.scenario}{'--' + self.variant if self.variant else ''}: exit={self.exit_code}"
            f" signal={self.signal} timed_out={self.timed_out} duration={self.duration:.1f}s\n"
            f"argv: {self.argv_normalised}\nrunner: {self.log}\n"
            f"unfired actions: {self.unfired_actions}\n"
            f"requests: {[(r.path, r.answer) for r in self.requests]}\n"
            f"stderr: {self.stderr[-2000:]}\nstdout tail: {self.stdout_lines[-5:]}"
        )


@dataclass
class CliSetup:
    """A started scripted server plus what is needed to spawn the CLI against it."""

    scenario: Scenario
    agent: str
    server: ScriptedServer
    base_url: str
    binary: Path
    argv: list[str]  # binary first
    env: dict[str, str]
    cwd: Path  # the workspace
    home: Path
    root: Path  # holds home/ and workspace/
    prior_results: list[RunResult] = field(default_factory=list)

    @property
    def names(self) -> dict[str, str]:
        return {"workspace": str(self.cwd), "home": str(self.home), "base_url": self.base_url}

    def expand(self, value: Any) -> Any:
        return expand(value, self.names)

    def normalise(self, text: str) -> str:
        """Undo the run-specific parts of a string (paths, port) for storing it in a fixture."""
        text = text.replace(str(self.binary), rigenv.spec(self.agent).bin_name)
        for k, v in sorted(self.names.items(), key=lambda kv: -len(kv[1])):
            text = text.replace(v, "{" + k + "}")
        return text

    async def run(self, timeout: float | None = None) -> RunResult:
        timeout = timeout or self.scenario.run.timeout
        for args in self.scenario.run.prior:
            # Earlier runs (e.g. the session a --resume continues): no stdin, no actions.
            prior = RunSpec(args=args, timeout=timeout)
            r = await _drive(self, prior, timeout)
            if r.exit_code != 0:
                raise RuntimeError(f"prior run failed: {r.describe()}")
            self.prior_results.append(r)
        return await _drive(self, self.scenario.run, timeout)


@contextlib.asynccontextmanager
async def scripted_cli(
    scenario: Scenario | str | Path,
    *,
    agent: str | None = None,
    variant: str | None = None,
    workdir: Path | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    keep: bool = False,
) -> AsyncIterator[CliSetup]:
    """Start the scenario's scripted server and prepare home, workspace, env and argv.

    ``workdir``: use (and empty) this directory instead of a temporary one, e.g. so recorded
    fixtures show stable paths. ``keep``: leave the directory for inspection afterwards.
    """
    sc = resolve(scenario, agent).variant(variant)
    binary = rigenv.cli_path(sc.agent)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        root = workdir
    else:
        root = Path(tempfile.mkdtemp(prefix=f"rig-{sc.agent}-"))
    home = rigenv.make_home(sc.agent, root / "home")
    cwd = root / "workspace"
    cwd.mkdir()
    names = {"workspace": str(cwd), "home": str(home)}
    server = make_server(sc.agent, expand(sc.calls, names))
    try:
        base_url = await server.start()
        names["base_url"] = base_url
        for rel, content in sc.run.files.items():
            path = cwd / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, dict):  # { base64 = "..." }: a binary file (an image)
                path.write_bytes(base64.b64decode(content["base64"]))
            else:
                path.write_text(expand(content, names))
        env = rigenv.agent_env(
            sc.agent, base_url=base_url, home=home, extra=expand(sc.run.env, names)
        )
        argv = [str(binary), *expand(sc.run.args, names), *extra_args]
        yield CliSetup(sc, sc.agent, server, base_url, binary, argv, env, cwd, home, root)
    finally:
        await server.close()
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)


async def run_scenario(
    scenario: Scenario | str | Path, *, timeout: float | None = None, **setup: Any
) -> RunResult:
    """Run the CLI for a scenario against its scripted server; see the module doc. ``setup``:
    ``scripted_cli``'s keywords (agent, variant, workdir, extra_args)."""
    async with scripted_cli(scenario, **setup) as cli:
        return await cli.run(timeout)


def _line(value: Any) -> str:
    """A stdin line: tables become one line of compact JSON, strings are sent as they are."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def _drive(cli: CliSetup, spec: RunSpec, timeout: float) -> RunResult:
    sc, server = cli.scenario, cli.server
    argv = [str(cli.binary), *cli.expand(spec.args)] if spec is not sc.run else cli.argv
    t0 = time.monotonic()
    log: list[str] = []
    stdin_lines: list[str] = []
    stdin_times: list[float] = []
    stdout_lines: list[str] = []
    stdout_times: list[float] = []
    stdout_raw: list[bytes] = []
    stderr_chunks: list[bytes] = []
    tasks: list[asyncio.Task[Any]] = []

    def note(what: str) -> None:
        log.append(f"{time.monotonic() - t0:.2f}s {what}")

    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cli.cwd,
        env=cli.env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group: a timeout kills tools' children too
        limit=STREAM_LIMIT,
    )
    assert proc.stdin and proc.stdout and proc.stderr
    stdin = proc.stdin

    async def write(value: Any) -> None:
        text = _line(cli.expand(value))
        if stdin.is_closing():
            note(f"stdin already closed, not sent: {text[:80]}")
            return
        stdin_lines.append(cli.normalise(text))
        stdin_times.append(time.monotonic() - t0)
        try:
            stdin.write(text.encode() + b"\n")
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            note("stdin broken")

    def close_stdin() -> None:
        if not stdin.is_closing():
            stdin.close()
            note("stdin closed")

    fired: set[int] = set()

    async def perform(a: Action, source: Any) -> None:
        fired.add(id(a))
        if a.delay:
            await asyncio.sleep(a.delay)
        if a.do == "write":
            note(f"write ({a.on})")
            await write(fill_from(a.line, source))
        elif a.do == "close_stdin":
            close_stdin()
        elif a.do == "signal":
            note(f"{a.signal}{' to the group' if a.group else ''} ({a.on})")
            with contextlib.suppress(ProcessLookupError):
                sig = getattr(signal, a.signal or "")
                # The Gemini CLI relaunches itself as a child and its parent ignores SIGINT and
                # SIGTERM, so only a signal to the whole group reaches the process that acts.
                if a.group:
                    os.killpg(proc.pid, sig)
                else:
                    proc.send_signal(sig)

    async def on_server(a: Action) -> None:
        if a.on == "call":
            await server.wait_call(a.call or 1)
        else:
            await server.wait_hang(a.count)
        await perform(a, None)

    stdout_actions = [a for a in spec.actions if a.on == "stdout"]
    seen = [0] * len(stdout_actions)

    async def read_stdout() -> None:
        async for raw in proc.stdout:
            stdout_times.append(time.monotonic() - t0)
            stdout_raw.append(raw)
            line = raw.decode("utf-8", "replace").rstrip("\n")
            stdout_lines.append(line)
            if not stdout_actions:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            for i, a in enumerate(stdout_actions):
                if seen[i] < a.count and contains(obj, a.match):
                    seen[i] += 1
                    if seen[i] == a.count:
                        tasks.append(asyncio.create_task(perform(a, obj)))

    async def read_stderr() -> None:
        async for raw in proc.stderr:
            stderr_chunks.append(raw)

    readers = [asyncio.create_task(read_stdout()), asyncio.create_task(read_stderr())]
    tasks += [asyncio.create_task(on_server(a)) for a in spec.actions if a.on in ("call", "hang")]
    for value in spec.stdin:
        await write(value)
    # "auto": close now unless an action will still write to stdin or close it itself.
    stdin_later = any(a.do in ("write", "close_stdin") for a in spec.actions)
    if spec.close_stdin == "start" or (spec.close_stdin == "auto" and not stdin_later):
        close_stdin()
    for a in spec.actions:
        if a.on == "start":
            tasks.append(asyncio.create_task(perform(a, None)))

    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        timed_out = True
        note(f"timeout after {timeout}s: killing the process group")
    # Whether it exited or timed out, nothing it started may live on (e.g. a Bash tool's sleep).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()
    note(f"exited {proc.returncode}")
    _, pending = await asyncio.wait(readers, timeout=5)
    for t in [*pending, *tasks]:
        t.cancel()
    await asyncio.gather(*pending, *tasks, return_exceptions=True)

    rc = proc.returncode
    return RunResult(
        scenario=sc.name,
        variant=sc.active_variant,
        agent=cli.agent,
        argv=list(argv),
        argv_normalised=[cli.normalise(a) for a in argv],
        stdin_lines=stdin_lines,
        stdout_lines=stdout_lines,
        stdout_bytes=b"".join(stdout_raw),
        stdout_times=stdout_times,
        stdin_times=stdin_times,
        stderr=b"".join(stderr_chunks).decode("utf-8", "replace"),
        exit_code=rc if rc is not None and rc >= 0 else None,
        signal=signal.Signals(-rc).name if rc is not None and rc < 0 else None,
        timed_out=timed_out,
        duration=time.monotonic() - t0,
        base_url=cli.base_url,
        workspace=cli.cwd,
        home=cli.home,
        requests=list(server.requests),
        unexpected=server.unexpected,
        unused_calls=server.unused_calls,
        log=log,
        unfired_actions=[
            f"{a.do} on {a.on}" + (f" {a.match}" if a.match else "") + f" (count {a.count})"
            for a in spec.actions
            if id(a) not in fired
        ],
    )
