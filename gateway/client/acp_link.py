"""The asyncio shell of ``rawp-gateway acp``: the editor's stdin and stdout, the gateway's ``/acp``
WebSocket, and the reconnect loop. Every decision is ``Relay``'s (``acp_relay.py``); this module
only reads, writes, connects and waits, in the order the relay's actions say.

* stdin is read a line at a time, each line bounded by ``RelayLimits.max_line_bytes`` (a longer
  one is skipped to its newline and answered with an error); end of input ends the relay.
* stdout is written through an asyncio pipe and drained after each line, so an editor that stops
  reading slows the socket down instead of filling memory.
* The socket is opened with ``Authorization: Bearer`` when there is a token, never with the token
  in the URL; a token found in the port's file is read again for every connect (a gateway started
  again made a new one); after a failed attempt the next waits 0.25 s, doubling up to 10 s, with one stderr
  line each time; after a drop the first attempt is immediate.
* One socket per link: the one at ``--url``, and one at ``<url>/pods/<pod>/acp`` for each pod of a
  fleet the relay's sessions live on (``Connect``), each with its own reconnect loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, Final, TextIO
from urllib.parse import urlencode, urlsplit, urlunsplit

import aiohttp

from gateway.client.acp_messages import Action, Connect, Log, RelayLimits, ToEditor, ToGateway
from gateway.client.acp_relay import Relay
from gateway.client.websocket import DEFAULT_MAX_MESSAGE

__all__ = ["Backoff", "acp_url", "run_relay"]

LOG_PREFIX: Final = "rawp-gateway acp: "
HEARTBEAT_SEC: Final = 30.0  # pings keep routers from closing a quiet socket; a dead peer is seen
CONNECT_TIMEOUT_SEC: Final = 10.0


@dataclass(frozen=True)
class Backoff:
    """Waits between connection attempts: ``first`` doubling up to ``cap`` seconds."""

    first: float = 0.25
    cap: float = 10.0

    def delay(self, failures: int) -> float:
        return min(self.cap, self.first * 2 ** max(0, failures - 1))


def acp_url(base: str, agent: str | None = None, pod: str = "") -> str:
    """The WebSocket URL of ``/acp`` under a gateway's (or a router's) base URL: ``http`` becomes
    ``ws``, ``https`` ``wss``; a URL already ending in ``/acp`` is kept; ``agent`` is ``?agent=``;
    ``pod``: that pod's ``/pods/<pod>/acp`` under the router."""
    parts = urlsplit(base)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"not an http(s) or ws(s) URL: {base!r}")
    path = parts.path.rstrip("/").removesuffix("/acp")
    if pod:
        path += f"/pods/{pod}"
    path += "/acp"
    query = parts.query
    if agent:
        query = (query + "&" if query else "") + urlencode({"agent": agent})
    return urlunsplit((scheme, parts.netloc, path, query, ""))


