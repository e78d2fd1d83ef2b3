"""What compiling the per-line hot path with mypyc would gain, measured in the same run.

Theory of operation
-------------------
``build`` copies ``gateway/`` and ``parsers/`` into a temporary directory and compiles the modules
of ``COMPILED`` there with mypyc (``pip install -c constraints.txt -e '.[bench]'`` brings it; it
needs a C compiler and Python's headers). Nothing of the product changes: the compiled copy exists
only in that directory, and only a process that puts it first on ``sys.path`` runs it. The source
is compiled as it is, but for these changes to the copy:

* mypyc type-checks the modules first and refuses type errors; those the sources have
  (``IGNORED_ERRORS``: a str where a Literal is declared, an unnarrowed union, ...) are told to
  pass: mypyc checks neither Literals nor those unions at run time, and any value that breaks a
  check it does make raises ``TypeError`` (the frames check below would fail, not mislead);
* the msgspec Structs of a compiled module move to an interpreted sibling module
  (``split_structs``), with a copy of the module's functions and constants they use: mypyc would
  build them without their class keywords (``tag=``, ``frozen=``, ...), silently;
* a mixin's ``if TYPE_CHECKING:`` block of what the class it is part of has becomes plain
  declarations (``unguard_declarations``): a native class body takes no statement but
  declarations and definitions;
* ``TABLES``: a dict of a class's own methods in its class body (the session machine's
  ``_EXITS``, ``_OWN_EVENTS``, ``_TIMERS``, ``LiveSession``'s ``_OBSERVERS``) moves after the
  class (``move_table``): a native class body cannot name its methods;
* ``PATCHES``: what mypyc cannot take as written (each says why).

A Struct is an interpreted class in any case (its metaclass keeps mypyc from making it native), so
the frames and events stay what they are; the functions and the plain classes and dataclasses
(``SessionMachine``, ``Mapper``, ``FrameFactory``, the parsers, ``LiveSession``, ``FrameBuffer``,
``WebSocketConnection``, the metrics) become C.

The measurement is ``bench_session_path.py``'s: its ``one_pass`` (each line of a long Claude Code
transcript through ``LiveSession.take_lines``: parser, session machine, encode once, the
reattach buffer, fan-out to a discarding connection, the real ``GatewayMetrics``), run in two worker
processes: one importing this checkout's pure-Python modules, one the compiled copy. Each worker
first checks which of its modules are compiled and feeds a transcript whose broadcast frames it
hashes (ids and timestamps left out), so the two prove they produce the same frames. Then rounds
alternate between the two workers, each pass timed in the worker's own CPU time; the best round of
each is compared.

    .venv/bin/python bench/bench_compiled.py [--lines 20000] [--rounds 7] [--build-dir DIR] [--core]
    .venv/bin/python bench/bench_compiled.py --tests [--build-dir DIR]

``--core`` compiles the sans-IO core only (``CORE``: the parsers and ``gateway/protocol/``), not the
shell's modules.

``--tests`` runs the test files of the compiled modules (``TESTS``) against the copy instead: the
tests that replace a method of a compiled class, subclass one or take a weak reference to one fail
there (a native class allows none of these), the others pass.

``--build-dir`` keeps the compiled copy there and reuses it while the sources and mypy are the same
(a build takes about a minute of CPU); ``bench_vs_websocketd.py --compiled DIR`` runs the gateway
of that directory side by side with websocketd and this checkout's.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGES = ("gateway", "parsers")

# The modules a stdout line of the agent goes through, from the parser to the socket write. Every
# parser is in: an interpreted class cannot inherit from a compiled one (``JsonLinesParser``).
COMPILED = (
    "parsers/base.py",
    "parsers/json_depth.py",
    "parsers/claude_code/stdout.py",
    "parsers/claude_code/content.py",
    "parsers/claude_code/stdin.py",
    "parsers/codex/stdout.py",
    "parsers/gemini/stdout.py",
    "parsers/plain.py",
    "gateway/protocol/capabilities.py",
    "gateway/protocol/codec.py",
    "gateway/protocol/factory.py",
    "gateway/protocol/mapper.py",
    "gateway/protocol/results.py",
    "gateway/protocol/recovery.py",
    "gateway/protocol/machine.py",
    "gateway/protocol/states.py",
    "gateway/protocol/actions.py",
    "gateway/protocol/interactions.py",
    "gateway/protocol/prompts.py",
    "gateway/protocol/tools.py",
    "gateway/session/connection.py",
    "gateway/session/fanout.py",
    "gateway/storage/files.py",
    "gateway/protocol/buffer.py",
    "gateway/metrics/__init__.py",
    "gateway/metrics/hot_path.py",
    "gateway/metrics/labels.py",
    "gateway/session/live.py",
    "gateway/session/agent_link.py",
    "gateway/session/masters.py",
)

# The sans-IO core alone (``--core``): what compiling it without the shell's modules gains.
CORE = tuple(m for m in COMPILED if m.startswith(("parsers/", "gateway/protocol/")))

# The test files of the compiled modules: ``--tests`` runs them against the copy.
TESTS = (
    "tests/parsers/test_claude_code_parser.py", "tests/parsers/test_claude_code_fixtures.py",
    "tests/parsers/test_codex_parser.py", "tests/parsers/test_gemini_parser.py", "tests/parsers/test_plain_parser.py",
    "tests/parsers/test_codex_gemini_fixtures.py", "tests/protocol/test_mapper.py", "tests/protocol/test_codec.py",
    "tests/protocol/test_factory.py", "tests/protocol/test_machine.py", "tests/protocol/test_buffer.py",
    "tests/session/test_fanout_bytes.py", "tests/metrics/test_metrics.py", "tests/protocol/test_capabilities.py",
    "tests/protocol/test_tools.py", "tests/storage/test_files.py", "tests/server/test_server.py",
    "tests/server/test_hostile_input.py", "tests/storage/test_persistence.py", "tests/session/test_memory_bounds.py",
    "tests/protocol/test_states.py", "tests/protocol/test_refusals.py", "tests/protocol/test_scenario.py",
    "tests/session/test_master_connection.py", "tests/session/test_parser_failed.py",
)  # fmt: skip

# mypy error codes the sources raise (see above; ``empty-body``: the mixins' method stubs, which the
# class they are part of overrides); mypyc stops on any other.
IGNORED_ERRORS = (
    "arg-type", "assignment", "attr-defined", "call-arg", "empty-body", "method-assign", "operator",
    "return-value", "union-attr",
)  # fmt: skip

# (module, pattern, replacement): applied to the copy of a compiled module; each must match.
PATCHES = (
    # mypyc names the C field of attribute ``_thread`` ``__thread``, a C keyword: the build fails.
    ("parsers/codex/stdout.py", r"\b_thread\b", "_thread_id"),
    # GatewayMetrics puts a C method in an attribute named like a method (no Python frame per
    # call); a native class's methods are read-only, so it stays a Python class with compiled
    # methods.
    (
        "gateway/metrics/__init__.py",
        r"\nclass GatewayMetrics:",
        "\nfrom mypy_extensions import mypyc_attr\n\n\n"
        "@mypyc_attr(native_class=False)\nclass GatewayMetrics:",
    ),
    # LiveSession's agent and masters sides are mixins: a native class has one native base, and
    # takes others only as traits.
    (
        "gateway/session/agent_link.py",
        r"\nclass AgentLink:",
        "\nfrom mypy_extensions import trait\n\n\n@trait\nclass AgentLink:",
    ),
    (
        "gateway/session/masters.py",
        r"\nclass Masters:",
        "\nfrom mypy_extensions import trait\n\n\n@trait\nclass Masters:",
    ),
    # mypy keeps ``self.turn`` narrowed to None across the ``_open_turn()`` that sets it, and
    # mypyc checks the value read against that type (TypeError "None object expected"), the
    # ``cast`` notwithstanding: read it untyped.
    (
        "gateway/protocol/machine.py",
        r"cast\(_Turn, self\.turn\)\.turn_id",
        'getattr(self, "turn").turn_id',
    ),
    # mypyc builds no native subclass of RuntimeError ("Inheriting from most builtin types is
    # unimplemented"): the machine's exception stays a Python class.
    (
        "gateway/protocol/states.py",
        r"\nclass IllegalTransition\(RuntimeError\):",
        "\nfrom mypy_extensions import mypyc_attr\n\n\n"
        "@mypyc_attr(native_class=False)\nclass IllegalTransition(RuntimeError):",
    ),
    # A Final tuple of floats that the compiled module finds unset when a function reads it.
    (
        "gateway/metrics/labels.py",
        r"CONTEXT_BANDS: Final = ",
        "CONTEXT_BANDS: tuple[float, ...] = ",
    ),
)

# (module, class, table): a dict of the class's own methods in its class body (``_EXITS:
# ClassVar[dict[...]] = {ProcessState.NONE: _exited, ...}``), which a native class body cannot
# name: ``move_table`` moves it after the class.
TABLES = (
    ("gateway/session/live.py", "LiveSession", "_OBSERVERS"),
    ("gateway/protocol/machine.py", "SessionMachine", "_EXITS"),
    ("gateway/protocol/machine.py", "SessionMachine", "_OWN_EVENTS"),
    ("gateway/protocol/machine.py", "SessionMachine", "_TIMERS"),
)


def move_table(path: Path, cls: str, table: str) -> None:
    """Move the table ``cls.table`` (see ``TABLES``) to the end of the module, as a module global
    whose entries name the class's methods through the class (``SessionMachine._exited``); the
    class's ``self.<table>`` reads it."""
    source = path.read_text()
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(
        n
        for n in body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == table
    )
    if not isinstance(node.value, ast.Dict):
        raise SystemExit(f"{cls}.{table} is no longer a dict literal: update TABLES")
    annotation = node.annotation
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "ClassVar":
        annotation = annotation.slice
    entries = "".join(
        f"    {ast.unparse(k)}: {cls}.{v.id if isinstance(v, ast.Name) else ast.unparse(v)},\n"
        for k, v in zip(node.value.keys, node.value.values, strict=True)
    )
    lines = source.splitlines(keepends=True)
    del lines[node.lineno - 1 : node.end_lineno]
    text = re.sub(rf"\bself\.{table}\b", table, "".join(lines))
    text += f"\n\n{table}: {ast.unparse(annotation)} = {{\n{entries}}}\n"
    path.write_text(text)


