"""A gateway process that exits without cleaning up, and the check that the processes its agent
started go with it (the atexit fallback of ``gateway.agent.descendants``)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

from tests.support.loops import PY, run
from tests.support.paths import REPO
from tests.support.procs import alive
from tests.support.waiting import eventually


def none_outlive_the_gateway(start: str, then: str, pidfile: Path) -> None:
    """A gateway process starts one agent ``p`` (``start``: ``AgentProcess.start``'s arguments,
    as Python source), runs ``then`` (Python statements that write the pids to look after,
    space-separated, to ``pidfile``) and exits: every one of those processes is soon gone."""
    gateway = f"""
import asyncio, sys
sys.path.insert(0, {str(REPO)!r})
from gateway.agent.process import AgentProcess
async def main():
    p = await AgentProcess.start({start})
{textwrap.indent(textwrap.dedent(then).strip(), "    ")}
asyncio.run(main())
"""

    async def scenario() -> None:
        proc = await asyncio.create_subprocess_exec(PY, "-c", gateway)
        assert await proc.wait() == 0
        pids = [int(x) for x in pidfile.read_text().split()]
        await eventually(
            lambda: not any(alive(p) for p in pids), "every process to be gone", timeout=10
        )

    run(asyncio.new_event_loop, scenario())
