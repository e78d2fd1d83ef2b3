"""A session's MCP servers, as configured or sent: checked, expanded, merged, and shown redacted.

Theory of operation
-------------------
A ``ServerSpec`` is one MCP server a session hands its agent (the control plane's "MCP servers"):
its name, its kind (``stdio``: a ``command`` argv and its ``env``; ``http``: a Streamable HTTP
``url`` and its ``headers``), the profiles it is for (``agents``, configured servers only) and
where it came from (``ORIGINS``: the configuration's ``[mcp.servers.NAME]``, ``mcp_servers`` of
``POST /v1/session``, an editor's ``mcpServers`` on ``/acp``). It is not the agent's own report of
a server (``parsers.events.McpServer``): that one says what became of it.

Everything here is pure: a table in, a spec or a ``McpServerError`` out. Each field is declared as
a configuration key (``setting``, gateway/setting.py) so gateway/config/ reads ``[mcp.servers.NAME]``
like every other section; a request's list is read by ``servers_from_wire`` with the same checks,
so a master's table and the file's are refused for the same reasons in the same words. Every size
is bounded before it is looked at (``MAX_*``; docs/mcp.md lists them).

``${NAME}`` in a configured server's ``env`` and ``headers`` values is taken from the gateway's
environment when the configuration is read (``expand``, the mapping passed in): a name that is not
there is an error naming it, and a ``RAWP_GATEWAY_*`` name is refused (the agent never holds the
gateway's settings). A server a master or an editor sent is never expanded: it would read the
gateway's environment out to whoever sent it.

``merged`` is a session's servers: the configured ones its profile takes, then the request's and
the editor's; a name given twice is refused (a configured server is never replaced). ``redacted`` is
what a frame, a log line, the audit log and the session object may say of a server: the names of its
env variables and headers, never their values; its URL without credentials or query.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, TypeGuard

from gateway.setting import setting

__all__ = [
    "KINDS",
    "MAX_ARGS",
    "MAX_ARGV_BYTES",
    "MAX_NAME_CHARS",
    "MAX_SERVERS",
    "MAX_URL_CHARS",
    "MAX_VALUE_BYTES",
    "MAX_VARIABLES",
    "NAME_WORDS",
    "ORIGINS",
    "STATUSES",
    "Kind",
    "McpServerError",
    "Origin",
    "ServerSpec",
    "expand",
    "finished",
    "from_record",
    "is_server_name",
    "merged",
    "not_taken",
    "redacted",
    "report",
    "server_from_table",
    "servers_from_wire",
    "servers_to_wire",
    "to_record",
    "variables",
]

Kind = Literal["stdio", "http"]
Origin = Literal["config", "request", "editor"]
KINDS: Final[tuple[Kind, ...]] = ("stdio", "http")
ORIGINS: Final[tuple[Origin, ...]] = ("config", "request", "editor")

# What one session may be handed: each a documented default (docs/mcp.md#limits).
MAX_SERVERS: Final = 32  # a session's servers, all origins together
MAX_NAME_CHARS: Final = 64  # a server's name: part of every tool name mcp__<server>__<tool>
MAX_ARGS: Final = 256  # a stdio server's argv entries
MAX_ARGV_BYTES: Final = 64 * 1024  # a stdio server's argv, all entries together (UTF-8)
MAX_VARIABLES: Final = 64  # env variables of a stdio server, headers of an http one
MAX_VARIABLE_NAME_CHARS: Final = 128
MAX_VALUE_BYTES: Final = 8 * 1024  # one env or header value (UTF-8)
MAX_URL_CHARS: Final = 2048
MAX_AGENTS: Final = 64  # profiles a configured server is restricted to

# Letters, digits, '_' and '-', starting with a letter or digit; no "__", which separates the
# server from the tool in mcp__<server>__<tool> (a name holding it would make tool names ambiguous).
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# An HTTP header's name is a token (RFC 9110 §5.1).
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# scheme, authority, path; the query and fragment after (a URL is split here by hand: the sans-IO
# core imports nothing of urllib, which a repo test takes for I/O).
_URL: Final = re.compile(r"(?i)(https?)://([^/?#]*)([^?#]*)(?:\?[^#]*)?(?:#.*)?", re.S)
_VARIABLE: Final = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_GATEWAY_PREFIX: Final = "RAWP_GATEWAY_"
NAME_WORDS: Final = (
    f"letters, digits, '_' or '-' (at most {MAX_NAME_CHARS} characters, starting with a letter "
    "or digit, no '__')"
)


class McpServerError(ValueError):
    """A server's table cannot be used; the message says which server, which key and why."""


