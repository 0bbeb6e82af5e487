"""How a hot command is declared (``cli.table``): its words, its options and positional
words, its help, and the body that runs it -- plain data, read by ``cli.parsing`` to build the
one parser (docs/design.md §8.1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from procledger.cli.values import text

__all__ = ["Argument", "CommandSpec", "Option"]


class Option:
    """A flag: a switch when ``metavar`` is ``None``, else it takes a value, turned into the
    option's value by ``value(text, flag)`` (which raises ``UsageError``). (Plain classes, not
    dataclasses: making a dataclass costs the fast path's start-up a millisecond each.)"""

    __slots__ = ("choices", "default", "dest", "flags", "help", "metavar", "repeat", "value")

    def __init__(
        self,
        flags: tuple[str, ...],
        dest: str,
        help: str,
        metavar: str | None = None,
        default: Any = None,
        *,
        value: Callable[[str, str], Any] = text,
        choices: tuple[str, ...] = (),
        repeat: bool = False,
    ) -> None:
        self.flags, self.dest, self.help, self.metavar = flags, dest, help, metavar
        self.default, self.value, self.choices, self.repeat = default, value, choices, repeat


class Argument:
    """A positional word (a process id); ``rest``: every word from here on, options or not
    (``run``'s command and its arguments); ``optional``: it may be left out (``None``)."""

    __slots__ = ("dest", "help", "metavar", "optional", "rest")

    def __init__(
        self, dest: str, metavar: str, help: str, *, rest: bool = False, optional: bool = False
    ) -> None:
        self.dest, self.metavar, self.help, self.rest = dest, metavar, help, rest
        self.optional = optional


Params = tuple[Option | Argument, ...]


class CommandSpec:
    """One hot command: ``words`` as typed (``("agent", "status")``), ``summary`` for the list
    of commands, ``help`` for its own ``--help``, ``params`` (or what gives them, imported when
    the command runs), ``run``: ``module:function``, imported only when the command runs, and
    ``usage`` where argparse's own line would not say what to type."""

    __slots__ = ("help", "params", "run", "summary", "usage", "words")

    def __init__(
        self,
        words: tuple[str, ...],
        summary: str,
        help: str,
        params: Params | Callable[[], Params],
        run: str,
        *,
        usage: str | None = None,
    ) -> None:
        self.words, self.summary, self.help, self.params = words, summary, help, params
        self.run, self.usage = run, usage

    @property
    def name(self) -> str:
        return " ".join(self.words)

    def parameters(self) -> Params:
        return self.params() if callable(self.params) else self.params
