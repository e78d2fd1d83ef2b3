"""Capacity of one gateway of a fleet against websocketd at the same work, in the same run: N
sessions of a recorded working session at its recorded pace, the same masters sending the same
prompts at the same times; and what the agents themselves cost beside it.

Theory of operation
-------------------
Two relays take turns, rounds interleaved (gateway, websocketd, websocketd, gateway, ...), each
round on its own with the machine to itself: one gateway process (``relay_rig.Gateway``: the real
server on uvloop, ``synth_agent.py`` as its agent) and Debian's websocketd (``relay_rig.Websocketd``,
as ``bench_vs_websocketd.py`` runs it: a relay in Go that moves each stdout line of a process it
starts per connection to a WebSocket message, without parsing it; the floor for the transport).

In a round, ``--sessions`` connections, each with its own agent: the gateway's sessions are created
over HTTP (``POST /v1/session``) and get one master each (``relay_rig.LeanMaster``); websocketd's
masters connect (the same ``LeanMaster`` at ``/``, no subprotocol), which starts their agents. Both
run the same synthetic agent replaying ``--transcript``, by default
``tests/fixtures/claude-code/working-session.jsonl``: the real Claude Code 2.1 with the gateway's
flags, recorded by the rig with its timing (three prompts, a person's 30 s and 25 s between them; a
model paced like a real one, about 25 text deltas a second after a second or so to the first token;
real tools). Each master sends the recording's prompts at the times they were written in it (to the
gateway as ``control.prompt.request``, to websocketd as the stream-json line the gateway would
write to the agent's stdin), and the agent answers each with the recorded turn at its recorded pace
(``synth_agent.py``), each text and thinking delta stamped with the time it was written; after the
last turn a session waits the recording's mean think time and starts again. The masters start at
random times over the first cycle (the warm-up, the same seed for every round), so from then on
they are spread evenly over it: what one relay sees from that many people working at once. Measured
over ``--seconds`` after the warm-up, per relay, the best of ``--rounds``:

* the relay's own CPU (its process, every thread, not its children), in cores; the agents' CPU
  apart (their processes and their ended tools'); the relay's CPU as a share of the agents';
* the relay's resident memory per session (RSS after opening the connections, then after the run,
  less RSS before; the agents are processes of their own);
* latency from the agent's write to the master's receive, p50 and p99;

and the gateway's figures besides: µs a line and the kernel's share, sessions per core at this
pace, its garbage collections of 1 ms or more.

``--router`` puts the fleet's router in the gateway's rounds: Debian's nginx running
``deploy/k8s/router/default.conf.template`` (rendered by ``tests/support/fleet_rig.py`` as the tests
do); the sessions are created through it and the even masters connect through it, the odd ones
straight to the gateway: what the router adds to latency, under the same load. The comparison
with websocketd then counts the direct masters only.

``--agent claude-code`` runs the real Claude Code instead of the synthetic agent (the gateway
alone: websocketd cannot give each connection a model server of its own): per session a scripted
model server (``tests/support/rig``, the recording's own scenario, ``working-session.toml``, its
model's answers repeated for as many cycles as the round lasts), a throwaway HOME and workspace, and
a profile that is the built-in ``claude-code`` with the recording's flags. The masters send the same
prompts at the same times; what it prints that matters is the gateway's CPU as a share of real
agents' (no latency: the real CLI's lines carry no stamp). Default ``--sessions 24``.

``--rate N`` replays the recording's messages in a loop at N lines/s a session instead, all sessions
at once (a stress: at the recorded pace a session streams only while its model answers).

``--profile PATH`` samples the gateway with py-spy (in the ``bench`` extra, pinned; sampling another
process needs root or ptrace rights) over the measured window of its last round and writes the
samples to PATH: speedscope JSON, or py-spy's raw collapsed stacks when PATH ends in ``.txt``. py-spy
samples 100 times a second with ``--nonblocking`` (the gateway is not paused to be read), but its
own CPU is taken from the same two cores: a profiled run's latencies are not the figures to quote.
Time spent in uvloop's C code and in the kernel (pipe reads, epoll) has no Python frame of its own
and shows as ``Runner.run`` itself; ``perf record -g -p <pid>`` sees into it.

``--perf DIR`` records each relay with ``perf record -g`` for 20 s of its last round's window, into
``DIR/<relay>.data`` (``perf report -i ... --sort dso``: the kernel, the interpreter, uvloop, Go).

``--compiled [DIR]`` runs the gateway of a copy of this checkout whose per-line modules are compiled
with mypyc (``bench_compiled.build``, in DIR, reused while current, or in a temporary directory)
instead of this checkout's.

    .venv/bin/python bench/bench_fleet.py [--sessions 500] [--seconds 60] [--rounds 3] [--router]
        [--relays rawp-gateway,websocketd] [--agent synth|claude-code] [--rate N] [--compiled [DIR]]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import uvloop

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_compiled import build, runs_compiled  # noqa: E402
from relay_rig import (  # noqa: E402
    Gateway,
    LeanMaster,
    Websocketd,
    children_pids,
    cpu_seconds_of,
    cpu_seconds_reaped,
    cpu_split,
    gateway_headers,
    quantile,
    rss_bytes,
)

from tests.support.fleet_rig import READY, Dns, Router, nginx_path  # noqa: E402

RECORDING = HERE.parent / "tests/fixtures/claude-code/working-session.jsonl"
SCENARIO = "working-session"  # the rig's scenario the recording was made of
# The recording's flags beside the built-in profile's: no permission asked, its four tools.
CLAUDE_FLAGS = ("--dangerously-skip-permissions", "--tools", "Bash,Read,Grep,Edit")
GATEWAY, WEBSOCKETD = "rawp-gateway", "websocketd"


@dataclass
class Pace:
    """A timed recording's schedule: when each prompt is written in one cycle, and its length."""

    prompts: list[tuple[float, str]]  # (seconds into the cycle, the prompt's text)
    cycle: float
    lines: int  # agent lines in one cycle

    @classmethod
    def of(cls, recording: Path) -> Pace:
        meta = json.loads(recording.with_name(recording.stem + ".meta.json").read_text())
        times, written = meta.get("stdout_times"), meta.get("stdin_times")
        if not times or not written:
            raise SystemExit(f"{recording.name} has no timing: record a timed scenario, or --rate")
        texts = [json.loads(line)["message"]["content"] for line in meta["stdin"]]
        # A person's think time: from the last line before a prompt to the prompt.
        thinks = [t - max(x for x in times if x < t) for t in written[1:]]
        cycle = times[-1] + sum(thinks) / len(thinks)
        return cls(list(zip(written, texts, strict=True)), cycle, len(times))


