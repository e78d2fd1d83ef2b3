"""The repository explains itself: a clone with nothing beside it has every file its docs and code
point to.

Checked over every file git tracks (and new files not yet added, unless ignored):

* no absolute path of a development machine (its work folder, ``/root/...``, ``/home/<user>/...``,
  ``/Users/<user>/...``). ``/home/rawp`` is allowed: it is the home of the deployment image's own
  user (deploy/Dockerfile). Recorded fixtures are checked like everything else: the rig runs every
  CLI under ``/tmp/rawp-rig/`` with a throwaway HOME there, so a recording holds no machine path,
  and one that does was recorded wrongly;
* no path up into a sibling folder of reference material, and no outside reference document
  named (``control-plane.md``, ``conformance.md``, ...): code and docs name docs/ instead;
* no issue numbers (``issue 5``, ``#12``) in code, scripts, configuration or docs: comments say why
  in words;
* every Markdown link (``[text](target)``, ``[text]: target``) outside code resolves to a file of
  the repository, and its ``#anchor`` to a heading of that file; links leave the repository never;
* every repository path to a Markdown file named in code or docs (``docs/x.md``) exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO

MACHINE_PATH = re.compile(
    r"(?<![\w.~/$-])"  # the start of a path, not the middle of one (/tmp/x/home/y is fine)
    r"(/wor[k]/|/root(?![\w.-])|/home/(?!rawp(?![\w.-]))[\w.-]+|/Users/[\w.-]+)"
)
OUTSIDE = re.compile(r"\.\./shared\b")
# The reference documents the project was built from live outside the repository: code and docs name
# the repository's own docs instead (docs/http-api.md, docs/configuration.md, the mapping pages).
OUTSIDE_DOCUMENT = re.compile(
    r"\b(?:control-plane|conformance|rawp-dps-[\d.]+|style)\.md\b|\bagents/[\w-]+\.md\b"
)
ISSUE_WORD = re.compile(r"\b(?:issue|pull request|PR)\s*#?\d+\b", re.IGNORECASE)
ISSUE_HASH = re.compile(r"(?<![\w&/#])#\d+\b")
# Files where "#123" can only mean an issue (CSS, HTML and JSON use it for colours).
ISSUE_HASH_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ""}
MD_PATH = re.compile(
    r"(?<![\w./-])((?:docs|deploy|bench|tests|grafana|scripts|gateway|parsers)/[\w./-]*\.md)\b"
)

INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    paths = [REPO / p for p in out.decode().split("\0") if p]
    return [p for p in paths if p.is_file() and not p.is_symlink()]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary: nothing to read


def texts() -> dict[Path, str]:
    """Every text file but this one, which holds examples of what it refuses."""
    found = {p: text_of(p) for p in tracked_files() if p != Path(__file__).resolve()}
    return {p: t for p, t in found.items() if t is not None}


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def hits(pattern: re.Pattern[str], text: str) -> list[str]:
    return [
        f"{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in pattern.finditer(text)
    ]


# --------------------------------------------------------------------------- the checks


def machine_paths(text: str) -> list[str]:
    return hits(MACHINE_PATH, text)


def issue_numbers(path: Path, text: str) -> list[str]:
    found = hits(ISSUE_WORD, text)
    if path.suffix in ISSUE_HASH_SUFFIXES:
        found += hits(ISSUE_HASH, text)
    return found


def without_fences(markdown: str) -> str:
    """The Markdown with fenced code blocks blanked (kept line for line)."""
    return re.sub(
        r"^(```|~~~).*?^\1[^\n]*$",
        lambda m: "\n" * m.group(0).count("\n"),
        markdown,
        flags=re.MULTILINE | re.DOTALL,
    )


def without_code(markdown: str) -> str:
    """The Markdown with fenced blocks and inline code blanked."""
    return re.sub(r"`[^`\n]*`", "``", without_fences(markdown))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces become hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", without_fences(markdown), re.MULTILINE):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def broken_links(path: Path, markdown: str, root: Path = REPO) -> list[str]:
    """Each link of ``path`` that leaves the repository or names no file (or no heading)."""
    prose = without_code(markdown)
    targets = [m.group(1) for m in INLINE_LINK.finditer(prose)]
    targets += [m.group(1) for m in REFERENCE_LINK.finditer(prose)]
    broken = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            broken.append(f"{target} (links stay inside the repository)")
            continue
        file_part, _, anchor = target.partition("#")
        if file_part:
            base = root if file_part.startswith("/") else path.parent
            resolved = (base / file_part.lstrip("/")).resolve()
        else:
            resolved = path
        if resolved != root and root not in resolved.parents:
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            broken.append(f"{target} (no such heading)")
    return broken


# --------------------------------------------------------------------------- over the repository


def test_no_absolute_path_of_a_development_machine():
    found = {rel(p): h for p, t in texts().items() if (h := machine_paths(t))}
    assert found == {}, "absolute machine paths (write paths relative to the repository)"


def test_nothing_points_outside_the_repository():
    found = {rel(p): h for p, t in texts().items() if (h := hits(OUTSIDE, t))}
    assert found == {}


def test_no_document_outside_the_repository_is_named():
    found = {rel(p): h for p, t in texts().items() if (h := hits(OUTSIDE_DOCUMENT, t))}
    assert found == {}, "name the repository's own docs"


def test_no_issue_numbers():
    found = {
        rel(p): h
        for p, t in texts().items()
        if not rel(p).startswith("tests/fixtures/") and (h := issue_numbers(p, t))
    }
    assert found == {}, "say why in words, not with an issue number"


def test_every_markdown_link_resolves_inside_the_repository():
    found = {
        rel(p): b for p, t in texts().items() if p.suffix == ".md" and (b := broken_links(p, t))
    }
    assert found == {}


def test_every_markdown_file_named_in_code_or_docs_exists():
    found = {
        rel(p): missing
        for p, t in texts().items()
        if (missing := sorted({m for m in MD_PATH.findall(t) if not (REPO / m).is_file()}))
    }
    assert found == {}


def test_the_readme_links_the_reference_docs():
    readme = (REPO / "README.md").read_text()
    for doc in ("docs/README.md", "docs/http-api.md", "docs/configuration.md"):
        assert f"]({doc}" in readme, doc


# --------------------------------------------------------------------------- the checks themselves


@pytest.mark.parametrize(
    "text",
    [
        "see /w" + "ork/shared/spec/x.md",  # split: the repository holds no such path itself
        "HOME=/root",
        "/root/.pyenv/shims/python3",
        'cwd = "/home/alice/src/rawp"',
        "/Users/bob/rawp",
    ],
)
def test_machine_paths_are_found(text):
    assert machine_paths(text)


@pytest.mark.parametrize(
    "text",
    [
        "/tmp/rawp-rig/claude-code/x/home/tmp/cc-socks/1.sock",  # a rig recording
        "--home-dir /home/rawp --shell /usr/sbin/nologin",  # the deployment image's user
        "~/w" + "ork/repo and $HOME/work",
        "/workspace/.rawp and /rooted",
    ],
)
def test_other_paths_are_not_machine_paths(text):
    assert machine_paths(text) == []


def test_issue_numbers_are_found_but_not_ids_or_colours():
    assert issue_numbers(Path("x.py"), "x = 2.0  # then SIGINT (issue 5)")
    assert issue_numbers(Path("x.md"), "fixed in #12")
    assert issue_numbers(Path("x.py"), 'ids = ["item_5#0", "item_5#1"]  # 2 s') == []
    assert issue_numbers(Path("x.css"), "color: #333;") == []


OUT = ".." + "/shared/x.md"  # a link out of the repository (split, as above)


def test_broken_links_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## The HTTP API (v1)\n")
    page = tmp_path / "README.md"
    page.write_text(
        text := "\n".join(
            [
                "[ok](docs/a.md) [ok](docs/a.md#the-http-api-v1) [ok](#here) [ok](/docs/a.md)",
                "# Here",
                "[gone](docs/b.md) [no heading](docs/a.md#nope) [out](" + OUT + ")",
                "[web](https://example.com) ![img](pic.png)",
                "[ref]: docs/c.md",
                "```",
                "[in code](nowhere.md)",
                "```",
                "`[inline](nowhere.md)`",
            ]
        )
    )
    assert broken_links(page, text, root=tmp_path) == [
        "docs/b.md (no such file)",
        "docs/a.md#nope (no such heading)",
        OUT + " (outside the repository)",
        "https://example.com (links stay inside the repository)",
        "pic.png (no such file)",
        "docs/c.md (no such file)",
    ]
