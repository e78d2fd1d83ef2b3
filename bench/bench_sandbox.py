"""Benchmark: what the agent sandbox (`[isolation] mode = "sandbox"`, docs/isolation.md) adds to an
agent's start and to a session's first frame, against the same thing unsandboxed in the same run,
and what a team's system (`[isolation] system_root`) adds to a sandboxed start.

Not a test. Run: `.venv/bin/python bench/bench_sandbox.py [--rounds N] [--system-root DIR]` (needs
`bwrap`; without `--system-root`, the team's system scripts/build-toolchain makes, built first if
it is not there, which needs root and debootstrap).

* start: `AgentProcess.start()` of a small agent (the system's Python printing one line) until its
  first stdout line, then its exit; rounds alternate unsandboxed and sandboxed so that the machine's
  load falls on both alike.
* system_root: the same start of a shell printing one line (both systems have `sh`, a team's has no
  Python), sandboxed in the gateway's system and in the team's, alternating in the same rounds; and
  in the team's with a `bind_ro` into its `/usr/bin` (this machine's `node`, which makes the
  sandbox rebuild that directory entry by entry). A team's image without `/etc/hosts` (a
  debootstrap, most slim images) has its `/etc` rebuilt too, every start.
* first frame: an in-process gateway with a `plain` profile (the same small agent, one process per
  prompt), a master attached; from the prompt sent to the first `agent.text.delta`.

It prints the median and p90 of each in ms, the difference (the target: at most +50 ms per start)
and the ratio. The per-line path is not touched by the sandbox (the agent's pipes are the same
pipes), so it is not measured here: bench/bench_session_path.py is.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop

from gateway.agent.process import AgentProcess
from gateway.agent.profiles import AgentProfile, parser_features
from gateway.agent.sandbox import Isolation, SpawnSandbox, probe
from tests.support import toolchain
from tests.support.gateway_peer import Master, create_session, make_config, start_gateway

AGENT = ("/usr/bin/python3", "-c", "import sys; print(sys.argv[1] if len(sys.argv) > 1 else 'hi')")
SHELL = ("sh", "-c", "echo hi")
SANDBOX = Isolation(mode="sandbox")
_STARTS = itertools.count()


async def one_start(
    workspace: str,
    home: str,
    sandboxed: bool,
    isolation: Isolation = SANDBOX,
    agent: tuple[str, ...] = AGENT,
) -> float:
    box = SpawnSandbox(isolation, workspace=workspace, home=home, hidden=()) if sandboxed else None
    t0 = time.perf_counter()
    proc = await AgentProcess.start(
        agent,
        env={"PATH": "/usr/bin:/bin"},
        # One id a start: what an agent left running is found by its id and ended after its exit.
        session_id=f"bench-{next(_STARTS)}",
        workspace=workspace,
        sandbox=box,
    )
    line = await proc.readline()
    took = time.perf_counter() - t0
    assert line is not None, proc.stderr_tail()
    await proc.wait()
    proc.close()
    return took * 1000


async def one_first_frame(client, text: str) -> float:
    created = await create_session(client, "plain")
    master = await Master.attach(client, created["session_id"])
    t0 = time.perf_counter()
    await master.send("control.prompt.request", {"prompt_text": text})
    await master.until("agent.text.delta", timeout=30)
    took = time.perf_counter() - t0
    await master.until("session.turn.end", timeout=30)
    await master.ws.close()
    await client.delete(f"/v1/session/{created['session_id']}")
    return took * 1000


def summary(
    name: str,
    plain: list[float],
    boxed: list[float],
    labels: tuple[str, str] = ("unsandboxed", "sandboxed"),
) -> None:
    def p90(xs: list[float]) -> float:
        return sorted(xs)[int(0.9 * (len(xs) - 1))]

    a, b = statistics.median(plain), statistics.median(boxed)
    print(
        f"{name:12} {labels[0]} median {a:7.1f} ms (p90 {p90(plain):6.1f})   "
        f"{labels[1]} median {b:7.1f} ms (p90 {p90(boxed):6.1f})   "
        f"+{b - a:6.1f} ms   ratio {b / a:5.2f}x"
    )


async def system_root_starts(ws: str, home: str, rounds: int, root: str) -> None:
    """A sandboxed start in the gateway's system beside the same in a team's, same rounds."""
    team = Isolation(mode="sandbox", system_root=root)
    node = shutil.which("node")
    spliced = Isolation(mode="sandbox", system_root=root, bind_ro=(node,)) if node else None
    for isolation in (team, spliced):
        if isolation is not None and (problem := await probe(isolation)) is not None:
            sys.exit(f"bench_sandbox: {problem}")
    for _ in range(3):
        await one_start(ws, home, True, SANDBOX, SHELL)
        await one_start(ws, home, True, team, SHELL)
    own, teams, rebuilt = [], [], []
    for _ in range(rounds):
        own.append(await one_start(ws, home, True, SANDBOX, SHELL))
        teams.append(await one_start(ws, home, True, team, SHELL))
        if spliced is not None:
            rebuilt.append(await one_start(ws, home, True, spliced, SHELL))
    summary("system_root", own, teams, ("gateway's", "team's"))
    if rebuilt:
        summary("+ /usr/bin", own, rebuilt, ("gateway's", "team's, node bound in its /usr/bin"))


async def main(rounds: int, system_root: str | None) -> None:
    problem = await probe(SANDBOX)
    if problem is not None:
        sys.exit(f"bench_sandbox: {problem}")
    with tempfile.TemporaryDirectory(prefix="rawp-bench-sandbox-") as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        (root / "home").mkdir()
        ws, home = str(root / "ws"), str(root / "home")
        for _ in range(3):  # warm the page cache for both
            await one_start(ws, home, False)
            await one_start(ws, home, True)
        plain, boxed = [], []
        for _ in range(rounds):
            plain.append(await one_start(ws, home, False))
            boxed.append(await one_start(ws, home, True))
        summary("start", plain, boxed)
        if system_root is None:
            system_root = str(toolchain.built(dir_only=True).root)
        await system_root_starts(ws, home, rounds, system_root)

        profile = AgentProfile(
            name="plain",
            parser="plain",
            command=(*AGENT, "{prompt}"),
            single_turn_process=True,
            features=parser_features("plain"),
        )
        clients = []
        for isolation in (Isolation(), SANDBOX):
            config = make_config(root / "ws", agents={"plain": profile}, isolation=isolation)
            clients.append(await start_gateway(config))
        try:
            for client in clients:
                await one_first_frame(client, "warm")
            plain, boxed = [], []
            for _ in range(rounds):
                plain.append(await one_first_frame(clients[0], "hello"))
                boxed.append(await one_first_frame(clients[1], "hello"))
            summary("first frame", plain, boxed)
        finally:
            for client in clients:
                await client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--system-root", help="a team's system (default: scripts/build-toolchain's)"
    )
    args = parser.parse_args()
    uvloop.run(main(args.rounds, args.system_root))
