"""The architecture as the import graph shows it (docs/architecture.md), kept by reading the source
with ``ast`` alone: each package imports only the packages below it, no module takes part in an
import cycle, ``parsers`` stands apart from ``gateway``, and the protocol core does no I/O."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The package order, lowest first: a package may import the ones before it in its chain. The
# master-side client and the terminal chat are a chain of their own above the protocol, so a
# client never pulls the server in; the commands (cli) sit on top of both.
SERVER_CHAIN = (
    "parsers",
    "gateway.protocol",
    "gateway.storage",
    "gateway.agent",
    "gateway.config",
    "gateway.metrics",
    "gateway.team",
    "gateway.console",
    "gateway.session",
    "gateway.server",
)
CLIENT_CHAIN = ("parsers", "gateway.protocol", "gateway.client", "gateway.chat")
TOP = "gateway.cli"
# Modules every part may import: they import nothing of the project's themselves.
LEAVES = ("gateway", "gateway.api_error", "gateway.local_token", "gateway.logs", "gateway.setting")
# Entry points that only hand over to the package that does the work.
ENTRY_POINTS = {"gateway.__main__": TOP, "gateway.demo_agent": "gateway.agent"}

# What the sans-IO core never imports: event loops, sockets, processes, files, threads.
IO_MODULES = frozenset(
    {
        "aiohttp",
        "asyncio",
        "fcntl",
        "glob",
        "http",
        "multiprocessing",
        "pathlib",
        "selectors",
        "shutil",
        "socket",
        "ssl",
        "subprocess",
        "tempfile",
        "threading",
        "urllib",
        "uvloop",
    }
)
# The one use of os in the core: the frame factory's default source of random bytes.
OS_ALLOWED = frozenset({"gateway.protocol.factory"})


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def modules() -> dict[str, Path]:
    found = {}
    for top in ("gateway", "parsers"):
        for path in sorted((REPO / top).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def imported(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every module ``name`` imports, anywhere in the file, resolved to a module of the tree or to
    the top-level name of a third-party or standard module."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            for target in imported_from(name, path, node):
                yield target, node.lineno


def imported_from(name: str, path: Path, node: ast.ImportFrom) -> list[str]:
    """What each name of a ``from ... import`` resolves to: the module of the tree it names, else
    the module it is taken from."""
    is_package = path.name == "__init__.py"
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        module = ".".join([*base, node.module] if node.module else base)
    else:
        module = node.module or ""
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]


def edges() -> list[Edge]:
    found = []
    for name, path in MODULES.items():
        for target, line in imported(name, path):
            if target.split(".")[0] in ("gateway", "parsers") and target != name:
                found.append(Edge(name, target, line))
    return found


EDGES = edges()


def part(module: str) -> str:
    """The package a module belongs to, as the chains name them."""
    if module in LEAVES or module in ENTRY_POINTS:
        return module
    if module.startswith("parsers"):
        return "parsers"
    pieces = module.split(".")
    return ".".join(pieces[:2])


def below(owner: str) -> set[str]:
    allowed: set[str] = {owner, *LEAVES}
    if owner in ENTRY_POINTS:
        return allowed | {ENTRY_POINTS[owner]}
    if owner == TOP:
        return allowed | set(SERVER_CHAIN) | set(CLIENT_CHAIN)
    for chain in (SERVER_CHAIN, CLIENT_CHAIN):
        if owner in chain:
            allowed |= set(chain[: chain.index(owner)])
    return allowed


def test_every_module_belongs_to_a_known_part() -> None:
    known = set(SERVER_CHAIN) | set(CLIENT_CHAIN) | {TOP, *LEAVES, *ENTRY_POINTS}
    strays = sorted(m for m in MODULES if part(m) not in known)
    assert not strays, f"modules outside every part of the layout: {strays}"


def test_each_part_imports_only_the_parts_below_it() -> None:
    wrong = [
        f"{MODULES[e.source].relative_to(REPO)}:{e.line} ({part(e.source)}) imports {e.target}"
        for e in EDGES
        if part(e.target) not in below(part(e.source))
    ]
    assert not wrong, "imports against the package order:\n" + "\n".join(wrong)


def test_leaves_import_nothing_of_the_project() -> None:
    wrong = [f"{e.source} imports {e.target}" for e in EDGES if e.source in LEAVES]
    assert not wrong, wrong


def test_parsers_never_import_the_gateway() -> None:
    wrong = [
        f"{e.source}:{e.line} imports {e.target}" for e in EDGES if part(e.source) == "parsers"
    ]
    assert not [w for w in wrong if " gateway" in w], wrong


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in EDGES:
        if e.target in graph:
            graph[e.source].add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    assert cycles() == []


@pytest.mark.parametrize("name", sorted(m for m in MODULES if part(m) == "gateway.protocol"))
def test_the_protocol_core_does_no_io(name: str) -> None:
    path = MODULES[name]
    io = sorted(
        f"line {line}: {target}"
        for target, line in imported(name, path)
        if target.split(".")[0] in IO_MODULES
        or (target.split(".")[0] == "os" and name not in OS_ALLOWED)
    )
    opens = [
        f"line {node.lineno}: open()"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open"
    ]
    assert not io + opens, f"{path.relative_to(REPO)} does I/O: {io + opens}"


def test_the_rules_see_the_tree() -> None:
    """A rule that reads nothing proves nothing: the graph has the parts and edges it must."""
    assert {"gateway.protocol.machine", "gateway.server", "parsers.base"} <= set(MODULES)
    assert any(
        e.source == "gateway.session.live" and part(e.target) == "gateway.protocol" for e in EDGES
    )


# A module is a room of one purpose, about 600 lines at the most. The exceptions are single state
# machines kept whole on purpose, each saying so (and why) in its opening docstring.
MAX_LINES = 650
STATE_MACHINES = frozenset(
    {"gateway.protocol.machine", "gateway.protocol.mapper", "parsers.acp.adapter"}
)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_outgrows_its_room(name: str) -> None:
    path = MODULES[name]
    lines = len(path.read_text().splitlines())
    if name in STATE_MACHINES:
        opening = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "kept whole" in opening, f"{path.relative_to(REPO)} does not say why it is one file"
    else:
        assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines"


# --- contracts and words (docs/architecture.md, "Words") -----------------------------------------


def private_uses(name: str, path: Path) -> Iterator[str]:
    """``module._name`` for every private name of another module of the tree that ``name`` takes:
    imported by name, or read as an attribute of a module it imported."""
    tree = ast.parse(path.read_text(), str(path))
    modules_bound: dict[str, str] = {}  # local name -> module of the tree
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    modules_bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            targets = dict(
                zip((a.name for a in node.names), imported_from(name, path, node), strict=True)
            )
            for alias in node.names:
                target = targets[alias.name]
                if target in MODULES and target.endswith(f".{alias.name}"):
                    modules_bound[alias.asname or alias.name] = target
                elif is_private(alias.name) and target in MODULES and target != name:
                    yield f"{target}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules_bound
            and is_private(node.attr)
            and modules_bound[node.value.id] != name
        ):
            yield f"{modules_bound[node.value.id]}.{node.attr}"


def is_private(identifier: str) -> bool:
    return identifier.startswith("_") and not identifier.startswith("__")


def test_a_module_takes_only_the_public_names_of_another() -> None:
    """A module's contract is public: what another module uses has no leading underscore (and is
    in the module's ``__all__`` where it has one)."""
    found = sorted({use for name, path in MODULES.items() for use in private_uses(name, path)})
    assert found == []


def identifiers(path: Path) -> Iterator[tuple[str, int]]:
    """Every name the file binds or reads: variables, attributes, functions, classes, arguments."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name):
            yield node.id, node.lineno
        elif isinstance(node, ast.Attribute):
            yield node.attr, node.lineno
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, node.lineno
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            yield node.arg, node.lineno


def test_a_duration_in_seconds_ends_in_sec() -> None:
    """One suffix for seconds, the one the TOML keys use (``reattach_window_sec``): ``_sec``, never
    ``_s``."""
    found = sorted(
        f"{path.relative_to(REPO)}:{line} {word}"
        for path in MODULES.values()
        for word, line in identifiers(path)
        if word.lower().endswith("_s") and word.strip("_").lower() != "s"
    )
    assert found == []


MAX_MACHINE_FUNCTION_LINES = 50


def test_no_function_of_the_session_machine_is_over_fifty_lines() -> None:
    """The machine is read in one place, a transition at a time: a long function hides a state."""
    path = MODULES["gateway.protocol.machine"]
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_MACHINE_FUNCTION_LINES
    ]
    assert long == []
