"""`rawp-gateway chat`: a terminal master for one Agent Session.

    rawp-gateway chat --url URL --agent NAME [--token-file F] [--workspace DIR] [--session ID]
        [--resume [ID]] [--yes | --no] [--keep]

Theory of operation
-------------------
The chat is a thin UI on ``gateway.client``: it creates a session (or attaches to ``--session``;
with ``--resume`` the new session continues a conversation the agent saved, chosen from a numbered
list when no id is given, and shows its earlier turns), attaches the WebSocket, and then four
parts share one ``MasterView``:

* the *receiver* takes frames off the WebSocket, applies them to the view and prints them: streamed
  ``agent.text.delta`` text as it arrives, thinking labelled and dimmed, a tool call as ``→ Bash: ls`` and its
  result as ``← ok (12 lines)`` with a short preview (a diff as ``← ok (+3 -1)`` and its changed
  lines, coloured, the middle of a long one elided), subagents, errors, and the turn's end with its
  stop reason and the token usage of the ``session.usage`` that follows it (DPS-7.5.2-usage), with
  the session's running totals and context fill (``format_totals``, docs/usage.md), and a line
  when one of the session's MCP servers connects or fails (``mcp.py``, once per change). When
  the socket drops it finalises the view (DPS-7.8-finalize), reattaches with ``last_message_id``
  and replays the ``session.history`` (DPS-7.8-unfinalize);
* the *line reader* turns stdin into lines without blocking the loop (``lines.py``; on a terminal
  the line editor of ``editor.py``);
* the *dispatcher* hands each line to whoever waits for it: a pending question first, else the
  command queue (so lines typed during a turn are type-ahead, not lost);
* the *runner* (the calling task) takes commands one at a time: a prompt is sent and the runner
  waits until the turn it started has ended; ``/plan``, ``/default``, ``/review`` switch mode,
  ``/compact [instruction]`` compacts, ``/attach PATH`` uploads a file (a screenshot) that goes
  with the next prompt as a ``context_files`` entry, ``/mcp`` lists the session's MCP servers and
  their status, ``/help`` lists commands, ``/quit`` exits,
  and any other ``/x`` goes to the agent as a prompt with ``input_type: "slash_command"``. A file
  the agent produced (``agent.file.transfer``) is shown with the URL to fetch it from.

Questions (``agent.interaction.request``) are asked one at a time by a task of their own, so
frames keep printing while a question waits; one that is answered elsewhere, or whose turn ends, is
withdrawn. A PERMISSION reads "Allow Bash: rm x? [y/N]" and is answered with ``selected_value``
``"allow"`` or ``"deny"`` (no answer in ``timeout_sec``: ``control.interaction.timeout``). With
``--yes``/``--no`` (``auto_answer``) questions are answered at once; without them, a stdin that is
not a terminal declines (a script cannot be asked).

Signed in with a user of its own (docs/identities.md), the chat says who and under which role, and
with the role ``viewer`` on the session it only watches: a prompt or a command that would change
something is refused here with a line saying why, and questions are shown, not asked. Another
master's prompt and answer are shown with who sent them (``metadata.rawp_user``).

Ctrl-C during a turn sends ``control.prompt.cancel`` for the running turn (a second Ctrl-C quits);
Ctrl-C at the prompt, ``/quit`` or end of input exits, deleting the session this chat created
unless ``--keep``. Piped stdin is the non-interactive mode tests use: each line is echoed, run to
the end of its turn, and the chat exits after the last one. ANSI styling only when stdout is a
terminal (and ``NO_COLOR`` is unset).

The rooms: ``command.py`` (the command, its options and the session it runs on), ``app.py``
(``Chat``: receiver, dispatcher, asker and runner), ``render.py`` (frames as text on a
``Screen``), ``lines.py`` (piped stdin as lines), ``editor.py`` (the line editor).
"""

from __future__ import annotations

from gateway.chat.command import (
    add_chat_arguments,
    run_chat,
    run_chat_command,
    run_chat_from_args,
)
from gateway.chat.render import answer_value

__all__ = [
    "add_chat_arguments",
    "answer_value",
    "run_chat",
    "run_chat_command",
    "run_chat_from_args",
]
