"""Output for people: rich tables, local times, a process's outcome and command line.

rich is imported on first use: commands that print JSON or nothing for people never load it.
"""

from __future__ import annotations

import shlex
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from procledger import ProcessState

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from procledger import ProcessRecord


def console() -> Console:
    """Rich output for people; into a pipe, wide enough that ids are never folded."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 240)


def plain_table(*columns: str) -> Table:
    """A plain table whose columns never wrap, except the last (a command line) folds."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD)
    for column in columns[:-1]:
        table.add_column(column, no_wrap=True)
    table.add_column(columns[-1], overflow="fold")
    return table


def local_time(ms: int | None) -> str:
    """The ledger keeps UTC milliseconds; people read their own time zone, to the second."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def outcome(record: ProcessRecord) -> str:
    """The exit code when the process exited by itself, otherwise why it ended (if it did)."""
    if record.state is ProcessState.exited:
        return f"exit {record.exit_code}"
    return record.reason.value if record.reason else ""


def command_text(record: ProcessRecord) -> str:
    """A command line a shell would accept; work without argv shows its label or kind."""
    argv = record.input.argv
    return shlex.join(argv) if argv else (record.identity.label or record.identity.kind)
