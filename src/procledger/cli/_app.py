"""The Typer app and what every command shares: the global ``--url`` option, the one place
errors become one line on stderr, opening the ledger, JSON output and exit codes.

Commands live in their group's module and are registered by ``procledger.cli``; this module
knows none of them, so it stays cheap to import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.main
from typer.core import TyperCommand

from procledger.cli.lines import (
    EXIT_FAILURE,
    EXIT_STOPPED,
    EXIT_USAGE,
    PROG,
    URL_VARIABLE,
    is_utf8,
    log_to_stderr,
    quiet_broken_pipe,
    say_error,
)
from procledger.cli.sentences import error_sentence, plain
from procledger.cli.values import UsageError, usage_errors

if TYPE_CHECKING:
    from procledger import ProcessRegistry

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
IdArgument = Annotated[
    str, typer.Argument(metavar="ID", help="A process id, or any unique prefix of one.")
]
"""The process a command acts on (``ProcessRegistry.resolve_process_id``, docs/design.md §8)."""


@dataclass
class CliState:
    """What the global options decided, shared with every command through ``ctx.obj``."""

    url: str | None = None
    """``--url``, else ``$PROCLEDGER_URL`` (the same option: the two mean exactly the same);
    ``None`` lets ``open_registry`` use the default SQLite ledger (docs/design.md §7)."""
    command: str | None = None
    """The subcommand being run, named in the error line."""


app = typer.Typer(
    name=PROG,
    help="Supervise OS processes and keep their whole lifecycle as an event-sourced log.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


_USAGE_ERROR: type[Exception] = next(
    base for base in typer.BadParameter.__mro__ if base.__name__ == "UsageError"
)
"""click's ``UsageError`` (typer may vendor click): found from a public typer name."""


