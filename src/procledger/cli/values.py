"""How the hot commands' option values are read from text, and the ``UsageError`` a refused
one raises (docs/design.md §8.1): standard library only, for the fast path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from procledger.domain.vocabulary import MAX_LEDGER_INT

MAX_GRACE_S = 86_400.0
"""``--grace`` is at most a day: a stop that waits longer is a mistake, not a policy."""


class UsageError(Exception):
    """What was typed cannot be run: one line naming the option, exit 2, nothing recorded."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message if option is None else f"invalid value for {option}: {message}")
        self.option = option
        self.detail = message
        """What is wrong with the value, without the option's name."""


def text(value: str, option: str) -> str:
    """An option's text, which must be UTF-8: what a shell passes as other bytes is refused
    before anything is opened or recorded."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        import os

        raise UsageError(f"{os.fsencode(value)!r} is not valid UTF-8", option) from None
    return value


def count(value: str, option: str) -> int:
    """An option that counts (a limit, a cursor, an offset): from 0 to the largest integer the
    ledger keeps, so a larger one is a usage error, not an ``OverflowError`` later."""
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{value!r} is not a whole number", option) from None
    if not 0 <= number <= MAX_LEDGER_INT:
        raise UsageError(f"{number} is not from 0 to {MAX_LEDGER_INT}", option)
    return number


def grace(value: str, option: str = "--grace") -> float:
    """``--grace``: a finite number of seconds from 0 to a day; anything else (``inf``,
    ``nan``, ``1e308``) is a usage error, found before anything is recorded."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0.0 <= seconds <= MAX_GRACE_S):
        message = f"{value!r} is not a number of seconds from 0 to {MAX_GRACE_S:.0f}"
        raise UsageError(message, option)
    return seconds


@contextmanager
def usage_errors() -> Iterator[None]:
    """An ``OptionError`` (a bad duration, port, regex or policy) as a usage error: one line
    naming the flag, exit 2, nothing recorded."""
    from procledger.domain.errors import OptionError

    try:
        yield
    except OptionError as error:
        message = str(error).removeprefix(f"{error.option}: ")
        raise UsageError(message, error.option) from None
