"""Tool knowledge: the built-in catalog of Claude Code's tools and the §5.3.3 ``output_type`` rule.

Theory of operation
-------------------
A ``ToolSpec`` is what the gateway knows about a tool beyond its name: a description for the
catalog, the §5.4.1 ``category``, a declared ``output_type`` (only where one type always fits), whether
it needs approval, and its ``operation`` (read, write, list, ...), which §5.3.3 needs to tell a
filesystem read from a write. ``BUILTIN_TOOLS`` covers Appendix A, every name Claude Code 2.1.328
reports, the tools of Codex 0.171.0 and Gemini CLI 0.61.0 and ACP's tool kinds; ``lookup(name)`` also knows MCP tools (``mcp__server__tool`` → category ``mcp``) and falls
back to a ``custom`` tool for names it has never seen.

``decide_output_type`` is §5.3.3 as one pure function: the declared type, else the category default,
else ``text`` (DPS-5.3.3-output-type). Write tools deliberately declare nothing, so the category rule
"diff when the write changed something, else empty" decides per call.

``build_catalog`` is the ``tool.catalog.publish`` the mapper sends for the tools an agent reports:
each tool's catalog entry, and the tools of an MCP server that is not connected marked as such.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from gateway.protocol import frames as F
from gateway.protocol.frames import CatalogTool, OutputType, ToolCategory
from parsers import events as ev

__all__ = [
    "BUILTIN_TOOLS",
    "ToolSpec",
    "build_catalog",
    "catalog_entry",
    "decide_output_type",
    "lookup",
]

Operation = Literal["read", "write", "list", "search", "exec", "delegate", "other"]


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str
    category: ToolCategory
    operation: Operation = "other"
    output_type: OutputType | None = None
    requires_approval: bool = False

    @property
    def writes(self) -> bool:
        """Blocked in ``plan`` and ``review`` modes (§6.3.2): writes and shell commands."""
        return self.operation == "write" or self.category == "shell"


def _t(
    name: str,
    description: str,
    category: ToolCategory,
    operation: Operation = "other",
    output_type: OutputType | None = None,
    requires_approval: bool = False,
) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        category=category,
        operation=operation,
        output_type=output_type,
        requires_approval=requires_approval,
    )


_SPECS: Final = (
    # Appendix A.1
    _t("Bash", "Run a shell command in the workspace", "shell", "exec", "text", True),
    _t("Read", "Read a file (with line numbers)", "filesystem", "read", "file_content"),
    _t("Write", "Create or overwrite a file", "filesystem", "write", None, True),
    _t("Edit", "Replace a string in a file", "filesystem", "write", None, True),
    _t("MultiEdit", "Apply several edits to one file", "filesystem", "write", None, True),
    _t("Glob", "Find files by glob pattern", "filesystem", "list", "file_list"),
    # Grep's type depends on its output mode (file names or matching lines): decided per call.
    _t("Grep", "Search file contents with a regular expression", "search", "search"),
    _t("LS", "List a directory", "filesystem", "list", "file_list"),
    # Appendix A.2
    _t("WebFetch", "Fetch a web page and answer about it", "web", "read", "web_content", True),
    _t("WebSearch", "Search the web", "search", "search", "web_content"),
    _t("NotebookRead", "Read a Jupyter notebook", "notebook", "read", "file_content"),
    _t("NotebookEdit", "Edit a cell of a Jupyter notebook", "notebook", "write", None, True),
    _t("TodoRead", "Read the session's todo list", "task_management", "read", "structured"),
    _t("TodoWrite", "Write the session's todo list", "task_management", "other", "structured"),
    _t("Task", "Delegate a task to a subagent", "agent", "delegate", "agent_result"),
    # Claude Code 2.1.328: the subagent tool is called Agent in tool calls, Task in init.tools.
    _t("Agent", "Delegate a task to a subagent", "agent", "delegate", "agent_result"),
    _t("EnterPlanMode", "Switch to plan mode", "planning"),
    _t("ExitPlanMode", "Present the plan and leave plan mode", "planning", "other", None, True),
    _t("AskUserQuestion", "Ask the user a multiple-choice question", "custom", "other", None, True),
    _t("TaskCreate", "Create a task in the task list", "task_management", "other", "structured"),
    _t("TaskGet", "Get a task from the task list", "task_management", "read", "structured"),
    _t("TaskUpdate", "Update a task in the task list", "task_management", "other", "structured"),
    _t("TaskList", "List the tasks", "task_management", "read", "structured"),
    _t("TaskOutput", "Read a background task's output", "task_management", "read", "text"),
    _t("TaskStop", "Stop a background task", "task_management", "other", "text"),
    _t("BashOutput", "Read a background shell's output", "shell", "read", "text"),
    _t("KillShell", "Stop a background shell", "shell", "exec", "text"),
    _t("Monitor", "Watch a background process", "shell", "read", "text"),
    _t("CronCreate", "Schedule a recurring prompt", "task_management", "other", "structured"),
    _t("CronDelete", "Delete a scheduled prompt", "task_management", "other", "structured"),
    _t("CronList", "List scheduled prompts", "task_management", "read", "structured"),
    _t("ScheduleWakeup", "Schedule the agent to resume later", "task_management"),
    _t("Skill", "Run a skill", "custom"),
    _t("ToolSearch", "Find deferred tools by name or description", "search", "search", "text"),
    _t("ListMcpResourcesTool", "List resources of MCP servers", "mcp", "list", "structured"),
    _t("ReadMcpResourceTool", "Read a resource of an MCP server", "mcp", "read", "text"),
    _t("EnterWorktree", "Work in a new git worktree", "filesystem", "other", "text", True),
    _t("ExitWorktree", "Leave the git worktree", "filesystem", "other", "text", True),
    _t("ListAgents", "List the available subagent types", "agent", "read", "structured"),
    _t("SendMessage", "Send a message to another agent", "agent", "other", "text"),
    _t("ReportFindings", "Report findings to the user", "custom"),
    _t("Workflow", "Run a workflow", "custom"),
    _t("LSP", "Query a language server", "search", "search", "text"),
    _t("SlashCommand", "Run a slash command", "custom"),
    # Codex CLI 0.171.0 (codex exec --json items, named as the parser names them)
    _t("shell", "Run a shell command in the workspace", "shell", "exec", "text", True),
    _t("exec_command", "Run a shell command in the workspace", "shell", "exec", "text", True),
    _t("apply_patch", "Apply a patch to files in the workspace", "filesystem", "write", None, True),
    _t("update_plan", "Update the plan (todo list)", "task_management", "other", "structured"),
    _t("web_search", "Search the web", "search", "search", "web_content"),
    _t("tool_search", "Find tools by name or description", "search", "search", "text"),
    # Gemini CLI 0.61.0
    _t("run_shell_command", "Run a shell command", "shell", "exec", "text", True),
    _t("read_file", "Read a file", "filesystem", "read", "file_content"),
    _t("read_many_files", "Read several files", "filesystem", "read", "file_content"),
    _t("write_file", "Create or overwrite a file", "filesystem", "write", None, True),
    _t("replace", "Replace text in a file", "filesystem", "write", None, True),
    _t("glob", "Find files by glob pattern", "filesystem", "list", "file_list"),
    _t("list_directory", "List a directory", "filesystem", "list", "file_list"),
    _t("search_file_content", "Search file contents", "search", "search"),
    _t("google_web_search", "Search the web", "search", "search", "web_content"),
    _t("web_fetch", "Fetch web pages", "web", "read", "web_content", True),
    _t("save_memory", "Save a fact to memory", "custom"),
    _t("write_todos", "Write the todo list", "task_management", "other", "structured"),
    # ACP tool kinds: the name of an ACP agent's call when it gives none of its own
    # (parsers/acp/adapter.py); its output_type is decided from its kind and content.
    _t("read", "Read files or data", "filesystem", "read", None),
    _t("edit", "Modify files", "filesystem", "write", None, True),
    _t("delete", "Remove files", "filesystem", "write", None, True),
    _t("move", "Move or rename files", "filesystem", "write", None, True),
    _t("search", "Search for information", "search", "search"),
    _t("execute", "Run a command", "shell", "exec", None, True),
    _t("think", "Internal reasoning or planning", "planning"),
    _t("fetch", "Retrieve external data", "web", "read", None, True),
    _t("switch_mode", "Switch the session's mode", "planning", "other", None, True),
    _t("other", "A tool of the agent", "custom"),
)

BUILTIN_TOOLS: Final[dict[str, ToolSpec]] = {spec.name: spec for spec in _SPECS}


def lookup(name: str, known: dict[str, ToolSpec] = BUILTIN_TOOLS) -> ToolSpec:
    """What is known of a tool; MCP tools by their ``mcp__server__tool`` name, else ``custom``."""
    spec = known.get(name)
    if spec is not None:
        return spec
    if name.startswith("mcp__"):
        server, _, tool = name[5:].partition("__")
        return ToolSpec(
            name=name, description=f"{tool or name} (MCP server {server})", category="mcp"
        )
    return ToolSpec(name=name, description=name, category="custom")


def catalog_entry(spec: ToolSpec, **status: object) -> CatalogTool:
    """The ``tool.catalog.publish`` entry of a tool; ``status`` fills status fields."""
    return CatalogTool(
        name=spec.name,
        description=spec.description,
        category=spec.category,
        output_type=spec.output_type,
        requires_approval=spec.requires_approval or None,
        **status,  # type: ignore[arg-type]
    )


_CATEGORY_DEFAULT: Final[dict[str, OutputType]] = {
    "shell": "text",
    "web": "web_content",
    "task_management": "structured",
    "agent": "agent_result",
}
_READ_DEFAULT: Final[dict[str, OutputType]] = {
    "read": "file_content",
    "list": "file_list",
}


def decide_output_type(
    *,
    declared: OutputType | None,
    category: str | None,
    operation: str | None = None,
    changed: bool | None = None,
    listing: bool = False,
) -> OutputType:
    """§5.3.3 (DPS-5.3.3-output-type).

    ``declared`` is the catalog's ``output_type``; ``category`` the catalog's category;
    ``operation`` tells filesystem reads, writes and listings apart; ``changed`` says whether a write
    changed something; ``listing`` whether a search returned file paths rather than text.
    """
    if declared is not None:
        return declared
    if category in ("filesystem", "notebook"):
        if operation == "write":
            return "diff" if changed else "empty"
        if operation in _READ_DEFAULT:
            return _READ_DEFAULT[operation]
    elif category == "search":
        return "file_list" if listing else "text"
    elif category in _CATEGORY_DEFAULT:
        return _CATEGORY_DEFAULT[category]
    return "text"


# MCP server status (the agent's word) → catalog status of its tools, and the diagnostic.
_MCP_STATUS: Final[dict[str, tuple[F.ToolStatus, str, str]]] = {
    "failed": ("unavailable", "error", "MCP_SERVER_FAILED"),
    "needs-auth": ("unavailable", "error", "MCP_SERVER_NEEDS_AUTH"),
    "disabled": ("unavailable", "warning", "MCP_SERVER_DISABLED"),
    "pending": ("degraded", "warning", "MCP_SERVER_PENDING"),
}


def build_catalog(tools: list[str], servers: list[ev.McpServer]) -> F.CatalogPublish:
    """``tool.catalog.publish`` (DPS-5.4-catalog): every named tool with the built-in catalog's
    description and category; the tools of an MCP server that is not connected are ``unavailable``
    (failed, needs auth) or ``degraded`` (pending), with a diagnostic. A server in trouble whose
    tools the agent does not list at all is shown as one ``mcp__<server>`` entry, so the master
    still sees it."""
    status_of: dict[str, tuple[F.ToolStatus, str]] = {}
    diagnostics: list[F.Diagnostic] = []
    extra: list[F.CatalogTool] = []
    for server in servers:
        known = _MCP_STATUS.get(server.status)
        if known is None:
            continue  # connected (or a word we do not know): its tools are available
        status, severity, code = known
        why = f"MCP server {server.name} is {server.status}" + (
            f": {server.error}" if server.error else ""
        )
        for name in server.tools:
            status_of[name] = (status, why)
            diagnostics.append(
                F.Diagnostic(severity=severity, code=code, message=why, tool_name=name)  # type: ignore[arg-type]
            )
        if not server.tools:
            placeholder = f"mcp__{server.name}"
            extra.append(
                F.CatalogTool(
                    name=placeholder,
                    description=f"Tools of MCP server {server.name}",
                    category="mcp",
                    status=status,
                    status_description=why,
                )
            )
            diagnostics.append(
                F.Diagnostic(severity=severity, code=code, message=why, tool_name=placeholder)  # type: ignore[arg-type]
            )
    entries = []
    for name in tools:
        spec = lookup(name)
        if name in status_of:
            status, why = status_of[name]
            entries.append(catalog_entry(spec, status=status, status_description=why))
        else:
            entries.append(catalog_entry(spec))
    return F.CatalogPublish(tools=entries + extra, diagnostics=diagnostics or None)
