"""The grammar of the durations, ports and patterns people type (``--timeout 5m``, ``--since
2h``, ``--ready-port 8080``): pure functions of text, with no model behind them, so the CLI's
fast path parses exactly what the library does without loading pydantic (docs/design.md §8,
§15). Every refusal is an ``OptionError`` naming the option.
"""

from __future__ import annotations

import math
import re
from typing import Final

from procledger.domain.errors import OptionError
from procledger.domain.vocabulary import MAX_LEDGER_INT

__all__ = [
    "MAX_DURATION_S",
    "age_ms",
    "ascii_digits",
    "check_port",
    "check_regex",
    "parse_duration",
]

MAX_DURATION_S: Final = 366 * 86400.0
"""The longest duration any option takes (a year): anything longer is a typo."""

_UNITS: Final = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(ms|s|m|h|d|w)?")


def parse_duration(
    text: str | float, *, option: str = "duration", longest: float = MAX_DURATION_S
) -> float:
    """Seconds from ``0.2s``, ``60s``, ``5m``, ``1h``, ``3d``, ``1w``, ``250ms`` or a bare
    number of seconds (a float or int passes through the same checks): the one grammar of every
    duration procledger takes. Negative, malformed, infinite or over ``longest`` (a year for a
    timeout or a delay, where more is a typo): ``OptionError`` naming ``option``."""
    if isinstance(text, bool):
        raise OptionError(option, f"{text!r} is not a duration")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        stripped = text.strip()
        if stripped.startswith("-"):
            raise OptionError(option, f"{text!r} is negative; a duration is 0 or more")
        found = _DURATION.fullmatch(stripped)
        if found is None:
            raise OptionError(
                option, f"{text!r} is not a duration such as 0.2s, 90s, 15m, 2h or 3d"
            )
        seconds = float(found.group(1)) * _UNITS[found.group(2) or "s"]
    if not math.isfinite(seconds) or seconds < 0:
        raise OptionError(option, f"{text!r} is not a finite duration of 0 or more")
    if seconds > longest:
        raise OptionError(option, f"{text!r} is longer than a year")
    return seconds


def age_ms(text: str, *, option: str) -> int:
    """How long ago, in milliseconds, for a filter such as ``--since 2h`` or ``--older-than
    30d``: the duration grammar with no upper bound (a ledger may be years old) -- but the
    milliseconds must be a number the ledger can compare with (2⁶³ − 1: some 292 million
    years), else ``OptionError``, not an ``OverflowError`` from the database."""
    milliseconds = parse_duration(text, option=option, longest=math.inf) * 1000
    if milliseconds > MAX_LEDGER_INT:
        raise OptionError(option, f"{text!r} is longer than the ledger can count back")
    return int(milliseconds)


def check_port(value: str | int, *, option: str = "port") -> int:
    """A TCP port, 1 to 65535 (a string of digits too); else ``OptionError``."""
    if isinstance(value, bool):
        raise OptionError(option, f"{value!r} is not a port")
    port = (
        ascii_digits(value, option, "a port number (1 to 65535)")
        if isinstance(value, str)
        else value
    )
    if not 1 <= port <= 65535:
        raise OptionError(option, f"{value} is out of range (1 to 65535)")
    return port


def check_regex(pattern: str, *, option: str = "output regex") -> str:
    """``pattern`` if Python's ``re`` compiles it; else ``OptionError`` saying why."""
    try:
        re.compile(pattern)
    except re.error as error:
        raise OptionError(option, f"{pattern!r} does not compile: {error}") from None
    return pattern


def ascii_digits(text: str, option: str, what: str) -> int:
    """The number ``text`` spells in ASCII digits (``str.isdigit`` also passes ``²``, which
    ``int`` refuses); ``OptionError`` saying it is not ``what``. Digits past any number the
    ledger keeps are not converted (``int`` refuses thousands of them with a ``ValueError``)."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()):
        raise OptionError(option, f"{text!r} is not {what}")
    if len(digits.lstrip("0")) > len(str(MAX_LEDGER_INT)):
        return MAX_LEDGER_INT + 1
    return int(digits)