class Command(TyperCommand):
    """A command whose usage line names its arguments as people write them (``ID``), not in
    typer's braces for a required one (``{ID}``), and whose options take only UTF-8 text."""

    bytes_options: frozenset[str] = frozenset()
    """Options whose value is used only here, as bytes (a path to read): any bytes will do."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        return [piece.replace("{", "").replace("}", "") for piece in pieces]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """typer names a list argument's type ``<list[str]>``; its metavar (``[NAME]...``)
        already says it takes several."""
        super().format_help(ctx, formatter)
        formatter.buffer[:] = [piece.replace(" <list[str]>", "") for piece in formatter.buffer]

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        rest: list[str] = super().parse_args(ctx, args)
        for param in self.get_params(ctx):
            if param.param_type_name == "option" and param.name not in self.bytes_options:
                utf8_option(ctx.params.get(param.name), param.opts[0])
        return rest


def utf8_option(value: object, option: str) -> None:
    """An option's text (or each of its values) must be UTF-8: what a shell passes as other
    bytes is refused as a usage error, before anything is opened or recorded."""
    for text in value if isinstance(value, list | tuple) else [value]:
        if isinstance(text, str) and not is_utf8(text):
            message = f"{os.fsencode(text)!r} is not valid UTF-8"
            raise typer.BadParameter(message, param_hint=option)


def cli_state(ctx: typer.Context) -> CliState:
    """The global options of this invocation (set up by the app callback)."""
    state = ctx.find_root().obj
    if not isinstance(state, CliState):  # pragma: no cover - only if a caller bypasses main()
        raise TypeError("procledger CLI state missing: run the app through procledger.cli.main")
    return state


def _print_version(value: bool) -> None:
    """``--version``: answered while parsing, before any command runs or any store opens."""
    if value:
        import procledger

        sys.stdout.write(f"{PROG} {procledger.__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _global_options(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            metavar="URL",
            envvar=URL_VARIABLE,
            show_envvar=False,
            help="Store URL: sqlite:///relative.db, sqlite:////absolute.db, "
            "postgresql://user@host/db, memory://. Default: $PROCLEDGER_URL, else the SQLite "
            "ledger under $XDG_DATA_HOME/procledger.",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            is_eager=True,
            callback=_print_version,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    state = ctx.ensure_object(CliState)
    utf8_option(url, "--url")
    state.url = url or None
    state.command = ctx.invoked_subcommand


@contextmanager
def open_ledger(
    url: str | None, *, create: bool = True, read_only: bool = False
) -> Iterator[ProcessRegistry]:
    """The one way a command opens the store, closed after it. ``create=False`` for the
    commands that never create a ledger, a missing one is an error naming it; ``read_only``
    for those that only read (no DDL, no write lock: docs/design.md §7.1).
    ``open_registry`` is imported here, through the package's public name, so that
    ``procledger table`` never loads a store."""
    from procledger import open_registry

    registry = open_registry(url, create=create, read_only=read_only)
    try:
        yield registry
    finally:
        registry.close()


def resolve_id(registry: ProcessRegistry, text: str) -> str:
    """The process id ``text`` names: the id itself, or a unique prefix of one (an ambiguous
    one is ``AmbiguousProcessId`` listing candidates). Text that is not valid UTF-8 -- a shell
    can pass any bytes -- names no process."""
    from procledger import NotFound

    if not is_utf8(text):
        raise NotFound(f"no process {os.fsencode(text)!r}: a process id is UTF-8 text")
    return registry.resolve_process_id(text)


def _say(state: CliState, text: str) -> None:
    say_error(state.command, plain(text))  # plain: pydantic's words in a usage line too


def fail(state: CliState, exc: BaseException, code: int = EXIT_FAILURE) -> NoReturn:
    """Report ``exc`` as the one error line (naming the command, then ``error_sentence``'s
    sentence) and exit with ``code`` -- for a command that exits with something other than 1
    on an error."""
    _say(state, error_sentence(exc))
    raise SystemExit(code)


def _missing_driver(exc: ImportError) -> str | None:
    """PostgreSQL support is an extra: name what to install when its driver is missing."""
    name = exc.name or ""
    if name.split(".")[0] in ("psycopg", "psycopg_pool"):
        return f"PostgreSQL support is not installed ({name}): pip install 'procledger[postgres]'"
    return None


def _usage(state: CliState, exc: Exception) -> NoReturn:
    """A usage error (click's): one line naming the command, and exit 2; nothing was done."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # `procledger` or a group with no command
        sys.stderr.write(str(getattr(exc, "message", exc)).rstrip() + "\n")
        raise SystemExit(EXIT_USAGE)
    context = getattr(exc, "ctx", None)
    named = (getattr(context, "command_path", None) or PROG).removeprefix(PROG).strip()
    state.command = named or state.command  # click may blame the group for a command's option
    path = f"{PROG} {state.command}" if state.command else PROG
    if state.command and getattr(exc, "option_name", None) == "--url":
        # The app's option, unknown to the command: say where it goes, not the nearest option.
        _say(state, f"--url goes before the command: {PROG} --url URL {state.command} ...")
        raise SystemExit(EXIT_USAGE)
    _say(state, f"{exc.format_message()} (see '{path} --help')")  # type: ignore[attr-defined]
    raise SystemExit(EXIT_USAGE)


def _invoke(state: CliState, args: list[str]) -> int:
    """Parse ``args`` and run the command; its exit code. Click exceptions come back raised
    (no standalone mode), so that every way out is decided in ``main``."""
    log_to_stderr()
    command = typer.main.get_command(app)
    with command.make_context(PROG, args, obj=state) as ctx:
        command.invoke(ctx)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the CLI: every way a command ends becomes an exit code, and every failure
    exactly one line on stderr -- never a traceback (docs/design.md §8)."""
    state = CliState()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _invoke(state, args)
    except typer.Exit as done:
        code = done.exit_code
    except (KeyboardInterrupt, typer.Abort):
        code = EXIT_STOPPED
    except BrokenPipeError:
        quiet_broken_pipe()
    except _USAGE_ERROR as exc:
        _usage(state, exc)
    except ImportError as exc:
        missing = _missing_driver(exc)
        if missing is None:
            fail(state, exc)
        _say(state, missing)
        raise SystemExit(EXIT_FAILURE) from None
    except Exception as exc:  # ProcledgerError, OSError -- and a bug: one line all the same
        fail(state, exc)
    raise SystemExit(code)


@contextmanager
def option_errors() -> Iterator[None]:
    """``values.usage_errors`` for a typer command: an ``OptionError`` (a bad duration, port,
    regex or policy) as typer's usage error naming the flag, exit 2, nothing recorded."""
    try:
        with usage_errors():
            yield
    except UsageError as error:
        raise typer.BadParameter(error.detail, param_hint=error.option) from None


def dump(model: Any) -> Any:
    """A pydantic model as JSON-ready data: ids, enums and timestamps as the ledger stores them."""
    return model.model_dump(mode="json")
