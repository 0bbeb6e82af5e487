"""`prune`: retention -- ended processes deleted with their events and output (docs/design.md
§5.5), or with ``--dry-run`` listed. (`logs` is a hot command: ``cli.hot.output``.)"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from procledger.cli._app import cli_state, open_ledger, option_errors
from procledger.cli._format import command_text, local_time, short_time, to_terminal, write_table
from procledger.cli.lines import warn

if TYPE_CHECKING:
    from procledger import ProcessListFilter, ProcessRegistry


def prune(
    ctx: typer.Context,
    *,
    older_than: Annotated[
        str,
        typer.Option("--older-than", metavar="DURATION", help="Ended before 90s/15m/2h/3d ago."),
    ],
    status: Annotated[
        str | None,
        typer.Option(
            "--status", metavar="STATUS", help="Only completed, failed, cancelled or abandoned."
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="List what would be deleted (id, state, updated, command); delete nothing.",
        ),
    ] = False,
) -> None:
    """Delete ended processes last updated long ago, with their events and output."""
    cutoff = int(time.time() * 1000) - parse_age(older_than, "--older-than")
    selection = decode_filter({"status": status or "any"})
    if dry_run:
        with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
            _preview_prune(registry, cutoff, selection)
        return
    with open_ledger(cli_state(ctx).url, create=False) as registry:
        report = registry.prune_terminal(cutoff, selection)
    sys.stdout.write(f"pruned {len(report.processes)} processes ({report.events} events)\n")


def _preview_prune(registry: ProcessRegistry, cutoff_ms: int, selection: ProcessListFilter) -> None:
    """`prune --dry-run`: the processes a prune with the same options would delete now, the
    longest unchanged first, in columns as `ps` writes them (into a pipe: tab-separated, times
    in full); on stderr, how many and that nothing was deleted. A damaged record is named, not
    listed (a prune deletes it if its row says it ended before the cutoff)."""
    from procledger.application.listing import select_processes
    from procledger.application.retention import prunable

    scan = select_processes(registry, selection, attempts=True)
    records = [record for record in scan.records if prunable(record, cutoff_ms)]
    records.sort(key=lambda record: (record.updated_at_ms, record.id))
    if records:
        when = short_time if to_terminal() else local_time
        rows = [(r.id, r.state.value, when(r.updated_at_ms), command_text(r)) for r in records]
        write_table(("ID", "STATE", "UPDATED", "COMMAND"), rows)
    if scan.damaged:
        warn(f"{len(scan.damaged)} damaged record(s) not listed: {', '.join(scan.damaged)}")
    warn(f"dry run: would prune {len(records)} processes; nothing was deleted")


def parse_age(text: str, option: str) -> int:
    """``--since 2h``, ``--older-than 30d``: milliseconds ago, or a usage error naming
    ``option``."""
    from procledger.domain.durations import age_ms

    with option_errors():
        return age_ms(text, option=option)


_FILTER_OPTIONS = {"status": "--status", "identity_label": "--label"}


def decode_filter(keys: dict[str, object]) -> ProcessListFilter:
    """The list filter the options name; a value it refuses (``--status bogus``) is a usage
    error naming the option, like a bad ``--state``."""
    from procledger import FilterError, ProcessListFilter

    try:
        return ProcessListFilter.decode(keys)
    except FilterError as error:
        message = str(error).removeprefix(f"filter key {error.key!r}: ")
        raise typer.BadParameter(message, param_hint=_FILTER_OPTIONS.get(error.key)) from None
