"""The ``procledger`` command's entry: the hot commands answered on the fast path, everything
else handed to the full CLI (docs/design.md §8.1).

``procledger [--url URL] COMMAND ...``: when COMMAND is a hot one (``cli.table``) its words are
parsed by the table's parser and it runs over ``LedgerReads`` opened by the standard library
(a SQLite file) -- or, where that cannot serve (PostgreSQL, ``memory://``, an older schema,
a damaged row), over the registry; ``PROCLEDGER_FAST=0`` takes the full path always. Anything
else (``--help``, another command, a global option this entry does not know) goes to the typer
app with the words untouched. Either way a failure is one line on stderr and an exit code.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from procledger.cli.lines import (
    EXIT_FAILURE,
    EXIT_STOPPED,
    EXIT_USAGE,
    PROG,
    URL_VARIABLE,
    is_utf8,
    quiet_broken_pipe,
    say_error,
)
from procledger.cli.table import CommandSpec, find
from procledger.cli.values import UsageError

__all__ = ["FAST_VARIABLE", "main", "run_hot"]

FAST_VARIABLE = "PROCLEDGER_FAST"
"""``0`` sends the hot commands down the full path (a check, or a way round a fast-path bug)."""


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``procledger`` script."""
    args = list(sys.argv[1:] if argv is None else argv)
    url, rest = _global_options(args)
    hot = None if rest is None else find(rest)
    if hot is None:
        from procledger.cli.full import main as full_main

        full_main(args)
        return
    spec, words = hot
    run_hot(spec, words, url, fast=os.environ.get(FAST_VARIABLE, "1") != "0")


def _global_options(args: list[str]) -> tuple[str | None, list[str] | None]:
    """``--url URL`` (or ``--url=URL``, else ``$PROCLEDGER_URL``) and the words after the
    global options; ``None`` for words only the full CLI reads (``--help``, ``--version``,
    a missing or non-UTF-8 URL)."""
    url = os.environ.get(URL_VARIABLE)
    index = 0
    while index < len(args) and args[index].startswith("--url"):
        if args[index] == "--url" and index + 1 < len(args):
            url, index = args[index + 1], index + 2
        elif args[index].startswith("--url="):
            url, index = args[index].removeprefix("--url="), index + 1
        else:
            return None, None
    if url is not None and not is_utf8(url):
        return None, None
    return (url or None), args[index:]


def run_hot(spec: CommandSpec, words: list[str], url: str | None, *, fast: bool) -> NoReturn:
    """Parse ``words`` as ``spec``'s options and run it; every way out is an exit code, every
    failure one line on stderr naming the command (never a traceback)."""
    try:
        from procledger.cli.parsing import parse

        options = parse(spec, words)
        module, name = spec.run.split(":")
        command = getattr(importlib.import_module(module), name)
        code = _run(command, options, url, fast=fast)
    except UsageError as error:
        _usage(spec, error)
    except KeyboardInterrupt:
        code = EXIT_STOPPED
    except BrokenPipeError:
        quiet_broken_pipe()
    except SystemExit:
        raise
    except ImportError as error:
        _missing_module(spec, error)
    except Exception as error:  # ProcledgerError, OSError -- and a bug: one line all the same
        fail(spec.name, error)
    raise SystemExit(code or 0)


def _run(command: Any, options: Any, url: str | None, *, fast: bool) -> int | None:
    """The command on the fast path, or again on the full path where the fast one declined
    (before it printed anything: a body reads all it needs first)."""
    from procledger.cli.hot.reads import NeedsFullPath

    try:
        return command(options, url, fast=fast)  # type: ignore[no-any-return]
    except NeedsFullPath:
        return command(options, url, fast=False)  # type: ignore[no-any-return]


def error_text(error: BaseException) -> str:
    """The error line's message."""
    from procledger.cli.sentences import error_sentence

    return error_sentence(error)


def fail(command: str, error: BaseException, code: int = EXIT_FAILURE) -> NoReturn:
    """``error`` as the one line naming ``command``, and exit ``code``."""
    say_error(command, error_text(error))
    raise SystemExit(code)


def _usage(spec: CommandSpec, error: UsageError) -> NoReturn:
    message = str(error)
    if not message.startswith("--url goes before"):
        message += f" (see '{PROG} {spec.name} --help')"
    say_error(spec.name, message)
    raise SystemExit(EXIT_USAGE)


def _missing_module(spec: CommandSpec, error: ImportError) -> NoReturn:
    """PostgreSQL support is an extra: name what to install when its driver is missing."""
    name = error.name or ""
    if name.split(".")[0] in ("psycopg", "psycopg_pool"):
        message = (
            f"PostgreSQL support is not installed ({name}): pip install 'procledger[postgres]'"
        )
        say_error(spec.name, message)
        raise SystemExit(EXIT_FAILURE)
    fail(spec.name, error)
