"""Claude Code (CLI 2.1.328) ``--output-format stream-json --verbose``: stdout lines → agent events,
what the gateway writes on its stdin, and the conversations it saves.

Theory of operation
-------------------
``ClaudeCodeParser.feed(line)`` decodes each line once, with one msgspec decoder over a tagged union
of the line kinds (``type``: ``stream_event``, ``assistant``, ``user``, ``system``, ``result``,
``control_request``, ``control_response``). Nested parts that only some lines need (a user line's
``tool_use_result``, a tool's ``input``) are typed loosely and read on demand; everything else is
skipped by the decoder without building Python objects. A line that is not JSON, or a known kind of
the wrong shape, becomes ``ParseError``; a well-formed line of a kind this parser does not know
becomes ``Unknown``. Nothing raises.

The hot path is ``stream_event`` ``text_delta`` (one line per few tokens with
``--include-partial-messages``): one decode, two attribute reads, one event.

What the CLI prints and what it becomes (the full table is ``docs/claude-code-mapping.md``):

* Text and thinking come from ``stream_event`` deltas when partial messages are on. The CLI then
  still prints the whole block as an ``assistant`` line (just before the block's
  ``content_block_stop``); the parser remembers which API messages it saw streamed
  (``message_start``) and skips their text/thinking blocks in ``assistant`` lines, so nothing is
  said twice. Without partial messages each ``assistant`` line carries one whole block, which becomes
  a delta and its end at once. Block keys are ``<message id>:<index>`` (streamed) or
  ``<message id>:a<n>`` (whole blocks); the CLI restarts ``index`` at 0 for every API message, the
  mapper turns keys into turn-unique ``content_index`` es.
* ``tool_use`` blocks always come from ``assistant`` lines (they carry the complete input; the
  streamed ``input_json_delta`` s are not needed). Calls of one API message share ``group`` (the
  message id).
* ``user`` lines carry ``tool_result`` blocks; the richer ``tool_use_result`` beside them is turned
  into the output its ``output_type`` promises (Edit/Write ``structuredPatch`` → unified diff, Read →
  file text, Glob → paths, Grep by output mode, Bash → stdout and stderr, TodoWrite → the todo list,
  Agent → the subagent's report).
* Subagents: lines from inside one carry ``parent_tool_use_id``, which becomes ``parent``. A
  foreground subagent's end is announced right before its ``Agent`` result (from the result's own
  status, usage and duration); a background one (``is_backgrounded`` / ``isAsync``) returns at once,
  so its result is flagged ``background`` and its end comes from the later ``task_notification``.
* Compaction: ``compact_boundary`` (trigger, token counts) is held until the synthetic summary
  message that follows it, then both become one ``Compacted``.
* Interrupts: an ``assistant`` line marked ``aborted`` ends its blocks as cancelled; a tool result
  the CLI produced because the user interrupted the call becomes a cancelled result.

``ClaudeCodeInput`` is the stdin side (``--input-format stream-json``), shapes from
the recorded fixtures under ``tests/fixtures/claude-code/``.

The rooms: ``wire.py`` the line kinds (msgspec structs and their decoder), ``stdout.py`` the parser
(``ClaudeCodeParser``: what it remembers between lines), ``content.py`` the pure shaping of what a
line carries into event fields (tool results by tool, usage, stop reasons, compaction summaries and
``preserved_elements``), ``stdin.py`` ``ClaudeCodeInput``, ``saved.py`` the saved conversations.
"""

from __future__ import annotations

from typing import Final

from ..base import ParserSpec
from ..saved import SavedFormat
from .content import preserved_elements
from .stdin import ClaudeCodeInput
from .stdout import MAX_OPEN_BLOCKS, MAX_STREAMED_MESSAGES, ClaudeCodeParser

__all__ = [
    "MAX_OPEN_BLOCKS",
    "MAX_STREAMED_MESSAGES",
    "SPEC",
    "ClaudeCodeInput",
    "ClaudeCodeParser",
    "preserved_elements",
]


def _saved() -> SavedFormat:
    from .saved import FORMAT  # imported when asked for: listing conversations only

    return FORMAT


SPEC: Final = ParserSpec(
    name="claude-code",
    parser=ClaudeCodeParser,
    input=ClaudeCodeInput,
    saved=_saved,
    description="Claude Code CLI (stream-json, tested with 2.1.328)",
    credentials="ANTHROPIC_API_KEY, or the login that `claude` then /login keeps in "
    "~/.claude/.credentials.json of the user running the gateway",
    # Thinking and tool input deltas (--include-partial-messages), Task subagents with their
    # context, /compact and permission modes (plan) on stdin: the CLI does all of them.
    features=frozenset(
        {
            "thinking_stream",
            "tool_streaming",
            "subagent",
            "subagent_context",
            "context_compaction",
            "plan_mode",
        }
    ),
    # What 2.1.328's init lists with --input-format stream-json and --permission-prompt-tool
    # stdio (the long-lived profile): the catalog until the CLI's own init, at the first prompt.
    tools=(
        "Task",
        "AskUserQuestion",
        "Bash",
        "CronCreate",
        "CronDelete",
        "CronList",
        "Edit",
        "EnterPlanMode",
        "EnterWorktree",
        "ExitPlanMode",
        "ExitWorktree",
        "ListAgents",
        "Monitor",
        "NotebookEdit",
        "Read",
        "ReportFindings",
        "ScheduleWakeup",
        "SendMessage",
        "Skill",
        "TaskStop",
        "ToolSearch",
        "WebFetch",
        "WebSearch",
        "Workflow",
        "Write",
    ),
)
