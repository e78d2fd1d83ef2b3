"""Any Agent Client Protocol agent: the gateway is its ACP client, sans-IO.

``adapter.py`` is one agent process's conversation (``AcpAdapter``: parser and input at once, the
theory of operation), ``schema.py`` the parts of ACP's schema it reads, ``content.py`` what the
agent's content and tool calls become, ``store_query.py`` the questions about the agent's saved
sessions (``StoreQuery``).
"""

from __future__ import annotations

from typing import Final

from ..base import ParserSpec
from .adapter import MAX_OPEN_CALLS, MAX_PROTOCOL_WARNINGS, AcpAdapter
from .store_query import StoreQuery

__all__ = [
    "MAX_OPEN_CALLS",
    "MAX_PROTOCOL_WARNINGS",
    "SPEC",
    "AcpAdapter",
    "StoreQuery",
]

SPEC: Final = ParserSpec(
    name="acp",
    parser=AcpAdapter,
    input=AcpAdapter,
    converses=True,
    description="Any Agent Client Protocol agent (JSON-RPC over stdio; the gateway is its client)",
    # What ACP can carry; each agent's initialize and session/new answers narrow it at run time
    # (plan_mode when it lists a plan mode).
    features=frozenset({"thinking_stream", "tool_streaming", "plan_mode"}),
)
