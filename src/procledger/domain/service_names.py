"""What a service may be called (the key of ``[services.NAME]`` in ``procledger.toml``).

A service name is typed where a process id is (``procledger stop web``), so it must never be
mistaken for one: it starts with a letter, where an id or an id prefix may start with a digit
and an address with ``:``. It stays short and plain (ASCII letters, digits, ``_``, ``-``,
``.``, no trailing ``.`` or ``-``) so that it is the same word in a shell, a file name, a DNS
label and a log line. Standard library only: the CLI's hot commands may check it.
"""

from __future__ import annotations

import re
from typing import Final

from procledger.domain.errors import OptionError

__all__ = ["MAX_SERVICE_NAME", "SERVICE_NAME", "check_service_name"]

MAX_SERVICE_NAME: Final = 63
"""A DNS label's limit: a name can become a host name or a unit name unchanged."""

SERVICE_NAME: Final = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9_])?")
"""The whole rule as one pattern (use ``fullmatch``); ``check_service_name`` says which part
of it a name breaks."""

_LETTERS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ALLOWED: Final = _LETTERS | frozenset("0123456789_-.")


def check_service_name(value: str, option: str = "--name") -> str:
    """``value`` if it is a service name; else ``OptionError`` naming ``option`` and the part
    of the rule it breaks, so the fix is obvious from the one line."""
    if SERVICE_NAME.fullmatch(value):
        return value
    if not value:
        raise OptionError(option, "a service name cannot be empty")
    if len(value) > MAX_SERVICE_NAME:
        why = f"is longer than {MAX_SERVICE_NAME} characters"
    elif value[0] not in _LETTERS:
        why = "must start with an ASCII letter (a process id may start with a digit)"
    elif bad := next((char for char in value if char not in _ALLOWED), None):
        why = f"has {bad!r}: only ASCII letters, digits, '_', '-' and '.' may follow the first"
    else:
        why = "must not end with '.' or '-'"
    raise OptionError(option, f"{value!r} is not a service name: it {why}")
