"""Paths judged where the tool touches them: the shell reads the disk for a permission question's
paths (gateway/session/tool_paths.py) and the starter rule set of docs/policies.md, read from the
page itself, denies every spelling of a path outside the workspace, a symlink out included."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from gateway.config.policy import parse_policy
from gateway.protocol.policy import decide
from gateway.session.tool_paths import MAX_PATHS, resolve_tool_paths, where_paths
from parsers import events as ev

DOCS = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


def starter_rules():
    text = DOCS.read_text()
    section = text[text.index("## A starter set for a team") :]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    return parse_policy(tomllib.loads(block.group(1))["policy"], str(DOCS)).rules


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace with a symlink ``out`` to a directory outside it, reached itself through a
    symlinked parent (as /tmp is on some systems)."""
    (tmp_path / "real" / "ws" / "src").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "real" / "ws" / "out").symlink_to(tmp_path / "outside")
    (tmp_path / "real" / "ws" / "inner").symlink_to("src")
    (tmp_path / "via").symlink_to(tmp_path / "real")
    return tmp_path / "via" / "ws"


def judged(workspace: Path, tool: str, **tool_input: str) -> tuple[str, str] | None:
    ws = str(workspace)
    request = ev.PermissionRequest(request_id="r", tool_name=tool, input=tool_input)
    (request,) = resolve_tool_paths([request], ws)  # type: ignore[assignment]
    found = decide(
        starter_rules(),
        tool=tool,
        tool_input=tool_input,
        agent="claude-code",
        role="operator",
        workspace=ws,
        paths=request.resolved_paths,  # type: ignore[attr-defined]
    )
    return None if found is None else (found.decision, found.name)


@pytest.mark.parametrize(
    ("tool", "path", "rule"),
    [
        ("Write", "{ws}/../../../etc/cron.d/x", "writes-outside"),
        ("Write", "{ws}/./../x", "writes-outside"),
        ("Write", "{ws}//../x", "writes-outside"),
        ("Write", "{ws}/out/x", "writes-outside"),  # a symlink in the workspace, out of it
        ("Write", "{ws}/out/../../../x", "writes-outside"),
        ("Edit", "{ws}/out/new-dir/x", "writes-outside"),  # the part that exists is followed
        ("Write", "~/.bashrc", "writes-outside"),
        ("Read", "{ws}/../../../etc/shadow", "reads-outside"),
        ("Read", "{ws}/out/secret", "reads-outside"),
    ],
)
def test_the_starter_set_denies_every_spelling_of_outside(workspace, tool, path, rule):
    assert judged(workspace, tool, file_path=path.format(ws=workspace)) == ("deny", rule)


def test_the_starter_set_allows_inside_however_spelled(workspace):
    for path in ("{ws}/src/a.py", "src/a.py", "{ws}/inner/a.py", "{ws}/src/../a.py"):
        spelled = path.format(ws=workspace)
        assert judged(workspace, "Write", file_path=spelled) == ("allow", "writes-inside")
    assert judged(workspace, "Read", file_path="src/a.py") == ("allow", "reads")
    assert judged(workspace, "Grep", path=str(workspace)) == ("allow", "searches-here")
    assert judged(workspace, "Grep", path=f"{workspace}/out") == ("deny", "searches-outside")


def test_the_starter_set_reads_commands_by_their_simple_commands(workspace):
    for command in ("git  push --force", "cd . && git push -f", "GIT_TRACE=0 git\tpush -f"):
        assert judged(workspace, "Bash", command=command) == ("deny", "no-force-push")
    assert judged(workspace, "Bash", command="ls && rm -rf x") == ("ask", "shell-deletions")


def test_where_paths_names_a_path_inside_by_the_workspace_and_is_bounded(workspace):
    ws = str(workspace)
    real = os.path.realpath(ws)
    assert real != ws
    found = where_paths({"file_path": "inner/a", "path": f"{ws}/out/b"}, [f"{ws}//c"], ws)
    assert found == {
        "inner/a": f"{ws}/src/a",
        f"{ws}/out/b": os.path.join(os.path.realpath(workspace.parent.parent), "outside", "b"),
        f"{ws}//c": f"{ws}/c",
    }
    many = [f"f{i}" for i in range(MAX_PATHS + 5)]
    assert len(where_paths({}, many, ws)) == MAX_PATHS
    assert where_paths({"file_path": "~/x", "path": 3}, [], ws) == {}
