"""What instrumenting the hot path costs: the same simulated hot path with and without metrics.

Theory of operation
-------------------
The hot path of the gateway, per agent stdout line: decode the JSON line (msgspec), map it to a
DPS frame (a dict envelope with a fresh message_id and a timestamp, as every frame needs), encode
it, append it to the history buffer, write it to each attached WebSocket. The instrumented variant
adds exactly the calls the server makes (see `gateway.metrics.GatewayMetrics`): a clock read after
parse+map (the read-time stamp itself is taken by gateway.agent.stdout whether metrics are on or not),
`AgentLineMetrics.line(kind, parse_ns)`, `frame_out(type, nbytes)`,
`history_appended(nbytes)`, and per connection a clock read and `observe_latency_ns(ns)`.

Three ways to measure, all comparing the two variants in the same run:

- default: no socket write (the worst case for the ratio: the cheapest possible baseline), both
  variants interleaved in many short rounds, timed with the process's CPU time
  (time.process_time: being descheduled does not count), best round of each;
- `--ws`: every frame really written with aiohttp to `--fanout` WebSockets on loopback, read by a
  client process of its own (its CPU is not counted);
- `--instructions`: instructions per line counted by valgrind's callgrind (a run over 2n lines minus
  one over n lines, so start-up cancels out). Slow (minutes), but it does not depend on what else
  the machine is doing; use it on a shared or busy machine, where any timing is noise.

Prints each variant's rate and the ratio; exits non-zero if instrumentation costs more than
`--max-overhead` (default 10%; the target is a few percent). This path is a model, stripped to the
least a gateway could do per line, so it overstates the share; `bench_session_path.py` measures the
same instruments on the gateway's real per-line code (parser, session machine, fan-out).

    .venv/bin/python bench/bench_metrics.py [--lines 20000] [--rounds 25] [--fanout 1]
    .venv/bin/python bench/bench_metrics.py --ws [--fanout 3]
    .venv/bin/python bench/bench_metrics.py --instructions --lines 500
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.metrics import GatewayMetrics

# Representative Claude Code stream-json lines, in the mix a streaming answer produces: mostly text
# deltas, some tool traffic.
LINES = [
    b'{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":'
    b'{"type":"text_delta","text":"Let me look at the failing test first, then "}},'
    b'"session_id":"5b1e0c3a-2f7e-4c7e-9b1a-6a0f3b1d2c4e","parent_tool_use_id":null,'
    b'"uuid":"8c5b1f2e-4f5e-4a0b-9c43-3ad1a0d0f7b1"}',
    b'{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":'
    b'{"type":"text_delta","text":"I will fix the import."}},'
    b'"session_id":"5b1e0c3a-2f7e-4c7e-9b1a-6a0f3b1d2c4e","parent_tool_use_id":null,'
    b'"uuid":"0d7c1a9e-3b2f-4e5d-8a6c-1f2e3d4c5b6a"}',
    b'{"type":"assistant","message":{"id":"msg_01","type":"message","role":"assistant",'
    b'"content":[{"type":"tool_use","id":"toolu_01","name":"Read","input":'
    b'{"file_path":"/workspace/src/app.py"}}]},"session_id":"5b1e0c3a-2f7e-4c7e-9b1a-6a0f3b1d2c4e"}',
    b'{"type":"user","message":{"role":"user","content":[{"type":"tool_result",'
    b'"tool_use_id":"toolu_01","content":"1\\timport os\\n2\\timport sys\\n","is_error":false}]},'
    b'"session_id":"5b1e0c3a-2f7e-4c7e-9b1a-6a0f3b1d2c4e"}',
]

SESSION_ID = "3f2b8c1e-9d4a-4b7e-a1c2-5e6f7a8b9c0d"
TURN_ID = "turn-1"


def _map(line: dict) -> tuple[str, str, dict]:
    """A stand-in for the parser: (line kind, frame type, payload)."""
    kind = line["type"]
    if kind == "stream_event":
        event = line["event"]
        return (
            kind,
            "agent.text.delta",
            {
                "content_index": event["index"],
                "text": event["delta"]["text"],
            },
        )
    if kind == "assistant":
        block = line["message"]["content"][0]
        return (
            kind,
            "tool.invoke.request",
            {
                "invocation_id": block["id"],
                "tool_name": block["name"],
                "input": block["input"],
            },
        )
    block = line["message"]["content"][0]
    return (
        kind,
        "tool.invoke.result",
        {
            "invocation_id": block["tool_use_id"],
            "status": "error" if block["is_error"] else "success",
            "output": block["content"],
        },
    )


def _envelope(type_: str, payload: dict) -> dict:
    return {
        "v": 1,
        "type": type_,
        "message_id": str(uuid.uuid4()),
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "session_id": SESSION_ID,
        "turn_id": TURN_ID,
        "payload": payload,
    }


def run_plain(lines: list[bytes], fanout: int) -> int:
    decode = msgspec.json.Decoder().decode
    encode = msgspec.json.Encoder().encode
    clock_ns = time.perf_counter_ns
    history: list[bytes] = []
    written = 0
    for raw in lines:
        # gateway.agent.stdout stamps every stdout line with the clock whether or not metrics are on
        # (StdoutLine.t_ns), so that read belongs to the uninstrumented path too.
        _t0 = clock_ns()
        _kind, type_, payload = _map(decode(raw))
        data = encode(_envelope(type_, payload))
        history.append(data)
        for _ in range(fanout):
            written += len(data)
        if len(history) > 1024:
            history.clear()
    return written


def run_instrumented(lines: list[bytes], fanout: int, metrics: GatewayMetrics) -> int:
    decode = msgspec.json.Decoder().decode
    encode = msgspec.json.Encoder().encode
    clock_ns = metrics.clock_ns
    agent = metrics.agent_lines("claude-code")  # once per session
    history: list[bytes] = []
    written = 0
    for raw in lines:
        t0 = clock_ns()  # StdoutLine.t_ns, as in run_plain
        kind, type_, payload = _map(decode(raw))
        data = encode(_envelope(type_, payload))
        agent.line(kind, clock_ns() - t0)
        nbytes = len(data)
        metrics.frame_out(type_, nbytes)
        history.append(data)
        metrics.history_appended(nbytes)
        for _ in range(fanout):
            written += nbytes
            metrics.observe_latency_ns(clock_ns() - t0)
        if len(history) > 1024:
            history.clear()
    return written


# --------------------------------------------------------------------------- --ws: real sockets


async def ws_plain(lines: list[bytes], conns: list) -> None:
    decode = msgspec.json.Decoder().decode
    encode = msgspec.json.Encoder().encode
    clock_ns = time.perf_counter_ns
    history: list[bytes] = []
    for raw in lines:
        _t0 = clock_ns()
        _kind, type_, payload = _map(decode(raw))
        data = encode(_envelope(type_, payload))
        history.append(data)
        text = data.decode()  # DPS frames are WebSocket text messages
        for ws in conns:
            await ws.send_str(text)
        if len(history) > 1024:
            history.clear()


async def ws_instrumented(lines: list[bytes], conns: list, metrics: GatewayMetrics) -> None:
    decode = msgspec.json.Decoder().decode
    encode = msgspec.json.Encoder().encode
    clock_ns = metrics.clock_ns
    agent = metrics.agent_lines("claude-code")
    history: list[bytes] = []
    for raw in lines:
        t0 = clock_ns()
        kind, type_, payload = _map(decode(raw))
        data = encode(_envelope(type_, payload))
        agent.line(kind, clock_ns() - t0)
        nbytes = len(data)
        metrics.frame_out(type_, nbytes)
        history.append(data)
        metrics.history_appended(nbytes)
        text = data.decode()
        for ws in conns:
            await ws.send_str(text)
            metrics.observe_latency_ns(clock_ns() - t0)
        if len(history) > 1024:
            history.clear()


async def ws_client(url: str, fanout: int) -> None:
    """The masters, in a process of their own: connect `fanout` WebSockets, read until the bench
    closes them, reconnect for the next round; stop when the bench is gone."""
    import aiohttp  # here, not at the top: the callgrind runs should not pay for importing it

    async with aiohttp.ClientSession() as http:
        while True:
            try:
                conns = [await http.ws_connect(url, max_msg_size=0) for _ in range(fanout)]
            except aiohttp.ClientError:
                return

            async def drain(ws) -> None:
                async for _msg in ws:
                    pass

            await asyncio.gather(*(drain(ws) for ws in conns))


async def ws_bench(lines: list[bytes], rounds: int, fanout: int) -> tuple[float, float]:
    """Serve a WebSocket on loopback, run each variant once per round over `fanout` connections
    from a client process, and return the best CPU time of each (this process only: the client's
    reading is not the gateway's cost)."""
    from aiohttp import web

    arrivals: asyncio.Queue[web.WebSocketResponse] = asyncio.Queue()

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        arrivals.put_nowait(ws)
        async for _msg in ws:  # until the bench closes it
            pass
        return ws

    app = web.Application()
    app.router.add_get("/ws", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    client = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--ws-client", f"http://127.0.0.1:{port}/ws", str(fanout)
    )
    metrics = GatewayMetrics()
    best = {"plain": float("inf"), "instrumented": float("inf")}
    try:
        for round_ in range(rounds):
            # Alternate which variant goes first, so neither always inherits the other's backlog.
            for variant in list(best)[:: 1 if round_ % 2 else -1]:
                conns = [await arrivals.get() for _ in range(fanout)]
                t = time.process_time()
                if variant == "plain":
                    await ws_plain(lines, conns)
                else:
                    await ws_instrumented(lines, conns, metrics)
                # Closing waits for the client to have read everything, so data still queued in
                # the transport is written (and counted) before the clock stops.
                await asyncio.gather(*(ws.close() for ws in conns))
                best[variant] = min(best[variant], time.process_time() - t)
    finally:
        await runner.cleanup()
        with contextlib.suppress(ProcessLookupError):
            client.kill()
        await client.wait()
    return best["plain"], best["instrumented"]


# --------------------------------------------------------------------------- --instructions


def run_variant(variant: str, lines: list[bytes], fanout: int) -> None:
    """One variant once, for callgrind (`--variant`)."""
    if variant == "plain":
        run_plain(lines, fanout)
    else:
        run_instrumented(lines, fanout, GatewayMetrics())


def callgrind_instructions(variant: str, n: int, fanout: int, workdir: str) -> int:
    """Instructions executed by this script running `variant` over `n` lines, under callgrind."""
    out = f"{workdir}/callgrind.{variant}.{n}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--variant",
            variant,
            "--lines",
            str(n),
            "--fanout",
            str(fanout),
        ],
        check=True,
        capture_output=True,
    )
    with open(out) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {out}")


