"""How a hot command is declared (``cli.table``): its words, its options and positional
words, its help, and the body that runs it -- plain data, read by ``cli.parsing`` to build the
one parser (docs/design.md §8.1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from procledger.cli.values import text

__all__ = ["Argument", "CommandSpec", "Option"]


@dataclass(frozen=True)
class Option:
    """A flag: a switch when ``metavar`` is ``None``, else it takes a value, turned into the
    option's value by ``value(text, flag)`` (which raises ``UsageError``)."""

    flags: tuple[str, ...]
    dest: str
    help: str
    metavar: str | None = None
    default: Any = None
    value: Callable[[str, str], Any] = text
    choices: tuple[str, ...] = ()
    repeat: bool = False


@dataclass(frozen=True)
class Argument:
    """A positional word (a process id); ``rest``: every word from here on, options or not
    (``run``'s command and its arguments)."""

    dest: str
    metavar: str
    help: str
    rest: bool = False


@dataclass(frozen=True)
class CommandSpec:
    """One hot command: ``words`` as typed (``("agent", "status")``), ``summary`` for the list
    of commands, ``help`` for its own ``--help``, and ``run``: ``module:function``, imported
    only when the command runs."""

    words: tuple[str, ...]
    summary: str
    help: str
    params: tuple[Option | Argument, ...]
    run: str
    usage: str | None = None
    """The usage line, where argparse's own would not say what to type."""

    @property
    def name(self) -> str:
        return " ".join(self.words)
