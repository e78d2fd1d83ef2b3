"""Many gateways behind one router: routed paths, forwarded headers, readiness, the fleet's list
(docs/fleet.md).

Theory of operation
-------------------
A fleet is a set of gateways (a Kubernetes StatefulSet) behind a router that sends
``<route_prefix>/...`` to the gateway that owns that prefix and everything else to any of them. A
session lives on the gateway that created it, so every URL a gateway hands out starts with its
``[server] route_prefix`` (``/pods/{pod}``): ``ws_path``, file URLs, the console's links. Nothing
else is shared: no registry; only
``/acp`` relays a session to the gateway that holds it (an ACP connection is not one session's).

* ``add_prefixed_routes`` makes the application answer each of its paths also under the prefix (the
  same handlers, registered twice), so a router may pass paths through unchanged.
* ``forwarded_middleware``: a request from one of ``[server] trusted_proxies`` is seen with the host,
  scheme and client address its ``X-Forwarded-Host``/``-Proto``/``-For`` give (the Origin and Host
  checks, the loopback-only ``?role=local-ui``); from anyone else those headers are ignored.
* ``readyz``: 200 while new sessions are taken, else 503 ``SHUTTING_DOWN``: from SIGTERM on
  (``begin_stopping``: nothing new, not even an attachment, while the sessions are suspended), and
  while an operator drains the gateway (``set_draining``, SIGUSR1 until SIGUSR2: no new session,
  the sessions held go on, attachments included), so Kubernetes and the router send new sessions
  elsewhere.
* ``sessions_answer``: ``GET /v1/sessions`` lists the sessions of this gateway and of every peer
  (``[fleet] peers``, a list or one DNS name resolved at each call), each peer asked
  ``?scope=local`` with the caller's own ``Authorization``, concurrently, within
  ``PEER_TIMEOUT_SEC``; a peer that does not answer in time with a list is named in ``unreachable``.
* ``find_on_peers``: which peer lists a session to the caller, and its base URL, so that ``/acp``
  can relay a session another gateway holds to that gateway's own ``/acp`` (``peer_ws_http``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import msgspec
from aiohttp import web

from gateway.config import MAX_PEERS, Config

__all__ = [
    "READINESS",
    "PeerSession",
    "Readiness",
    "add_prefixed_routes",
    "begin_stopping",
    "find_on_peers",
    "forwarded_middleware",
    "peer_ws_http",
    "readyz",
    "refusal",
    "sessions_answer",
    "set_draining",
    "strip_prefix",
]

log = logging.getLogger("rawp_gateway.fleet")

PEER_TIMEOUT_SEC: Final = 2.0  # one peer's whole answer to GET /v1/sessions?scope=local
PEER_CONNECT_SEC: Final = 5.0  # opening a WebSocket to a peer (an /acp relay of a session)
MAX_PEER_ANSWER_BYTES: Final = 16 * 1024 * 1024  # a peer's list read at most (docs/limits.md)
MAX_FORWARDED_CHARS: Final = 1024  # an X-Forwarded-* header longer than this is ignored
_PEER_HTTP: Final = web.AppKey("peer_http", aiohttp.ClientSession)
_PEER_WS: Final = web.AppKey("peer_ws", aiohttp.ClientSession)
_CONFIG: Final = web.AppKey("fleet_config", Config)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- routed paths ---------------------------------------------------------------------------------


def add_prefixed_routes(app: web.Application, prefix: str) -> None:
    """Every route of ``app`` once more under ``prefix`` (same handler, same method, HEAD
    included). Called when all routes are added; the prefixed copies carry no name (names are
    unique in aiohttp)."""
    if not prefix:
        return
    for route in list(app.router.routes()):
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if path is not None:
            app.router.add_route(route.method, prefix + path, route.handler)


def strip_prefix(path: str, prefix: str) -> str:
    """``path`` as the gateway's own route sees it: without ``prefix`` when it starts with it."""
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        return path[len(prefix) :] or "/"
    return path


# --- forwarded headers ----------------------------------------------------------------------------


