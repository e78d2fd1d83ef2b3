"""Commands that run the command their arguments name (``sudo -u x cmd``), read as each one reads
its own options, for the permission rules (docs/policies.md), sans-IO.

``command_starts(name, args)`` says where the wrapped command begins in ``args`` (the words after
the wrapper's name), option by option as the wrapper's own manual gives them: ``sudo(8)``,
``doas(1)``, ``env(1)``, ``nice(1)``, ``nohup(1)``, ``timeout(1)``, ``stdbuf(1)``, ``xargs(1)``,
GNU ``time(1)`` and bash's ``exec``, ``command`` and ``builtin``. An option that takes an
argument takes the next word (``-u x``) or the rest of its word (``-ux``, ``--user=x``); options
cluster (``-Eu x``); a long option may be cut short where that leaves one name (``--us x``, as
getopt_long reads it); ``--`` ends the options; the first word that is not an option is the
command, after ``env``'s and ``sudo``'s ``NAME=VALUE`` words and ``timeout``'s duration.

So ``sudo -u root rm -rf /`` is judged as ``rm -rf /`` too, where reading ``-u`` as a flag would
have made ``root`` the command: a ``deny`` on ``rm`` holds, and an option's argument cannot pose
as the command an ``allow`` names.

``Unwrapped.opaque``: no ``allow`` may hold for the line, because

- an option is not one the wrapper's manual lists: whether it takes the next word is unknown, so
  the command is given both ways (``starts``), for a ``deny``, and never allowed;
- the option runs text as a command line (``env -S``/``--split-string``: its string is given in
  ``line``, to be read as a line) or writes a file (``time -o``/``--output``, as ``>`` would).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_STARTS", "WRAPPERS", "Unwrapped", "command_starts"]

MAX_STARTS: Final = 4  # readings of one wrapper's words kept (unknown options branch)
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_NICE_NUMBER: Final = re.compile(r"-[-+]?[0-9]+")


@dataclass(frozen=True, slots=True)
class _Wrapper:
    """One wrapper's options, as its manual lists them (letters of short options, names of long
    ones without ``--``)."""

    takes: str = ""  # short options whose argument is the rest of the word or the next word
    attached: str = ""  # short options whose optional argument can only be the rest of the word
    flags: str = ""  # short options without an argument
    long_takes: frozenset[str] = frozenset()  # long options with a required argument
    long_flags: frozenset[str] = frozenset()  # without one, or with an optional "=VALUE"
    runs_text: frozenset[str] = frozenset()  # options whose argument is a command line
    writes: frozenset[str] = frozenset()  # options whose argument is a file written
    assignments: bool = False  # NAME=VALUE words before the command (env, sudo)
    operands: int = 0  # words between the options and the command (timeout's duration)
    number_option: bool = False  # nice's old "-N" adjustment
    dash: bool = False  # "-" alone is an option (env's -i)

    def long_name(self, given: str) -> str | None:
        """The long option ``given`` names, in full or cut short where only one name fits."""
        names = self.long_takes | self.long_flags
        if given in names:
            return given
        fits = [n for n in names if n.startswith(given)] if given else []
        return fits[0] if len(fits) == 1 else None


def _names(names: str) -> frozenset[str]:
    return frozenset(names.split())


_HELP: Final = "help version"

WRAPPERS: Final[dict[str, _Wrapper]] = {
    # sudo(8) (its getopt string "+Aa:BbC:c:D:Eeg:Hh::iKklNnPp:R:r:SsT:t:U:u:Vv"): -a type,
    # -C num, -c class, -D directory, -g group, -p prompt, -R directory, -r role, -T timeout,
    # -t type, -U user, -u user; -h alone is help, -hHOST a host; -e (sudoedit) and -l (list)
    # name files or a command to list, which a deny still sees.
    "sudo": _Wrapper(
        takes="aCcDgpRrTtUu",
        attached="h",
        flags="ABbEeHiKklNnPSsVv",
        long_takes=_names(
            "user group close-from chdir host prompt role type command-timeout other-user"
            " login-class chroot auth-type"
        ),
        long_flags=_names(
            "askpass background bell preserve-env edit set-home login remove-timestamp"
            f" reset-timestamp list non-interactive preserve-groups stdin shell validate {_HELP}"
        ),
        assignments=True,
    ),
    # doas(1): -C config, -u user; -L, -n, -s.
    "doas": _Wrapper(takes="Cu", flags="Lns"),
    # env(1), GNU coreutils: -u name, -C dir, -S string (split into the command line it runs),
    # -a arg (argv[0]); -i (also "-"), -0, -v; --*-signal take an optional "=SIG".
    "env": _Wrapper(
        takes="uCSa",
        flags="i0v",
        long_takes=_names("unset chdir split-string argv0"),
        long_flags=_names(
            "ignore-environment null debug block-signal default-signal ignore-signal"
            f" list-signal-handling {_HELP}"
        ),
        runs_text=_names("-S --split-string"),
        assignments=True,
        dash=True,
    ),
    # nice(1): -n adjustment, --adjustment=N, and the old -N (also --N, -+N).
    "nice": _Wrapper(
        takes="n", long_takes=_names("adjustment"), long_flags=_names(_HELP), number_option=True
    ),
    # nohup(1): only --help and --version.
    "nohup": _Wrapper(long_flags=_names(_HELP)),
    # timeout(1): -k duration, -s signal; -f, -p, -v; then DURATION, then the command.
    "timeout": _Wrapper(
        takes="ks",
        flags="fpv",
        long_takes=_names("kill-after signal"),
        long_flags=_names(f"foreground preserve-status verbose {_HELP}"),
        operands=1,
    ),
    # stdbuf(1): -i, -o, -e mode.
    "stdbuf": _Wrapper(
        takes="ioe", long_takes=_names("input output error"), long_flags=_names(_HELP)
    ),
    # xargs(1), GNU findutils: -a file, -d delim, -E eof, -I replace, -L lines, -n args,
    # -P procs, -s chars; -e, -i, -l take an optional argument in the same word only.
    "xargs": _Wrapper(
        takes="adEILnPs",
        attached="eil",
        flags="0oprtx",
        long_takes=_names("arg-file delimiter max-args max-procs max-chars process-slot-var"),
        long_flags=_names(
            "eof replace max-lines null open-tty interactive no-run-if-empty verbose exit"
            f" show-limits {_HELP}"
        ),
    ),
    # GNU time(1): -f format, -o file (written); -a, -p, -q, -v, -V. (bash's time takes -p.)
    "time": _Wrapper(
        takes="fo",
        flags="apqvV",
        long_takes=_names("format output"),
        long_flags=_names(f"append portability quiet verbose {_HELP}"),
        writes=_names("-o --output"),
    ),
    # bash's builtins: exec [-cl] [-a name], command [-pVv], builtin.
    "exec": _Wrapper(takes="a", flags="cl"),
    "command": _Wrapper(flags="pVv"),
    "builtin": _Wrapper(),
}


@dataclass(frozen=True, slots=True)
class Unwrapped:
    """Where the wrapped command may begin (indexes into the wrapper's words, each reading once),
    whether an allow may not hold (``opaque``), and a command line an option runs (``line``)."""

    starts: tuple[int, ...]
    opaque: bool = False
    line: str | None = None


def command_starts(name: str, args: list[str]) -> Unwrapped:
    """Where the command that wrapper ``name`` runs begins in ``args`` (see the module docstring);
    an index past the end: it names none."""
    wrapper = WRAPPERS[name]
    reader = _Options(wrapper, args)
    starts = reader.read(0)
    return Unwrapped(tuple(dict.fromkeys(starts)), reader.opaque, reader.line)


class _Options:
    __slots__ = ("args", "line", "opaque", "readings", "wrapper")

    def __init__(self, wrapper: _Wrapper, args: list[str]) -> None:
        self.wrapper = wrapper
        self.args = args
        self.opaque = False
        self.line: str | None = None
        self.readings = MAX_STARTS

    def read(self, i: int) -> list[int]:
        """The command's start when the options are read from ``args[i]``; an unknown option
        gives two readings (it takes the next word, or not), up to ``MAX_STARTS``."""
        args, wrapper = self.args, self.wrapper
        while i < len(args):
            word = args[i]
            step: int | None
            if word == "--":
                i += 1
                break
            if word == "-" and wrapper.dash:
                step = 1  # env's "-" is -i
            elif word.startswith("--") and len(word) > 2:
                step = self._long(word, i)
            elif word.startswith("-") and len(word) > 1:
                step = self._short(word, i)
            elif wrapper.assignments and _ASSIGNMENT.match(word):
                step = 1
            else:
                break
            if step is None:  # an unknown option: it may take the next word as its argument
                self.opaque = True
                if self.readings > 1 and i + 2 <= len(args):
                    self.readings -= 1
                    return self.read(i + 1) + self.read(i + 2)
                step = 1
            i += step
        return [i + wrapper.operands]

    def _long(self, word: str, i: int) -> int | None:
        given, eq, value = word[2:].partition("=")
        name = self.wrapper.long_name(given)
        if name is None:
            return None
        if name not in self.wrapper.long_takes:
            return 1
        argument = value if eq else (self.args[i + 1] if i + 1 < len(self.args) else "")
        self._argument(f"--{name}", argument)
        return 1 if eq else 2

    def _short(self, word: str, i: int) -> int | None:
        wrapper = self.wrapper
        if wrapper.number_option and _NICE_NUMBER.fullmatch(word):
            return 1
        for j, letter in enumerate(word[1:], 1):
            if letter in wrapper.takes:
                rest = word[j + 1 :]
                argument = rest or (self.args[i + 1] if i + 1 < len(self.args) else "")
                self._argument(f"-{letter}", argument)
                return 1 if rest else 2
            if letter in wrapper.attached:
                return 1
            if letter not in wrapper.flags:
                return None
        return 1

    def _argument(self, option: str, argument: str) -> None:
        if option in self.wrapper.runs_text:
            self.opaque = True
            self.line = argument
        elif option in self.wrapper.writes:
            self.opaque = True
