"""The grammar of the two other values ``run`` and the service file share with people: sizes
(``--output-limit 64MiB``, ``output_limit = "64MiB"``) and stop signals (``--stop-signal
TERM``, ``stop_signal = "SIGTERM"``). One parser each, so a flag and a file key mean the same;
every refusal is an ``OptionError`` naming the option. Standard library only: ``run`` is a hot
command (docs/design.md §8.1).

The domain may not import ``signal`` (it reads nothing of the host, tests/domain/test_purity.py),
so signal numbers come from the caller: the CLI and the file loader pass the host's table; the
default is the signals whose numbers POSIX fixes for ``kill -s``, the same on every system.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from procledger.domain.errors import OptionError
from procledger.domain.vocabulary import MAX_LEDGER_INT

__all__ = ["POSIX_SIGNALS", "parse_signal", "parse_size"]

POSIX_SIGNALS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "SIGHUP": 1,
        "SIGINT": 2,
        "SIGQUIT": 3,
        "SIGABRT": 6,
        "SIGKILL": 9,
        "SIGALRM": 14,
        "SIGTERM": 15,
    }
)
"""The signals whose numbers POSIX's ``kill`` utility fixes: right on any host, when the caller
has no table of its own."""

_SIZE = re.compile(r"([0-9]{1,30})\s*(B|KiB|MiB|GiB|K|M|G)?", re.IGNORECASE)
"""ASCII digits (``\\d`` would take any script's), and not thousands of them (``int`` refuses
those with a ``ValueError``): 30 already say more than the ledger can count."""
_SIZE_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
}


def parse_size(text: str | int, *, option: str = "--output-limit") -> int:
    """Bytes from ``512KiB``, ``1MiB``, ``64MiB`` or a plain number of bytes (an ``int`` passes
    the same range check: a service file writes ``output_limit = 1048576``). Malformed, negative
    or more than the ledger can count: ``OptionError`` naming ``option``."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        size = text
    else:
        found = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
        if found is None:
            message = f"{text!r} is not a size such as 512KiB, 1MiB, 64MiB or a number of bytes"
            raise OptionError(option, message)
        size = int(found.group(1)) * _SIZE_UNITS[(found.group(2) or "").lower()]
    if size > MAX_LEDGER_INT:
        message = f"{text!r} is more than the ledger can count ({MAX_LEDGER_INT} bytes)"
        raise OptionError(option, message)
    return size


def parse_signal(
    value: str | int, *, option: str = "--stop-signal", names: Mapping[str, int] = POSIX_SIGNALS
) -> int:
    """The number of ``TERM``, ``SIGTERM`` (any case) or ``15``, looked up in ``names`` (name
    -> number, ``SIG`` included); a number must be one of its values. Anything else:
    ``OptionError`` naming ``option``."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        name = value.strip().upper()
        if name.isdigit():
            try:
                number = int(name)
            except ValueError:  # a digit of another script: "²".isdigit(), but not int's
                number = None
        else:
            number = names.get(name if name.startswith("SIG") else f"SIG{name}")
    if number is None or number not in names.values():
        raise OptionError(option, f"{value!r} is not a signal name or number")
    return number
