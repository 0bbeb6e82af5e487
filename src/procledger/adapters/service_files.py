"""Reading the service file from disk: where ``procledger.toml`` is looked for, and what a
missing, unreadable or non-UTF-8 file is said as. The parsing itself is pure
(``procledger.domain.service_file``); this module gives it the file's text, its folder and this
host's signal numbers.
"""

from __future__ import annotations

import os
import signal

from procledger.domain.errors import ServiceFileError
from procledger.domain.service_file import ServiceFile, parse_service_file
from procledger.domain.toml_keys import line_column

__all__ = ["DEFAULT_FILE_NAME", "host_signals", "load_service_file"]

DEFAULT_FILE_NAME = "procledger.toml"
"""Looked for in the working directory when no file is named, as a project's own file is."""

_BOM = "\ufeff"


def host_signals() -> dict[str, int]:
    """This host's signal numbers by name, aliases (``SIGIOT``) included: ``SIGUSR1`` is 10 on
    Linux and 30 on macOS, so the file's names are resolved where it is read."""
    return {name: int(number) for name, number in signal.Signals.__members__.items()}


def load_service_file(path: str | None = None, *, cwd: str | None = None) -> ServiceFile:
    """The service file at ``path`` (relative to ``cwd``), else ``procledger.toml`` in ``cwd``
    (default: the current directory), parsed and checked. Missing, unreadable, not UTF-8, or
    wrong inside: ``ServiceFileError`` naming the file as given -- with line and column where
    a place in it is at fault."""
    folder = os.getcwd() if cwd is None else cwd
    if path is None:
        shown = DEFAULT_FILE_NAME if cwd is None else os.path.join(cwd, DEFAULT_FILE_NAME)
        target = os.path.join(folder, DEFAULT_FILE_NAME)
    else:
        shown, target = path, os.path.join(folder, path)
    target = os.path.abspath(target)
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:
        message = f"{os.fsencode(target)!r} is not valid UTF-8: the ledger keeps paths as text"
        raise ServiceFileError(shown, message) from None
    data = _read(target, shown, folder if path is None else None)
    text = _decoded(data, shown)
    base_dir = os.path.dirname(target)
    return parse_service_file(text, path=shown, base_dir=base_dir, signals=host_signals())


def _read(target: str, shown: str, looked_in: str | None) -> bytes:
    """The file's bytes; ``looked_in``: the folder searched for the default file, named when
    it is not there."""
    try:
        with open(target, "rb") as file:
            return file.read()
    except FileNotFoundError:
        if looked_in is not None:
            message = f"no {DEFAULT_FILE_NAME} in {looked_in} (or give --file PATH)"
        else:
            message = f"{shown}: no such file"
        raise ServiceFileError(shown, message) from None
    except IsADirectoryError:
        raise ServiceFileError(shown, f"{shown}: is a folder, not a service file") from None
    except OSError as error:
        why = (error.strerror or str(error)).lower()
        raise ServiceFileError(shown, f"{shown}: cannot be read ({why})") from None


def _decoded(data: bytes, shown: str) -> str:
    """UTF-8 text (TOML's only encoding), without the byte-order mark some editors write; the
    first byte that is not UTF-8 is placed like any other mistake."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        before = data[: error.start].decode("utf-8")
        line, column = line_column(before + "?", len(before))
        message = f"encoding: byte {data[error.start]:#04x} is not UTF-8 (a TOML file is UTF-8)"
        raise ServiceFileError(shown, message, line=line, column=column) from None
    return text.removeprefix(_BOM)