def _show(value: Any) -> str:
    """A value quoted for an error, cut: it comes from a master or a file."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_server_name(value: Any) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and len(value) <= MAX_NAME_CHARS
        and bool(_NAME.fullmatch(value))
        and "__" not in value
    )


def _text(value: Any, what: str, limit: int, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {_show(value)}")
    if "\0" in value:
        raise ValueError(f"{what} must not hold a NUL character")
    if not empty and not value:
        raise ValueError(f"{what} must not be empty")
    if len(value.encode(errors="surrogatepass")) > limit:
        raise ValueError(f"{what} is longer than {limit} bytes")
    return value


def _command(value: Any, name: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f"{name} must be a non-empty list of strings (the argv)")
    if len(value) > MAX_ARGS:
        raise ValueError(f"{name} has {len(value)} entries; at most {MAX_ARGS}")
    argv = tuple(_text(arg, f"{name} entry", MAX_ARGV_BYTES) for arg in value)
    if not argv[0]:
        raise ValueError(f"{name}'s program must not be empty")
    if sum(len(a.encode(errors="surrogatepass")) for a in argv) > MAX_ARGV_BYTES:
        raise ValueError(f"{name} is longer than {MAX_ARGV_BYTES} bytes in all")
    return argv


def _table(value: Any, name: str, names: re.Pattern[str], header: bool) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a table of strings")
    if len(value) > MAX_VARIABLES:
        raise ValueError(f"{name} has {len(value)} entries; at most {MAX_VARIABLES}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or len(key) > MAX_VARIABLE_NAME_CHARS:
            raise ValueError(f"{name}: a name is at most {MAX_VARIABLE_NAME_CHARS} characters")
        if not names.fullmatch(key):
            raise ValueError(f"{name}: {_show(key)} is not a usable name")
        text = _text(item, f"{name}.{key}", MAX_VALUE_BYTES)
        if header and ("\r" in text or "\n" in text):
            raise ValueError(f"{name}.{key} must not hold a line break")
        out[key] = text
    return out


def _env(value: Any, name: str) -> dict[str, str]:
    return _table(value, name, _ENV_NAME, header=False)


def _headers(value: Any, name: str) -> dict[str, str]:
    return _table(value, name, _HEADER_NAME, header=True)


def _url(value: Any, name: str) -> str | None:
    if value is None:
        return None
    text = _text(value, name, MAX_URL_CHARS, empty=False)  # its UTF-8 bytes: never fewer
    if any(c.isspace() for c in text):
        raise ValueError(f"{name} must not hold white space")
    parts = _URL.fullmatch(text)
    if parts is None or not _host(parts.group(2)):
        raise ValueError(f"{name} must be an http:// or https:// URL, got {_show(text)}")
    return text


def _host(authority: str) -> str:
    """The host and port of a URL's authority, without its user and password."""
    return authority.rpartition("@")[2]


def _agents(value: Any, name: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) > MAX_AGENTS:
        raise ValueError(f"{name} must be a list of at most {MAX_AGENTS} profile names")
    for entry in value:
        if not isinstance(entry, str) or not entry or len(entry) > 128:
            raise ValueError(f"{name} must be profile names, got {_show(entry)}")
    return tuple(value)