class _Shell:
    def __init__(
        self,
        url: str,
        agent: str | None,
        token: str | Callable[[], str | None] | None,
        relay: Relay,
        stdout: asyncio.StreamWriter | _FileOut,
        stderr: TextIO,
        backoff: Backoff,
    ) -> None:
        self.url = url
        self.agent = agent
        self.token = token
        self.relay = relay
        self.stdout = stdout
        self.stderr = stderr
        self.backoff = backoff
        self.ws: dict[str, aiohttp.ClientWebSocketResponse] = {}  # link -> its open socket
        self.tasks: dict[str, asyncio.Task[None]] = {}  # link -> its connect loop
        self.http: aiohttp.ClientSession | None = None

    def headers(self) -> dict[str, str]:
        """Read for every connect: a token found in the port's file is read again, since a
        gateway started again on the port made a new one and the old one is 401 for ever."""
        token = self.token() if callable(self.token) else self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ToEditor):
                self.stdout.write(action.data)
                await self.stdout.drain()
            elif isinstance(action, ToGateway):
                ws = self.ws.get(action.link)
                if ws is None or ws.closed:
                    continue  # the drop is being reported: the relay already counts it as sent
                with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                    await ws.send_str(action.data.decode())
            elif isinstance(action, Connect):
                self.start(action.link)
            elif isinstance(action, Log):
                self.log(action.text)

    def start(self, link: str) -> None:
        """The connect loop of ``link``, once."""
        if link not in self.tasks:
            assert self.http is not None
            self.tasks[link] = asyncio.create_task(self.gateway(self.http, link))

    def log(self, text: str) -> None:
        self.stderr.write(LOG_PREFIX + text + "\n")
        self.stderr.flush()

    async def editor(self, stdin: asyncio.StreamReader) -> None:
        """Read the editor's lines until end of input."""
        while True:
            try:
                line = await stdin.readuntil(b"\n")
            except asyncio.IncompleteReadError as err:
                if err.partial.strip():
                    await self.perform(self.relay.editor_line(err.partial))
                return
            except asyncio.LimitOverrunError:
                await self._skip_line(stdin)
                await self.perform(self.relay.editor_line_too_long())
                continue
            await self.perform(self.relay.editor_line(line.rstrip(b"\r\n")))

    @staticmethod
    async def _skip_line(stdin: asyncio.StreamReader) -> None:
        """Drop what is left of an over-long line, through its newline, a buffer at a time."""
        while True:
            try:
                await stdin.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as err:
                await stdin.readexactly(err.consumed)
            except asyncio.IncompleteReadError:
                return

    async def gateway(self, http: aiohttp.ClientSession, link: str) -> None:
        """Connect ``link``, relay until its socket drops, and again, while the editor is there."""
        relay, url = self.relay, acp_url(self.url, self.agent, link)
        failures = 0
        while True:
            try:
                ws = await http.ws_connect(
                    url,
                    headers=self.headers(),
                    heartbeat=HEARTBEAT_SEC,
                    max_msg_size=DEFAULT_MAX_MESSAGE,
                    timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                )
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                failures += 1
                delay = self.backoff.delay(failures)
                await self.perform(relay.connect_failed(_describe(err), delay, link))
                await asyncio.sleep(delay)
                continue
            failures = 0
            self.ws[link] = ws
            await self.perform(relay.connected(link))
            reason = ""
            async for msg in ws:
                if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    await self.perform(relay.gateway_message(msg.data, link))
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    reason = str(ws.exception() or "error")
                    break
            code = None if reason else ws.close_code
            if not reason:
                reason = f"closed by the gateway (code {ws.close_code})"
            del self.ws[link]
            await ws.close()
            await self.perform(relay.disconnected(reason, link, code))


def _describe(err: BaseException) -> str:
    if isinstance(err, aiohttp.WSServerHandshakeError):
        why = {401: " (the token was refused)", 403: " (forbidden)", 404: " (no /acp there)"}
        return f"HTTP {err.status}{why.get(err.status, '')}"
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    return str(err) or type(err).__name__


class _FileOut:
    """stdout redirected to a regular file (no pipe to wait on): plain writes."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out

    def write(self, data: bytes) -> None:
        self.out.write(data)

    async def drain(self) -> None:
        self.out.flush()


async def _stdio(limit: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter | _FileOut]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(), sys.stdout
        )
    except ValueError:  # a regular file
        return reader, _FileOut(sys.stdout.buffer)
    return reader, asyncio.StreamWriter(transport, protocol, None, loop)


async def run_relay(
    url: str,
    *,
    token: str | Callable[[], str | None] | None = None,
    agent: str | None = None,
    limits: RelayLimits | None = None,
    backoff: Backoff | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Relay this process's stdin and stdout to the gateway at ``url`` until stdin ends.
    ``token``: the token, or a function giving it, called before every connect."""
    relay = Relay(limits)
    acp_url(url, agent)  # a URL it cannot use fails here, before anything is read
    stdin, stdout = await _stdio(relay.limits.max_line_bytes + 1)
    shell = _Shell(url, agent, token, relay, stdout, stderr or sys.stderr, backoff or Backoff())
    shell.log(f"relaying stdio to {acp_url(url, agent)}")
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_SEC)
    ) as http:
        shell.http = http
        editor = asyncio.create_task(shell.editor(stdin))
        shell.start("")
        try:  # until the editor is gone (or the loop at --url fails: a bug, said below)
            done, _ = await asyncio.wait(
                {editor, shell.tasks[""]}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (editor, *shell.tasks.values()):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for ws in list(shell.ws.values()):
                await ws.close()
    failed = [t.exception() for t in done if not t.cancelled() and t.exception() is not None]
    if failed:  # the editor closed its end of a pipe, or a bug: said, not hidden
        shell.log(f"stopped: {failed[0]!r}")
        return 1
    return 0
