"""``rawp-gateway acp`` as a process, fed by hand: what it does with input no editor should send
(a line that is not JSON, a line over 16 MiB, a batch), what it says on stderr when the gateway
refuses it, and the arguments it refuses before reading anything."""

from __future__ import annotations

import asyncio
import json
import subprocess

from tests.support.acp_editors import relay_argv, relay_env
from tests.support.auth import users_config
from tests.support.gateway_peer import base_url, start_gateway
from tests.support.servers import CLI
from tests.support.waiting import eventually

TURN = 60.0  # a bound on a hang, not a measure


async def read_json(stdout: asyncio.StreamReader) -> dict:
    return json.loads(await asyncio.wait_for(stdout.readline(), TURN))


async def test_input_no_editor_should_send_is_answered_and_the_relay_goes_on(gw, tmp_path):
    proc = await asyncio.create_subprocess_exec(
        *relay_argv(base_url(gw)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=relay_env(),
        limit=1 << 20,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"this is not json\n")
        assert (await read_json(proc.stdout))["error"]["code"] == -32700
        # Over the 16 MiB line bound: skipped to its newline, answered once.
        proc.stdin.write(b'{"jsonrpc": "2.0", "id": 1, "params": "' + b"x" * (17 << 20) + b'"}\n')
        too_long = await read_json(proc.stdout)
        assert too_long["id"] is None and too_long["error"]["data"]["error_code"] == "LINE_TOO_LONG"
        proc.stdin.write(b'[{"jsonrpc": "2.0", "id": 2, "method": "initialize"}]\n')
        assert (await read_json(proc.stdout))["error"]["code"] == -32600
        init = {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"protocolVersion": 1}}
        proc.stdin.write(json.dumps(init).encode() + b"\n")
        answer = await read_json(proc.stdout)
        assert answer["id"] == 3 and answer["result"]["protocolVersion"] == 1
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), TURN) == 0  # end of input ends it
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_refused_token_is_said_on_stderr_and_waiting_requests_get_an_error(tmp_path):
    gw = await start_gateway(users_config(tmp_path, {"alice": ("operator", "alice-token")}))
    stderr = tmp_path / "stderr.txt"
    try:
        with stderr.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *relay_argv(base_url(gw)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=relay_env("not-the-token"),
            )
        assert proc.stdin is not None and proc.stdout is not None
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
        proc.stdin.write(json.dumps(init).encode() + b"\n")
        # After five refused attempts (0.25 + 0.5 + 1 + 2 s apart) the request is answered.
        answer = await read_json(proc.stdout)
        assert answer["id"] == 0
        assert answer["error"]["data"]["error_code"] == "GATEWAY_UNREACHABLE"
        assert "401" in answer["error"]["message"]
        await eventually(lambda: "HTTP 401" in stderr.read_text(), "the refusal on stderr")
        proc.stdin.close()
        assert await asyncio.wait_for(proc.wait(), TURN) == 0
    finally:
        await gw.close()


def test_an_unusable_url_or_token_file_is_one_line_on_stderr(tmp_path):
    bad_url = subprocess.run(
        [*CLI, "acp", "--url", "ftp://example"], capture_output=True, text=True, timeout=60
    )
    assert bad_url.returncode == 2 and bad_url.stdout == ""
    assert bad_url.stderr.startswith("rawp-gateway acp: not an http(s) or ws(s) URL")
    missing = tmp_path / "no-such-token"
    bad_token = subprocess.run(
        [*CLI, "acp", "--url", "http://127.0.0.1:1", "--token-file", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad_token.returncode == 2 and bad_token.stdout == ""
    assert str(missing) in bad_token.stderr and len(bad_token.stderr.splitlines()) == 1