def unguard_declarations(path: Path) -> None:
    """A class body's ``if TYPE_CHECKING:`` block (a mixin declaring what the class it is part of
    has) becomes plain declarations: a native class body takes no ``if``. The methods it declares
    stay stubs that the class overrides (a trait's method comes after the class's own)."""
    source = path.read_text()
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    guards = [
        n
        for c in tree.body
        if isinstance(c, ast.ClassDef)
        for n in c.body
        if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING" and not n.orelse
    ]
    for node in reversed(guards):
        block = lines[node.lineno : node.end_lineno]
        lines[node.lineno - 1 : node.end_lineno] = [re.sub(r"^    ", "", x) for x in block]
    path.write_text("".join(lines))


def split_structs(path: Path) -> list[str]:
    """Move the msgspec Structs of a module to be compiled into an interpreted sibling module.

    mypyc builds a non-native class by calling its metaclass with (name, bases, namespace) and
    drops the class keywords: ``tag=``, ``tag_field=``, ``frozen=``, ``kw_only=`` would be lost
    without an error. The sibling ``_<module>_structs.py`` gets the module's imports and its Struct
    classes (and the classes built on them), in their order; the module imports them back by name.
    Returns the names moved.
    """
    source = path.read_text()
    tree = ast.parse(source)
    moved: list[ast.ClassDef] = []
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(
            ast.unparse(base) in ("msgspec.Struct", *names) for base in node.bases
        ):
            moved.append(node)
            names.add(node.name)
    if not moved:
        return []
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    lines = source.splitlines(keepends=True)

    def segment(node: ast.stmt) -> str:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "".join(lines[first - 1 : node.end_lineno])

    sibling = f"_{path.stem}_structs"
    text = "".join(segment(n) + "\n" for n in imports) + "\n"
    text += "".join(segment(n) + "\n\n" for n in _helpers(tree.body, moved))
    text += "\n\n".join(segment(n) for n in moved)
    (path.parent / f"{sibling}.py").write_text(text)
    for node in reversed(moved):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        del lines[first - 1 : node.end_lineno]
    after_imports = imports[-1].end_lineno
    order = [n.name for n in moved]
    lines.insert(after_imports, f"from .{sibling} import {', '.join(order)}  # noqa\n")
    path.write_text("".join(lines))
    return order