_TABLE: Final = {"toml": dict, "expected": "a table of strings", "shown": "`{}`"}


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server of a session. The declared fields are the keys of ``[mcp.servers.NAME]``
    and of an entry of ``mcp_servers`` (gateway/setting.py); ``name`` and ``origin`` are not keys
    of the table (the name is the table's, or the entry's ``name``)."""

    command: tuple[str, ...] | None = setting(
        None,
        toml=list,
        check=_command,
        expected="a list of strings",
        doc="a stdio server: the argv the agent starts it with (never through a shell)",
    )
    env: dict[str, str] = setting(
        factory=dict,
        check=_env,
        doc="a stdio server's environment variables; values may say ${NAME}",
        **_TABLE,
    )
    url: str | None = setting(
        None, toml=str, check=_url, doc="a Streamable HTTP server: its http:// or https:// URL"
    )
    headers: dict[str, str] = setting(
        factory=dict,
        check=_headers,
        doc="an http server's request headers; values may say ${NAME}",
        **_TABLE,
    )
    agents: tuple[str, ...] | None = setting(
        None,
        toml=list,
        check=_agents,
        expected="a list of profile names",
        shown="every profile",
        doc="only these profiles get it (the configuration only)",
    )
    name: str = ""
    origin: Origin = "config"

    @property
    def kind(self) -> Kind:
        return "http" if self.url is not None else "stdio"

    def secrets(self) -> dict[str, str]:
        """The values that must never be shown (env for stdio, headers for http)."""
        return dict(self.headers if self.kind == "http" else self.env)

    def __repr__(self) -> str:  # a spec in a traceback or a log says no secret either
        return f"ServerSpec({redacted(self)!r})"


_KEYS: Final = ("command", "env", "url", "headers", "agents")
_CHECKS: Final = {"command": _command, "env": _env, "url": _url, "headers": _headers}


def finished(spec: ServerSpec, name: str, origin: Origin) -> ServerSpec:
    """``spec`` (its keys checked one by one) named and checked as a whole: a stdio server or an
    http one, never both, never neither; ``agents`` only in the configuration."""
    if not is_server_name(name):
        raise McpServerError(f"MCP server {_show(name)}: the name must be {NAME_WORDS}")
    if (spec.command is None) == (spec.url is None):
        raise McpServerError(f"MCP server {name}: give either command (stdio) or url (http)")
    if spec.command is not None and spec.headers:
        raise McpServerError(f"MCP server {name}: headers are for an http server (url)")
    if spec.url is not None and spec.env:
        raise McpServerError(f"MCP server {name}: env is for a stdio server (command)")
    if origin != "config" and spec.agents is not None:
        raise McpServerError(f"MCP server {name}: agents is for the configuration's servers")
    return replace(spec, name=name, origin=origin)


def server_from_table(table: Any, origin: Origin, name: str | None = None) -> ServerSpec:
    """One server of a master's or an editor's list (``name`` in the table), or of another
    source whose name is given; every key checked as the configuration's is."""
    if not isinstance(table, Mapping):
        raise McpServerError("an MCP server must be an object")
    if name is None:
        given = table.get("name")
        if not is_server_name(given):
            raise McpServerError(f"an MCP server's name must be {NAME_WORDS}, got {_show(given)}")
        name = given
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key == "name":
            continue
        if key not in _KEYS or (key == "agents" and origin != "config"):
            raise McpServerError(f"MCP server {name}: unknown key {_show(key)}")
        try:
            if key == "agents":
                values[key] = _agents(value, key)
            else:
                values[key] = _CHECKS[key](value, key)
        except ValueError as err:
            raise McpServerError(f"MCP server {name}: {err}") from None
    return finished(ServerSpec(**values), name, origin)


def servers_from_wire(entries: Any, origin: Origin) -> tuple[ServerSpec, ...]:
    """``mcp_servers`` of a request (a list of tables), each checked; names unique."""
    if not isinstance(entries, list):
        raise McpServerError("mcp_servers must be a list of objects")
    if len(entries) > MAX_SERVERS:
        raise McpServerError(f"mcp_servers has {len(entries)} servers; at most {MAX_SERVERS}")
    specs = tuple(server_from_table(entry, origin) for entry in entries)
    _refuse_twice(specs)
    return specs


