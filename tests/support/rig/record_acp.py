"""Record ACP transcripts from the real ACP agents, for ``rawp-gateway translate --agent acp``.

    python -m tests.support.rig.record_acp [TRANSCRIPT ...]

Theory of operation
-------------------
An ACP agent is driven, not just run: this recorder is a minimal ACP client (``initialize`` with
``fs`` off and ``terminal: false``, ``session/new`` with the workspace as ``cwd``, one
``session/prompt`` per prompt, each permission request answered with the option of the kind the
transcript names) against the agent's scripted model server (``run.scripted_cli``). Every message
of both directions is written, in order, to ``tests/fixtures/acp/<name>.jsonl``: the agent's stdout
lines byte for byte, the client's lines wrapped as ``{"sent": <message>}``; ``<name>.meta.json``
says how it was made (agent, version, argv, the model requests answered). Runs use a fixed
directory (``/tmp/rawp-rig/acp/<name>``) so the paths in the transcript stay the same between
recordings. Transcripts are never edited by hand: change ``TRANSCRIPTS`` and record again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from . import env as rigenv
from .run import scripted_cli
from .scenario import parse_scenario

WORK_ROOT = Path("/tmp/rawp-rig/acp")
FIXTURES = rigenv.FIXTURE_ROOT / "acp"
WRITE = {
    "functionCall": {"name": "write_file", "args": {"file_path": "notes.txt", "content": "new\n"}}
}

# name → how to record it: the rig agent (its CLI, server and environment), the agent's args, the
# workspace's files, the prompts, the permission option kind to choose, the model's answers.
TRANSCRIPTS: dict[str, dict[str, Any]] = {
    "gemini-write": {
        "agent": "gemini",
        "args": ["--acp", "--skip-trust", "-m", "gemini-2.5-flash"],
        "files": {"notes.txt": "old\n"},
        "prompts": ["Update notes.txt.", "And say hello."],
        "permission": "allow_once",
        "calls": [
            {"parts": [{"text": "Planning the edit.", "thought": True}, WRITE]},
            {"match": {"function_response": True}, "parts": [{"text": "Wrote the file."}]},
            {"parts": [{"text": "Hello there."}]},
        ],
    },
    "claude-write": {
        "agent": "claude-acp",
        "args": [],
        "files": {},
        "prompts": ["Write a.txt."],
        "permission": "allow_once",
        "calls": [
            {
                "content": [
                    {"type": "thinking", "thinking": "Think first.", "signature": "sig"},
                    {
                        "type": "tool_use",
                        "name": "Write",
                        "input": {"file_path": "{workspace}/a.txt", "content": "new\n"},
                    },
                ]
            },
            {"match": {"tool_result": True}, "content": [{"type": "text", "text": "Wrote a.txt."}]},
        ],
    },
    "gemini-shell": {
        "agent": "gemini",
        "args": ["--acp", "--skip-trust", "-m", "gemini-2.5-flash"],
        "files": {},
        "prompts": ["Run echo."],
        "permission": "allow_once",
        "calls": [
            {
                "parts": [
                    {"functionCall": {"name": "run_shell_command", "args": {"command": "echo hi"}}}
                ]
            },
            {"match": {"function_response": True}, "parts": [{"text": "It printed hi."}]},
        ],
    },
    "claude-bash": {
        "agent": "claude-acp",
        "args": [],
        "files": {},
        "prompts": ["Run echo."],
        "permission": "allow_once",
        "calls": [
            {
                "content": [
                    {
                        "type": "tool_use",
                        "name": "Bash",
                        "input": {"command": "echo hi", "description": "Print hi"},
                    },
                ]
            },
            {
                "match": {"tool_result": True},
                "content": [{"type": "text", "text": "It printed hi."}],
            },
        ],
    },
    "codex-exec": {
        "agent": "codex-acp",
        "args": [],
        "files": {},
        "prompts": ["Make a file."],
        "permission": "allow_once",
        # As the codex-acp profile runs it: unsandboxed, asking before each command
        # (tests/support/rig/README.md).
        "codex_config": 'sandbox_mode = "danger-full-access"\napproval_policy = "untrusted"\n',
        "calls": [
            {
                "output": [
                    {"type": "reasoning", "summary": "Check the files."},
                    {
                        "type": "function_call",
                        "name": "exec_command",
                        "arguments": {"cmd": "echo hi > made.txt"},
                    },
                ]
            },
            {"match": {"tool_output": True}, "output": [{"type": "message", "text": "Made it."}]},
        ],
    },
    "codex-edit": {
        "agent": "codex-acp",
        "args": [],
        "files": {"notes.txt": "alpha\nbeta\n"},
        "prompts": ["Change beta to gamma."],
        "permission": "allow_once",
        "codex_config": 'sandbox_mode = "danger-full-access"\napproval_policy = "untrusted"\n',
        "calls": [
            {
                "output": [
                    {
                        "type": "custom_tool_call",
                        "name": "apply_patch",
                        "input": "*** Begin Patch\n*** Update File: notes.txt\n@@\n alpha\n"
                        "-beta\n+gamma\n*** End Patch\n",
                    }
                ]
            },
            {"match": {"tool_output": True}, "output": [{"type": "message", "text": "Done."}]},
        ],
    },
}


async def record(name: str) -> list[str]:
    spec = TRANSCRIPTS[name]
    agent = spec["agent"]
    data = {"run": {"args": spec["args"], "files": spec["files"]}, "calls": spec["calls"]}
    scenario = parse_scenario(data, name=name, agent=agent)
    lines: list[bytes] = []
    async with scripted_cli(scenario, workdir=WORK_ROOT / name) as cli:
        if "codex_config" in spec:
            config = cli.home / ".codex" / "config.toml"
            config.write_text(spec["codex_config"] + config.read_text())
        proc = await asyncio.create_subprocess_exec(
            *cli.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=cli.env,
            cwd=cli.cwd,
            limit=1 << 24,
            start_new_session=True,  # the CLI starts itself again as a child: stop them both
        )
        assert proc.stdin is not None and proc.stdout is not None
        next_id = 0

        async def send(message: dict[str, Any]) -> None:
            raw = json.dumps({"jsonrpc": "2.0", **message}, separators=(",", ":"))
            lines.append(b'{"sent":' + raw.encode() + b"}")
            proc.stdin.write(raw.encode() + b"\n")  # type: ignore[union-attr]
            await proc.stdin.drain()  # type: ignore[union-attr]

        async def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
            nonlocal next_id
            rpc_id, next_id = next_id, next_id + 1
            await send({"id": rpc_id, "method": method, "params": params})
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), 120)  # type: ignore[union-attr]
                if not line:
                    raise RuntimeError(f"{name}: the agent closed stdout during {method}")
                lines.append(line.rstrip(b"\n"))
                msg = json.loads(line)
                if msg.get("id") == rpc_id and "method" not in msg:
                    return msg
                if msg.get("method") == "session/request_permission":
                    options = msg["params"]["options"]
                    chosen = next(o for o in options if o["kind"] == spec["permission"])
                    outcome = {"outcome": "selected", "optionId": chosen["optionId"]}
                    await send({"id": msg["id"], "result": {"outcome": outcome}})
                elif "id" in msg and "method" in msg:
                    await send({"id": msg["id"], "error": {"code": -32601, "message": "no"}})

        try:
            caps = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}
            await ask("initialize", {"protocolVersion": 1, "clientCapabilities": caps})
            new = await ask("session/new", {"cwd": str(cli.cwd), "mcpServers": []})
            session_id = new["result"]["sessionId"]
            for prompt in spec["prompts"]:
                block = {"type": "text", "text": prompt}
                await ask("session/prompt", {"sessionId": session_id, "prompt": [block]})
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        problems = (
            [f"unused calls: {cli.server.unused}"] if getattr(cli.server, "unused", None) else []
        )
        # claude-agent-acp first checks that its base URL answers at all: a request for "/".
        unexpected = [r.path for r in cli.server.unexpected if r.path != "/"]
        if unexpected:
            problems.append(f"unscripted requests: {unexpected}")
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"{name}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        argv = [Path(cli.argv[0]).name, *cli.argv[1:]]
        meta = {
            "agent": agent,
            "transcript": name,
            "cli_package": rigenv.spec(agent).package,
            "cli_version": rigenv.installed_version(agent),
            "argv": argv,
            "workspace": str(cli.cwd),
            "prompts": spec["prompts"],
            "permission": spec["permission"],
            "model_requests": [r.path for r in cli.server.requests],
        }
        (FIXTURES / f"{name}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return problems


def main(argv: list[str]) -> int:
    names = argv or sorted(TRANSCRIPTS)
    failed = 0
    for name in names:
        problems = asyncio.run(record(name))
        print(f"{name}: {'ok' if not problems else '; '.join(problems)}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
