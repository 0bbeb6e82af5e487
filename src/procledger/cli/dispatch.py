"""Running a hot command: its words parsed by the table's parser, its body called on the fast
or the full path, and every way out turned into an exit code and at most one line on stderr
(docs/design.md §8, §8.1). Called by the entry and by the typer app's face of each hot command.
"""

from __future__ import annotations

import importlib
from typing import Any, NoReturn

from procledger.cli.lines import (
    EXIT_FAILURE,
    EXIT_STOPPED,
    EXIT_USAGE,
    PROG,
    log_to_stderr,
    quiet_broken_pipe,
    say_error,
)
from procledger.cli.table import CommandSpec
from procledger.cli.values import UsageError

__all__ = ["fail", "run_hot"]


def run_hot(spec: CommandSpec, words: list[str], url: str | None, *, fast: bool) -> NoReturn:
    """Parse ``words`` as ``spec``'s options and run it; every way out is an exit code, every
    failure one line on stderr naming the command (never a traceback)."""
    log_to_stderr()
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
    from procledger.application.document_reads import NeedsFullPath

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
