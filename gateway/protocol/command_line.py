"""A shell command line as a shell reads it, for the permission rules (docs/policies.md), sans-IO.

``read_line`` parses a line with tree-sitter's bash grammar (the one Codex judges commands with)
into its simple commands (``Line.parts``): each one's words unquoted and joined by one space, the
assignments in front of it dropped, so ``GIT_TRACE=0 git  push\\t'--force'`` is ``git push
--force``. A command run through a wrapper that runs its arguments (``sudo``, ``env``, ``nice``,
``timeout``, ``xargs`` ...) or by a path (``/usr/bin/git``) is also given as the command after the
wrapper, or by its base name: a ``deny`` matches either spelling, an ``allow`` must match both.
Where the wrapped command begins is read from the wrapper's options as its manual gives them
(gateway/protocol/shell_wrappers.py): ``sudo -u root rm`` runs ``rm``, not ``root``.

A line that is only a shell running a quoted script (``/bin/bash -lc 'npm test'``, as Codex runs
every command) is read as that script.

``Line.opaque`` says the line holds something a reader of its text cannot see through, so no
``allow`` rule may hold for it:

- a command or process substitution (``$(...)``, backticks, ``<(...)``, ``>(...)``), an
  arithmetic expansion (bash evaluates the variables it names as code), also inside a string, a
  heredoc or an assignment;
- an expansion in command position (``$CMD args``);
- ``eval``, ``source``, ``.``, ``exec``, a nested shell's ``-c`` string, ``xargs``, ``env -S``:
  they run text as commands (the commands of a quoted ``-c``, ``eval`` or ``env -S`` string are
  read too, for ``deny``);
- a wrapper's option its manual does not list, or one that writes a file (``time -o``);
- a redirection of output into a file (``>``, ``>>``, ``&>``, ``>|``, ``<>`` to anything but
  ``/dev/null``, ``/dev/stdout``, ``/dev/stderr`` or a descriptor);
- a background job (``&``), a function definition, or any construct this reader does not know.

A line that does not parse (the grammar's ERROR or missing nodes) is ``Line.parsed`` False: the
rules judge its text as written, and never allow it. A line with more syntax or simple commands
than ``MAX_NODES``, ``MAX_PARTS`` and ``MAX_PART_CHARS`` allow is ``Line.too_big``: judged as a
field too long is, never allowed, always denied. Nothing here reads a file or a clock; a line's
reading is kept (``MAX_KEPT`` lines), since an agent asks about the same command again.
"""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass
from typing import Final

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from gateway.protocol.shell_wrappers import WRAPPERS, command_starts

__all__ = ["MAX_KEPT", "MAX_NODES", "MAX_PARTS", "MAX_PART_CHARS", "Line", "read_line"]

MAX_KEPT: Final = 128  # lines whose reading is kept (each up to 16 KiB, its parts 64 KiB)
MAX_NESTING: Final = 3  # nested -c and eval strings read into
# A line larger than this is too big to judge, as a field too long is (docs/policies.md): the
# walk stops, and each rule would match each part of it on a permission question.
MAX_NODES: Final = 4096  # syntax nodes walked, nested strings included
MAX_PARTS: Final = 128  # distinct simple commands
MAX_PART_CHARS: Final = 64 * 1024  # of all simple commands together (each holds its arguments)
_PARSER: Final = Parser(Language(tree_sitter_bash.language()))

