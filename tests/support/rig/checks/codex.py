"""What the real Codex CLI must print for each of its scenarios (tests/rig/test_rig_cli.py runs them):
the kinds of events of the recorded fixture (``shape``) and the checks specific to each scenario
(``CHECKS``, by fixture name)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.support.rig.checks import by_fixture
from tests.support.rig.run import CliSetup, RunResult

PARALLEL = 6  # scenario runs side by side

# Item types that a scenario prints in some runs and not in others (see its description).
UNSTABLE_ITEMS = {"sandbox-denied": {"command_execution"}}


def shape(fixture: str, events: list[dict[str, Any]]) -> Counter[Any]:
    """What kinds of events a run printed, as a multiset: parallel commands complete in the order
    they finish, so the order of those lines is not stable from run to run."""
    unstable = UNSTABLE_ITEMS.get(fixture, set())
    return Counter(
        (e["type"], e.get("item", {}).get("type"), e.get("item", {}).get("status"))
        for e in events
        if e.get("item", {}).get("type") not in unstable
    )


def items(r: RunResult, kind: str) -> list[dict[str, Any]]:
    return [e["item"] for e in r.of_type("item.completed") if e["item"]["type"] == kind]


def check_text(r: RunResult, cli: CliSetup) -> None:
    started, turn, msg, done = r.events
    assert started["type"] == "thread.started" and started["thread_id"]
    assert turn == {"type": "turn.started"}
    assert msg["item"] == {
        "id": "item_0",
        "type": "agent_message",
        "text": "Hello from the scripted model. Nothing else to do.",
    }
    assert done["usage"]["input_tokens"] == 100 and done["usage"]["output_tokens"] == 10
    (req,) = r.requests
    assert (req.method, req.path) == ("POST", "/v1/responses")
    assert req.body["stream"] is True and req.body["store"] is False
    assert req.headers["Authorization"] == "Bearer sk-rig-not-a-real-key"
    assert {"exec_command", "apply_patch"} <= {t.get("name") for t in req.body["tools"]}


def check_reasoning(r: RunResult, cli: CliSetup) -> None:
    assert [i["text"] for i in items(r, "reasoning")] == [
        "**Multiplying**\n\nSix times seven is forty-two."
    ]
    (done,) = r.of_type("turn.completed")
    assert done["usage"]["reasoning_output_tokens"] == 18


def check_shell(r: RunResult, cli: CliSetup) -> None:
    (cmd,) = items(r, "command_execution")
    assert cmd["command"] == "/bin/bash -lc 'echo hello from the shell'"
    assert (cmd["exit_code"], cmd["status"]) == (0, "completed")
    assert cmd["aggregated_output"] == "hello from the shell\n"
    (started,) = r.of_type("item.started")
    assert started["item"]["id"] == cmd["id"] and started["item"]["status"] == "in_progress"
    # The command's output went back to the model with the call id the server chose.
    out = r.requests[1].body["input"][-1]
    assert out["type"] == "function_call_output" and out["call_id"] == "call_rig_01_0"


def check_shell_fail(r: RunResult, cli: CliSetup) -> None:
    (cmd,) = items(r, "command_execution")
    assert (cmd["exit_code"], cmd["status"]) == (2, "failed")
    assert "No such file or directory" in cmd["aggregated_output"]


def check_edit(r: RunResult, cli: CliSetup) -> None:
    (change,) = items(r, "file_change")
    assert change["status"] == "completed"
    assert sorted((c["path"], c["kind"]) for c in change["changes"]) == [
        (str(cli.cwd / "hello.txt"), "add"),
        (str(cli.cwd / "notes.txt"), "update"),
    ]
    assert (cli.cwd / "notes.txt").read_text() == "alpha\ngamma\n"
    assert (cli.cwd / "hello.txt").read_text() == "hello\n"


def check_multi_step(r: RunResult, cli: CliSetup) -> None:
    cmds = [i["command"] for i in items(r, "command_execution")]
    assert cmds[0] == "/bin/bash -lc ls" and cmds[-1] == "/bin/bash -lc 'tail -n 1 notes.txt'"
    assert sorted(cmds[1:3]) == ["/bin/bash -lc 'cat notes.txt'", "/bin/bash -lc 'wc -l notes.txt'"]
    (done,) = r.of_type("turn.completed")
    assert done["usage"]["input_tokens"] == 5 * 100  # summed over the turn's five model calls
    assert (cli.cwd / "notes.txt").read_text() == "one\ntwo\nthree\ncount: 3\n"


def check_mcp(r: RunResult, cli: CliSetup) -> None:
    (call,) = items(r, "mcp_tool_call")
    assert (call["server"], call["tool"], call["arguments"]) == ("echo", "echo", {"text": "hello"})
    assert call["result"]["content"] == [{"type": "text", "text": "echo: hello"}]
    assert call["status"] == "completed" and call["error"] is None
    # The MCP tool is offered only through tool_search, then inside the mcp__echo namespace.
    found = r.requests[1].body["input"][-1]
    assert found["type"] == "tool_search_output"
    assert [t["name"] for t in found["tools"]] == ["mcp__echo"]


def check_http_400(r: RunResult, cli: CliSetup) -> None:
    (err,) = r.of_type("error")
    (failed,) = r.of_type("turn.failed")
    assert "rig scripted bad request" in err["message"]
    assert failed["error"]["message"] == err["message"]
    assert not r.of_type("turn.completed")


def check_http_500(r: RunResult, cli: CliSetup) -> None:
    (err,) = r.of_type("error")
    assert "The server had an error" not in err["message"]  # a generic message instead
    assert len(r.requests) == 1  # request_max_retries = 0


def check_stream_failed(r: RunResult, cli: CliSetup) -> None:
    (failed,) = r.of_type("turn.failed")
    assert "rig: the model failed mid-response." in failed["error"]["message"]


def check_resume(r: RunResult, cli: CliSetup) -> None:
    (prior,) = cli.prior_results
    (first,) = [e for e in prior.events if e["type"] == "thread.started"]
    (again,) = r.of_type("thread.started")
    assert again["thread_id"] == first["thread_id"]
    # Usage is cumulative over the thread: both runs' single calls.
    (done,) = r.of_type("turn.completed")
    assert done["usage"]["input_tokens"] == 200


def check_sigint(r: RunResult, cli: CliSetup) -> None:
    # Interrupted mid-stream: the turn is neither completed nor failed in the output.
    assert r.events[-1]["item"]["type"] == "agent_message"
    assert not r.of_type("turn.completed") and not r.of_type("turn.failed")


def check_sigterm(r: RunResult, cli: CliSetup) -> None:
    (started,) = r.of_type("item.started")
    assert started["item"]["command"] == "/bin/bash -lc 'sleep 30'"
    assert not r.of_type("item.completed") and r.signal == "SIGTERM"


def check_sandbox_denied(r: RunResult, cli: CliSetup) -> None:
    for cmd in items(r, "command_execution"):  # printed in some runs only
        assert (cmd["exit_code"], cmd["status"]) == (1, "failed")
        assert "Read-only file system" in cmd["aggregated_output"]
    assert "Read-only file system" in json.dumps(r.requests[1].body["input"][-1])
    assert not (cli.cwd / "created.txt").exists()


def check_patch_fail(r: RunResult, cli: CliSetup) -> None:
    assert not items(r, "file_change") and not r.of_type("item.started")
    assert (cli.cwd / "notes.txt").read_text() == "alpha\nbeta\n"
    # The model is told, even though nothing is printed.
    out = r.requests[1].body["input"][-1]
    assert out["type"] == "custom_tool_call_output"


def check_http_401(r: RunResult, cli: CliSetup) -> None:
    (err,) = r.of_type("error")
    assert err["message"].startswith("unexpected status 401 Unauthorized: Incorrect API key")
    assert f"url: {cli.base_url}/v1/responses" in err["message"]


def check_web_search(r: RunResult, cli: CliSetup) -> None:
    # The CLI prints the key "id" twice in a web_search item; json.loads keeps the last one.
    line = next(x for x in r.stdout_lines if '"type":"web_search"' in x)
    assert line.count('"id":') == 2
    (item,) = items(r, "web_search")
    assert item["id"] == "ws_rig_01_0" and item["query"] == "RAWP protocol"


def check_long_command(r: RunResult, cli: CliSetup) -> None:
    (started,) = r.of_type("item.started")
    (cmd,) = items(r, "command_execution")
    assert started["item"]["id"] == cmd["id"] and cmd["aggregated_output"] == "start\ndone\n"
    assert (cmd["exit_code"], cmd["status"]) == (0, "completed")
    # The poll went to the session the first tool output named.
    poll = json.loads(r.requests[2].body["input"][-2]["arguments"])
    assert f"session ID {poll['session_id']}" in r.requests[1].body["input"][-1]["output"]


def check_command_left_running(r: RunResult, cli: CliSetup) -> None:
    (started,) = r.of_type("item.started")
    assert started["item"]["type"] == "command_execution"
    assert not items(r, "command_execution") and r.of_type("turn.completed")


def check_reasoning_raw(r: RunResult, cli: CliSetup) -> None:
    assert not items(r, "reasoning") and [i["text"] for i in items(r, "agent_message")] == [
        "Done thinking."
    ]


def check_mcp_error(r: RunResult, cli: CliSetup) -> None:
    (call,) = items(r, "mcp_tool_call")
    assert call["status"] == "failed" and call["error"] is None
    assert call["result"]["content"] == [{"type": "text", "text": "echo failed: hello"}]


def check_full_access(r: RunResult, cli: CliSetup) -> None:
    (cmd,) = items(r, "command_execution")
    assert (cmd["exit_code"], cmd["aggregated_output"]) == (0, "created\n")
    assert (cli.cwd / "created.txt").exists()


def check_view_image(r: RunResult, cli: CliSetup) -> None:
    # exec --json prints no item for view_image at all: only the answer. The model got the image.
    assert [i["type"] for e in r.of_type("item.completed") for i in [e["item"]]] == [
        "agent_message"
    ]
    assert "data:image/png;base64," in json.dumps(r.requests[1].body["input"])


CHECKS: dict[str, Callable[[RunResult, CliSetup], None]] = by_fixture(globals())
