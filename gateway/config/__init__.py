"""Configuration: the TOML file of docs/configuration.md, command-line flags, ``RAWP_GATEWAY_*`` variables,
and the agent profiles they configure (built-in ones: gateway/agent/profiles.py).

Theory of operation
-------------------
``load_config(path, flags, environ)`` layers the sources: built-in defaults, then the TOML file,
then command-line flags, then environment variables (docs/configuration.md: "Command-line flags override
the file; RAWP_GATEWAY_* environment variables override both"). Every error names the file, the key
and what was expected; nothing is ignored: an unknown section or key is an error too, with its line
and the nearest known name (strict.py).

The sections have rooms of their own: ``[agents.NAME]`` in agents.py, ``[auth]`` in auth.py,
``[notify]`` in notify.py, ``[isolation]`` in isolation.py, ``[[policy.rules]]`` in policy.py,
``[budgets]`` in gateway/protocol/budget.py (``limits_of``); this module holds ``Config``,
``[server]``, ``[fleet]``, the names each section knows and the layering.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from gateway.agent.profiles import (
    FEATURE_NAMES,
    MAX_ARGV_PROMPT_BYTES,
    AgentProfile,
    builtin_profiles,
    command_for,
    parser_features,
    prompt_on_stdin,
    template_args,
)
from gateway.agent.sandbox import Isolation
from gateway.config.agents import PROFILE_KEYS, parse_profile
from gateway.config.auth import AUTH_KEYS, OIDC_KEYS, AuthConfigError, AuthSettings, parse_auth
from gateway.config.checks import ConfigError, check_type
from gateway.config.isolation import ISOLATION_KEYS, check_binds_apart, parse_isolation
from gateway.config.notify import WEBHOOK_KEYS, NotifyConfigError, Webhook, parse_webhooks
from gateway.config.policy import (
    MAX_FILE_BYTES,
    POLICY_SCHEMA,
    parse_policy,
    refuse_too_many_rules,
)
from gateway.config.strict import ANY_NAME, Locator, Schema, known_names, unknown_name
from gateway.protocol.budget import Limits, limits_of
from gateway.protocol.history import POLICIES
from gateway.protocol.policy import Rule

# The profile names are gateway/agent/profiles.py's, re-exported: a Config holds profiles, and
# whoever builds one names them with it.
__all__ = [
    "MAX_ARGV_PROMPT_BYTES",
    "AgentProfile",
    "Config",
    "ConfigError",
    "builtin_profiles",
    "command_for",
    "load_config",
    "parser_features",
    "prompt_on_stdin",
    "template_args",
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


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    workspace_root: Path = field(default_factory=Path.cwd)
    token: str | None = None
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    max_request_bytes: int = 1024 * 1024
    send_queue_bytes: int = 16 * 1024 * 1024  # per connection; past it the connection is closed
    max_stdin_bytes: int = 4 * 1024 * 1024  # agent input not read yet; past it input is refused
    reattach_window_sec: float = 300.0
    buffer_policy: str = "RING"
    buffer_max_bytes: int = 8 * 1024 * 1024
    max_buffer_bytes: int = 256 * 1024 * 1024  # the most a session may ask for
    max_session_file_bytes: int = (
        256 * 1024 * 1024
    )  # all files of a session (gateway/storage/files.py)
    max_upload_bytes: int = 20 * 1024 * 1024  # one PUT /v1/session/{id}/files
    max_sessions: int = 64  # sessions not yet terminated; POST /v1/session beyond it is a 503
    max_connections_per_session: int = 64  # WebSockets of one session; an upgrade beyond: 503
    header_timeout_sec: float = 10.0  # a request's headers must be complete within it
    max_pending_connections: int = (
        256  # connections not yet authenticated (gateway/server/limits.py)
    )
    shutdown_grace_sec: float = 5.0
    # An ACP agent asked for its saved sessions (gateway/agent/conversations/ask_acp.py), spawn to answer
    conversations_timeout_sec: float = 60.0
    log_format: str = "text"  # or "json"
    state_dir: Path | None = None  # sessions and their replay buffers survive a restart
    # Origins (besides the gateway's own) whose pages may open WebSockets: browser console.
    allowed_origins: frozenset[str] = frozenset()
    # Fleet (docs/fleet.md): this gateway's name, the path its URLs start with ({pod} filled in,
    # "" for none), the proxies whose X-Forwarded-* headers are believed, and its peers (base
    # URLs, or one "dns:NAME:PORT" resolved at each use).
    pod_name: str = field(default_factory=socket.gethostname)
    route_prefix: str = ""
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    fleet_peers: tuple[str, ...] = ()
    agents: Mapping[str, AgentProfile] = field(default_factory=builtin_profiles)
    # Identities, the audit log (gateway/config/auth.py) and webhooks (gateway/config/notify.py).
    auth: AuthSettings = field(default_factory=AuthSettings)
    webhooks: tuple[Webhook, ...] = ()
    # Where people reach the gateway (https://host[:port][/prefix]): links in notifications.
    public_url: str | None = None
    # Permission rules (docs/policies.md), first match wins; and the file they came from, which
    # SIGHUP reads again.
    policy: tuple[Rule, ...] = ()
    config_file: Path | None = None
    isolation: Isolation = field(default_factory=Isolation)
    # Every file the gateway read a setting or a secret from (config, token, users, webhook
    # secrets) or writes one to (the audit log and its rotations): never shown to an agent.
    gateway_files: tuple[Path, ...] = ()
    # The agent of an ACP client's session/new that names none (docs/acp-masters.md).
    acp_default_agent: str | None = None
    # Spend caps on the cost the agents report (docs/budgets.md); 0: none.
    budgets: Limits = field(default_factory=Limits)

    @property
    def authenticated(self) -> bool:
        """Some credential is configured: requests need one (else loopback only)."""
        return self.token is not None or self.auth.configured

    @property
    def hidden_paths(self) -> tuple[str, ...]:
        """What a sandboxed agent must not see (docs/isolation.md): the gateway's files, its state
        dir and the workspace root (each session's own workspace is shown again on top)."""
        dirs = [self.workspace_root] + ([self.state_dir] if self.state_dir is not None else [])
        return tuple(str(p) for p in (*self.gateway_files, *dirs))


_SERVER_KEYS: Final = {
    "host": str,
    "port": int,
    "workspace_root": str,
    "token_file": str,
    "max_frame_size": int,
    "max_request_bytes": int,
    "send_queue_bytes": int,
    "max_stdin_bytes": int,
    "reattach_window_sec": (int, float),
    "buffer_policy": str,
    "buffer_max_bytes": int,
    "max_buffer_bytes": int,
    "max_session_file_bytes": int,
    "max_upload_bytes": int,
    "max_sessions": int,
    "max_connections_per_session": int,
    "header_timeout_sec": (int, float),
    "max_pending_connections": int,
    "shutdown_grace_sec": (int, float),
    "conversations_timeout_sec": (int, float),
    "log_format": str,
    "state_dir": str,
    "allowed_origins": list,
    "public_url": str,
    "pod_name": str,
    "route_prefix": str,
    "trusted_proxies": list,
}
_FLEET_KEYS: Final = {"peers": (str, list)}
BUDGET_KEYS: Final = ("session_usd", "user_daily_usd", "warn_at")
_ACP_KEYS: Final = {"default_agent": str}
# Every name the file may use; any other is an error (gateway/config/strict.py).
_SCHEMA: Final[Schema] = {
    "server": known_names(_SERVER_KEYS),
    "agents": {ANY_NAME: {**known_names(PROFILE_KEYS), "features": known_names(FEATURE_NAMES)}},
    "auth": {**known_names(AUTH_KEYS), "oidc": known_names(OIDC_KEYS)},
    "notify": {"webhooks": [known_names(WEBHOOK_KEYS)]},
    "fleet": known_names(_FLEET_KEYS),
    "acp": known_names(_ACP_KEYS),
    "isolation": known_names(ISOLATION_KEYS),
    "policy": POLICY_SCHEMA,
    "budgets": known_names(BUDGET_KEYS),
}
_ENV: Final = {
    "RAWP_GATEWAY_HOST": "host",
    "RAWP_GATEWAY_PORT": "port",
    "RAWP_GATEWAY_WORKSPACE_ROOT": "workspace_root",
    "RAWP_GATEWAY_TOKEN_FILE": "token_file",
    "RAWP_GATEWAY_MAX_FRAME_SIZE": "max_frame_size",
    "RAWP_GATEWAY_REATTACH_WINDOW_SEC": "reattach_window_sec",
    "RAWP_GATEWAY_BUFFER_POLICY": "buffer_policy",
    "RAWP_GATEWAY_BUFFER_MAX_BYTES": "buffer_max_bytes",
    "RAWP_GATEWAY_MAX_SESSIONS": "max_sessions",
    "RAWP_GATEWAY_LOG_FORMAT": "log_format",
    "RAWP_GATEWAY_STATE_DIR": "state_dir",
}


def load_config(
    path: str | os.PathLike[str] | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """The effective configuration: defaults < TOML file < flags < ``RAWP_GATEWAY_*``."""
    environ = os.environ if environ is None else environ
    settings: dict[str, Any] = {}
    agents = builtin_profiles(environ.get("RAWP_GATEWAY_CLAUDE", "claude"))
    if path is not None:
        where = str(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_FILE_BYTES + 1)
            if len(raw) > MAX_FILE_BYTES:
                raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES} bytes")
            text = raw.decode()  # TOML is UTF-8
            refuse_too_many_rules(where)(text)
            data = tomllib.loads(text)
        except OSError as err:
            raise ConfigError(f"cannot read config file {where}: {err.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{where}: not valid TOML: {err}") from None
        except RecursionError:  # tomllib reads nested arrays and tables recursively
            raise ConfigError(f"{where}: not valid TOML: nested too deeply") from None
        settings["config_file"] = Path(path)
        locate = Locator(where, text)
        unknown = unknown_name(data, _SCHEMA)
        if unknown is not None:
            name, message = unknown
            raise ConfigError(f"{locate(name)}: {message}")
        server = data.get("server", {})
        agent_tables = data.get("agents", {})
        fleet = data.get("fleet", {})
        acp = data.get("acp", {})
        for section, table in (
            ("server", server),
            ("agents", agent_tables),
            ("fleet", fleet),
            ("acp", acp),
        ):
            if not isinstance(table, dict):
                raise ConfigError(f"{where}: [{section}] must be a table")
        for key, value in server.items():
            settings[key] = check_type(f"{where} [server]", key, value, _SERVER_KEYS[key])
        for key, value in fleet.items():
            settings[f"fleet_{key}"] = check_type(f"{where} [fleet]", key, value, _FLEET_KEYS[key])
        for key, value in acp.items():
            settings[f"acp_{key}"] = check_type(f"{where} [acp]", key, value, _ACP_KEYS[key])
        for name, table in agent_tables.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{where}: [agents.{name}] must be a table")
            agents[name] = parse_profile(name, table, agents.get(name), where, locate)
        if "isolation" in data:
            settings["isolation"] = parse_isolation(data["isolation"], locate)
        if "policy" in data:
            settings["policy"] = parse_policy(data["policy"], where)
        if "budgets" in data:
            if not isinstance(data["budgets"], dict):
                raise ConfigError(f"{where}: [budgets] must be a table")
            try:
                settings["budgets"] = limits_of(data["budgets"])
            except ValueError as err:
                raise ConfigError(f"{where} [budgets]: {err}") from None
        try:
            if "auth" in data:
                settings["auth"] = parse_auth(data["auth"], where)
            if "notify" in data:
                settings["webhooks"] = parse_webhooks(data["notify"], where)
        except (AuthConfigError, NotifyConfigError) as err:
            raise ConfigError(str(err)) from None
        settings["secret_files"] = [
            Path(hook["secret_file"]).expanduser()
            for hook in data.get("notify", {}).get("webhooks", [])
            if hook.get("secret_file")
        ]
    for key, value in (flags or {}).items():
        if value is not None:
            settings[key] = value
    for var, key in _ENV.items():
        if var in environ:
            settings[key] = environ[var]
    if "RAWP_GATEWAY_TOKEN" in environ:
        settings["token"] = environ["RAWP_GATEWAY_TOKEN"]
    if "pod_name" not in settings and environ.get("RAWP_GATEWAY_POD_NAME"):
        # The Downward API's pod name: a default, below the file (docs/fleet.md).
        settings["pod_name"] = environ["RAWP_GATEWAY_POD_NAME"]
    return _build(settings, agents)


def _build(settings: dict[str, Any], agents: dict[str, AgentProfile]) -> Config:
    def number(key: str, kind: type, low: float) -> Any:
        value = settings[key]
        try:
            value = kind(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{key} must be a number, got {value!r}") from None
        if not math.isfinite(value):  # "nan" and "inf" parse as floats
            raise ConfigError(f"{key} must be a finite number, got {value}")
        if value < low:
            raise ConfigError(f"{key} must be at least {low}, got {value}")
        return value

    kw: dict[str, Any] = {"agents": agents}
    for key, kind, low in (
        ("port", int, 0),
        ("max_frame_size", int, 4096),
        ("max_request_bytes", int, 1024),
        ("send_queue_bytes", int, 65536),
        ("max_stdin_bytes", int, 65536),
        ("reattach_window_sec", float, 0),
        ("buffer_max_bytes", int, 0),
        ("max_buffer_bytes", int, 0),
        ("max_session_file_bytes", int, 0),
        ("max_upload_bytes", int, 1),
        ("max_sessions", int, 1),
        ("max_connections_per_session", int, 1),
        ("header_timeout_sec", float, 0.1),
        ("max_pending_connections", int, 1),
        ("shutdown_grace_sec", float, 0),
        ("conversations_timeout_sec", float, 0.1),
    ):
        if key in settings:
            kw[key] = number(key, kind, low)
    if kw.get("port", 0) > 65535:  # the socket layer would silently take it modulo 65536
        raise ConfigError(f"port must be at most 65535, got {kw['port']}")
    if "host" in settings:
        host = str(settings["host"])
        if not host or host != host.strip() or any(c.isspace() or c == "\0" for c in host):
            raise ConfigError(f"host must be an address or a name without spaces, got {host!r}")
        kw["host"] = host
    if "workspace_root" in settings:
        kw["workspace_root"] = Path(settings["workspace_root"])
    if settings.get("state_dir"):  # empty: none, as unset
        kw["state_dir"] = Path(settings["state_dir"]).expanduser().absolute()
    if "buffer_policy" in settings:
        policy = str(settings["buffer_policy"]).upper()
        if policy not in POLICIES:
            raise ConfigError(f"buffer_policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        kw["buffer_policy"] = policy
    if "log_format" in settings:
        if settings["log_format"] not in ("text", "json"):
            raise ConfigError(f"log_format must be text or json, got {settings['log_format']!r}")
        kw["log_format"] = settings["log_format"]
    if "allowed_origins" in settings:
        kw["allowed_origins"] = _origins(settings["allowed_origins"])
    for key in ("auth", "webhooks", "policy", "config_file", "isolation", "budgets"):
        if key in settings:
            kw[key] = settings[key]
    default_agent = settings.get("acp_default_agent")
    if default_agent is not None:
        if default_agent not in agents:
            known = ", ".join(sorted(agents))
            raise ConfigError(
                f"[acp] default_agent {default_agent!r} is not an agent profile; known: {known}"
            )
        kw["acp_default_agent"] = default_agent
    if settings.get("public_url"):
        url = str(settings["public_url"]).rstrip("/")
        if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
            raise ConfigError(f"public_url must be an http(s) URL, got {url!r}")
        kw["public_url"] = url
    kw.update(_fleet(settings))
    token = settings.get("token")
    if token is not None and not token.strip():
        # An empty variable must not turn authentication off (nor hide a token file).
        raise ConfigError("RAWP_GATEWAY_TOKEN is set but empty: unset it or give a token")
    if token is None and settings.get("token_file"):
        token = read_token_file(settings["token_file"])
    kw["token"] = token
    if (
        kw["token"] or kw.get("auth", AuthSettings()).configured
    ) and "workspace_root" not in settings:
        # A token means others reach the gateway: which directory their agents work in must be a
        # decision, not wherever the gateway happened to be started.
        raise ConfigError(
            f"with a token, workspace_root must be set (--workspace-root, [server] workspace_root "
            f"or RAWP_GATEWAY_WORKSPACE_ROOT); it would otherwise be the current directory, "
            f"{Path.cwd()}"
        )
    kw["gateway_files"] = _gateway_files(settings, kw.get("auth", AuthSettings()))
    config = Config(**kw)
    root = config.workspace_root.expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"workspace_root {str(root)!r} is not a directory")
    config = replace(config, workspace_root=root)
    check_binds_apart(config.isolation, [Path(p) for p in config.hidden_paths])
    return config


def _gateway_files(settings: dict[str, Any], auth: AuthSettings) -> tuple[Path, ...]:
    """``Config.gateway_files``: where the gateway read its settings and secrets from, and its
    audit log with every rotation it may make."""
    files = [settings.get("config_file"), settings.get("token_file"), auth.users_file]
    files += settings.get("secret_files", [])
    if auth.audit_log is not None:
        log = auth.audit_log
        files += [log, *(log.with_name(f"{log.name}.{n}") for n in range(1, auth.audit_keep + 1))]
    return tuple(Path(f).expanduser().absolute() for f in files if f)


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, without a trailing slash."""
    return origin.strip().rstrip("/").lower()


def _origins(values: list[Any]) -> frozenset[str]:
    """``[server] allowed_origins``: ``scheme://host[:port]`` strings, normalised."""
    if len(values) > MAX_ALLOWED_ORIGINS:
        raise ConfigError(f"allowed_origins may list at most {MAX_ALLOWED_ORIGINS} origins")
    out: set[str] = set()
    for value in values:
        if not isinstance(value, str) or len(value) > MAX_ORIGIN_CHARS:
            raise ConfigError(
                f"allowed_origins entries must be strings of at most {MAX_ORIGIN_CHARS} "
                f"characters, got {value!r}"
            )
        origin = normalize_origin(value)
        scheme, sep, host = origin.partition("://")
        if not sep or scheme not in ("http", "https") or not host or "/" in host:
            raise ConfigError(
                f"allowed_origins entries must look like https://host[:port], got {value!r}"
            )
        out.add(origin)
    return frozenset(out)


def _fleet(settings: dict[str, Any]) -> dict[str, Any]:
    """``pod_name``, ``route_prefix`` (``{pod}`` filled in), ``trusted_proxies`` and ``[fleet]
    peers``, checked (docs/fleet.md)."""
    kw: dict[str, Any] = {}
    pod = str(settings.get("pod_name") or socket.gethostname())
    if len(pod) > MAX_POD_NAME_CHARS or not _POD_NAME.fullmatch(pod):
        raise ConfigError(
            f"pod_name must be a DNS name of at most {MAX_POD_NAME_CHARS} characters "
            f"(letters, digits, '.', '-', '_'), got {pod!r}"
        )
    kw["pod_name"] = pod
    prefix = str(settings.get("route_prefix") or "").replace("{pod}", pod)
    if prefix and (
        len(prefix) > MAX_ROUTE_PREFIX_CHARS
        or not _ROUTE_PREFIX.fullmatch(prefix)
        or any(part in (".", "..") for part in prefix.split("/"))
    ):
        raise ConfigError(
            f"route_prefix must be a path like /pods/{{pod}} (no trailing '/', no '.' or '..', "
            f"at most {MAX_ROUTE_PREFIX_CHARS} characters), got {prefix!r}"
        )
    kw["route_prefix"] = prefix
    proxies = settings.get("trusted_proxies", [])
    if len(proxies) > MAX_TRUSTED_PROXIES:
        raise ConfigError(f"trusted_proxies may list at most {MAX_TRUSTED_PROXIES} networks")
    networks = []
    for value in proxies:
        try:
            if not isinstance(value, str):
                raise TypeError(value)
            networks.append(ipaddress.ip_network(value))
        except (TypeError, ValueError):
            raise ConfigError(
                f"trusted_proxies entries must be addresses or networks (10.0.0.0/8), got {value!r}"
            ) from None
    kw["trusted_proxies"] = tuple(networks)
    peers = settings.get("fleet_peers", [])
    if isinstance(peers, str):
        match = _DNS_PEERS.fullmatch(peers)
        if len(peers) > MAX_PEER_CHARS or match is None or not 0 < int(match[3]) <= 65535:
            raise ConfigError(
                f'[fleet] peers as a string must be "dns:NAME:PORT", got {peers[:300]!r}'
            )
        kw["fleet_peers"] = (peers,)
        return kw
    if len(peers) > MAX_PEERS:
        raise ConfigError(f"[fleet] peers may list at most {MAX_PEERS} base URLs")
    urls = []
    for value in peers:
        url = value.rstrip("/") if isinstance(value, str) else ""
        scheme, sep, rest = url.partition("://")
        if (
            len(url) > MAX_PEER_CHARS
            or scheme not in ("http", "https")
            or not sep
            or not rest
            or "/" in rest
            or any(c.isspace() for c in rest)
        ):
            raise ConfigError(
                f"[fleet] peers entries must be base URLs like http://10.1.2.3:8765, got {value!r}"
            )
        urls.append(url)
    kw["fleet_peers"] = tuple(urls)
    return kw


def read_token_file(path: str | os.PathLike[str]) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ConfigError(f"cannot read token file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"token file {path} is not UTF-8 text") from None
    if not token:
        raise ConfigError(f"token file {path} is empty")
    return token
