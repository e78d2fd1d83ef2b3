"""A hostile agent: prints a line, leaves a descendant behind, prints another line and exits (or,
with --stay, waits for a signal).

usage: leaves_descendant.py HOW [--stay] [--ignore-term] [PROMPT ...]
       leaves_descendant.py HOW [--ignore-term] --exec ARGV ...   (leave it, then become ARGV)

HOW says where the descendant goes:
  group    a child in the agent's own process group that keeps the agent's stdout
  setsid   a child that calls setsid() and keeps the agent's stdout
  devnull  a child that calls setsid() and puts fds 0-2 on /dev/null (any other fd it inherited
           stays open)
  daemon   a double fork: the grandchild calls setsid(), its parent exits at once, 0-2 on /dev/null

--ignore-term: the descendant ignores SIGTERM. The descendant sleeps 120 s; its pid is written to
descendant.pid in the working directory before the agent's last line.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def descendant(ignore_term: bool, devnull: bool) -> None:
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if devnull:
        fd = os.open(os.devnull, os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(fd, target)
    time.sleep(120)
    os._exit(0)


def main() -> None:
    how = sys.argv[1]
    args = sys.argv
    then = args[args.index("--exec") + 1 :] if "--exec" in args else None
    args = args[: len(args) - len(then) - 1] if then is not None else args
    stay = "--stay" in args
    ignore_term = "--ignore-term" in args
    if then is None:
        print("working", flush=True)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if how != "group":
            os.setsid()
        if how == "daemon" and os.fork() > 0:
            os._exit(0)
        if ignore_term:  # before the pid is reported: no window where SIGTERM still works
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        descendant(ignore_term, devnull=how in ("devnull", "daemon"))
    os.close(w)
    grandchild = int(os.read(r, 64))
    if how == "daemon":
        os.waitpid(pid, 0)
    with open("descendant.pid", "w") as f:
        f.write(str(grandchild))
    if then is not None:
        os.execv(then[0], then)
    print("done", flush=True)
    if stay:
        signal.pause()


if __name__ == "__main__":
    main()
