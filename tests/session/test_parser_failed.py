"""A third-party parser that raises, on a real server: its turn ends with ``agent.error``
``PARSER_FAILED`` instead of hanging, the session goes on with a fresh parser, and nothing else of
the gateway notices. The parser is
registered as an installed package's would be (``tests/support/raising_parser.py``), the agent is
``tests/support/hostile/breaks_parser.py``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.config import builtin_profiles
from gateway.protocol.machine import MAX_ERROR_MESSAGE
from tests.support import gateway_peer as peer
from tests.support.gateway_peer import Master, of
from tests.support.logs import SESSION_LOGGER
from tests.support.paths import HOSTILE
from tests.support.raising_parser import MESSAGE, NAME, ParserBug, register


def breaking_profile():
    return replace(
        builtin_profiles()["plain"],
        name="breaks",
        parser=NAME,
        command=(sys.executable, str(HOSTILE / "breaks_parser.py")),
        single_turn_process=False,
    )


def pid_in(frames: list[dict]) -> int:
    said = "".join(f["payload"]["text"] for f in of(frames, "agent.text.delta"))
    found = re.search(r"\(pid (\d+)\)", said)
    assert found, said
    return int(found.group(1))


async def gone(pid: int, timeout: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await asyncio.sleep(0.05)
    return False


def stream(master: Master) -> list[str]:
    """The ids of what the session said to ``master``: every frame but the masters' own relayed
    control frames (a master is not sent its own)."""
    return [f["message_id"] for f in master.frames if not f["type"].startswith("control.")]


async def test_DPS_4_4_error_a_parser_that_raises_ends_its_turn_and_the_session_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DPS-4.4-error: the parser raises on a line mid-turn. Both masters of the session get the
    same ``agent.error`` ``PARSER_FAILED`` (severity error, recoverable) naming the exception's
    type and (bounded) message, no traceback; the turn ends ``error`` and the agent process is
    stopped, nothing it printed after the bad line reaching anyone. The session goes on: the same
    master's next prompt starts a new agent process (DPS-18-respawn) read by a fresh parser (the
    one that raised raises on every line after), and completes its turn, which the second master
    sees too. Another session with the same parser is not touched; the gateway's log has the
    traceback, once, with the session's id."""
    register(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    caplog.set_level(logging.INFO, logger=SESSION_LOGGER)
    config = peer.make_config(tmp_path, agents={"breaks": breaking_profile()})
    client = await peer.start_gateway(config)
    try:
        session_id = (await peer.create_session(client, "breaks"))["session_id"]
        other_id = (await peer.create_session(client, "breaks"))["session_id"]
        one = await Master.attach(client, session_id)
        two = await Master.attach(client, session_id)
        other = await Master.attach(client, other_id)
        # A turn the parser can read, then one it cannot, then one more.
        pid = pid_in(await peer.prompt_and_wait(one, "hello"))
        broken = await peer.prompt_and_wait(one, "please break")

        errors = of(broken, "agent.error")
        assert [e["payload"]["error_code"] for e in errors] == ["PARSER_FAILED"]
        error = errors[0]["payload"]
        assert (error["severity"], error["recoverable"]) == ("error", True)
        assert error["details"] == {"module": "parser"}  # no trace
        assert error["message"].startswith(
            "the breaks agent's parser raised tests.support.raising_parser.ParserBug in feed: "
            "cannot read this line x"
        )
        assert len(error["message"]) <= MAX_ERROR_MESSAGE < len(MESSAGE)
        assert "Traceback" not in json.dumps(broken)
        kinds = [f["type"] for f in broken]
        assert [t["payload"]["stop_reason"] for t in of(broken, "session.turn.end")] == ["error"]
        assert kinds.index("agent.error") < kinds.index("session.turn.end")
        assert errors[0]["turn_id"] == of(broken, "session.turn.end")[0]["turn_id"]
        assert await gone(pid)

        again = await peer.prompt_and_wait(one, "hello again")
        assert of(again, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        assert pid_in(again) != pid  # a new agent process
        said = "".join(f["payload"]["text"] for f in of(one.frames, "agent.text.delta"))
        assert "after the boom" not in said
        assert not of(again, "agent.error") and not of(again, "session.deleted")
        # The second master saw the same frames, from the error to the new turn's end.
        since, last = errors[0]["message_id"], of(again, "session.usage")[0]["message_id"]
        while last not in stream(two):
            await two.next()
        ones, twos = stream(one), stream(two)
        assert (
            twos[twos.index(since) : twos.index(last) + 1]
            == (ones[ones.index(since) : ones.index(last) + 1])
        )
        resp = await client.get(f"/v1/session/{session_id}")
        assert resp.status == 200, await resp.text()

        # Another session, of the same parser, goes on.
        done = await peer.prompt_and_wait(other, "still here")
        assert of(done, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        assert not of(other.frames, "agent.error")

        raised = [
            r
            for r in caplog.records
            if r.getMessage() == "agent plugin raised" and getattr(r, "session", None) == session_id
        ]
        # Once: the broken parser was fed nothing more (it would have raised on every line).
        assert len(raised) == 1
        assert raised[0].exc_info is not None and raised[0].exc_info[0] is ParserBug
        assert "raise ParserBug(MESSAGE)" in caplog.text  # the traceback, for the operator
    finally:
        await client.close()
