"""How each agent is handed a session's MCP servers: Codex's ``-c`` overrides, Gemini's settings,
an ACP agent's ``mcpServers``; pure, the shell writes and starts what these return.

Theory of operation
-------------------
A session's servers (``ServerSpec``, gateway/protocol/mcp_servers.py: checked, ``${NAME}``
already expanded) become what the agent's own configuration takes. What each pinned CLI takes was
tried against it (docs/mcp.md has the findings):

- Codex 0.171.0: ``-c mcp_servers.<name>.<key>=<TOML>`` on the command line, once per key (the
  argv is the agent's, which every process on the host can read in ``/proc``, and the gateway logs
  it). So no secret goes there: an ``env`` or ``headers`` value rides in a variable of the agent's
  environment (``SECRET_PREFIX`` and a number), named in the argv. A header is
  ``env_http_headers = {<header> = "<variable>"}``. A stdio server's variables are passed by Codex
  only when listed in ``env_vars`` and only under their own name, so the server is started through
  ``/bin/sh -c`` setting each of its own names from the numbered variable and ``exec``-ing the
  argv unchanged; the script holds names only. ``shell_environment_policy.exclude`` keeps the
  numbered variables out of the commands Codex's shell tool runs (it replaces an ``exclude`` of
  the user's own ``config.toml``).
- Gemini CLI 0.61.0: ``mcpServers`` in its settings file (``httpUrl`` and ``headers`` for an http
  server), and ``--allowed-mcp-server-names`` naming exactly the session's (as Claude Code's
  ``--strict-mcp-config``: the user's other servers stay off, and an ``mcp.allowed`` in the
  user's settings does not hide the session's). Gemini expands ``$NAME`` and ``${NAME}`` in every
  string of its settings from its environment, so a value is never written into the file as it is:
  each secret, and any other string holding a ``$``, is a ``${variable}`` of the agent's
  environment instead, which also keeps the secrets off the disk.
- An ACP agent: ``mcpServers`` of ``session/new`` and ``session/load``, in ACP's shapes (stdio
  without ``type``: claude-agent-acp 0.23.1 fails ``session/new`` with an entry typed
  ``"stdio"``); which kinds an agent takes it says in ``initialize`` (the adapter, parsers/acp/,
  keeps those and reports the others failed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.protocol.mcp_servers import (
    MAX_SERVERS,
    MAX_VARIABLES,
    McpServerError,
    ServerSpec,
)

__all__ = [
    "SECRET_PREFIX",
    "CliDelivery",
    "acp_servers",
    "codex_delivery",
    "editor_servers",
    "gemini_delivery",
    "gemini_settings",
]

SECRET_PREFIX: Final = "RAWP_MCP_SECRET_"
SHELL: Final = "/bin/sh"


@dataclass(frozen=True)
class CliDelivery:
    """What the shell adds to one agent start: ``args`` to its argv (before the template's end of
    options), ``env`` to its environment (the servers' secrets, never logged), and for Gemini the
    ``mcpServers`` table its settings file gets."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    servers: Mapping[str, Any] | None = None


class _Variables:
    """Numbered environment variables holding values the agent's configuration only names."""

    def __init__(self) -> None:
        self.env: dict[str, str] = {}

    def add(self, value: str) -> str:
        name = f"{SECRET_PREFIX}{len(self.env) + 1}"
        self.env[name] = value
        return name


def _toml(value: str | Sequence[str]) -> str:
    """A TOML string or array of strings: JSON's, whose escapes TOML reads the same, with the
    text itself kept (JSON's ``\\ud83d``-style pairs for characters beyond the BMP are not TOML)."""
    return json.dumps(value, ensure_ascii=False)


def codex_delivery(specs: Iterable[ServerSpec]) -> CliDelivery:
    """Codex's ``-c mcp_servers.<name>...`` overrides and the variables they name."""
    args: list[str] = []
    names = _Variables()
    for spec in specs:
        key = f"mcp_servers.{spec.name}"
        if spec.kind == "http":
            args += ["-c", f"{key}.url={_toml(spec.url or '')}"]
            if spec.headers:
                pairs = ", ".join(
                    f"{_toml(header)} = {_toml(names.add(value))}"
                    for header, value in spec.headers.items()
                )
                args += ["-c", f"{key}.env_http_headers={{{pairs}}}"]
            continue
        argv = list(spec.command or ())
        if spec.env:
            given = {variable: names.add(value) for variable, value in spec.env.items()}
            # Names only: each of the server's own variables from its numbered one, then the argv
            # as it was ($0 and "$@": never split, never read again by the shell).
            sets = " ".join(f'{variable}="${theirs}"' for variable, theirs in given.items())
            script = f'export {sets}; exec "$0" "$@"'
            args += [
                "-c",
                f"{key}.command={_toml(SHELL)}",
                "-c",
                f"{key}.args={_toml(['-c', script, *argv])}",
                "-c",
                f"{key}.env_vars={_toml(list(given.values()))}",
            ]
        else:
            args += ["-c", f"{key}.command={_toml(argv[0])}", "-c", f"{key}.args={_toml(argv[1:])}"]
    if names.env:
        # The variables are the servers', not the commands': Codex's shell tool leaves them out.
        args += ["-c", f"shell_environment_policy.exclude={_toml([SECRET_PREFIX + '*'])}"]
    return CliDelivery(args=tuple(args), env=names.env)


def gemini_delivery(specs: Iterable[ServerSpec]) -> CliDelivery:
    """Gemini's ``mcpServers`` (for its settings file), the variables they name, and the flag that
    allows exactly these servers; nothing at all for a session without servers."""
    names = _Variables()

    def literal(text: str) -> str:
        # Gemini would expand a "$" of the text itself: such a string goes by variable too.
        return f"${{{names.add(text)}}}" if "$" in text else text

    servers: dict[str, Any] = {}
    for spec in specs:
        if spec.kind == "http":
            entry: dict[str, Any] = {"httpUrl": literal(spec.url or "")}
            if spec.headers:
                entry["headers"] = {h: f"${{{names.add(v)}}}" for h, v in spec.headers.items()}
        else:
            argv = list(spec.command or ())
            entry = {"command": literal(argv[0]), "args": [literal(a) for a in argv[1:]]}
            if spec.env:
                entry["env"] = {k: f"${{{names.add(v)}}}" for k, v in spec.env.items()}
        servers[spec.name] = entry
    if not servers:
        return CliDelivery()
    # One argument, comma-separated (the flag takes one value per use; names hold no comma).
    allowed = ("--allowed-mcp-server-names", ",".join(servers))
    return CliDelivery(args=allowed, env=names.env, servers=servers)


def gemini_settings(existing: Any, servers: Mapping[str, Any]) -> dict[str, Any]:
    """The settings file Gemini reads: ``existing`` (the session's own copy; anything but a JSON
    object counts as empty) with ``mcpServers`` replaced by the session's."""
    settings = dict(existing) if isinstance(existing, dict) else {}
    settings["mcpServers"] = dict(servers)
    return settings


def acp_servers(specs: Iterable[ServerSpec]) -> list[dict[str, Any]]:
    """The servers as ACP's ``session/new`` and ``session/load`` carry them."""
    out: list[dict[str, Any]] = []
    for spec in specs:
        if spec.kind == "http":
            headers = [{"name": k, "value": v} for k, v in spec.headers.items()]
            out.append({"type": "http", "name": spec.name, "url": spec.url, "headers": headers})
        else:
            argv = list(spec.command or ())
            env = [{"name": k, "value": v} for k, v in spec.env.items()]
            # No "type": ACP's stdio shape has none, and claude-agent-acp 0.23.1 refuses the
            # whole session/new for an entry typed "stdio".
            out.append({"name": spec.name, "command": argv[0], "args": argv[1:], "env": env})
    return out


def editor_servers(entries: Any) -> list[dict[str, Any]]:
    """An ACP client's ``mcpServers`` (``session/new`` on ``/acp``) as the tables of
    ``mcp_servers`` (gateway/protocol/mcp_servers.py checks them as a master's): stdio
    ``{name, command, args, env: [{name, value}]}`` (a ``type`` of ``"stdio"`` taken too), http
    ``{type: "http", name, url, headers: [{name, value}]}``. McpServerError for another kind (sse:
    the gateway advertises none) or a shape that is neither; bounds are the tables' checks."""
    if not isinstance(entries, list):
        raise McpServerError("mcpServers must be a list of objects")
    if len(entries) > MAX_SERVERS:
        raise McpServerError(f"mcpServers has {len(entries)} servers; at most {MAX_SERVERS}")
    tables: list[dict[str, Any]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise McpServerError("an MCP server must be an object")
        kind = entry.get("type", "stdio")
        name = entry.get("name")
        if kind == "http":
            tables.append(
                {"name": name, "url": entry.get("url"), "headers": _pairs(entry.get("headers"))}
            )
        elif kind == "stdio":
            args = entry.get("args", [])
            if not isinstance(args, list):
                raise McpServerError(f"MCP server {str(name)[:64]!r}: args must be a list")
            table = {"name": name, "command": [entry.get("command"), *args]}
            table["env"] = _pairs(entry.get("env"))
            tables.append(table)
        else:
            raise McpServerError(
                f"MCP server {str(name)[:64]!r}: {str(kind)[:16]!r} servers are not taken "
                "(mcpCapabilities says which are)"
            )
    return tables


def _pairs(value: Any) -> Any:
    """ACP's ``[{name, value}]`` as a table; anything else as it is, for the table's check to
    refuse (a name given twice too: the last would silently win)."""
    if value is None:
        return {}
    if not isinstance(value, list):
        return value
    if len(value) > MAX_VARIABLES:
        raise McpServerError(f"env and headers hold at most {MAX_VARIABLES} entries")
    table: dict[Any, Any] = {}
    for pair in value:
        if not isinstance(pair, dict) or set(pair) - {"name", "value", "_meta"}:
            raise McpServerError("env and headers must be lists of {name, value}")
        key = pair.get("name")
        if not isinstance(key, str) or key in table:
            raise McpServerError(f"env and headers: {str(key)[:64]!r} is no name, or given twice")
        table[key] = pair.get("value")
    return table
