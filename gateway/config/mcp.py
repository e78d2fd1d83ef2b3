"""``[mcp.servers.NAME]`` (docs/configuration.md, docs/mcp.md): the MCP servers a team gives its
sessions, read into ``ServerSpec``s (gateway/protocol/mcp_servers.py, whose fields declare the
keys), each ``${NAME}`` of their env and header values taken from the gateway's environment now:
a name the environment lacks stops ``serve`` with one line naming it, before anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.config.checks import ConfigError
from gateway.config.settings import build, declared, file_values
from gateway.protocol.mcp_servers import (
    MAX_SERVERS,
    McpServerError,
    ServerSpec,
    expand,
    finished,
)

__all__ = ["MCP_KEYS", "McpSettings", "parse_mcp"]

MCP_KEYS: Final = tuple(declared(ServerSpec))


@dataclass(frozen=True)
class McpSettings:
    """``[mcp]``: the configured servers, in the file's order, their ``${NAME}``s expanded."""

    servers: tuple[ServerSpec, ...] = ()

    def for_profile(self, profile: str) -> tuple[ServerSpec, ...]:
        return tuple(s for s in self.servers if s.agents is None or profile in s.agents)


def parse_mcp(
    table: Any, where: str, environ: Mapping[str, str], profiles: Mapping[str, Any]
) -> McpSettings:
    """``[mcp]`` checked (its names are known already: gateway/config/strict.py) and expanded
    from ``environ``; ``profiles``: the names ``agents`` may use."""
    if not isinstance(table, dict) or not isinstance(table.get("servers", {}), dict):
        raise ConfigError(f"{where}: [mcp] and [mcp.servers] must be tables")
    servers = table.get("servers", {})
    if len(servers) > MAX_SERVERS:
        raise ConfigError(
            f"{where}: [mcp.servers] has {len(servers)} servers; at most {MAX_SERVERS}"
        )
    specs = []
    for name, entry in servers.items():
        there = f"{where} [mcp.servers.{name}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{there} must be a table")
        try:
            spec = finished(
                build(ServerSpec, file_values(ServerSpec, entry, there), there), name, "config"
            )
            spec = expand(spec, environ)
        except McpServerError as err:
            raise ConfigError(f"{there}: {err}") from None
        unknown = sorted(set(spec.agents or ()) - set(profiles))
        if unknown:
            raise ConfigError(
                f"{there} agents: {', '.join(unknown)} is no agent profile; known: "
                f"{', '.join(sorted(profiles))}"
            )
        specs.append(spec)
    return McpSettings(tuple(specs))
