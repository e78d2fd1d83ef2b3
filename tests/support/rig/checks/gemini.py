"""What the real Gemini CLI must print for each of its scenarios (tests/rig/test_rig_cli.py runs
them): the kinds of events of the recorded fixture (``shape``) and the checks specific to each
scenario (``CHECKS``, by fixture name)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.support.rig.checks import by_fixture
from tests.support.rig.run import CliSetup, RunResult

PARALLEL = 4  # scenario runs side by side


def shape(fixture: str, events: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """What kinds of events a run printed, as a multiset: results of parallel tool calls come in
    the order they finish, so the order of those lines is not stable from run to run."""
    return Counter(
        (e["type"], e.get("role"), e.get("tool_name"), e.get("status"), e.get("delta"))
        for e in events
    )


def answer(r: RunResult) -> str:
    return "".join(
        e["content"] for e in r.of_type("message") if e["role"] == "assistant" and e.get("delta")
    )


def tool_pairs(r: RunResult) -> list[tuple[str, dict[str, Any]]]:
    """(tool_name, its tool_result) in tool_use order."""
    results = {e["tool_id"]: e for e in r.of_type("tool_result")}
    return [(u["tool_name"], results[u["tool_id"]]) for u in r.of_type("tool_use")]


def check_text(r: RunResult, cli: CliSetup) -> None:
    init, prompt, *deltas, result = r.events
    assert init["type"] == "init" and init["model"] == "gemini-2.5-flash" and init["session_id"]
    assert (prompt["type"], prompt["role"], prompt["content"]) == ("message", "user", "Say hello.")
    assert len(deltas) > 1 and answer(r) == "Hello from the scripted model. Nothing else to do."
    assert result["type"] == "result" and result["status"] == "success"
    assert result["stats"]["input_tokens"] == 100 and result["stats"]["output_tokens"] == 10
    (req,) = r.requests
    assert req.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    assert req.query == {"alt": "sse"} and req.headers["x-goog-api-key"] == "rig-not-a-real-key"


def check_thinking(r: RunResult, cli: CliSetup) -> None:
    assert "Multiplying" not in json.dumps(r.events)  # thoughts are never printed
    assert answer(r) == "6 times 7 is 42."
    (result,) = r.of_type("result")
    assert result["stats"]["output_tokens"] == 12 and result["stats"]["total_tokens"] == 150


def check_shell(r: RunResult, cli: CliSetup) -> None:
    ((name, res),) = tool_pairs(r)
    assert name == "run_shell_command"
    assert (res["status"], res["output"]) == ("success", "hello from the shell")
    (use,) = r.of_type("tool_use")
    assert use["parameters"] == {
        "command": "echo hello from the shell",
        "description": "Print a greeting",
    }


def check_shell_fail(r: RunResult, cli: CliSetup) -> None:
    ((name, res),) = tool_pairs(r)
    assert name == "run_shell_command" and res["status"] == "success"  # exit code not shown
    assert "No such file or directory" in res["output"]


def check_edit(r: RunResult, cli: CliSetup) -> None:
    assert [(n, res["status"]) for n, res in tool_pairs(r)] == [
        ("replace", "success"),
        ("write_file", "success"),
    ]
    assert all("output" not in res for _, res in tool_pairs(r))
    assert (cli.cwd / "notes.txt").read_text() == "alpha\ngamma\n"
    assert (cli.cwd / "hello.txt").read_text() == "hello\n"


def check_multi_step(r: RunResult, cli: CliSetup) -> None:
    pairs = tool_pairs(r)
    assert [n for n, _ in pairs] == ["read_file", "run_shell_command", "write_file", "read_file"]
    assert pairs[1][1]["output"] == "3"
    assert pairs[3][1]["status"] == "error" and pairs[3][1]["error"]["type"] == "file_not_found"
    assert (cli.cwd / "count.txt").read_text() == "3\n"
    (result,) = r.of_type("result")
    assert result["stats"]["tool_calls"] == 4 and result["stats"]["input_tokens"] == 500


def check_mcp(r: RunResult, cli: CliSetup) -> None:
    ((name, res),) = tool_pairs(r)
    assert name == "mcp_echo_echo" and (res["status"], res["output"]) == ("success", "echo: hello")


def check_http_400(r: RunResult, cli: CliSetup) -> None:
    (result,) = r.of_type("result")
    assert result["status"] == "error" and "INVALID_ARGUMENT" in result["error"]["message"]
    assert len(r.requests) == 1


def check_http_500(r: RunResult, cli: CliSetup) -> None:
    (result,) = r.of_type("result")
    assert result["status"] == "error" and '"code":500' in result["error"]["message"]
    assert len(r.requests) == 1  # general.maxAttempts = 1: no retry
    # The CLI's error report lands in the run's own temp dir, not in /tmp.
    assert list((cli.home / "tmp").glob("gemini-client-error-*.json"))


def check_resume(r: RunResult, cli: CliSetup) -> None:
    (init,) = r.of_type("init")
    assert init["session_id"] == "5e551011-0000-4000-8000-000000000042"
    assert answer(r) == "You asked me to remember 42."
    (result,) = r.of_type("result")
    assert result["stats"]["input_tokens"] == 100  # not carried over from the first run


def check_auto_model(r: RunResult, cli: CliSetup) -> None:
    (init,) = r.of_type("init")
    assert init["model"] == "auto"
    assert [q.path.rsplit(":", 1)[1] for q in r.requests] == [
        "generateContent",
        "streamGenerateContent",
    ]
    (result,) = r.of_type("result")
    assert len(result["stats"]["models"]) == 2


def check_sigint(r: RunResult, cli: CliSetup) -> None:
    # Interrupted mid-stream: exit 0, and no result line says that the turn ended.
    assert answer(r) == "Hello, I am still typ" and not r.of_type("result")


def check_sigterm(r: RunResult, cli: CliSetup) -> None:
    (use,) = r.of_type("tool_use")
    assert use["parameters"] == {"command": "sleep 30"}
    assert not r.of_type("tool_result") and not r.of_type("result")


def check_tool_not_registered(r: RunResult, cli: CliSetup) -> None:
    ((name, res),) = tool_pairs(r)
    assert name == "write_file" and res["status"] == "error"
    assert res["error"]["type"] == "tool_not_registered"
    assert not (cli.cwd / "x.txt").exists()


def check_empty_response(r: RunResult, cli: CliSetup) -> None:
    (err,) = r.of_type("error")
    assert err["severity"] == "error" and "empty response" in err["message"]
    (result,) = r.of_type("result")
    assert result["status"] == "error" and "error" not in result


def check_http_429(r: RunResult, cli: CliSetup) -> None:
    (result,) = r.of_type("result")
    assert (
        result["status"] == "error" and "Resource has been exhausted" in result["error"]["message"]
    )
    assert len(r.requests) == 1


def check_stream_error(r: RunResult, cli: CliSetup) -> None:
    assert answer(r) == "Hello, I was about to"
    (err,) = r.of_type("error")
    assert err["message"] == "Model stream ended without a finish reason."
    (result,) = r.of_type("result")
    assert result["status"] == "error"


def check_mcp_error(r: RunResult, cli: CliSetup) -> None:
    ((name, res),) = tool_pairs(r)
    assert name == "mcp_echo_echo" and res["status"] == "error"
    assert (
        res["error"]["type"] == "mcp_tool_error" and "echo failed: hello" in res["error"]["message"]
    )


def check_auto_edit(r: RunResult, cli: CliSetup) -> None:
    pairs = tool_pairs(r)
    assert [(n, res["status"]) for n, res in pairs] == [
        ("write_file", "success"),
        ("run_shell_command", "error"),
    ]
    assert pairs[1][1]["error"]["type"] == "tool_not_registered"
    assert (cli.cwd / "auto.txt").read_text() == "auto\n"
    kinds = [e["type"] for e in r.events if e["type"] in ("tool_use", "tool_result")]
    assert kinds == ["tool_use", "tool_use", "tool_result", "tool_result"]


def check_read_image(r: RunResult, cli: CliSetup) -> None:
    # The tool_result output is a display string; the bytes go to the model, not to stdout.
    ((name, res),) = tool_pairs(r)
    assert (name, res["status"], res["output"]) == (
        "read_file",
        "success",
        "Read image file: dot.png",
    )
    assert "base64" not in json.dumps(r.events)
    assert '"mimeType": "image/png"' in json.dumps(r.requests[1].body)


# A stream cut midway and one that ends short are checked alike.
CHECKS: dict[str, Callable[[RunResult, CliSetup], None]] = {
    **by_fixture(globals()),
    "truncated": check_stream_error,
}
