"""The Typer app and what every command shares: the global ``--url`` option, the one place
errors become one line on stderr, opening the ledger, JSON output and exit codes.

Commands live in their group's module and are registered by ``procledger.cli``; this module
knows none of them, so it stays cheap to import.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import orjson
import typer

from procledger import ProcledgerError

if TYPE_CHECKING:
    from procledger import ProcessRegistry

PROG = "procledger"
EXIT_FAILURE = 1
EXIT_STOPPED = 130
"""128 + SIGINT: what a command stopped on request (Ctrl-C, ``procledger stop``) exits with."""

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


@dataclass
class CliState:
    """What the global options decided, shared with every command through ``ctx.obj``."""

    url: str | None = None
    """``--url``; ``None`` lets ``open_registry`` fall back to ``$PROCLEDGER_URL``, then the
    default SQLite ledger (docs/design.md §7)."""
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


def cli_state(ctx: typer.Context) -> CliState:
    """The global options of this invocation (set up by the app callback)."""
    state = ctx.find_root().obj
    if not isinstance(state, CliState):  # pragma: no cover - only if a caller bypasses main()
        raise TypeError("procledger CLI state missing: run the app through procledger.cli.main")
    return state


@app.callback()
def _global_options(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            metavar="URL",
            help="Store URL (memory://, sqlite:///path.db, postgresql://...). "
            "Default: $PROCLEDGER_URL, else the SQLite ledger under $XDG_DATA_HOME/procledger.",
        ),
    ] = None,
) -> None:
    state = ctx.ensure_object(CliState)
    state.url = url
    state.command = ctx.invoked_subcommand


@contextmanager
def open_ledger(url: str | None) -> Iterator[ProcessRegistry]:
    """The one way a command opens the store, closed after it. ``open_registry`` is imported
    here, through the package's public name, so that ``procledger table`` never loads a store
    and a move of the registry inside the library changes nothing in the CLI."""
    from procledger import open_registry

    registry = open_registry(url)
    try:
        yield registry
    finally:
        registry.close()


def one_line(text: str) -> str:
    """Collapse whitespace: an error is reported on exactly one line, whatever its message."""
    return " ".join(text.split())


def _fail(state: CliState, exc: BaseException) -> NoReturn:
    where = f"{PROG} {state.command}" if state.command else PROG
    detail = one_line(str(exc)) or "(no message)"
    sys.stderr.write(f"{where}: {type(exc).__name__}: {detail}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_FAILURE)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``procledger`` script and of ``python -m procledger``."""
    state = CliState()
    try:
        app(args=list(argv) if argv is not None else None, prog_name=PROG, obj=state)
    except (ProcledgerError, OSError) as exc:
        _fail(state, exc)


def dump(model: Any) -> Any:
    """A pydantic model as JSON-ready data: ids, enums and timestamps as the ledger stores them."""
    return model.model_dump(mode="json")


def write_json(value: Any) -> None:
    """One JSON document per line, flushed: a pipe reader sees each line as soon as it is done."""
    sys.stdout.write(orjson.dumps(value).decode() + "\n")
    sys.stdout.flush()
