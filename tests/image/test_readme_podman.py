"""deploy/README.md's podman commands as a person types them: the shell blocks of its section
"Podman on one Debian host", exactly as written and in order, in one login shell that carries none
of the project's podman settings, in a copy of the repository (tests/support/readme.py says how).
The image is the one the ``engine`` fixture built from these sources, so the blocks'
``scripts/build-image`` finds it and builds nothing.

The blocks publish the documented loopback port 8765 and use fixed names (the container
``rawp-gateway``, the compose project ``rawp-gateway``, their volumes): the test refuses to run
where any of them is already taken, so a deployment on the machine is never touched, and removes
what the blocks keep on purpose (the volumes) afterwards.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.support.engine import Engine
from tests.support.readme import Names, type_blocks
from tests.support.readme import blocks as section_blocks

pytestmark = pytest.mark.image

SECTION = "### Podman on one Debian host"
PORT = 8765  # the documented one: the blocks publish it as written
NAMES = Names(
    containers=("rawp-gateway", "rawp-gateway_gateway_1"),  # podman run's; podman-compose 1.0's
    volumes=(
        "rawp-workspace",
        "rawp-gateway-state",
        "rawp-gateway_workspace",
        "rawp-gateway_gateway-state",
    ),
    network="rawp-gateway_default",
    port=PORT,
)


def blocks() -> list[str]:
    """The ```sh blocks of SECTION, in order."""
    return section_blocks(SECTION)


def test_the_readme_podman_blocks_carry_the_containers_security_settings(engine: Engine) -> None:
    """The documented ``podman run`` runs the gateway as the manifests and the compose file do
    (tests.support.engine.SECURITY), its user aside: the image's USER is that uid already."""
    (run,) = [b for b in blocks() if "podman run" in b]
    tokens = shlex.split(run.replace("\\\n", " "))
    wanted = engine.security_args()
    assert wanted[0] == "--user"
    wanted = wanted[2:]
    while wanted:
        if wanted[0] == "--read-only":
            assert "--read-only" in tokens
            wanted = wanted[1:]
            continue
        pair = wanted[:2]
        assert any(tokens[i : i + 2] == pair for i in range(len(tokens))), (pair, tokens)
        wanted = wanted[2:]


def test_the_readme_podman_commands_work_as_written(engine: Engine, tmp_path: Path) -> None:
    """Each block as written; each ``curl`` of /healthz gets ``{"status": "ok"}``, from the
    ``podman run`` container and from podman-compose's; afterwards neither container nor the
    compose network is left and the port is free again."""
    if engine.name != "podman":
        pytest.skip("the blocks are podman's: scripts/build-image picked Docker here")
    steps = blocks()
    assert sum("podman run " in b for b in steps) == 1
    assert sum("podman-compose" in b and " up " in b for b in steps) == 1
    NAMES.refuse_taken(engine)
    try:
        typed = type_blocks(steps, tmp_path)
        out, report = typed.out, typed.report
        healthy = [i for i, step in enumerate(steps) if "/healthz" in step]
        assert len(healthy) == 2, steps
        for i in healthy:
            assert json.loads(out[str(i)].strip().splitlines()[-1]) == {"status": "ok"}, report
        # The README's own teardown left nothing running and freed the port.
        assert NAMES.left(engine) == [], report
    finally:
        NAMES.remove(engine)