def servers_to_wire(specs: Iterable[ServerSpec]) -> list[dict[str, Any]]:
    """Servers as ``servers_from_wire`` reads them back (the state dir's copy of a master's or an
    editor's servers, values included: see docs/mcp.md#what-is-kept)."""
    out = []
    for spec in specs:
        entry: dict[str, Any] = {"name": spec.name}
        if spec.kind == "stdio":
            entry.update(command=list(spec.command or ()), env=dict(spec.env))
        else:
            entry.update(url=spec.url, headers=dict(spec.headers))
        out.append(entry)
    return out


def variables(spec: ServerSpec) -> list[str]:
    """The ``${NAME}`` names a server's env and header values use, in order, once each."""
    found: dict[str, None] = {}
    for value in (*spec.env.values(), *spec.headers.values()):
        found.update(dict.fromkeys(_VARIABLE.findall(value)))
    return list(found)


def expand(spec: ServerSpec, environ: Mapping[str, str]) -> ServerSpec:
    """A configured server with each ``${NAME}`` of its env and header values taken from
    ``environ``; McpServerError naming the first that ``environ`` lacks, or a gateway setting."""
    for name in variables(spec):
        if name.startswith(_GATEWAY_PREFIX):
            raise McpServerError(
                f"MCP server {spec.name}: ${{{name}}} is a gateway setting, never given to an agent"
            )
        if name not in environ:
            raise McpServerError(
                f"MCP server {spec.name}: ${{{name}}} is not set in the gateway's environment"
            )

    def filled(values: Mapping[str, str], what: str) -> dict[str, str]:
        out = {k: _VARIABLE.sub(lambda m: environ[m.group(1)], v) for k, v in values.items()}
        for key, value in out.items():
            _text(value, f"MCP server {spec.name}: {what}.{key}", MAX_VALUE_BYTES)
        return out

    try:
        env, headers = filled(spec.env, "env"), filled(spec.headers, "headers")
        if spec.url is not None and any("\r" in v or "\n" in v for v in headers.values()):
            raise ValueError(f"MCP server {spec.name}: a header's value holds a line break")
    except ValueError as err:
        raise McpServerError(str(err)) from None
    return replace(spec, env=env, headers=headers)


def merged(
    configured: Iterable[ServerSpec],
    profile: str,
    *more: Sequence[ServerSpec],
) -> tuple[ServerSpec, ...]:
    """A session's servers: the configured ones for ``profile`` (all, or those whose ``agents``
    names it), then each further list (the request's, the editor's) in order. McpServerError
    when a name comes twice (a configured server is never replaced) or there are too many."""
    ours = [s for s in configured if s.agents is None or profile in s.agents]
    specs = (*ours, *(s for group in more for s in group))
    _refuse_twice(specs)
    if len(specs) > MAX_SERVERS:
        raise McpServerError(f"a session has at most {MAX_SERVERS} MCP servers, got {len(specs)}")
    return specs


def _refuse_twice(specs: Sequence[ServerSpec]) -> None:
    seen: dict[str, ServerSpec] = {}
    for spec in specs:
        first = seen.get(spec.name)
        if first is not None:
            if first.origin == "config":
                raise McpServerError(
                    f"MCP server {spec.name}: the name is a configured server's, which is "
                    "never replaced"
                )
            raise McpServerError(f"MCP server {spec.name}: the name is given twice")
        seen[spec.name] = spec


def _shown_url(url: str) -> str:
    """The URL without user, password, query or fragment (each may carry a credential)."""
    parts = _URL.fullmatch(url)
    if parts is None:  # never: every spec's URL was checked
        return ""
    scheme, authority, path = parts.groups()
    return f"{scheme}://{_host(authority)}{path}"


def redacted(spec: ServerSpec) -> dict[str, Any]:
    """What may be said of a server anywhere (a frame, a log line, the audit log, the session
    object): name, kind, origin, the program and URL, and the names of its env variables and
    headers, never their values."""
    shown: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "origin": spec.origin}
    if spec.kind == "stdio":
        shown["command"] = list(spec.command or ())[:1]
        shown["env"] = sorted(spec.env)
    else:
        shown["url"] = _shown_url(spec.url or "")
        shown["headers"] = sorted(spec.headers)
    return shown