@dataclass
class Agents:
    """What a round's sessions run: per session a profile of the gateway and a workspace (None:
    the root), and the profiles to add to the gateway's."""

    names: list[str]
    workspaces: list[str | None]
    profiles: dict[str, dict] = field(default_factory=dict)
    root: str | None = None  # the gateway's workspace root, when the sessions need their own


@contextlib.asynccontextmanager
async def synthetic(n: int, cycles: int) -> AsyncIterator[Agents]:
    yield Agents(["synth"] * n, [None] * n)


@contextlib.asynccontextmanager
async def real_claude(n: int, cycles: int) -> AsyncIterator[Agents]:
    """Per session a scripted model server for the recording's scenario (its answers repeated
    ``cycles`` times), a HOME and a workspace, and a profile running the real Claude Code."""
    from gateway.config import builtin_profiles
    from tests.support.rig.run import scripted_cli
    from tests.support.rig.scenario import find_scenario

    # A round ends with its agents stopped, some in the middle of a model request: the servers'
    # "cannot write to closing transport" then is the end of the round, not a finding.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    scenario = find_scenario("claude-code", SCENARIO)
    scenario = replace(scenario, calls=scenario.calls * cycles)
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-claude-"))
    agents = Agents([], [], root=str(root))
    servers = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            for i in range(n):
                cli = await stack.enter_async_context(
                    scripted_cli(scenario, workdir=root / f"s{i}")
                )
                servers.append(cli.server)
                command = builtin_profiles(claude=str(cli.binary))["claude-code"].command
                name = f"claude-{i}"
                agents.profiles[name] = {
                    "base": "claude-code",
                    "command": [*command, *CLAUDE_FLAGS],
                    "env": cli.env,
                }
                agents.names.append(name)
                agents.workspaces.append(str(cli.cwd.relative_to(root)))
            yield agents
            asked = sum(len(s.requests) for s in servers)
            odd = sum(len(s.unexpected) for s in servers)
            print(f"  the model servers answered {asked} requests, {odd} of them unscripted")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Round:
    """What one relay did in one round: CPU seconds over ``wall`` seconds, RSS in bytes."""

    relay: str
    sessions: int
    wall: float
    cpu: float  # the relay's own process
    kernel: float  # of which in the kernel
    agents_cpu: float
    router_cpu: float
    rss: tuple[int, int, int]  # before, with the connections open, after the run
    agents_rss: int  # every agent's, at the end of the window
    messages: int  # what the masters read, from their connection on
    direct: list[int]  # latencies (ns) of the lines written in the window, straight to the relay
    routed: list[int]  # through the router
    pauses: list[tuple[int, int, int, int]]  # the gateway's collections of 1 ms or more

    @property
    def cores(self) -> float:
        return self.cpu / self.wall

    @property
    def agents_cores(self) -> float:
        return self.agents_cpu / self.wall

    @property
    def share(self) -> float:
        """The relay's CPU as a share of its agents'."""
        return self.cpu / self.agents_cpu if self.agents_cpu else float("nan")

    def kib_a_session(self, when: int) -> float:
        return (self.rss[when] - self.rss[0]) / self.sessions / 1024


