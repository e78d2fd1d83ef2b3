"""`demo`: the embedded default agent, speaking Claude Code's stream-json with no model behind it.

    python -m gateway.demo_agent [-p] [--input-format stream-json] [--output-format stream-json]
        [--verbose] [--include-partial-messages] [--permission-prompt-tool stdio]
        [--permission-mode default|acceptEdits|plan|bypassPermissions]
        [--dangerously-skip-permissions] [--model NAME] [--tools T1,T2] [--resume ID | --session-id ID]
        [PROMPT]

Theory of operation
-------------------
The gateway's whole loop (spawn, parse, map to RAWP-DPS frames, permissions, interrupts,
compaction) must run on a machine with nothing else installed, so this module plays the part of the
Claude Code CLI 2.1.328 run as `claude -p --input-format stream-json --output-format stream-json
--verbose --include-partial-messages --permission-prompt-tool stdio`. It prints the same line shapes,
field names and ordering that the real CLI prints (checked against the recordings in
tests/fixtures/claude-code), so the Claude Code parser reads it unchanged. `claude_code_version`
in `system/init` names the dialect (2.1.328), not a real CLI; `model` is "demo".

stdin carries one JSON object per line: `user` messages start turns (queued while one runs);
`control_request` `interrupt` stops the running turn; `set_permission_mode` changes the mode;
`control_response` answers our `can_use_tool` requests. When stdin closes, queued turns finish and
the process exits 0. SIGTERM exits 143 at once without a `result` (like the CLI); SIGINT interrupts
the running turn and exits 0.

The "model" is a few deterministic rules on the prompt text (see `choose_action`):
"/compact" -> the compaction sequence; "write|create <file>" -> Write (asks permission, writes
inside the workspace only); "read <file>" -> Read; "list" or "files" -> Glob over the workspace;
"think" -> a thinking block first (alone: an answer about thinking); anything else -> a short
text reply. Text is streamed word by word with `RAWP_DEMO_DELAY_MS` (default 20) between deltas,
so streaming is visible in a UI and interrupts have something to interrupt. No network, no
randomness beyond ids.

Images both ways, as the CLI does them: a Read of a .png/.jpg/.jpeg/.gif/.webp file answers with an
image block (base64) in the tool_result and `tool_use_result` `{"type": "image", "file": {...}}`
(at most `MAX_IMAGE_BYTES`, like the API's own limit; the demo never resizes). A user message's
image blocks and the "Attached files:" list the gateway appends to a prompt are acknowledged first
("I see the image dot.png (4x3).", "I see the file .rawp/uploads/app.log (12 bytes)."), so a master
can tell what reached the agent; the list is not read as part of the request.

Stdout is written with blocking writes, one flushed line at a time: the consumer is the gateway's
reader, and a demo agent that blocks while the gateway applies backpressure is what we want.
"""

from __future__ import annotations

from typing import Final

# The package's parts: script.py (the "model"), tools.py, output.py (the lines it prints), agent.py
# (the stream-json loop), __main__.py (the command line). Only constants and texts live here, so
# that the gateway's config can name the demo's tools without importing the agent.

DIALECT_VERSION: Final = "2.1.328"  # the Claude Code CLI whose output this mirrors
DEFAULT_MODEL: Final = "demo"
CONTEXT_WINDOW: Final = 200_000
MAX_OUTPUT_TOKENS: Final = 32_000
DEFAULT_DELAY_MS: Final = 20
GLOB_LIMIT: Final = 100  # the real Glob tool truncates at 100 files too
ALL_TOOLS: Final = ("Glob", "Read", "Write")
# Tools that ask for permission (Write edits files; the real CLI asks for Bash too, not offered here).
NEEDS_PERMISSION: Final = frozenset({"Write", "Bash"})
EDIT_TOOLS: Final = frozenset({"Write", "Edit"})
PERMISSION_MODES: Final = ("default", "acceptEdits", "plan", "bypassPermissions", "dontAsk")
# Only the commands it answers as what they are: a listed /cost that answered with the greeting
# would tell the user something untrue.
SLASH_COMMANDS: Final = ["compact"]
INTERRUPTED: Final = "[Request interrupted by user]"
INTERRUPTED_TOOL: Final = "[Request interrupted by user for tool use]"
REJECTED_BY_INTERRUPT: Final = (
    "The user doesn't want to proceed with this tool use. The tool use was rejected (eg. if it was"
    " a file edit, the new_string was NOT written to the file). STOP what you are doing and wait"
    " for the user to tell you how to proceed."
)
COMPACT_SUMMARY: Final = (
    "This session is being continued from a previous conversation that ran out of context. The"
    " summary below covers the earlier portion of the conversation.\n\nSummary:\n1. Primary Request"
    " and Intent: the user talked to the RAWP demo agent.\n2. Current Work: nothing pending.\n\n"
    "Continue the conversation from where it left off without asking the user any further"
    " questions."
)
HELP_TEXT: Final = (
    "Hello! I am the RAWP demo agent, running without a model. Ask me to list the files, read a"
    " file or an image, look at files you attach, write a file (for example: write hello.txt),"
    " think first, or /compact."
)
THOUGHT_TEXT: Final = (
    "I thought it over first: the thinking above streamed as its own block, the way a model's"
    " reasoning does. Without a model that is as deep as it goes; try it with a task, for"
    " example: think, then list the files."
)
DEFAULT_FILE_CONTENT: Final = "Hello from the RAWP demo agent.\n"
# A Read of a file with one of these extensions answers with an image block, as the CLI's does.
IMAGE_EXTENSIONS: Final = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})
MAX_IMAGE_BYTES: Final = 5 * 1024 * 1024  # the Messages API's limit for one image
# What the gateway appends to a prompt that has context_files (gateway/protocol/prompts.py).
ATTACHED_HEADER: Final = "\n\nAttached files:\n"