def _helpers(body: list[ast.stmt], moved: list[ast.ClassDef]) -> list[ast.stmt]:
    """The module's functions and constants the moved classes use (``Outgoing.of`` calls
    ``text_frame``), and those these use, in the module's order: the sibling gets a copy of each,
    since it cannot import them from the module that imports it."""
    defined: dict[str, ast.stmt] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef):
            defined[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    defined[target.id] = node
    needed: list[ast.stmt] = []
    todo: list[ast.AST] = list(moved)
    while todo:
        for n in ast.walk(todo.pop()):
            if isinstance(n, ast.Name) and n.id in defined and defined[n.id] not in needed:
                needed.append(defined[n.id])
                todo.append(defined[n.id])
    return [n for n in body if n in needed]


def _sources_digest(modules: tuple[str, ...]) -> str:
    """What a build depends on: the package sources, this file and mypy's version."""
    from importlib.metadata import version

    h = hashlib.sha256(f"{version('mypy')} {modules}".encode() + Path(__file__).read_bytes())
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def build(dest: Path, modules: tuple[str, ...] = COMPILED) -> None:
    """A copy of the packages in ``dest`` with ``modules`` compiled in place (reused if current)."""
    if importlib.util.find_spec("mypyc") is None:
        raise SystemExit("mypyc is missing: pip install -c constraints.txt -e '.[bench]'")
    stamp = dest / "compiled.stamp"
    digest = _sources_digest(modules)
    if stamp.is_file() and stamp.read_text() == digest:
        return
    for old in dest.glob("*__mypyc.*"):  # an earlier build's library
        old.unlink()
    for package in PACKAGES:
        shutil.rmtree(dest / package, ignore_errors=True)
        shutil.copytree(
            ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for module in modules:
        split_structs(dest / module)
        unguard_declarations(dest / module)
    for module, cls, table in TABLES:
        if module in modules:
            move_table(dest / module, cls, table)
    for module, pattern, replacement in PATCHES:
        if module not in modules:
            continue
        path = dest / module
        text, n = re.subn(pattern, replacement, path.read_text())
        if n == 0:
            raise SystemExit(f"patch {pattern!r} no longer matches {module}: update PATCHES")
        path.write_text(text)
    argv = [sys.executable, "-m", "mypyc", *modules]
    for code in IGNORED_ERRORS:
        argv += ["--disable-error-code", code]
    print(f"compiling {len(modules)} modules with mypyc in {dest} ...", file=sys.stderr)
    t0 = time.monotonic()
    done = subprocess.run(argv, cwd=dest, capture_output=True, text=True)
    (dest / "build.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"mypyc failed (rc {done.returncode}):\n{done.stdout[-3000:]}")
    print(f"compiled in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    stamp.write_text(digest)


_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def runs_compiled(pid: int, dest: Path) -> bool:
    """Whether process ``pid`` has loaded the compiled modules of ``dest``: the library mypyc
    builds for them all (its per-module shims need not stay mapped)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return any(f"{dest}/" in line and "__mypyc." in line for line in maps)


def run_tests(dest: Path) -> int:
    """``TESTS`` with the packages imported from ``dest`` (pytest would put this checkout first)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import gateway, parsers, parsers.base; "
        "assert parsers.base.__file__.endswith('.so'), parsers.base.__file__; "
        "import pytest; sys.exit(pytest.main(sys.argv[2:]))"
    )
    argv = [sys.executable, "-c", code, str(dest), "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    return subprocess.run([*argv, "-rf", *TESTS], cwd=ROOT).returncode


# --- the worker: one process per variant ------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    """Import the packages (from ``--compiled`` when given), then serve "hash" and "run" on stdin."""
    if args.compiled:
        sys.path.insert(0, args.compiled)
        import gateway  # noqa: F401  the packages, and so all their modules, come from the copy
        import parsers  # noqa: F401
    sys.path.insert(0, str(HERE))
    import bench_session_path as path
    import msgspec

    from gateway.config import Config, ServerSettings, builtin_profiles
    from gateway.session import LiveSession

    compiled = [
        m for m in COMPILED if importlib.import_module(_module_name(m)).__file__.endswith(".so")
    ]
    lines = path.transcript(args.fixture, args.lines)
    root = Path(tempfile.mkdtemp(prefix="bench-compiled-"))

    async def frames_digest() -> str:
        """The broadcast frames of the transcript, message ids and timestamps left out, hashed."""
        session = LiveSession(
            "0b6c2a8e-5d8f-4c1e-9a3b-2f1e0d9c8b7a", builtin_profiles()["demo"], root,
            config=Config(server=ServerSettings(workspace_root=root)), metrics=path.GatewayMetrics(),
        )  # fmt: skip
        session.buffer.max_bytes = 1 << 40  # keep every frame
        path.start_session(session, 1)
        await path.feed_lines(session, lines)
        h = hashlib.sha256()
        ids: dict[bytes, bytes] = {}  # turn ids and the like are random: numbered as they come
        for data in session.buffer.everything().frames:
            frame = msgspec.json.decode(data)
            del frame["message_id"], frame["timestamp"]
            text = msgspec.json.encode(frame, order="sorted")
            h.update(_UUID.sub(lambda m: ids.setdefault(m[0], b"#%d" % len(ids)), text))
        for conn in list(session.connections.values()):
            await conn.aclose()
        return f"{h.hexdigest()[:16]} ({len(session.buffer)} frames)"

    async def serve() -> None:
        reply = {"compiled": compiled, "frames": await frames_digest()}
        print(json.dumps(reply), flush=True)
        for command in sys.stdin:
            if command.strip() != "run":
                break
            cpu = await path.one_pass(lines, path.GatewayMetrics(), 1, root)
            print(json.dumps(cpu), flush=True)

    asyncio.run(serve())
    shutil.rmtree(root, ignore_errors=True)


class Worker:
    def __init__(self, name: str, args: argparse.Namespace, compiled: Path | None) -> None:
        self.name = name
        argv = [sys.executable, __file__, "--worker", "--lines", str(args.lines)]
        argv += ["--fixture", args.fixture]
        if compiled is not None:
            argv += ["--compiled", str(compiled)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._reply()

    def _reply(self):
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.name} worker ended (rc {self.proc.wait()})")
        return json.loads(line)

    def run(self) -> float:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._reply()

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fixture", default="thinking--partial")
    parser.add_argument("--build-dir", help="keep the compiled copy here and reuse it")
    parser.add_argument(
        "--tests", action="store_true", help="run the compiled modules' tests against the copy"
    )
    parser.add_argument(
        "--core",
        action="store_true",
        help="compile the sans-IO core only (parsers/, gateway/protocol/), not the shell",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compiled", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    tmp = None
    if args.build_dir:
        dest = Path(args.build_dir).resolve()
        dest.mkdir(parents=True, exist_ok=True)
    else:
        dest = tmp = Path(tempfile.mkdtemp(prefix="rawp-compiled-"))
    modules = CORE if args.core else COMPILED
    try:
        build(dest, modules)
        if args.tests:
            sys.exit(run_tests(dest))
        load0 = os.getloadavg()[0]
        workers = [Worker("pure", args, None), Worker("compiled", args, dest)]
        pure, comp = workers
        try:
            if pure.hello["compiled"] or comp.hello["compiled"] != list(modules):
                raise SystemExit(f"not the modules expected: {pure.hello} {comp.hello}")
            if pure.hello["frames"] != comp.hello["frames"]:
                raise SystemExit(f"different frames: {pure.hello} {comp.hello}")
            times: dict[str, list[float]] = {w.name: [] for w in workers}
            for i in range(args.rounds):
                for w in workers if i % 2 == 0 else workers[::-1]:
                    times[w.name].append(w.run())
        finally:
            for w in workers:
                w.stop()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    n = args.lines
    best = {name: min(t) for name, t in times.items()}
    print(f"{n} lines ({args.fixture}), fan-out 1, real metrics; best of {args.rounds} "
          f"interleaved rounds (CPU time of each worker)")  # fmt: skip
    print(f"same frames from both: {pure.hello['frames']}")
    print(f"compiled with mypyc: {', '.join(_module_name(m) for m in modules)}")
    for name in times:
        spread = ", ".join(f"{1e6 * t / n:.2f}" for t in times[name])
        print(f"{name:9} {1e6 * best[name] / n:6.2f} µs/line   (rounds: {spread})")
    print(f"compiled / pure: {best['compiled'] / best['pure']:.2f}x CPU per line "
          f"({best['pure'] / best['compiled']:.2f}x as fast)")  # fmt: skip
    load1 = os.getloadavg()[0]
    print(f"load average: {load0:.1f} at the start, {load1:.1f} at the end, on "
          f"{os.cpu_count()} cores")  # fmt: skip


if __name__ == "__main__":
    main()
