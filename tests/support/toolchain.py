"""A team's toolchain, as scripts/build-toolchain makes it: Debian trixie with Go, gcc and make and the
pinned Claude Code at ``TEAM_CLAUDE``, for the tests of ``[isolation] system_root``.

``built()`` runs the script (it builds only when the recipe changed; its file lock makes
pytest-xdist workers wait for one build) and returns what it made: the unpacked system (``root``,
for ``serve`` on the host with ``system_root`` pointing at it) and, unless ``dir_only``, the image
to mount at /toolchain with the engine's environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tests.support.engine import run_script
from tests.support.paths import REPO

SCRIPT = REPO / "scripts" / "build-toolchain"
TEAM_BIN = "/opt/team/bin"  # the team's own tools: a directory only the toolchain has
TEAM_CLAUDE = f"{TEAM_BIN}/claude"
SUITE = "trixie"  # its /etc/os-release's VERSION_CODENAME


@dataclass(frozen=True)
class Toolchain:
    root: Path
    image: str | None = None
    engine: str | None = None
    env: dict[str, str] = field(default_factory=dict, repr=False)


def built(*, dir_only: bool = False) -> Toolchain:
    """The toolchain of the current recipe, built if it is not there yet."""
    out, env = run_script(SCRIPT, *(["--dir-only"] if dir_only else []))
    return Toolchain(Path(out["root"]), out.get("image"), out.get("engine"), env)
