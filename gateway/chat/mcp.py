"""What the terminal chat says of the session's MCP servers (docs/mcp.md#in-the-console-and-the-chat):
``McpNews`` keeps the newest list a catalog (or the gateway's ``session.capabilities``) carries and
makes a line for each server whose status changed, and ``/mcp``'s list. The list holds names,
never a secret's value; what the agent said (why a server failed, a server it reported) is shown
without its control characters."""

from __future__ import annotations

import re
from typing import Any, Final

from gateway.client import payload_of
from gateway.protocol import frames as F

MCP_REASON_WIDTH: Final = 300
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _shown(value: Any, width: int) -> str:
    """A word of the agent's on one line, its control characters out: an escape sequence must
    not reach the terminal."""
    text = " ".join(_CONTROL.sub(" ", str(value)).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def mcp_servers_in(frame: F.Frame) -> list[dict[str, Any]] | None:
    """What became of the session's MCP servers as this frame says it: a catalog's
    ``metadata.rawp_mcp_servers``, or ``extensions.mcp_servers`` of the gateway's
    ``session.capabilities`` (either absent: none); None for any other frame."""
    p = payload_of(frame)
    if isinstance(p, F.CatalogPublish):
        servers = (frame.metadata or {}).get("rawp_mcp_servers")
    elif isinstance(p, F.Capabilities):
        servers = (p.extensions or {}).get("mcp_servers")
    else:
        return None
    if not isinstance(servers, list):
        return []
    return [s for s in servers if isinstance(s, dict) and isinstance(s.get("name"), str)]


def mcp_tools(server: dict[str, Any]) -> str:
    tools = server.get("tools")
    n = len(tools) if isinstance(tools, list) else 0
    return f"{n} tool" if n == 1 else f"{n} tools"


def mcp_status_text(server: dict[str, Any]) -> str:
    """``docs connected (3 tools)``, ``tracker failed: Connection failed: HTTP 401``."""
    name = _shown(server["name"], 64)
    status = _shown(server.get("status", "pending"), 32)
    if status == "connected":
        return f"{name} connected ({mcp_tools(server)})"
    reason = server.get("reason")
    return f"{name} {status}: {_shown(reason, MCP_REASON_WIDTH)}" if reason else f"{name} {status}"


class McpNews:
    """The session's servers as last published, and what the chat last said of each."""

    def __init__(self) -> None:
        self.servers: list[dict[str, Any]] = []
        self._said: dict[str, str] = {}

    def frame(self, frame: F.Frame) -> list[tuple[str, str]]:
        """The lines a frame makes, each with its server's status (its colour): one for each
        server whose status (or the reason it failed) is new. Pending says nothing (each start of the agent makes the servers
        pending until it reports): a server that connects again after a respawn is not news."""
        servers = mcp_servers_in(frame)
        if servers is None:
            return []
        self.servers = servers
        out: list[tuple[str, str]] = []
        for server in servers:
            status = server.get("status")
            text = mcp_status_text(server)
            if status == "pending" or self._said.get(server["name"]) == text:
                continue
            self._said[server["name"]] = text
            mark = "⚙" if status == "connected" else "✗"
            out.append((f"{mark} MCP server {text}", str(status)))
        return out

    def listed(self) -> str:
        """``/mcp``: each server with its kind, where it came from and its status."""
        if not self.servers:
            return "no MCP servers on this session"
        out = ["MCP servers:"]
        for server in self.servers:
            kind = f"{_shown(server['kind'], 16)}, " if server.get("kind") else ""
            origin = _shown(server.get("origin", "?"), 16)
            out.append(f"  {mcp_status_text(server)} · {kind}from {origin}")
        return "\n".join(out)
