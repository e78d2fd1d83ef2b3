"""Real MCP servers for the tests, made with the official MCP Python SDK (PyPI ``mcp``, pinned in
pyproject's test extra): a stdio one and a Streamable HTTP one that answers only a bearer token.

Each tool's answer proves the server ran and saw what it was given, without saying a secret: the
stdio server's ``secret_digest`` answers the SHA-256 of an environment variable (the test compares
it with the digest of the value it configured, so the value itself never enters a frame), the HTTP
server answers only a request carrying ``Authorization: Bearer <secret>`` (401 otherwise).

Run as a program (a script path, so an agent's sandbox needs only this file and the venv)::

    python tests/support/mcp_servers.py stdio
    python tests/support/mcp_servers.py http --secret-file FILE   # prints "listening PORT"

``stdio_command()`` is the argv of the first; ``http_server(secret)`` starts the second on
127.0.0.1 at a free port and stops it (an async context manager giving its URL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
# The prefix of every answer: a tool's result that holds it came from these servers.
STDIO_MARK = "stdio-mcp-ran"
HTTP_MARK = "http-mcp-ran"
# The variable the stdio server's secret_digest reads.
SECRET_VARIABLE = "MCP_TEST_SECRET"


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def stdio_command(python: str = sys.executable) -> list[str]:
    """The argv that starts the stdio server."""
    return [python, str(SCRIPT), "stdio"]


def _stdio() -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("rawp-test-stdio")

    @server.tool()
    def echo(text: str) -> str:
        """Answer the text back, marked as coming from this server."""
        return f"{STDIO_MARK}: {text}"

    @server.tool()
    def secret_digest() -> str:
        """The SHA-256 of the MCP_TEST_SECRET variable this server was started with."""
        value = os.environ.get(SECRET_VARIABLE)
        return f"{STDIO_MARK}: " + ("unset" if value is None else digest(value))

    server.run("stdio")


def _http(secret: str, ready: Any) -> None:
    import socket

    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from starlette.responses import JSONResponse

    server = MCPServer("rawp-test-http")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return f"{HTTP_MARK}: {a + b}"

    app = server.streamable_http_app()
    expected = f"Bearer {secret}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if auth != expected:
                response = JSONResponse({"error": "unauthorized"}, status_code=401)
                await response(scope, receive, send)
                return
        await app(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    print(f"listening {port}", file=ready, flush=True)
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


@contextlib.asynccontextmanager
async def http_server(secret: str) -> AsyncIterator[str]:
    """The HTTP server running on 127.0.0.1 (its own process), requiring ``Bearer <secret>``:
    its MCP URL. The secret goes in a file, never on a command line another process may read."""
    with tempfile.TemporaryDirectory() as tmp:
        secret_file = Path(tmp) / "secret"
        secret_file.write_text(secret)
        secret_file.chmod(0o600)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "http",
            "--secret-file",
            str(secret_file),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line.startswith(b"listening "), line
            yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            await proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=["stdio", "http"])
    parser.add_argument("--secret-file")
    args = parser.parse_args(argv)
    if args.kind == "stdio":
        _stdio()
    else:
        _http(Path(args.secret_file).read_text().strip(), sys.stdout)


if __name__ == "__main__":
    main()