# --- kept with the session ------------------------------------------------------------------


def to_record(specs: Iterable[ServerSpec]) -> list[dict[str, Any]]:
    """What the session's record keeps of its servers (docs/mcp.md#what-is-kept): a configured
    server by its name alone (its values are read from the configuration again at a restart), a
    master's or an editor's whole, values included (there is nowhere else to read them from)."""
    out: list[dict[str, Any]] = []
    for spec in specs:
        if spec.origin == "config":
            out.append({"name": spec.name, "origin": "config"})
        else:
            out.append({**servers_to_wire([spec])[0], "origin": spec.origin})
    return out


def from_record(
    entries: Any, configured: Iterable[ServerSpec]
) -> tuple[tuple[ServerSpec, ...], list[str]]:
    """A restored session's servers from its record (input like a request: the state dir may
    have been written by an agent) and the configuration's servers for its profile now; and what
    was dropped, each a sentence (a configured server gone from the configuration)."""
    if entries is None:
        return (), []
    if not isinstance(entries, list) or len(entries) > MAX_SERVERS:
        raise McpServerError("the record's mcp_servers is not a list of servers")
    by_name = {spec.name: spec for spec in configured}
    specs: list[ServerSpec] = []
    dropped: list[str] = []
    for entry in entries:
        if not isinstance(entry, Mapping) or entry.get("origin") not in ORIGINS:
            raise McpServerError("the record's mcp_servers holds an entry of no known origin")
        origin = entry["origin"]
        if origin == "config":
            found = by_name.get(entry.get("name"))  # type: ignore[arg-type]
            if found is None:
                dropped.append(f"MCP server {entry.get('name')!r} is no longer configured")
            else:
                specs.append(found)
        else:
            table = {k: v for k, v in entry.items() if k != "origin"}
            specs.append(server_from_table(table, origin))
    _refuse_twice(specs)
    return tuple(specs), dropped


# --- what became of them ----------------------------------------------------------------------

# The statuses said to masters (docs/mcp.md#what-masters-see): the agent's own word where it is
# one of these, else "failed" for what it could not start and "pending" before it reports.
STATUSES: Final = ("connected", "failed", "pending", "needs-auth", "disabled")


def not_taken(kind: str) -> str:
    return f"the agent does not take {kind} servers"


def report(
    shown: Sequence[Mapping[str, Any]],
    kinds: Sequence[str],
    reported: Sequence[Any] | None,
    reasons: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Each of the session's servers (``shown``: their ``redacted`` views, kept whole) with what
    became of it: ``status`` (``STATUSES``) and, where known, ``reason``, and the tools the agent listed.
    ``kinds``: what the agent takes (a server of another kind was never given to it: failed);
    ``reported``: the agent's own report (``parsers.events.McpServer``s; None: none yet, so
    pending); ``reasons``: why a failed one failed, found elsewhere (Claude Code's MCP logs).
    A server the agent reports that the session did not give it is listed too (origin
    ``agent``)."""
    reasons = reasons or {}
    by_name = {r.name: r for r in reported or ()}
    out: list[dict[str, Any]] = []
    for server in shown:
        name = server["name"]
        entry: dict[str, Any] = dict(server)  # the redacted view: names, never values
        agent = by_name.pop(name, None)
        if server["kind"] not in kinds:
            entry.update(status="failed", reason=not_taken(server["kind"]))
        elif agent is None:
            entry["status"] = "pending"
        else:
            entry.update(_status_of(agent, reasons.get(name)))
        out.append(entry)
    for agent in by_name.values():
        out.append(
            {"name": agent.name, "origin": "agent", **_status_of(agent, reasons.get(agent.name))}
        )
    return out


def _status_of(agent: Any, found: str | None) -> dict[str, Any]:
    status = agent.status if agent.status in STATUSES else "failed"
    out: dict[str, Any] = {"status": status}
    reason = agent.error or found
    if status != "connected" and reason:
        out["reason"] = reason
    elif agent.status not in STATUSES:
        out["reason"] = f"the agent says {agent.status!r}"
    if agent.tools:
        out["tools"] = list(agent.tools)
    return out
