"""A third-party parser that raises, on a real server: its session ends with ``agent.error``
``PARSER_FAILED`` instead of hanging, and nothing else of the gateway notices. The parser is
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


async def test_DPS_4_4_error_a_parser_that_raises_ends_its_session_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DPS-4.4-error, DPS-17.2.2-exit: the parser raises on a line mid-turn. Both masters of the
    session get the same fatal ``agent.error`` ``PARSER_FAILED`` naming the exception's type and
    (bounded) message, no traceback; the turn ends ``error``, the agent process is stopped and the
    session ends as after any fatal agent error. Another session with the same parser completes a
    turn afterwards, and the gateway's log has the traceback with the session's id."""
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
        # A turn the parser can read, then one it cannot.
        first = await peer.prompt_and_wait(one, "hello")
        pid = pid_in(first)
        await one.send("control.prompt.request", {"prompt_text": "please break"})
        seen_one = await one.drain_until_closed()
        seen_two = await two.drain_until_closed()

        errors = of(seen_one, "agent.error")
        assert [e["payload"]["error_code"] for e in errors] == ["PARSER_FAILED"]
        error = errors[0]["payload"]
        assert (error["severity"], error["recoverable"]) == ("fatal", False)
        assert "trace" not in error["details"]
        assert error["message"].startswith(
            "the breaks agent's parser raised tests.support.raising_parser.ParserBug in feed: "
            "cannot read this line x"
        )
        assert len(error["message"]) <= MAX_ERROR_MESSAGE < len(MESSAGE)
        assert "Traceback" not in json.dumps(seen_one)
        # The turn ends, then the session, as after any fatal error; nothing after the bad line.
        kinds = [f["type"] for f in seen_one]
        turn_end = of(seen_one, "session.turn.end")
        assert [t["payload"]["stop_reason"] for t in turn_end] == ["error"]
        assert kinds.index("agent.error") < kinds.index("session.turn.end")
        assert kinds[-1] == "session.deleted"
        assert seen_one[-1]["payload"]["reason"] == "error"
        said = "".join(f["payload"]["text"] for f in of(seen_one, "agent.text.delta"))
        assert "after the boom" not in said
        assert await gone(pid)
        # The second master saw the same frames from the error on.
        since = kinds.index("agent.error")
        ids_two = [f["message_id"] for f in seen_two]
        assert ids_two[ids_two.index(seen_one[since]["message_id"]) :] == [
            f["message_id"] for f in seen_one[since:]
        ]

        # Another session, of the same parser, goes on.
        done = await peer.prompt_and_wait(other, "still here")
        assert of(done, "session.turn.end")[0]["payload"]["stop_reason"] == "end_turn"
        resp = await client.get(f"/v1/session/{other_id}")
        assert resp.status == 200, await resp.text()

        raised = [
            r
            for r in caplog.records
            if r.getMessage() == "agent plugin raised" and getattr(r, "session", None) == session_id
        ]
        assert len(raised) == 1
        assert raised[0].exc_info is not None and raised[0].exc_info[0] is ParserBug
        assert "raise ParserBug(MESSAGE)" in caplog.text  # the traceback, for the operator
    finally:
        await client.close()