async def create(
    http: aiohttp.ClientSession, url: str, agents: Agents, headers: dict[str, str]
) -> list[str]:
    ids: list[str] = [""] * len(agents.names)
    sem = asyncio.Semaphore(8)  # each session starts an agent process: not all at once

    async def one(i: int) -> None:
        body: dict = {"agent": agents.names[i]}
        if agents.workspaces[i]:
            body["workspace_path"] = agents.workspaces[i]
        async with sem, http.post(f"{url}/v1/session", json=body, headers=headers) as resp:
            answer = await resp.json()
            if resp.status != 201:
                raise RuntimeError(f"session not created: {answer}")
            ids[i] = answer["session_id"]

    await asyncio.gather(*(one(i) for i in range(len(ids))))
    return ids


async def connect(port: int, n: int) -> list[LeanMaster]:
    """``n`` masters of a bare relay; each connection starts an agent, so a few at a time."""
    sem = asyncio.Semaphore(8)

    async def one() -> LeanMaster:
        async with sem:
            return await LeanMaster.attach(port, None)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def paced(master: LeanMaster, pace: Pace, start: float, stop: float) -> None:
    """Send the recording's prompts at their times, cycle after cycle from ``start``, until
    ``stop`` (loop-clock times)."""
    loop = asyncio.get_running_loop()
    cycle = 0
    while True:
        for at, text in pace.prompts:
            due = start + cycle * pace.cycle + at
            if due >= stop:
                return
            await asyncio.sleep(due - loop.time())
            master.prompt(text)
        cycle += 1


def profile(path: str, pid: int, seconds: float) -> subprocess.Popen:
    """py-spy sampling ``pid`` for ``seconds`` (see ``--profile``)."""
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("--profile needs py-spy: pip install -c constraints.txt -e '.[bench]'")
    fmt = "raw" if path.endswith(".txt") else "speedscope"
    argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds)))]
    argv += ["--rate", "100", "--nonblocking", "--format", fmt, "--output", path]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)