# Nodes a reader sees through: their commands are parts, their words are data.
_SEEN_THROUGH: Final = frozenset(
    {
        "program", "list", "pipeline", "redirected_statement", "subshell", "compound_statement",
        "if_statement", "elif_clause", "else_clause", "while_statement", "for_statement",
        "c_style_for_statement", "do_group", "case_statement", "case_item", "negated_command",
        "test_command", "binary_expression", "unary_expression", "parenthesized_expression",
        "postfix_expression", "ternary_expression", "comment", "variable_assignment",
        "variable_assignments", "word", "number", "raw_string", "string", "string_content",
        "simple_expansion", "expansion", "concatenation", "variable_name", "special_variable_name",
        "ansi_c_string", "translated_string", "array", "brace_expression", "subscript",
        "heredoc_body", "heredoc_content", "heredoc_start", "heredoc_end", "herestring_redirect",
        "heredoc_redirect", "file_descriptor", "extglob_pattern", "regex", "command_name",
        "file_redirect",
    }
)  # fmt: skip
_OPAQUE: Final = frozenset(
    {
        "command_substitution", "process_substitution", "arithmetic_expansion",
        "function_definition", "ERROR",
    }
)  # fmt: skip
_WRITES: Final = frozenset({">", ">>", "&>", "&>>", ">|", "<>", ">&", "&>|"})
_HARMLESS_TARGETS: Final = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_RUNS_TEXT: Final = frozenset({"eval", "source", ".", "exec", "xargs", "trap"})
_SHELLS: Final = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "fish", "busybox"})


@dataclass(frozen=True, slots=True)
class Line:
    """One command line read: its simple commands, whether an allow may hold for it, and whether
    it was too big to read (``MAX_NODES``, ``MAX_PARTS``: then ``parts`` is empty)."""

    parts: tuple[str, ...]
    opaque: bool
    parsed: bool
    too_big: bool = False


@functools.lru_cache(maxsize=MAX_KEPT)
def read_line(text: str) -> Line:
    """The simple commands of a shell command line (see the module docstring)."""
    script = _shell_script(text)
    if script is not None:  # Codex's "/bin/bash -lc '...'": the script is the line
        return read_line(script)
    reader = _Reader()
    parsed = reader.read(text, 0)
    parts = tuple(dict.fromkeys(reader.parts))
    if reader.budget < 0 or len(parts) > MAX_PARTS:
        return Line((), True, parsed, too_big=True)
    return Line(parts, reader.opaque or not parsed, parsed)


def _shell_script(text: str) -> str | None:
    """The script of a line that is only ``bash -c 'SCRIPT'`` (or ``-lc``, any shell of
    ``_SHELLS``), as Codex runs every command: a quoted string with no expansion, else None."""
    if len(text) > MAX_PART_CHARS:
        return None
    root = _PARSER.parse(text.encode()).root_node
    if root.has_error or root.named_child_count != 1:
        return None
    command = root.named_children[0]
    if command.type != "command" or command.named_child_count != 3:
        return None
    name, flag, script = command.named_children
    shell = _word(name)
    if (
        name.type != "command_name"
        or posixpath.basename(shell) not in _SHELLS
        or _word(flag) not in ("-c", "-lc", "-cl")
        or script.type not in ("raw_string", "string", "word")
        or _expands(script)
    ):
        return None
    return _word(script)


