"""``rawp-gateway translate``: an agent's recorded stdout in, the DPS frames a master would get out.

The same parser and session machine as the server, with no process, socket or prompt: turns open
when the agent's output starts one, and the end of the input stands for the process exiting with
``--exit-code`` (0 by default; DPS-17.2.2 decides what a non-zero code adds). The output is what a
master that announced every feature receives from the session's first frame on, one JSON frame per
line and nothing else; diagnostics go to stderr.

Binary content a tool returned (an image Claude Code's ``Read`` gave the model) is written to a
temporary directory, as the server would store it, and its ``agent.file.transfer`` carries the
file's ``file://`` URL, size and checksum, so it can be opened; stderr says where it went.

An ACP agent's transcript (``--agent acp`` or an ACP profile) has both directions: the agent's lines
as they were and the client's wrapped as ``{"sent": <message>}``, so answers are read as they were
meant (docs/acp-mapping.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Iterable
from typing import BinaryIO, Final, TextIO

from gateway.agent.exit import classify_exit
from gateway.config import Config, builtin_profiles
from gateway.protocol import actions as act
from gateway.protocol import codec
from gateway.protocol import machine as sm
from gateway.protocol.capabilities import ALL_FEATURES
from gateway.protocol.frames import FileTransfer
from gateway.storage.files import FileStore, store_tool_files
from parsers.base import NoInput, available
from parsers.base import get as get_parser
from parsers.events import ParseError, Unknown

__all__ = ["SENT_PREFIX", "guess_parser", "translate"]

SENT_PREFIX = b'{"sent":'  # a client line of a conversing agent's transcript
# After this many lines the parser does not know, the other parsers are asked which knows them.
GUESS_AFTER_UNKNOWN: Final = 3


def translate(
    lines: Iterable[bytes],
    out: BinaryIO,
    *,
    agent: str = "claude-code",
    session_id: str | None = None,
    exit_code: int = 0,
    err: TextIO = sys.stderr,
    forward_unknown: bool = False,
) -> int:
    """Write the frames for ``lines``; returns how many lines could not be parsed."""
    profile = builtin_profiles().get(agent)
    features = profile.features if profile is not None else ALL_FEATURES
    parser_name = profile.parser if profile is not None else agent
    spec = get_parser(parser_name)
    session_id = session_id or str(uuid.uuid4())
    defaults = Config()
    files = FileStore(
        session_id,
        max_session_bytes=defaults.server.max_session_file_bytes,
        max_upload_bytes=defaults.server.max_upload_bytes,
        url_of=lambda _transfer_id, path: path.as_uri(),
    )
    parser = spec.parser()
    # An agent the gateway converses with (ACP): its transcript holds both directions, the
    # client's lines wrapped as {"sent": ...}; the parser then writes nothing of its own.
    sent = getattr(parser, "sent", None)
    if sent is not None:
        parser.read_transcript()  # type: ignore[attr-defined]
    machine = sm.SessionMachine(
        session_id,
        parser,
        NoInput(),
        sm.SessionConfig(
            agent=agent,
            features=features,
            forward_unknown=forward_unknown,
            credentials=spec.credentials,
        ),
    )
    bad = 0

    def emit(actions: list[act.Action]) -> None:
        nonlocal bad
        for action in actions:
            if isinstance(action, act.Emit) and action.to is None:
                out.write(codec.encode(action.frame) + b"\n")
                payload = action.frame.payload
                if isinstance(payload, FileTransfer):
                    what = f"{payload.file_name} ({payload.mime_type}, {payload.size_bytes} bytes)"
                    print(f"translate: {what} written to {payload.file_url}", file=err)
            elif isinstance(action, act.Log):
                if action.level in ("warning", "error"):
                    bad += 1
                fields = " ".join(f"{k}={v}" for k, v in action.fields.items())
                print(f"translate: {action.message} {fields}".rstrip(), file=err)

    out.write(codec.encode(machine.capabilities_frame) + b"\n")
    unknown: list[bytes] = []  # the first few lines the parser did not know
    for line in lines:
        line = line.rstrip(b"\r\n")
        if sent is not None and line.startswith(SENT_PREFIX):
            emit(machine.agent_events(sent(line)))
            continue
        if not line:
            continue
        events = machine.parser.feed(line)
        emit(machine.agent_events(store_tool_files(events, files, None)))
        if len(unknown) < GUESS_AFTER_UNKNOWN and any(isinstance(e, Unknown) for e in events):
            unknown.append(line)
            if len(unknown) == GUESS_AFTER_UNKNOWN and (
                other := guess_parser(unknown, exclude=parser_name)
            ):
                print(
                    f"translate: these lines look like {other}'s, not {parser_name}'s: "
                    f"try --agent {other}",
                    file=err,
                )
    emit(machine.agent_stdout_closed())
    status = classify_exit(exit_code)
    emit(machine.agent_exited(status.kind, status.returncode, status.signal))
    return bad


def guess_parser(lines: list[bytes], *, exclude: str) -> str | None:
    """The first other parser that knows every one of ``lines`` (neither an unknown kind nor a
    line it cannot parse), if one does. ``plain`` takes any line as text, so it tells nothing and
    is not asked."""
    for name in available():
        if name in (exclude, "plain"):
            continue
        try:
            parser = get_parser(name).parser()
            events = [e for line in lines for e in parser.feed(line)]
            if not any(isinstance(e, Unknown | ParseError) for e in events):
                return name
        except Exception:  # a third-party parser that cannot take these lines at all
            continue
    return None


def translate_command(args: argparse.Namespace) -> int:
    """``rawp-gateway translate [FILE]``: ``translate`` from the file (or stdin) to stdout; 2 when
    the file cannot be read or the agent is unknown, 141 when the reader goes away."""
    try:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    except OSError as err:
        print(f"rawp-gateway translate: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    try:
        translate(
            stream,
            sys.stdout.buffer,
            agent=args.agent,
            session_id=args.session_id,
            exit_code=args.exit_code,
            forward_unknown=args.forward_unknown,
        )
        sys.stdout.flush()
    except KeyError as err:
        print(f"rawp-gateway translate: {err.args[0]}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`translate FILE | head -1`): stop quietly, as a tool killed by
        # SIGPIPE would (exit 128 + 13). stdout is pointed at /dev/null so that the interpreter's
        # own flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    return 0
