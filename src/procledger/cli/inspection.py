"""Commands that read the ledger and change nothing: `ps`, `show` and `feed`."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from procledger.cli._app import EXIT_STOPPED, JsonOption, cli_state, dump, open_ledger, write_json
from procledger.cli._format import command_text, console, local_time, outcome, plain_table

if TYPE_CHECKING:
    from rich.table import Table

    from procledger import ProcessEvent, ProcessRecord, ProcessRegistry

_FEED_PAGE = 500
_FEED_POLL_S = 0.25


def ps(
    ctx: typer.Context,
    *,
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Every process, not only running ones.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """List processes (running ones unless --all), by id."""
    from procledger import ProcessListFilter

    with open_ledger(cli_state(ctx).url) as registry:
        records = registry.list_processes(
            ProcessListFilter(status="any" if show_all else "running")
        )
    if as_json:
        write_json([dump(record) for record in records])
        return
    table = plain_table("ID", "STATE", "STATUS", "OUTCOME", "UPDATED", "COMMAND")
    for record in records:
        table.add_row(
            record.id,
            record.state.value,
            record.status.value,
            outcome(record),
            local_time(record.updated_at_ms),
            command_text(record),
        )
    console().print(table)


def show(
    ctx: typer.Context,
    process_id: Annotated[str, typer.Argument(metavar="ID")],
    *,
    as_json: JsonOption = False,
) -> None:
    """Show one process: its record and its whole event history."""
    with open_ledger(cli_state(ctx).url) as registry:
        record = registry.get(process_id)
        events = registry.events(process_id)
    if as_json:
        write_json({"record": dump(record), "events": [dump(e) for e in events]})
        return
    history = plain_table("SEQ", "AT", "KIND", "DETAILS")
    for event in events:
        history.add_row(
            str(event.sequence), local_time(event.occurred_at_ms), event.kind, _details(event)
        )
    out = console()
    out.print(_summary(record))
    out.print(history)


def _summary(record: ProcessRecord) -> Table:
    """`show`'s header: a borderless two-column grid, with rows only for what happened."""
    from rich.table import Table

    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    summary.add_row("id", record.id)
    summary.add_row("command", command_text(record))
    summary.add_row("state", f"{record.state.value} ({record.status.value})")
    summary.add_row("outcome", outcome(record))
    summary.add_row("disposition", record.disposition.value)
    if record.stop_requested:
        summary.add_row("stop requested", ", ".join(r.value for r in record.stop_requested))
    if record.first_started is not None:
        summary.add_row("first started by", record.first_started.owner.owner_id)
    if record.diagnostic:
        summary.add_row("diagnostic", record.diagnostic)
    return summary


def _details(event: ProcessEvent) -> str:
    """The payload fields a person scans a history for, as ``key=value``; the rest is in --json."""
    payload = event.payload if isinstance(event.payload, dict) else {}
    keys = ("state", "reason", "exit_code", "diagnostic")
    parts = [f"{k}={payload[k]}" for k in keys if payload.get(k) is not None]
    owner = payload.get("owner")
    if isinstance(owner, dict) and owner.get("owner_id"):
        parts.append(f"owner={owner['owner_id']}")
    return " ".join(parts)


def feed(
    ctx: typer.Context,
    *,
    since: Annotated[
        int, typer.Option("--since", min=0, metavar="N", help="Print changes after cursor N.")
    ] = 0,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=0, metavar="N", help="Print at most N changes, then exit."),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing changes as they happen.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help='JSON lines: {"record": ..., "cursor": N}.')
    ] = False,
) -> None:
    """Print what changed after a cursor: one line per changed process, with its cursor."""
    with open_ledger(cli_state(ctx).url) as registry:
        try:
            _print_feed(registry, since, limit, follow=follow, as_json=as_json)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_STOPPED) from None


def _print_feed(
    registry: ProcessRegistry, since: int, limit: int | None, *, follow: bool, as_json: bool
) -> None:
    """Page through the change feed, so a large backlog never sits in memory; with ``follow``,
    poll once the feed is drained."""
    from procledger import ChangeCursor

    cursor = ChangeCursor(since)
    left = limit
    while left is None or left > 0:
        page_size = _FEED_PAGE if left is None else min(left, _FEED_PAGE)
        records, cursor = registry.changes_since(cursor, page_size)
        for record in records:
            _print_change(record, as_json)
        sys.stdout.flush()
        if left is not None:
            left -= len(records)
        if not records:
            if not follow:
                return
            time.sleep(_FEED_POLL_S)


def _print_change(record: ProcessRecord, as_json: bool) -> None:
    if as_json:
        write_json({"record": dump(record), "cursor": record.change_seq})
    else:
        line = f"{record.change_seq}\t{record.id}\t{record.state.value}\t{outcome(record)}"
        sys.stdout.write(line + "\n")
