"""Gemini CLI (``gemini -p ... --output-format stream-json``): ``stdout.py`` the parser of what it
prints, with its theory of operation and its line structs; ``saved.py`` the conversations it
saves."""

from __future__ import annotations

from typing import Final

from ..base import NoInput, ParserSpec
from ..saved import SavedFormat
from .stdout import GeminiParser

__all__ = ["SPEC", "GeminiParser"]


def _saved() -> SavedFormat:
    from .saved import FORMAT  # imported when asked for: listing conversations only

    return FORMAT


SPEC: Final = ParserSpec(
    name="gemini",
    parser=GeminiParser,
    saved=_saved,
    input=NoInput,
    description="Gemini CLI (gemini -p --output-format stream-json, tested with 0.61.0)",
    credentials="GEMINI_API_KEY, with ~/.gemini/settings.json choosing that way to sign in "
    '({"security": {"auth": {"selectedType": "gemini-api-key"}}})',
    # stream-json prints no thinking, tool output chunks, subagents, compaction or modes: no
    # features (masters get the *_NOT_SUPPORTED errors).
    features=frozenset(),
)
