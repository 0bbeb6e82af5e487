"""The ``procledger`` command: ``procledger [--url URL] COMMAND ...`` (DESIGN.md §8).

How to add a command: decorate a function with ``@app.command()``, take ``ctx: typer.Context``
when it needs the global options (``cli_state(ctx).url``), and let library errors propagate.
``main`` is the one place that turns a ``ProcledgerError`` or ``OSError`` into exactly one line
on stderr and exit code 1; usage errors exit 2 (typer/click's own handling). Machine output goes
to stdout as plain text; nothing here opens a store unless the command needs one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, NoReturn

import typer

from procledger.domain.errors import ProcledgerError
from procledger.domain.lifecycle import render_markdown, render_mermaid

PROG = "procledger"
EXIT_FAILURE = 1


@dataclass
class CliState:
    """What the global options decided, shared with every command through ``ctx.obj``."""

    url: str | None = None
    """``--url``; ``None`` lets ``open_registry`` fall back to ``$PROCLEDGER_URL``, then the
    default SQLite ledger (DESIGN.md §7)."""
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


class TableFormat(StrEnum):
    markdown = "markdown"
    mermaid = "mermaid"


@app.command()
def table(
    fmt: Annotated[
        TableFormat,
        typer.Option(
            "--format",
            help="markdown: one row per (kind, state, reason); mermaid: the state diagram.",
        ),
    ] = TableFormat.markdown,
) -> None:
    """Print the closed lifecycle table (no store is opened)."""
    text = render_markdown() if fmt is TableFormat.markdown else render_mermaid()
    sys.stdout.write(text)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(state: CliState, exc: BaseException) -> NoReturn:
    where = f"{PROG} {state.command}" if state.command else PROG
    detail = _one_line(str(exc)) or "(no message)"
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
