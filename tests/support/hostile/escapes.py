"""A hostile agent for the sandbox's tests (a ``plain`` profile: its prompt is its one argument).
It tries every escape it is told of and writes what happened to ``escapes.json`` in its working
directory (its workspace), then prints one line. Standard library only: it runs on the system's
Python, inside the sandbox or out.

The prompt is a JSON object:

  {"read": [PATH...],            files to read (each: its first 64 KiB, or the error)
   "list": [PATH...],            directories to list
   "plant": [PATH...],           files to create (each: "ok" or the error)
   "kill": [PID...],             pids to SIGKILL (host pids of the gateway and another agent)
   "proc": [PID...],             /proc/PID/environ, cmdline and mem to open
   "flood": N,                   fork N children that sleep, count how many started
   "alloc_mb": N,                allocate N MiB at once (MemoryError caught and said)
   "die_alloc_mb": N,            the same, not caught: the agent dies of it
   "kill_all": true}             at the end, SIGKILL to every process it may signal (kill -9 -1)

and always: its environment's RAWP_GATEWAY_* variables, /proc/1/environ, whether it can write its
workspace, /tmp and HOME, and run a child.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def attempt(fn, *args):
    try:
        return {"ok": True, "value": fn(*args)}
    except Exception as err:  # every failure is an answer here
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read(1 << 16).decode(errors="replace")


def plant(path: str) -> str:
    with open(path, "w") as f:
        f.write("planted by a hostile agent\n")
    return "written"


def write_and_read(path: str) -> str:
    with open(path, "w") as f:
        f.write("mine")
    return read(path)


def flood(n: int) -> dict:
    children, error = [], None
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError as err:
            error = f"{type(err).__name__}: {err}"
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    for pid in children:
        os.waitpid(pid, 0)
    return {"started": len(children), "error": error}


def main() -> None:
    plan = json.loads(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].startswith("{") else {}
    out: dict = {
        "gateway_env": {k: v for k, v in os.environ.items() if k.startswith("RAWP_GATEWAY_")},
        "pid1_environ": attempt(read, "/proc/1/environ"),
        "uid": os.getuid(),
        "home": os.environ.get("HOME"),
        "workspace": attempt(write_and_read, "written-by-agent.txt"),
        "tmp": attempt(write_and_read, "/tmp/written-by-agent.txt"),
        "home_write": attempt(write_and_read, os.path.join(os.environ["HOME"], "agent-home.txt")),
        "child": attempt(
            lambda: subprocess.run(
                ["sh", "-c", "echo child ran"], capture_output=True, text=True
            ).stdout.strip()
        ),
        "proc_pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    }
    try:
        with open("/proc/1/environ", "rb") as f:
            out["pid1_gateway_vars"] = [
                v.decode(errors="replace") for v in f.read().split(b"\0") if b"RAWP_GATEWAY_" in v
            ]
    except OSError as err:  # outside a sandbox pid 1 is the machine's init
        out["pid1_gateway_vars"] = f"{type(err).__name__}: {err}"
    out["read"] = {p: attempt(read, p) for p in plan.get("read", [])}
    out["list"] = {p: attempt(lambda p=p: sorted(os.listdir(p))) for p in plan.get("list", [])}
    out["plant"] = {p: attempt(plant, p) for p in plan.get("plant", [])}
    out["kill"] = {str(p): attempt(os.kill, p, signal.SIGKILL) for p in plan.get("kill", [])}
    out["proc"] = {}
    for pid in plan.get("proc", []):
        for what in ("environ", "cmdline", "mem"):
            out["proc"][f"{pid}/{what}"] = attempt(read, f"/proc/{pid}/{what}")
    if "flood" in plan:
        out["flood"] = flood(plan["flood"])
    if "alloc_mb" in plan:
        out["alloc"] = attempt(lambda: len(bytearray(plan["alloc_mb"] << 20)))
    with open("escapes.json", "w") as f:
        json.dump(out, f)
    if "die_alloc_mb" in plan:
        sys.stdout.write("allocating\n")
        sys.stdout.flush()
        hold = bytearray(plan["die_alloc_mb"] << 20)  # MemoryError: the agent dies of it
        print(len(hold))
    print("escapes tried", flush=True)
    if plan.get("kill_all"):
        os.kill(-1, signal.SIGKILL)  # every process it may signal, itself last


if __name__ == "__main__":
    main()
