"""A live session: the asyncio shell around one ``SessionMachine``.

Theory of operation
-------------------
``LiveSession`` owns what the sans-IO machine may not touch: the agent process, the WebSocket
connections, the buffer, timers and metrics. It feeds the machine (agent lines, master
frames, exits, timers) and carries out the actions it returns, in order, in ``perform``:

* ``Emit`` broadcast: encode once, append to the buffer, offer the same bytes to every connection
  whose announced features admit the frame (a second encoding without ``subagent_context`` is made
  at most once per frame, for connections that did not announce it);
* ``Emit`` to one connection: a reply (``session.error``) or a greeting; not buffered;
* ``Spawn``/``WriteStdin``/``Signal``/``Terminate``: the agent process (writes made while the process
  is still starting are queued and flushed once it runs). Input the agent has not read (that queue,
  or the stdin pipe's buffer) is bounded by ``max_stdin_bytes``: a prompt that would pass it is
  refused before it opens a turn, with a non-fatal ``session.error`` ``AGENT_STDIN_FULL`` to its
  sender; any other write past it is dropped and every master is told the same way;
* ``StartTimer``/``CancelTimer``: ``loop.call_later`` handles by ``TimerKey``, whose firing is
  handed back to the machine (``timer_fired``);
* ``CloseAll``: every connection flushes its queue, then closes.
* ``WritePrompt``/``PlaceFile`` and ``Spawn.images``: a prompt's attached files, read from the
  session's ``FileStore`` (``gateway/storage/files.py``), which also keeps what tools return as bytes
  (stored between the parser and the machine, in ``_pump``) and is emptied with the session.

The reattach window (docs/http-api.md): while no connection is attached the session is
``DETACHED``. The machine is told of each connection attached and detached (``attached``,
``detached``) and decides: it starts the window's timer when the last one goes (and at ``start``),
cancels it when one comes, and deletes the session with ``reason: "timeout"`` when it fires.

With a state directory (``gateway/storage/state_dir.py``) every broadcast frame also goes to the
session's frame log and the record is rewritten when what it holds changes. ``suspend`` stops the
agent without a word to the machine when the gateway stops; ``LiveSession.restore`` makes the
session again from its files, closes the turn that was open (``gateway/protocol/recovery.py``) and
leaves the agent to be spawned, resumed, by the next prompt.

Rooms
-----
One class, ``LiveSession``, in three parts that share its state and its instance (so the per-line
path, ``take_lines`` to ``_emit`` to the connections, has no hop between objects):

* ``live.py``: the lifecycle, the record, ``perform``/``_act``/``_emit``, the turn and usage
  hooks, timers and tasks;
* ``agent_link.py``: the agent's side (spawn, stdout lines, stdin);
* ``masters.py``: the masters' side (attach, detach, receive, who may send what, routes);
* ``fanout.py``: one master's connection, written to without a task per frame.

Beside them, ``connection.py`` is the seam to the master protocols: the session knows each
connection only as a ``MasterConnection`` and sends it ``Outgoing`` frames (the typed frame, its
JSON, its WebSocket message); the DPS WebSocket (``fanout.py``) and an ACP client's view
(``acp_client.py``) are its two implementations.
"""

from gateway.session.live import LiveSession

__all__ = ["LiveSession"]
