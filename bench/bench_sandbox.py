"""Benchmark: what the agent sandbox (`[isolation] mode = "sandbox"`, docs/isolation.md) adds to an
agent's start and to a session's first frame, against the same thing unsandboxed in the same run.

Not a test. Run: `.venv/bin/python bench/bench_sandbox.py [--rounds N]` (needs `bwrap`).

* start: `AgentProcess.start()` of a small agent (the system's Python printing one line) until its
  first stdout line, then its exit; rounds alternate unsandboxed and sandboxed so that the machine's
  load falls on both alike.
* first frame: an in-process gateway with a `plain` profile (the same small agent, one process per
  prompt), a master attached; from the prompt sent to the first `agent.text.delta`.

It prints the median and p90 of each in ms, the difference (the target: at most +50 ms per start)
and the ratio. The per-line path is not touched by the sandbox (the agent's pipes are the same
pipes), so it is not measured here: bench/bench_session_path.py is.
"""

from __future__ import annotations

import argparse
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
from tests.support.gateway_peer import Master, create_session, make_config, start_gateway

AGENT = ("/usr/bin/python3", "-c", "import sys; print(sys.argv[1] if len(sys.argv) > 1 else 'hi')")
SANDBOX = Isolation(mode="sandbox")


async def one_start(workspace: str, home: str, sandboxed: bool) -> float:
    box = SpawnSandbox(SANDBOX, workspace=workspace, home=home, hidden=()) if sandboxed else None
    t0 = time.perf_counter()
    proc = await AgentProcess.start(
        AGENT, env={}, session_id="bench", workspace=workspace, sandbox=box
    )
    line = await proc.readline()
    took = time.perf_counter() - t0
    assert line is not None
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


def summary(name: str, plain: list[float], boxed: list[float]) -> None:
    def p90(xs: list[float]) -> float:
        return sorted(xs)[int(0.9 * (len(xs) - 1))]

    a, b = statistics.median(plain), statistics.median(boxed)
    print(
        f"{name:12} unsandboxed median {a:7.1f} ms (p90 {p90(plain):6.1f})   "
        f"sandboxed median {b:7.1f} ms (p90 {p90(boxed):6.1f})   "
        f"+{b - a:6.1f} ms   ratio {b / a:5.2f}x"
    )


async def main(rounds: int) -> None:
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
    uvloop.run(main(parser.parse_args().rounds))
