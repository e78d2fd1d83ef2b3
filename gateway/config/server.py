"""``[server]``, ``[fleet]`` and ``[acp]``: the gateway's own sections, each key declared once
(gateway/config/settings.py), with the checks of the values bounds cannot say.

What one key cannot check alone is gateway/config/__init__.py's: ``route_prefix`` with
``pod_name`` filled in, ``[acp] default_agent`` against the profiles, the workspace root a token
needs.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.config.settings import as_path, setting
from gateway.protocol.buffer import BUFFER_POLICIES

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_PORT",
    "MAX_PEERS",
    "AcpSettings",
    "FleetSettings",
    "ServerSettings",
    "normalize_origin",
    "route_prefix",
]

DEFAULT_PORT: Final = 8765
DEFAULT_MAX_FRAME_SIZE: Final = 1024 * 1024
MAX_ALLOWED_ORIGINS: Final = 64  # [server] allowed_origins entries
MAX_ORIGIN_CHARS: Final = 256
# Fleet (docs/fleet.md): bounds of [server] pod_name, route_prefix, trusted_proxies, [fleet] peers.
MAX_POD_NAME_CHARS: Final = 253  # a DNS name
MAX_ROUTE_PREFIX_CHARS: Final = 256
MAX_TRUSTED_PROXIES: Final = 64
MAX_PEERS: Final = 64
MAX_PEER_CHARS: Final = 256
_POD_NAME: Final = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_ROUTE_PREFIX: Final = re.compile(r"(/[A-Za-z0-9._~-]+)+")
_DNS_PEERS: Final = re.compile(r"dns:([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([0-9]{1,5})")
_MiB: Final = 1024 * 1024

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _host(value: Any, name: str) -> str:
    host = str(value)
    if not host or host != host.strip() or any(c.isspace() or c == "\0" for c in host):
        raise ValueError(f"{name} must be an address or a name without spaces, got {host!r}")
    return host


def _state_dir(value: Any, name: str) -> Path | None:
    # Empty: none, as unset.
    return Path(value).expanduser().absolute() if value else None


def _upper(value: Any, name: str) -> str:
    return str(value).upper()


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, without a trailing slash."""
    return origin.strip().rstrip("/").lower()


def _origins(values: list[Any], name: str) -> frozenset[str]:
    """``scheme://host[:port]`` strings, normalised."""
    if len(values) > MAX_ALLOWED_ORIGINS:
        raise ValueError(f"{name} may list at most {MAX_ALLOWED_ORIGINS} origins")
    out: set[str] = set()
    for value in values:
        if not isinstance(value, str) or len(value) > MAX_ORIGIN_CHARS:
            raise ValueError(
                f"{name} entries must be strings of at most {MAX_ORIGIN_CHARS} "
                f"characters, got {value!r}"
            )
        origin = normalize_origin(value)
        scheme, sep, host = origin.partition("://")
        if not sep or scheme not in ("http", "https") or not host or "/" in host:
            raise ValueError(f"{name} entries must look like https://host[:port], got {value!r}")
        out.add(origin)
    return frozenset(out)


def _public_url(value: Any, name: str) -> str | None:
    if not value:
        return None
    url = str(value).rstrip("/")
    if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
        raise ValueError(f"{name} must be an http(s) URL, got {url!r}")
    return url


def _pod_name(value: Any, name: str) -> str:
    pod = str(value or socket.gethostname())
    if len(pod) > MAX_POD_NAME_CHARS or not _POD_NAME.fullmatch(pod):
        raise ValueError(
            f"{name} must be a DNS name of at most {MAX_POD_NAME_CHARS} characters "
            f"(letters, digits, '.', '-', '_'), got {pod!r}"
        )
    return pod