def _trusted(address: str | None, networks: Iterable[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    ip = mapped or ip
    return any(ip in net for net in networks)


def _first(value: str | None) -> str | None:
    if not value or len(value) > MAX_FORWARDED_CHARS:
        return None
    first = value.split(",")[0].strip()
    return first or None


def forwarded_middleware(trusted: tuple[Network, ...]):
    """See the module docstring. The client address is the right-most ``X-Forwarded-For`` entry
    that is not itself a trusted proxy (each proxy appends the address it was reached from), or
    the left-most when all are."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not trusted or not _trusted(request.remote, trusted):
            return await handler(request)
        changes: dict[str, Any] = {}
        host = _first(request.headers.get("X-Forwarded-Host"))
        if host is not None and not any(c.isspace() or c in "/\\@" for c in host):
            changes["host"] = host
        scheme = _first(request.headers.get("X-Forwarded-Proto"))
        if scheme is not None and scheme.lower() in ("http", "https"):
            changes["scheme"] = scheme.lower()
        forwarded_for = request.headers.get("X-Forwarded-For", "")
        if forwarded_for and len(forwarded_for) <= MAX_FORWARDED_CHARS:
            hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
            untrusted = [h for h in hops if not _trusted(h, trusted)]
            if hops:  # every hop a trusted proxy: the first is where the request began
                changes["remote"] = untrusted[-1] if untrusted else hops[0]
        if not changes:
            return await handler(request)
        return await handler(request.clone(**changes))

    return middleware


# --- readiness ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Readiness:
    """Whether this gateway takes new work (docs/fleet.md, "Readiness, stopping, draining")."""

    stopping: bool = False  # SIGTERM arrived: the sessions are being suspended
    draining: bool = False  # SIGUSR1 until SIGUSR2: no new session, the held ones go on
    on_drain: Callable[[bool], None] | None = None  # the rawp_gateway_draining gauge
    # Why the state directory cannot be written now (a full disk), or None: said by /readyz.
    storage_problem: Callable[[], str | None] | None = None


READINESS: Final = web.AppKey("readiness", Readiness)


def begin_stopping(app: web.Application) -> None:
    """SIGTERM arrived: no new sessions and no new attachments from now on."""
    app[READINESS].stopping = True


def set_draining(app: web.Application, on: bool, held: int) -> None:
    """SIGUSR1 (``on``) or SIGUSR2: an operator drains this gateway before removing it, or ends
    that. ``held``: the sessions it holds now, for the log line."""
    readiness = app[READINESS]
    if readiness.draining == on:
        return
    readiness.draining = on
    if readiness.on_drain is not None:
        readiness.on_drain(on)
    if on:
        log.warning(
            "draining: not ready, no new sessions (503 SHUTTING_DOWN); the %d held go on; "
            "SIGUSR2 ends it",
            held,
            extra={"sessions": held},
        )
    else:
        log.warning("drain ended: ready, taking new sessions", extra={"sessions": held})


def refusal(app: web.Application, *, new_session: bool) -> str | None:
    """Why this gateway refuses new work now (answered 503 ``SHUTTING_DOWN``), or None. A new
    session is refused while stopping or draining, an attachment only while stopping."""
    readiness = app[READINESS]
    if readiness.stopping:
        return "this gateway is shutting down; try another"
    if readiness.draining and new_session:
        return "this gateway is draining: it takes no new sessions; try another"
    return None


async def readyz(request: web.Request) -> web.Response:
    why = refusal(request.app, new_session=True)
    if why is not None:
        return web.json_response({"error_code": "SHUTTING_DOWN", "message": why}, status=503)
    problem = request.app[READINESS].storage_problem
    failing = problem() if problem is not None else None
    if failing is not None:  # a new session's record could not be kept: send it elsewhere
        return web.json_response(
            {"error_code": "INSUFFICIENT_STORAGE", "message": failing}, status=503
        )
    return web.json_response({"status": "ready"})


# --- the fleet's list -----------------------------------------------------------------------------


async def _open_peer_http(app: web.Application) -> None:
    app[_PEER_HTTP] = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_SEC),
        json_serialize=lambda obj: msgspec.json.encode(obj).decode(),
    )

    app[_PEER_WS] = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, connect=PEER_CONNECT_SEC)
    )


async def _close_peer_http(app: web.Application) -> None:
    await app[_PEER_HTTP].close()
    await app[_PEER_WS].close()


def setup(
    app: web.Application, config: Config, on_drain: Callable[[bool], None] | None = None
) -> None:
    """The application state this module needs: readiness (``on_drain`` is told of each change
    of the drain), and an HTTP client for peers."""
    app[READINESS] = Readiness(on_drain=on_drain)
    app[_CONFIG] = config
    if config.fleet.peers:
        app.on_startup.append(_open_peer_http)
        app.on_cleanup.append(_close_peer_http)


async def peer_urls(peers: tuple[str, ...], own_host: str, own_port: int) -> list[str]:
    """The base URLs of the peers: the list as configured, or every address ``dns:NAME:PORT``
    resolves to now; this gateway's own address left out."""
    own = await _own_addresses(own_host)
    if len(peers) == 1 and peers[0].startswith("dns:"):
        _, name, port_text = peers[0].split(":")
        port = int(port_text)
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as err:
            log.warning("fleet peers: %s does not resolve: %s", name, err)
            return []
        addresses = sorted({str(info[4][0]) for info in infos})
        if len(addresses) > MAX_PEERS:  # the bound a configured list has too
            log.warning(
                "fleet peers: %s has %d addresses; asking %d", name, len(addresses), MAX_PEERS
            )
            addresses = addresses[:MAX_PEERS]
        return [
            f"http://{_url_host(a)}:{port}"
            for a in addresses
            if not (port == own_port and _same_ip(a, own))
        ]
    urls = []
    for url in peers:
        host, port = _host_port(url)
        if port == own_port and (host in own or _same_ip(host, own)):
            continue
        urls.append(url)
    return urls


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _host_port(url: str) -> tuple[str, int]:
    scheme, _, rest = url.partition("://")
    default = 443 if scheme == "https" else 80
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        return host, int(tail[1:]) if tail.startswith(":") else default
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    return host, int(port) if port.isdigit() else default


def _same_ip(address: str, own: set[str]) -> bool:
    try:
        return str(ipaddress.ip_address(address)) in own
    except ValueError:
        return False


async def _own_addresses(host: str) -> set[str]:
    """The addresses this gateway is reached at: its listening address, or (listening on all of
    them) the addresses its host name resolves to (a pod's IP in Kubernetes)."""
    own = {host}
    if host in ("0.0.0.0", "::", ""):
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
        except OSError:
            infos = []
        own.update(str(info[4][0]) for info in infos)
    return own


async def _ask_peer(
    http: aiohttp.ClientSession, url: str, authorization: str | None
) -> list[Any] | None:
    headers = {"Authorization": authorization} if authorization else {}
    try:
        async with http.get(
            f"{url}/v1/sessions", params={"scope": "local"}, headers=headers
        ) as resp:
            if resp.status != 200:
                log.warning("fleet peer %s answered %s", url, resp.status)
                return None
            body = await resp.content.read(MAX_PEER_ANSWER_BYTES + 1)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as err:
        log.warning("fleet peer %s did not answer: %s", url, err or type(err).__name__)
        return None
    if len(body) > MAX_PEER_ANSWER_BYTES:
        log.warning("fleet peer %s answered more than %d bytes", url, MAX_PEER_ANSWER_BYTES)
        return None
    try:
        sessions = msgspec.json.decode(body).get("sessions")
    except (msgspec.DecodeError, AttributeError):
        sessions = None
    if not isinstance(sessions, list):
        log.warning("fleet peer %s answered no session list", url)
        return None
    return [s for s in sessions if isinstance(s, dict)]


async def _peer_lists(request: web.Request) -> list[tuple[str, list[Any] | None]]:
    """Each peer's base URL and its own sessions as it lists them to the caller (None: no
    answer in time)."""
    config = request.app[_CONFIG]
    urls = await peer_urls(config.fleet.peers, config.server.host, config.server.port)
    authorization = request.headers.get("Authorization")
    http = request.app[_PEER_HTTP]
    answers = await asyncio.gather(*(_ask_peer(http, url, authorization) for url in urls))
    return list(zip(urls, answers, strict=True))


async def sessions_answer(request: web.Request, local: list[dict[str, Any]]) -> dict[str, Any]:
    """The body of a fleet-wide ``GET /v1/sessions``: this gateway's sessions, and with peers
    configured those of every peer, plus ``unreachable``."""
    config = request.app[_CONFIG]
    if not config.fleet.peers:
        return {"sessions": local}
    sessions = list(local)
    unreachable = []
    for url, answer in await _peer_lists(request):
        if answer is None:
            unreachable.append(url)
        else:
            sessions.extend(answer)
    return {"sessions": sessions, "unreachable": unreachable}


@dataclass(frozen=True)
class PeerSession:
    """A session another gateway of the fleet holds, as it lists it to the caller."""

    url: str  # that gateway's base URL, as this one reaches it
    listed: dict[str, Any]


async def find_on_peers(
    request: web.Request, session_id: str
) -> tuple[PeerSession | None, list[str]]:
    """The peer that lists ``session_id`` to the caller, if one does, and the peers that did not
    answer (one of them may hold it)."""
    config = request.app[_CONFIG]
    if not config.fleet.peers or not session_id:
        return None, []
    unreachable = []
    for url, answer in await _peer_lists(request):
        if answer is None:
            unreachable.append(url)
            continue
        for listed in answer:
            if listed.get("session_id") == session_id:
                return PeerSession(url, listed), unreachable
    return None, unreachable


def peer_ws_http(app: web.Application) -> aiohttp.ClientSession:
    """The HTTP client of this gateway's WebSockets to its peers (no total timeout: they last)."""
    return app[_PEER_WS]