def summary(latencies_ns: list[int]) -> tuple[float, float]:
    return quantile(latencies_ns, 0.5) / 1e6, quantile(latencies_ns, 0.99) / 1e6


async def started(pid: int, n: int, limit: float = 300.0) -> None:
    """Until the relay has ``n`` children: websocketd starts a connection's agent after its
    upgrade, and on a busy machine hundreds of them take seconds after the last connection."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    while len(children_pids(pid)) < n:
        if loop.time() > end:
            raise SystemExit(f"{len(children_pids(pid))} of {n} agents started in {limit:.0f} s")
        await asyncio.sleep(0.2)


def warmup_of(args: argparse.Namespace, pace: Pace | None) -> float:
    """Seconds before the measured window: one cycle of the recording (the sessions start at
    random times over it), 2 s with ``--rate``, unless ``--warmup`` says."""
    if args.warmup is not None:
        return args.warmup
    return pace.cycle if pace else 2.0


async def one_round(
    kind: str,
    args: argparse.Namespace,
    pace: Pace | None,
    compiled: Path | None,
    spy: bool,
    last: bool,
) -> Round:
    """One relay's round: start it, open the connections, drive them, measure, stop it."""
    loop = asyncio.get_running_loop()
    cycles = 1  # the recorded cycles a session goes through, at most: its start, then each cycle
    if pace:
        cycles += math.ceil((warmup_of(args, pace) + args.seconds) / pace.cycle)
    agents_cm = real_claude if args.agent == "claude-code" else synthetic
    home = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    router = dns = relay = recorder = None
    async with agents_cm(args.sessions, cycles) as agents:
        try:
            if kind == WEBSOCKETD:
                relay = Websocketd()
            else:
                tree = {"tree": compiled, "name": "compiled"} if compiled else {}
                relay = Gateway(**tree, workspace=agents.root, profiles=agents.profiles)
            await relay.ready()
            if args.router and kind == GATEWAY:
                dns = Dns({READY: ["127.0.0.1"]})  # no route prefix: any path, any ready gateway
                router = Router(home, dns, relay.port)
                await router.start()
            nginx = [router.proc.pid, *children_pids(router.proc.pid)] if router else []
            rss0 = rss_bytes(relay.proc.pid)
            t0 = time.monotonic()
            if kind == WEBSOCKETD:
                masters = await connect(relay.port, args.sessions)
                routed = [False] * len(masters)
            else:
                url = router.url if router else relay.url
                async with aiohttp.ClientSession() as http:
                    ids = await create(http, url, agents, gateway_headers(relay.port))
                router_port = int(router.url.rsplit(":", 1)[1]) if router else 0
                routed = [router is not None and i % 2 == 0 for i in range(len(ids))]
                masters = [
                    await LeanMaster.attach(router_port if via else relay.port, sid, relay.port)
                    for sid, via in zip(ids, routed, strict=True)
                ]
            await started(relay.proc.pid, len(masters))
            print(f"  {kind}: {len(masters)} sessions open in {time.monotonic() - t0:.1f} s")
            await asyncio.sleep(1.0)  # the capabilities answered, the agents idle
            rss1 = rss_bytes(relay.proc.pid)
            begin = loop.time()
            warmup = warmup_of(args, pace)
            if pace:
                spread = min(pace.cycle, warmup)
                window = (begin + warmup, begin + warmup + args.seconds)
                rng = random.Random(1)
                senders = [
                    asyncio.create_task(paced(m, pace, begin + rng.random() * spread, window[1]))
                    for m in masters
                ]
            else:
                lines = int(args.rate * (args.seconds + warmup))
                for i, m in enumerate(masters):
                    m.request_burst(lines, args.rate)
                    if i % 50 == 49:
                        await asyncio.sleep(1.0 / max(1, len(masters) // 50))
                window = (loop.time() + warmup, loop.time() + warmup + args.seconds)
                senders = []
            if compiled is not None and not runs_compiled(relay.proc.pid, compiled):
                raise SystemExit("the compiled copy's gateway did not load its compiled modules")
            await asyncio.sleep(window[0] - loop.time())
            agent_pids = children_pids(relay.proc.pid)
            cpu0 = cpu_seconds_of([relay.proc.pid, *nginx])
            agents0 = cpu_seconds_of(agent_pids, cpu_seconds_reaped)
            kernel0 = cpu_split(relay.proc.pid)[1]
            window_ns = (time.monotonic_ns(), 0)
            sampler = profile(args.profile, relay.proc.pid, args.seconds) if spy else None
            if args.perf and last:
                perf = Path(args.perf) / f"{kind}.data"
                argv = ["perf", "record", "-q", "-F", "499", "-g", "-p", str(relay.proc.pid)]
                recorder = subprocess.Popen([*argv, "-o", str(perf), "--", "sleep", "20"])
            await asyncio.sleep(window[1] - loop.time())
            cpu1 = cpu_seconds_of([relay.proc.pid, *nginx])
            agents1 = cpu_seconds_of(agent_pids, cpu_seconds_reaped)
            kernel = cpu_split(relay.proc.pid)[1] - kernel0
            window_ns = (window_ns[0], time.monotonic_ns())
            rss2 = rss_bytes(relay.proc.pid)
            agents_rss = 0
            for pid in agent_pids:
                with contextlib.suppress(OSError):  # an agent that ended meanwhile
                    agents_rss += rss_bytes(pid)
            pauses = relay.gc_pauses(*window_ns) if isinstance(relay, Gateway) else []
            await asyncio.gather(*senders)
            for tool in (sampler, recorder):
                if tool is not None:
                    tool.wait()
            for m in masters:
                m.ended.cancel()  # no burst to end at the recorded pace: nobody waits for one
                m.close()
        finally:
            if router is not None:
                router.stop()
            if dns is not None:
                dns.close()
            if relay is not None:
                relay.stop()
            shutil.rmtree(home, ignore_errors=True)

    def spent(before: dict[int, float], after: dict[int, float]) -> float:
        """CPU seconds over the window of the processes alive at both ends."""
        return sum(after[p] - before[p] for p in before if p in after)

    lat: dict[bool, list[int]] = {True: [], False: []}
    for m, via in zip(masters, routed, strict=True):
        lat[via] += [
            ns
            for ns, s in zip(m.latencies_ns, m.stamps_ns, strict=True)
            if window_ns[0] <= s < window_ns[1]
        ]
    return Round(
        relay=kind,
        sessions=len(masters),
        wall=(window_ns[1] - window_ns[0]) / 1e9,
        cpu=cpu1[relay.proc.pid] - cpu0[relay.proc.pid],
        kernel=kernel,
        agents_cpu=spent(agents0, agents1),
        router_cpu=sum(cpu1.get(p, 0) - cpu0.get(p, 0) for p in nginx),
        rss=(rss0, rss1, rss2),
        agents_rss=agents_rss,
        messages=sum(m.messages for m in masters),
        direct=lat[False],
        routed=lat[True],
        pauses=pauses,
    )


def best(rounds: list[Round]) -> dict[str, float]:
    """Each measure's best round (the least of each: on a shared machine, what the others took
    from a round only adds)."""
    return {
        "cores": min(r.cores for r in rounds),
        "kernel": min(r.kernel / r.wall for r in rounds),
        "agents_cores": min(r.agents_cores for r in rounds),
        "share": min(r.share for r in rounds),
        "kib": min(r.kib_a_session(1) for r in rounds),
        "kib_after": min(r.kib_a_session(2) for r in rounds),
        "agents_mib": min(r.agents_rss / r.sessions / 2**20 for r in rounds),
        "p50": min(summary(r.direct)[0] for r in rounds),
        "p99": min(summary(r.direct)[1] for r in rounds),
    }


ROWS = [
    ("relay CPU (cores)", "cores", "{:.3f}"),
    ("agents' CPU (cores)", "agents_cores", "{:.3f}"),
    ("relay CPU in the kernel (cores)", "kernel", "{:.3f}"),
    ("relay CPU / agents' CPU", "share", "{:.1%}"),
    ("relay RSS a session, connections open (KiB)", "kib", "{:.1f}"),
    ("relay RSS a session, after the run (KiB)", "kib_after", "{:.1f}"),
    ("agents' RSS a session (MiB)", "agents_mib", "{:.1f}"),
    ("p50 agent write -> master read (ms)", "p50", "{:.2f}"),
    ("p99 agent write -> master read (ms)", "p99", "{:.2f}"),
]


def report(runs: dict[str, list[Round]], args: argparse.Namespace, what: str, rate: float) -> None:
    figures = {name: best(rounds) for name, rounds in runs.items()}
    names = list(runs)
    first = runs[names[0]][0]
    print(
        f"\n{what}: {first.sessions} sessions, about {rate:,.0f} agent lines/s in all, "
        f"measured over {first.wall:.1f} s after the warm-up; best of {args.rounds} "
        f"interleaved round{'s' if args.rounds > 1 else ''}"
    )
    ratio = GATEWAY in figures and WEBSOCKETD in figures
    print(
        f"{'measure':46}"
        + "".join(f" {n:>13}" for n in names)
        + (f" {'gateway/websocketd':>19}" if ratio else "")
    )
    for label, key, fmt in ROWS:
        if args.agent == "claude-code" and key in ("p50", "p99"):
            continue  # the real CLI's lines carry no stamp
        cells = "".join(f" {fmt.format(figures[n][key]):>13}" for n in names)
        if ratio:
            ws = figures[WEBSOCKETD][key]
            ok = ws > 0 and not math.isnan(figures[GATEWAY][key])
            cells += f" {figures[GATEWAY][key] / ws:18.2f}x" if ok else f" {'-':>19}"
        print(f"{label:46}{cells}")
    if GATEWAY not in runs:
        return
    gw = min(runs[GATEWAY], key=lambda r: r.cores)  # its best round, for what only it has
    n = gw.sessions
    print(
        f"gateway{' (compiled with mypyc)' if args.compiled is not None else ''}, its best round: "
        f"{gw.cores / n * 1000:.2f} millicores a session, "
        f"{n / gw.cores if gw.cores else float('inf'):,.0f} sessions per core at this pace; "
        f"{gw.cores / rate * 1e6:.0f} µs a line, {gw.kernel / gw.cpu if gw.cpu else 0:.0%} of it "
        f"in the kernel; RSS {gw.rss[0] / 2**20:.0f} MiB idle, {gw.rss[1] / 2**20:.0f} MiB "
        f"with the sessions open, {gw.rss[2] / 2**20:.0f} MiB after the run"
    )
    longest = max(gw.pauses, key=lambda p: p[1], default=None)
    print(
        f"gateway garbage collections of 1 ms or more: {len(gw.pauses)}"
        + (
            f", the longest {longest[1] / 1e6:.1f} ms (generation {longest[3]}, "
            f"{longest[2] / 1e6:.1f} ms of it on the CPU)"
            if longest
            else ""
        )
    )
    if args.router:
        (d50, d99), (r50, r99) = summary(gw.direct), summary(gw.routed)
        print(
            f"router (nginx) CPU: {gw.router_cpu / gw.wall:.3f} cores; latency "
            f"({len(gw.direct):,} and {len(gw.routed):,} stamped lines):\n"
            f"  direct  p50 {d50:.2f} ms  p99 {d99:.2f} ms\n"
            f"  router  p50 {r50:.2f} ms  p99 {r99:.2f} ms\n"
            f"  router adds p50 {r50 - d50:+.2f} ms  p99 {r99 - d99:+.2f} ms"
        )
    read = ", ".join(f"{n} {min(r.messages for r in runs[n]):,}" for n in names)
    print(f"messages the masters read in a round, at least: {read}")
    print(f"load average after the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


async def main(args: argparse.Namespace) -> None:
    relays = [r.strip() for r in args.relays.split(",") if r.strip()]
    if args.agent == "claude-code":
        relays = [GATEWAY]  # websocketd cannot give each connection a model server of its own
        if args.rate:
            raise SystemExit("--agent claude-code replays the recording's prompts: no --rate")
    if not relays or set(relays) - {GATEWAY, WEBSOCKETD}:
        raise SystemExit(f"--relays: {GATEWAY} and/or {WEBSOCKETD}")
    if args.router and nginx_path() is None:
        raise SystemExit("nginx is not installed (scripts/install-nginx.sh)")
    recording = Path(args.transcript).resolve() if args.transcript else None
    pace = None if args.rate or recording is None else Pace.of(recording)
    if recording:  # synth_agent.py replays it (inherited through each relay's environment)
        os.environ["RAWP_SYNTH_TRANSCRIPT"] = str(recording)
    compiled = None
    if args.compiled is not None:  # built before the gateway starts: the build takes the cores
        compiled = Path(args.compiled or tempfile.mkdtemp(prefix="rawp-compiled-")).resolve()
        compiled.mkdir(parents=True, exist_ok=True)
        build(compiled)
    if pace:
        print(
            f"replaying {recording.name}: {pace.lines} lines a {pace.cycle:.1f} s cycle "
            f"({pace.lines / pace.cycle:.2f} lines/s a session on average); warm-up "
            f"{warmup_of(args, pace):.0f} s, then {args.seconds:g} s measured; agent: {args.agent}"
        )
    runs: dict[str, list[Round]] = {r: [] for r in relays}
    try:
        for i in range(args.rounds):
            for kind in relays if i % 2 == 0 else relays[::-1]:
                spy = bool(args.profile) and kind == GATEWAY and i == args.rounds - 1
                last = i == args.rounds - 1
                runs[kind].append(await one_round(kind, args, pace, compiled, spy, last))
    finally:
        if compiled is not None and not args.compiled:
            shutil.rmtree(compiled, ignore_errors=True)
    if pace:
        what = f"{recording.name} at its recorded pace ({args.agent})"
        rate = args.sessions * pace.lines / pace.cycle
    else:
        what = f"{recording.name if recording else 'synth_agent.py lines'} at {args.rate} lines/s"
        rate = args.sessions * args.rate
    report(runs, args, what, rate)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, help="500; 24 with --agent claude-code")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--rounds", type=int, default=3, help="per relay, interleaved")
    parser.add_argument(
        "--warmup", type=float, help="seconds before the window (default: one cycle; 2 with --rate)"
    )
    parser.add_argument(
        "--relays",
        default=f"{GATEWAY},{WEBSOCKETD}",
        help=f"the relays to run, in this order in the first round ({GATEWAY},{WEBSOCKETD})",
    )
    parser.add_argument(
        "--agent",
        choices=("synth", "claude-code"),
        default="synth",
        help="the synthetic agent, or the real Claude Code against scripted model servers",
    )
    parser.add_argument(
        "--router", action="store_true", help="half the gateway's masters through nginx"
    )
    parser.add_argument(
        "--rate", type=int, default=0, help="lines/s a session instead of the recorded pace"
    )
    parser.add_argument(
        "--transcript",
        default=str(RECORDING),
        help="a recording of Claude Code (with --rate, '' for synth_agent's own lines)",
    )
    parser.add_argument(
        "--profile", metavar="PATH", help="py-spy samples of the gateway over its last window"
    )
    parser.add_argument(
        "--perf", metavar="DIR", help="perf record of each relay, 20 s of its last window, in DIR"
    )
    parser.add_argument(
        "--compiled",
        nargs="?",
        const="",
        metavar="DIR",
        help="the gateway of a copy with its per-line modules compiled by mypyc (kept in DIR)",
    )
    ns = parser.parse_args(argv)
    if ns.sessions is None:
        ns.sessions = 24 if ns.agent == "claude-code" else 500
    return ns


if __name__ == "__main__":
    uvloop.run(main(arguments()))