def route_prefix(template: str, pod: str) -> str:
    """``[server] route_prefix`` with ``{pod}`` filled in, checked (docs/fleet.md)."""
    prefix = template.replace("{pod}", pod)
    if prefix and (
        len(prefix) > MAX_ROUTE_PREFIX_CHARS
        or not _ROUTE_PREFIX.fullmatch(prefix)
        or any(part in (".", "..") for part in prefix.split("/"))
    ):
        raise ValueError(
            f"route_prefix must be a path like /pods/{{pod}} (no trailing '/', no '.' or '..', "
            f"at most {MAX_ROUTE_PREFIX_CHARS} characters), got {prefix!r}"
        )
    return prefix


def _proxies(values: list[Any], name: str) -> tuple[Network, ...]:
    if len(values) > MAX_TRUSTED_PROXIES:
        raise ValueError(f"{name} may list at most {MAX_TRUSTED_PROXIES} networks")
    networks = []
    for value in values:
        try:
            if not isinstance(value, str):
                raise TypeError(value)
            networks.append(ipaddress.ip_network(value))
        except (TypeError, ValueError):
            raise ValueError(
                f"{name} entries must be addresses or networks (10.0.0.0/8), got {value!r}"
            ) from None
    return tuple(networks)


def _peers(value: str | list[Any], name: str) -> tuple[str, ...]:
    """Base URLs, or one ``"dns:NAME:PORT"`` resolved at each use."""
    if isinstance(value, str):
        match = _DNS_PEERS.fullmatch(value)
        if len(value) > MAX_PEER_CHARS or match is None or not 0 < int(match[3]) <= 65535:
            raise ValueError(f'{name} as a string must be "dns:NAME:PORT", got {value[:300]!r}')
        return (value,)
    if len(value) > MAX_PEERS:
        raise ValueError(f"{name} may list at most {MAX_PEERS} base URLs")
    urls = []
    for entry in value:
        url = entry.rstrip("/") if isinstance(entry, str) else ""
        scheme, sep, rest = url.partition("://")
        if (
            len(url) > MAX_PEER_CHARS
            or scheme not in ("http", "https")
            or not sep
            or not rest
            or "/" in rest
            or any(c.isspace() for c in rest)
        ):
            raise ValueError(
                f"{name} entries must be base URLs like http://10.1.2.3:8765, got {entry!r}"
            )
        urls.append(url)
    return tuple(urls)


