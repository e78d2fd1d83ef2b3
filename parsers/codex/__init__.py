"""Codex CLI (``codex exec --json``): ``stdout.py`` the parser of what it prints, with its theory of
operation and its line structs; ``saved.py`` the threads it saves."""

from __future__ import annotations

from typing import Final

from ..base import NoInput, ParserSpec
from ..saved import SavedFormat
from .stdout import CodexParser

__all__ = ["SPEC", "CodexParser"]


def _saved() -> SavedFormat:
    from .saved import FORMAT  # imported when asked for: listing conversations only

    return FORMAT


SPEC: Final = ParserSpec(
    name="codex",
    parser=CodexParser,
    input=NoInput,
    saved=_saved,
    description="Codex CLI (codex exec --json, tested with 0.171.0)",
    credentials="OPENAI_API_KEY, or the sign-in `codex login` keeps in ~/.codex/auth.json "
    "($CODEX_HOME) of the user running the gateway",
    # Reasoning summaries arrive whole, as thinking. No tool output chunks, subagents, compaction
    # or modes the gateway could relay or drive through `exec`.
    features=frozenset({"thinking_stream"}),
)
