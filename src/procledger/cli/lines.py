"""What every command writes, and how: the data on stdout (plain lines, JSON documents), notes
and the one error line on stderr, exit codes. Standard library and orjson only: the fast path of
the hot commands (docs/design.md §8.1) and the full CLI write through the same functions, so
their bytes agree.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from contextlib import suppress
from typing import Any, NoReturn

import orjson

PROG = "procledger"
URL_VARIABLE = "PROCLEDGER_URL"
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_STOPPED = 130
"""128 + SIGINT: what a command stopped on request (Ctrl-C, ``procledger stop``) exits with."""
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
"""What shells exit with when a command cannot be executed (126) or found (127)."""


def spawn_exit_code(number: int | None) -> int:
    """A command that could not be started exits as a shell would: 127 when the program is not
    there (``ENOENT``), 126 when it is but cannot be executed."""
    return EXIT_NOT_FOUND if number == errno.ENOENT else EXIT_CANNOT_EXECUTE


def one_line(text: str) -> str:
    """Collapse whitespace: an error is reported on exactly one line, whatever its message."""
    return " ".join(text.split())


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be kept as UTF-8 (an argument or path decoded from other bytes holds
    surrogate escapes, which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def warn(text: str) -> None:
    """A note for the person on stderr (stdout stays the command's data), on one line."""
    line = f"{PROG}: {one_line(text)}\n"
    sys.stderr.write(line.encode(errors="backslashreplace").decode())


def say_error(command: str | None, text: str) -> None:
    """The one error line: ``procledger COMMAND: message``. A message may carry undecodable
    bytes (surrogate escapes of a non-UTF-8 argument): they are shown escaped, so writing the
    error line can never itself fail."""
    where = f"{PROG} {command}" if command else PROG
    message = one_line(text) or "(no message)"
    line = f"{where}: {message}\n".encode(errors="backslashreplace").decode()
    sys.stderr.write(line)
    sys.stderr.flush()


def write_json(value: Any) -> None:
    """One JSON document per line, flushed: a pipe reader sees each line as soon as it is done."""
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()


def write_line(text: str) -> None:
    sys.stdout.write(text + "\n")


def quiet_broken_pipe() -> NoReturn:
    """The reader went away (``| head``): that is not a failure. Point stdout at /dev/null so
    the interpreter's final flush cannot raise again, and exit 0."""
    with suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
    raise SystemExit(0)


def log_to_stderr() -> None:
    """The library's warnings (a ledger readable by others, waiting for the store) reach the
    person as lines like the error line: ``procledger: <message>``. Installed once per process,
    writing to whatever ``sys.stderr`` is when a warning comes."""
    logger = logging.getLogger("procledger")
    if any(isinstance(handler, _StderrLines) for handler in logger.handlers):
        return
    handler = _StderrLines()
    handler.setLevel(logging.WARNING)  # on the handler: the logger's level stays the caller's
    logger.addHandler(handler)


class _StderrLines(logging.Handler):
    """One ``procledger: <message>`` line on the current ``sys.stderr`` per record."""

    def emit(self, record: logging.LogRecord) -> None:
        with suppress(OSError, ValueError):  # a closed stderr: nobody to tell
            warn(record.getMessage())
