"""How the terminal chat shows things: styles, the screen, and frames as lines of text.

``Screen`` writes to stdout and knows whether the cursor is at the start of a line, so streamed
text and whole lines interleave. The functions below it turn a frame's parts into text: a tool
call as ``Bash: ls``, its result as ``ok (12 lines)`` and a short preview (a diff as ``ok (+3 -1)``
and its changed lines), usage and the session's totals, why a session ended, an error's details,
and a question and the answer given to it. ``present`` prints the frames that are only shown;
the chat (``app.py``) prints those whose showing moves its state along.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TextIO

from gateway.chat.mcp import McpNews
from gateway.client import payload_of
from gateway.protocol import frames as F
from gateway.protocol.usage import UsageTally

PREVIEW_LINES: Final = 3
DIFF_PREVIEW_LINES: Final = 12  # changed lines of a diff shown; a longer one keeps its ends
PREVIEW_WIDTH: Final = 100
CALL_WIDTH: Final = 80


@dataclass(frozen=True)
class Style:
    dim: str = ""
    bold: str = ""
    red: str = ""
    green: str = ""
    yellow: str = ""
    cyan: str = ""
    reset: str = ""


PLAIN: Final = Style()
ANSI: Final = Style(
    dim="\x1b[2m",
    bold="\x1b[1m",
    red="\x1b[31m",
    green="\x1b[32m",
    yellow="\x1b[33m",
    cyan="\x1b[36m",
    reset="\x1b[0m",
)


class Screen:
    """Writes to stdout, remembering whether the cursor is at the start of a line.

    Streamed text and whole lines interleave: a line always starts on a fresh line, and text
    streamed from a subagent is indented on every line it starts.
    """

    def __init__(self, out: TextIO, style: Style) -> None:
        self.out = out
        self.s = style
        self.at_line_start = True
        # Below a line editor's prompt (editor.py): only whole lines are shown, as text without
        # its newline would be drawn over by the prompt; a question takes a line of its own.
        self.whole_lines = False

    def _write(self, text: str) -> None:
        if not text:
            return
        try:
            self.out.write(text)
            if not self.whole_lines:
                self.out.flush()
        except (BrokenPipeError, ValueError):
            pass  # stdout went away (`| head`, a closed terminal): the session still ends cleanly
        self.at_line_start = text.endswith("\n")

    def stream(self, text: str, *, style: str = "", indent: str = "") -> None:
        if indent:
            lead = indent if self.at_line_start else ""
            text = lead + text.replace("\n", "\n" + indent)
            if text.endswith("\n" + indent):
                text = text[: -len(indent)]
        if style:
            self._write(f"{style}{text}{self.s.reset}")
            self.at_line_start = text.endswith("\n")
        else:
            self._write(text)

    def end_line(self) -> None:
        if not self.at_line_start:
            self._write("\n")

    def line(self, text: str, *, style: str = "", indent: str = "") -> None:
        self.end_line()
        body = f"{style}{text}{self.s.reset}" if style else text
        self._write(f"{indent}{body}\n")

    def ask(self, text: str) -> None:
        """A question or the prompt: no newline, the answer is typed after it (at the line
        editor's prompt, below it)."""
        self.end_line()
        if self.whole_lines:
            self._write(text.rstrip() + "\n")
            return
        self._write(text)
        self.at_line_start = False

    def answer(self, text: str) -> None:
        """The answer to the question just asked, on its line (when no terminal echoes one)."""
        self._write(("  → " if self.whole_lines else "") + text + "\n")


def one_line(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# The input field that best says what a call does, per tool (Claude Code's names and others').
_CALL_FIELDS: Final = (
    "command",
    "cmd",
    "file_path",
    "path",
    "notebook_path",
    "pattern",
    "query",
    "url",
    "description",
    "prompt",
)


def describe_call(tool_name: str, tool_input: dict[str, Any] | None) -> str:
    """``Bash: ls -la``: the tool and its most telling input, on one short line."""
    tool_input = tool_input or {}
    for key in _CALL_FIELDS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return f"{tool_name}: {one_line(value, CALL_WIDTH)}"
    if tool_input:
        return f"{tool_name}: {one_line(json.dumps(tool_input, ensure_ascii=False), CALL_WIDTH)}"
    return tool_name


def output_text(output: Any) -> str:
    """A tool's output as text: strings as they are, lists one item a line, the rest as JSON."""
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(x, str) for x in output):
        return "\n".join(output)
    return json.dumps(output, ensure_ascii=False, indent=None)


BUDGET_CODES: Final = frozenset({"BUDGET_WARNING", "BUDGET_EXCEEDED"})


def policy_note(frame: F.Frame) -> str | None:
    """``allowed by policy NAME``, ``denied by policy NAME`` or ``asked by policy NAME`` where a
    permission rule decided (``metadata.rawp_policy``, docs/policies.md); None elsewhere."""
    meta = frame.metadata or {}
    rule = meta.get("rawp_policy")
    if not isinstance(rule, str):
        return None
    decided = meta.get("rawp_policy_decision")
    verb = {"allow": "allowed", "deny": "denied"}.get(decided if isinstance(decided, str) else "")
    return f"{verb or 'asked'} by policy {rule}"


def summarize_result(result: F.InvokeResult) -> tuple[str, list[str]]:
    """``("ok (12 lines)", first lines)`` for a ``tool.invoke.result``; for a diff
    ``("ok (+3 -1)", the changed lines)`` (``diff_preview``)."""
    status = "ok" if result.status == "success" else result.status
    if result.output_type == "binary_ref":
        # The file itself was announced by its agent.file.transfer line, with its URL.
        refs = result.output if isinstance(result.output, list) else [result.output]
        sizes = [r.get("size_bytes", 0) for r in refs if isinstance(r, dict)]
        files = f"{len(sizes)} file{'s' if len(sizes) != 1 else ''}"
        return f"{status} ({files}, {sum(sizes):,} bytes)", []
    text = output_text(result.output).rstrip("\n")
    lines = text.split("\n") if text else []
    if result.status == "cancelled" and lines:
        return f"{status}: {one_line(lines[0], PREVIEW_WIDTH)}", []
    if result.output_type == "diff" and result.status == "success":
        changes = diff_preview(lines)
        if changes is not None:
            added, removed, preview = changes
            head = f"{status} (+{added} -{removed}" + (", truncated)" if result.truncated else ")")
            if result.duration_ms is not None:
                head += f" {result.duration_ms} ms"
            return head, preview
    head = status
    if lines:
        head += f" ({len(lines)} line{'s' if len(lines) != 1 else ''}"
        head += ", truncated)" if result.truncated else ")"
    if result.duration_ms is not None:
        head += f" {result.duration_ms} ms"
    # "… 1 more" would take the line the last one needs: show it instead.
    shown = lines if len(lines) <= PREVIEW_LINES + 1 else lines[:PREVIEW_LINES]
    preview = [one_line(line, PREVIEW_WIDTH) for line in shown]
    if len(lines) > len(shown):
        preview.append(f"… {len(lines) - len(shown)} more")
    return head, preview


def diff_preview(lines: list[str]) -> tuple[int, int, list[str]] | None:
    """The changed lines of a unified diff (``+``/``-``, not its ``---``/``+++``/``@@`` headers;
    the file names only when it changes more than one file), with how many were added and
    removed. Past ``DIFF_PREVIEW_LINES`` the middle is elided, never the changes at its start
    and end. None when ``lines`` hold no change (not a diff, or an empty one)."""
    headers = {
        i
        for i in range(len(lines) - 1)
        if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")
    }
    headers |= {i + 1 for i in headers}
    files = [lines[i][4:] for i in sorted(headers) if lines[i].startswith("+++ ")]
    shown: list[str] = []
    added = removed = 0
    for i, line in enumerate(lines):
        if i in headers:
            if len(files) > 1 and line.startswith("+++ "):
                shown.append(line[4:].removeprefix("b/") + ":")
        elif line.startswith("+"):
            added += 1
            shown.append(line)
        elif line.startswith("-"):
            removed += 1
            shown.append(line)
    if not added and not removed:
        return None
    if len(shown) > DIFF_PREVIEW_LINES + 1:  # "… 1 more" would take the line it hides
        head = DIFF_PREVIEW_LINES * 2 // 3
        tail = DIFF_PREVIEW_LINES - head
        shown = [*shown[:head], f"… {len(shown) - head - tail} more", *shown[-tail:]]
    # Cut, not squeezed: a diff's indentation is part of what changed.
    return added, removed, [_cut(line.expandtabs(4), PREVIEW_WIDTH) for line in shown]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_usage(usage: F.Usage | None) -> str:
    if usage is None:
        return ""
    t = usage.token_usage
    parts = [f"{t.input_tokens:,} in / {t.output_tokens:,} out tokens"]
    if t.cache_read_tokens:
        parts.append(f"{t.cache_read_tokens:,} cached")
    if t.thinking_tokens:
        parts.append(f"{t.thinking_tokens:,} thinking")
    if usage.cost_usage.used:
        parts.append(f"{usage.cost_usage.used:.4f} {usage.cost_usage.unit}")
    return " · ".join(parts)


def format_totals(tally: UsageTally) -> str:
    """The session's running totals (docs/usage.md): tokens, the cost when the agent reports
    one, and how full the context window is."""
    text = f"session {tally.input_tokens:,} in / {tally.output_tokens:,} out"
    if tally.cache_read_tokens:
        text += f" / {tally.cache_read_tokens:,} cached"
    if tally.cost_usd > 0:
        text += f", ${tally.cost_usd:.4f}"
    if tally.fill is not None:
        text += f" · context {tally.fill:.0%}"
    return text


def compacted_text(p: F.Compacted, fill: float | None) -> str:
    """``⟲ compacted (manual): 80,000 → 12,000 tokens · context 6%``."""
    text = (
        f"⟲ compacted ({p.trigger}): {p.previous_token_count:,} → {p.current_token_count:,} tokens"
    )
    return text + (f" · context {fill:.0%}" if fill is not None else "")


def missing_text(lost: int | None) -> str:
    """What a reattach says when the gateway's buffer no longer held everything missed."""
    # Without a count the gateway cannot tell how many: it crashed and came back, or the id is one
    # it never had.
    why = (
        f"the gateway's buffer overflowed: {lost} frames lost"
        if lost is not None
        else "some frames are missing (the gateway cannot tell how many, as after a crash)"
    )
    return f"(reattached, but {why}; what is shown is incomplete)"


STDERR_LINES: Final = 5  # the end of an agent's stderr shown under its error

# Why a session ended, by session.deleted's reason; its deleted_by follows in brackets. "client"
# is the gateway (the spec's client node), never the person at this terminal.
_DELETED_WHY: Final = {
    "user_request": "a user deleted it",
    "master_request": "a master deleted it (DELETE /v1/session)",
    "timeout": "no master reattached within its reattach window",
    "error": "the gateway ended it after a fatal error, or as it shut down",
}


def deleted_text(p: F.Deleted) -> str:
    """``session ended: the gateway ended it after a fatal error, ... (error, deleted_by: client)``."""
    why = _DELETED_WHY.get(p.reason, p.reason)
    return f"session ended: {why} ({p.reason}, deleted_by: {p.deleted_by})"


def error_details(details: F.ErrorDetails | None, message: str) -> tuple[list[str], str | None]:
    """What an error's details add to its message: the exit code or signal and the end of the
    agent's stderr (each unless the message says it already), and the hint, if any."""
    if details is None:
        return [], None
    lines: list[str] = []
    facts = []
    if details.exit_code is not None and f"exit code {details.exit_code}" not in message:
        facts.append(f"exit code {details.exit_code}")
    if details.signal is not None and f"signal {details.signal}" not in message:
        facts.append(f"signal {details.signal}")
    if details.http_status is not None and str(details.http_status) not in message:
        facts.append(f"HTTP {details.http_status}")
    if facts:
        lines.append(" · ".join(facts))
    stderr = (details.stderr or "").strip()
    if stderr and stderr not in message:
        tail = stderr.splitlines()[-STDERR_LINES:]
        lines += [f"stderr │ {_cut(line, PREVIEW_WIDTH)}" for line in tail]
    return lines, details.hint


def turn_end_text(end: F.TurnEnd, usage: F.Usage | None, *, lost: bool) -> str:
    """``— end_turn · 1,200 in / 34 out tokens · 2 tool calls``; ``lost``: the connection ended
    it (a synthetic end, DPS-7.8-finalize)."""
    parts = [f"— {end.stop_reason}"]
    if usage is not None:
        parts.append(format_usage(usage))
    if end.tool_invocation_count:
        n = end.tool_invocation_count
        parts.append(f"{n} tool call{'s' if n != 1 else ''}")
    if lost:
        parts.append("(connection lost)")
    return " · ".join(parts)


def question_text(req: F.InteractionRequest) -> str:
    """A question as asked: ``Allow Bash: rm x? [y/N] ``, or its text and numbered options."""
    if req.interaction_type == "PERMISSION":
        return f"{permission_question(req)} [y/N] "
    if req.interaction_type == "YN":
        return f"{req.question_text} [y/N] "
    question = req.question_text
    for i, option in enumerate(req.options, 1):
        question += f"\n  {i}. {option.label}"
        if option.description:
            question += f" ({option.description})"
    return question + "\n? "


def permission_question(req: F.InteractionRequest) -> str:
    """``Allow Bash: rm x?`` from the request's context, else its own question text."""
    ctx = req.context
    if ctx is not None and ctx.tool_name:
        return f"Allow {describe_call(ctx.tool_name, ctx.tool_input)}?"
    return req.question_text


def _option_value(req: F.InteractionRequest, allow: bool) -> str:
    """The option that allows (or denies), preferring the values "allow" and "deny"."""
    wanted = "allow" if allow else "deny"
    values = [o.value for o in req.options]
    if wanted in values:
        return wanted
    for value in values:
        if value.lower().startswith(wanted[:4] if allow else ("deny", "reject", "no")):
            return value
    return wanted


def answer_value(
    req: F.InteractionRequest, answer: str | None, *, auto: str | None
) -> tuple[str | list[str] | None, str | None]:
    """The ``selected_value`` and ``text_input`` for an answer; ``(None, None)`` declines.

    ``answer`` is the line typed, or ``None`` when nobody was asked; then ``auto`` (``"allow"``
    for --yes, ``"deny"`` for --no, ``None``) decides: yes/no questions follow it, a selection
    takes its default (or, with --yes, the first option), free text takes its default.
    """
    if req.interaction_type in ("PERMISSION", "YN"):
        yes = auto == "allow" if answer is None else answer.strip().lower() in ("y", "yes")
        if req.interaction_type == "PERMISSION":
            return _option_value(req, yes), None
        if not req.options:
            return ("yes" if yes else "no"), None
        return req.options[0 if yes else -1].value, None
    if req.interaction_type == "TEXT_INPUT":
        if answer is None:
            return req.default_value, None
        return answer, answer
    # SELECT / MULTI_SELECT: option numbers or values, separated by spaces or commas.
    if answer is None or not answer.strip():
        if req.default_value is not None:
            return req.default_value, None
        if answer is None and auto == "allow" and req.options:
            return req.options[0].value, None
        return None, None
    chosen: list[str] = []
    for token in answer.replace(",", " ").split():
        if token.isdigit() and 1 <= int(token) <= len(req.options):
            chosen.append(req.options[int(token) - 1].value)
        else:
            chosen.append(token)
    if req.interaction_type == "MULTI_SELECT":
        return chosen, None
    return chosen[0], None


def answered_text(p: F.InteractionResponse | F.InteractionTimeout) -> str:
    """How another master's answer reads: its values, or ``timed out``."""
    if isinstance(p, F.InteractionTimeout):
        return "timed out"
    value = p.selected_value
    return ", ".join(str(v) for v in (value if isinstance(value, list) else [value]))


def answer_shown(req: F.InteractionRequest, value: str | list[str] | None) -> str:
    """How an answer given on the user's behalf reads after the question."""
    if value is None:
        return "no answer"
    if req.interaction_type == "PERMISSION":
        return "y" if value == _option_value(req, True) else "n"
    if req.interaction_type == "YN":
        yes = req.options[0].value if req.options else "yes"
        return "y" if value == yes else "n"
    return ", ".join(value) if isinstance(value, list) else value


def depth_indent(frame: F.Frame) -> str:
    ctx = (frame.metadata or {}).get("subagent_context")
    depth = ctx.get("depth", 0) if isinstance(ctx, dict) else 0
    return "  " * int(depth or 0)


# --------------------------------------------------------------------------- frames


class Printer:
    """The chat's frames on a ``Screen``: which stream is being printed (text, thinking, a tool's
    output), so that a new one starts on a line of its own, and whether this turn's plan is
    labelled yet (once: its blocks are one plan)."""

    def __init__(self, screen: Screen, file_location: Callable[[str], str]) -> None:
        self.screen = screen
        self.file_location = file_location  # where to GET a file the agent produced
        self.stream_key: tuple[Any, ...] | None = None
        self.plan_labelled = False
        self.mcp = McpNews()  # what became of the session's MCP servers, said once per change

    def stream_to(self, key: tuple[Any, ...] | None) -> None:
        """Start a new line when the stream being printed changes (text → thinking → tool)."""
        if key != self.stream_key:
            self.screen.end_line()
            self.stream_key = key

    def new_turn(self) -> None:
        self.stream_key = None
        self.plan_labelled = False


def present(printer: Printer, frame: F.Frame) -> bool:
    """Print a frame that is only shown; False, with nothing printed, for a frame whose showing
    moves the chat's state along (a question, a turn's start and end, usage, errors of the
    session, ...): the chat shows those itself (``Chat._present``)."""
    p = payload_of(frame)
    screen = printer.screen
    s = screen.s
    indent = depth_indent(frame)
    sub = (frame.metadata or {}).get("subagent_context") or {}
    parent = sub.get("parent_invocation_id") if isinstance(sub, dict) else None
    for text, status in printer.mcp.frame(frame):  # a catalog's or the capabilities'
        printer.stream_to(None)
        colour = {"connected": s.dim, "failed": s.red}.get(status, s.yellow)
        screen.line(text, style=colour)

    if isinstance(p, F.TextDelta):
        key = ("text", parent, p.content_index)
        if (
            printer.stream_key != key
            and not printer.plan_labelled
            and (frame.metadata or {}).get("content_role") == "plan"
        ):
            printer.plan_labelled = True
            printer.stream_to(key)
            screen.line("plan:", style=s.cyan, indent=indent)
        printer.stream_to(key)
        screen.stream(p.text, indent=indent)
    elif isinstance(p, F.ThinkingDelta):
        key = ("thinking", parent, p.content_index)
        if printer.stream_key != key:
            # Labelled as a plan is: dimmed alone, thinking would read like the answer.
            printer.stream_to(key)
            screen.line("thinking:", style=s.cyan, indent=indent)
        printer.stream_to(key)
        text = "[redacted]" if p.redacted and not p.text else p.text
        screen.stream(text, style=s.dim, indent=indent)
    elif isinstance(p, F.TextDone | F.ThinkingDone):
        kind = "text" if isinstance(p, F.TextDone) else "thinking"
        if printer.stream_key == (kind, parent, p.content_index):
            screen.end_line()
            printer.stream_key = None
        if p.is_cancelled:
            screen.line("(cancelled)", style=s.dim, indent=indent)
    elif isinstance(p, F.InvokeRequest):
        printer.stream_to(None)
        line = f"→ {describe_call(p.tool_name, p.input)}"
        screen.line(line, style=s.cyan, indent=indent)
    elif isinstance(p, F.InvokeStream):
        printer.stream_to(("tool", p.invocation_id))
        screen.stream(p.chunk, style=s.dim, indent=indent + "  ")
    elif isinstance(p, F.InvokeResult):
        printer.stream_to(None)
        head, preview = summarize_result(p)
        color = s.green if p.status == "success" else s.red
        screen.line(f"← {head}", style=color, indent=indent)
        ruled = policy_note(frame)
        if ruled:
            screen.line(f"({ruled})", style=s.dim, indent=indent + "  ")
        diff = p.output_type == "diff"
        for line in preview:
            style = s.dim
            if diff and line.startswith("+"):
                style = s.green
            elif diff and line.startswith("-"):
                style = s.red
            screen.line(line, style=style, indent=indent + "  ")
    elif isinstance(p, F.SubagentStarted):
        what = " ".join(x for x in (p.agent_type, p.description) if x) or "subagent"
        screen.line(f"⇢ subagent: {what}", style=s.cyan, indent=indent)
    elif isinstance(p, F.SubagentEnded):
        took = f" in {p.duration_ms / 1000:.1f} s" if p.duration_ms is not None else ""
        screen.line(f"⇠ subagent {p.status}{took}", style=s.cyan, indent=indent)
    elif isinstance(p, F.SessionError) and p.error_code in BUDGET_CODES and not frame.parent_id:
        # A budget the agents' cost reached, told to every master (docs/budgets.md); a prompt's
        # own refusal (with its parent_id) is the prompt's answer, printed where prompts are.
        printer.stream_to(None)
        mark = "⚠" if p.error_code == "BUDGET_WARNING" else "✗"
        screen.line(f"{mark} budget: {p.message}", style=s.yellow, indent=indent)
    elif isinstance(p, F.AgentError):
        screen.line(f"✗ {p.severity} {p.error_code}: {p.message}", style=s.red, indent=indent)
        lines, hint = error_details(p.details, p.message)
        for line in lines:
            screen.line(line, style=s.dim, indent=indent + "  ")
        if hint:
            screen.line(f"hint: {hint}", style=s.yellow, indent=indent + "  ")
    elif isinstance(p, F.PromptRequest):
        # Another master's prompt, relayed (DPS-2.4-relay): show it like ours, with who sent it.
        who = (frame.metadata or {}).get("rawp_user")
        by = f"{who}: " if who and who != "local" else ""
        screen.line(f"» {by}{p.prompt_text}", style=s.bold)
    elif isinstance(p, F.Renamed):
        screen.line(f"session renamed to {p.name!r}", style=s.dim)
    elif isinstance(p, F.CatalogPublish):
        # §5.4.1: a master should warn about error diagnostics; fatal ones block the tool.
        for d in p.diagnostics or ():
            if d.severity in ("error", "fatal"):
                where = f"{d.tool_name}: " if d.tool_name else ""
                screen.line(f"⚠ {where}{d.message} ({d.code})", style=s.yellow)
    elif isinstance(p, F.FileTransfer):
        # A file arrived (docs/files.md): where to GET it, with the token.
        printer.stream_to(None)
        url = printer.file_location(p.file_url)
        arrow = "⇩" if p.direction == "download" else "⇧"
        screen.line(
            f"{arrow} file {p.file_name} ({p.mime_type}, {p.size_bytes:,} bytes): {url}",
            style=s.cyan,
            indent=indent,
        )
    else:
        return False
    return True
