"""What the rig's own tests (tests/rig/test_rig_*.py) ask of every scripted server alike: it
answers with an event stream, a ``hang`` call holds its stream until released, and every
scenario file of an agent is valid."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.rig.scenario import Scenario, all_scenarios
from tests.support.rig.server import ScriptedServer


async def rest_after_hang(server: ScriptedServer, resp: Any, timeout: float) -> str:
    """What a stream held by a ``hang`` call sends once released, having sent nothing more while
    it was held."""
    await asyncio.wait_for(server.wait_hang(1), timeout)
    reading = asyncio.ensure_future(resp.content.read())
    await asyncio.sleep(0.1)
    assert not reading.done()  # still hanging
    server.release_hangs()
    return (await asyncio.wait_for(reading, timeout)).decode()


def assert_event_stream(resp: Any) -> None:
    """The answer is a stream of server-sent events."""
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")


def valid_scenarios(
    server: ScriptedServer, call_keys: set[str], at_least: int, body: dict[str, Any]
) -> list[Scenario]:
    """The agent's scenarios, each checked: it names the agent and says what it is for, its calls
    use only ``call_keys``, and the server knows every key of their ``match`` tables (tried on
    ``body``). The caller checks what is particular to the agent."""
    scenarios = all_scenarios(server.agent)
    assert len(scenarios) >= at_least
    for sc in scenarios:
        assert sc.agent == server.agent and sc.description, sc.name
        for call in sc.calls:
            assert set(call) <= call_keys, (sc.name, call)
            server.matches(call.get("match", {}), body)  # raises on unknown keys
    return scenarios