def instructions_bench(n: int, fanout: int) -> tuple[float, float]:
    """Instructions per line of each variant: the difference between a run over 2n lines and one
    over n lines, so interpreter start-up and imports cancel out. Instruction counts do not depend
    on what else the machine is doing, unlike any timing on a shared machine."""
    with tempfile.TemporaryDirectory() as workdir:
        per_line = {}
        for variant in ("plain", "instrumented"):
            small = callgrind_instructions(variant, n, fanout, workdir)
            large = callgrind_instructions(variant, 2 * n, fanout, workdir)
            per_line[variant] = (large - small) / n
    return per_line["plain"], per_line["instrumented"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=20_000, help="lines per round")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--fanout", type=int, default=1, help="WebSocket connections per session")
    ap.add_argument(
        "--ws", action="store_true", help="write every frame to real WebSockets on loopback"
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions with valgrind's callgrind instead of timing (noise-free)",
    )
    ap.add_argument("--variant", choices=("plain", "instrumented"), help=argparse.SUPPRESS)
    ap.add_argument("--ws-client", nargs=2, metavar=("URL", "FANOUT"), help=argparse.SUPPRESS)
    ap.add_argument("--max-overhead", type=float, default=0.10)
    args = ap.parse_args(argv)
    if args.ws_client:
        asyncio.run(ws_client(args.ws_client[0], int(args.ws_client[1])))
        return 0

    lines = (LINES * (args.lines // len(LINES) + 1))[: args.lines]
    if args.variant:
        run_variant(args.variant, lines, args.fanout)
        return 0
    if args.instructions:
        plain, instr = instructions_bench(args.lines, args.fanout)
        overhead = instr / plain - 1
        print(f"lines                {args.lines} and {2 * args.lines} (fanout {args.fanout})")
        print(f"uninstrumented       {plain:10,.0f} instructions/line")
        print(f"instrumented         {instr:10,.0f} instructions/line")
        print(f"throughput ratio     {plain / instr:.3f}  (by instructions)")
        print(
            f"overhead             {overhead * 100:+.1f}%  ({instr - plain:,.0f} instructions per line)"
        )
        return 1 if overhead > args.max_overhead else 0

    metrics = GatewayMetrics()
    best_plain = best_instr = float("inf")
    if args.ws:
        best_plain, best_instr = asyncio.run(ws_bench(lines, args.rounds, args.fanout))
    for round_ in range(0 if args.ws else args.rounds):
        if round_ % 2:  # alternate the order, so neither variant always runs first
            t = time.process_time()
            run_instrumented(lines, args.fanout, metrics)
            best_instr = min(best_instr, time.process_time() - t)
        t = time.process_time()
        run_plain(lines, args.fanout)
        best_plain = min(best_plain, time.process_time() - t)
        if not round_ % 2:
            t = time.process_time()
            run_instrumented(lines, args.fanout, metrics)
            best_instr = min(best_instr, time.process_time() - t)

    n = len(lines)
    plain_rate, instr_rate = n / best_plain, n / best_instr
    overhead = best_instr / best_plain - 1
    per_line_ns = (best_instr - best_plain) / n * 1e9
    where = "real WebSockets on loopback" if args.ws else "no socket write"
    print(
        f"lines per round      {n}  (fanout {args.fanout}, {where}, best of {args.rounds} rounds)"
    )
    print(f"uninstrumented       {plain_rate:12,.0f} lines/s  {best_plain / n * 1e9:8.0f} ns/line")
    print(f"instrumented         {instr_rate:12,.0f} lines/s  {best_instr / n * 1e9:8.0f} ns/line")
    print(f"throughput ratio     {instr_rate / plain_rate:.3f}  (instrumented / uninstrumented)")
    print(f"overhead             {overhead * 100:+.1f}%  ({per_line_ns:.0f} ns per line)")
    if overhead > args.max_overhead:
        print(f"FAIL: overhead above {args.max_overhead * 100:.0f}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