@dataclass(frozen=True)
class ServerSettings:
    """``[server]`` (docs/configuration.md): where the gateway listens, what it bounds."""

    host: str = setting(
        "127.0.0.1",
        env="RAWP_GATEWAY_HOST",
        flag=True,
        check=_host,
        doc="address to listen on",
    )
    port: int = setting(
        DEFAULT_PORT,
        low=0,
        high=65535,
        env="RAWP_GATEWAY_PORT",
        flag=True,
        doc="port to listen on; 0 picks one",
    )
    workspace_root: Path = setting(
        factory=Path.cwd,
        toml=str,
        check=as_path,
        env="RAWP_GATEWAY_WORKSPACE_ROOT",
        flag=True,
        shown="the current directory; with a token it must be set",
        doc="directory every session workspace must be in",
    )
    token_file: str | None = setting(
        None,
        toml=str,
        env="RAWP_GATEWAY_TOKEN_FILE",
        flag=True,
        doc="file holding the bearer token masters must send",
    )
    max_frame_size: int = setting(
        DEFAULT_MAX_FRAME_SIZE,
        low=4096,
        env="RAWP_GATEWAY_MAX_FRAME_SIZE",
        doc="the largest WebSocket message either side may send",
    )
    max_request_bytes: int = setting(_MiB, low=1024, doc="the largest HTTP request body")
    send_queue_bytes: int = setting(
        16 * _MiB,
        low=65536,
        doc="per connection: bytes held for a master that reads slowly; past it it is closed",
    )
    max_stdin_bytes: int = setting(
        4 * _MiB,
        low=65536,
        doc="an agent's input not read yet; past it a prompt is refused",
    )
    reattach_window_sec: float = setting(
        300.0,
        low=0,
        env="RAWP_GATEWAY_REATTACH_WINDOW_SEC",
        doc="how long a session lives with no WebSocket attached, by default",
    )
    buffer_policy: str = setting(
        "RING",
        check=_upper,
        choices=BUFFER_POLICIES,
        env="RAWP_GATEWAY_BUFFER_POLICY",
        doc="a session's buffer policy (what its replay buffer keeps), by default; any case",
    )
    buffer_max_bytes: int = setting(
        8 * _MiB,
        low=0,
        env="RAWP_GATEWAY_BUFFER_MAX_BYTES",
        doc="a session's replay buffer size, by default",
    )
    max_buffer_bytes: int = setting(
        256 * _MiB,
        low=0,
        doc="the largest buffer.max_bytes a session may ask for",
    )
    max_session_file_bytes: int = setting(
        256 * _MiB,
        low=0,
        doc="all files of one session together (gateway/storage/files.py)",
    )
    max_upload_bytes: int = setting(20 * _MiB, low=1, doc="one PUT /v1/session/{id}/files")
    max_sessions: int = setting(
        64,
        low=1,
        env="RAWP_GATEWAY_MAX_SESSIONS",
        doc="sessions not yet ended; POST /v1/session beyond it is a 503",
    )
    max_connections_per_session: int = setting(
        64,
        low=1,
        doc="WebSockets of one session; an upgrade beyond it is a 503",
    )
    header_timeout_sec: float = setting(
        10.0,
        low=0.1,
        doc="a request's headers must be complete within it",
    )
    max_pending_connections: int = setting(
        256,
        low=1,
        doc="connections not yet authenticated (gateway/server/limits.py)",
    )
    shutdown_grace_sec: float = setting(
        5.0,
        low=0,
        doc="an agent's time after SIGTERM before SIGKILL",
    )
    conversations_timeout_sec: float = setting(
        60.0,
        low=0.1,
        doc="an ACP agent asked for its saved sessions, from its spawn to its answer",
    )
    log_format: str = setting(
        "text",
        choices=("text", "json"),
        env="RAWP_GATEWAY_LOG_FORMAT",
        flag=True,
        doc="log format",
    )
    state_dir: Path | None = setting(
        None,
        toml=str,
        check=_state_dir,
        env="RAWP_GATEWAY_STATE_DIR",
        flag=True,
        shown="none (sessions in memory)",
        doc="keep sessions here so they survive a restart",
    )
    allowed_origins: frozenset[str] = setting(
        frozenset(),
        toml=list,
        check=_origins,
        doc="origins besides the gateway's own whose pages may open WebSockets",
    )
    public_url: str | None = setting(
        None,
        toml=str,
        check=_public_url,
        doc="where people reach the gateway: links in notifications",
    )
    # Fleet (docs/fleet.md): this gateway's name, the path its URLs start with ({pod} filled
    # in, "" for none) and the proxies whose X-Forwarded-* headers are believed.
    pod_name: str = setting(
        factory=socket.gethostname,
        check=_pod_name,
        env="RAWP_GATEWAY_POD_NAME",
        env_is_default=True,
        shown="`RAWP_GATEWAY_POD_NAME`, else the host name",
        doc="this gateway's name in a fleet",
    )
    route_prefix: str = setting("", doc="the path every URL the gateway hands out starts with")
    trusted_proxies: tuple[Network, ...] = setting(
        (),
        toml=list,
        check=_proxies,
        doc="the proxies whose X-Forwarded-Host, -Proto and -For are believed",
    )


@dataclass(frozen=True)
class FleetSettings:
    """``[fleet]`` (docs/fleet.md)."""

    peers: tuple[str, ...] = setting(
        (),
        toml=(str, list),
        check=_peers,
        doc='the other gateways of a fleet: base URLs, or one "dns:NAME:PORT"',
    )


@dataclass(frozen=True)
class AcpSettings:
    """``[acp]`` (docs/acp-masters.md)."""

    default_agent: str | None = setting(
        None,
        toml=str,
        doc="the agent of an ACP client's session/new that names none",
    )