class _Reader:
    __slots__ = ("budget", "chars", "opaque", "parts")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.opaque = False
        self.budget = MAX_NODES
        self.chars = MAX_PART_CHARS

    def part(self, text: str) -> None:
        self.parts.append(text)
        self.chars -= len(text)
        if self.chars < 0 or len(self.parts) > MAX_NODES:
            self.budget = -1  # too big: the walk stops

    def read(self, text: str, depth: int) -> bool:
        """Reads ``text``'s commands into ``parts``; False when it does not parse."""
        root = _PARSER.parse(text.encode()).root_node
        parsed = not root.has_error
        stack = [root]  # not recursive: a deeply nested line cannot exhaust the stack
        while stack and self.budget >= 0:  # a nested string's walk shares the budget
            self.budget -= 1
            node = stack.pop()
            kind = node.type
            if node.is_missing or kind in _OPAQUE:
                self.opaque = True
            elif kind == "command":
                self._command(node, depth)
            elif kind in ("declaration_command", "unset_command"):
                self.part(" ".join(_word(c) for c in node.children))
            elif kind == "file_redirect":
                self._redirect(node)
            elif kind == "heredoc_body" or kind == "&":
                # A heredoc's expansions are caught as their nodes; "&" alone is a background job.
                self.opaque = self.opaque or kind == "&"
            elif node.is_named and kind not in _SEEN_THROUGH:
                self.opaque = True
            stack.extend(reversed(node.children))
        return parsed

    def _command(self, node: Node, depth: int) -> None:
        if node.child_count > self.budget:
            self.budget = -1  # its words alone are more than a line may hold
            return
        words: list[str] = []
        for child in node.children:
            if child.type == "command_name":
                if _expands(child):
                    self.opaque = True  # an expansion in command position
                words.append(_word(child))
            elif words and child.type not in ("file_redirect", "herestring_redirect"):
                words.append(_word(child))
        if not words:
            return
        self.part(" ".join(words))
        self._unwrapped(words, node, depth)

    def _unwrapped(self, words: list[str], node: Node, depth: int) -> None:
        """The same command by its base name, after its wrappers (each read as its manual reads
        its options: gateway/protocol/shell_wrappers.py), and a nested string read."""
        pending, done = [0], set()
        while pending:  # each word read as a command once: a wrapper's readings may meet
            at = pending.pop()
            if at in done or at >= len(words):
                continue
            done.add(at)
            if at:
                self.part(" ".join(words[at:]))
            name = words[at]
            base = posixpath.basename(name) if "/" in name else name
            if base != name:
                self.part(" ".join([base, *words[at + 1 :]]))
            if base in _RUNS_TEXT:
                self.opaque = True
            if base == "eval" and depth < MAX_NESTING:
                self.read(" ".join(words[at + 1 :]), depth + 1)
            if base in _SHELLS:
                self._nested_shell(words[at + 1 :], depth)
            if base not in WRAPPERS:
                continue
            unwrapped = command_starts(base, words[at + 1 :])
            self.opaque = self.opaque or unwrapped.opaque
            if unwrapped.line is not None and depth < MAX_NESTING:
                self.read(unwrapped.line, depth + 1)  # env -S: its string is a command line
            pending.extend(at + 1 + start for start in unwrapped.starts)

    def _nested_shell(self, args: list[str], depth: int) -> None:
        for i, arg in enumerate(args):
            if arg.startswith("-") and not arg.startswith("--") and "c" in arg:
                self.opaque = True
                if i + 1 < len(args) and depth < MAX_NESTING:
                    self.read(args[i + 1], depth + 1)
                return

    def _redirect(self, node: Node) -> None:
        operator = next((c.type for c in node.children if not c.is_named), "")
        if operator not in _WRITES:
            return
        target = node.children[-1]
        if target.type == "number" or (operator == ">&" and _word(target) == "-"):
            return  # a descriptor: 2>&1, >&-
        if _word(target) not in _HARMLESS_TARGETS:
            self.opaque = True


_EXPANSIONS: Final = frozenset(
    {"simple_expansion", "expansion", "command_substitution", "process_substitution",
     "arithmetic_expansion", "ERROR"}
)  # fmt: skip


def _expands(node: Node) -> bool:
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type in _EXPANSIONS:
            return True
        stack.extend(current.children)
    return False


def _word(node: Node) -> str:
    """A word as the command sees it, where the text tells: quotes and escapes taken off; an
    expansion is kept as written."""
    kind = node.type
    text = (node.text or b"").decode(errors="replace")
    if kind == "word":
        return _unescape(text)
    if kind == "raw_string":
        return text[1:-1]
    if kind in ("string", "concatenation", "command_name"):
        return "".join(
            _unescape((c.text or b"").decode(errors="replace"))
            if c.type == "string_content"
            else _word(c)
            for c in node.children
            if c.type != '"'
        )
    return text


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, chars = [], iter(text)
    for char in chars:
        out.append(next(chars, "") if char == "\\" else char)
    return "".join(out)
