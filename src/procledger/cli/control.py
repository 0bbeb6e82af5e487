"""Commands that act on processes other `procledger` instances supervise (docs/design.md §8).

`stop` tells the truth: it succeeds only when someone will carry the stop out -- a live owner
holding the lease, which it asks through the ledger -- or when it carried it out itself: the
owner is gone and the recorded child is alive on this host, so it stops that tree and records
the outcome. Otherwise it records nothing, exits 1 and says what to do: `abandon` records a
process nobody owns as given up. `restore` settles this host's runs whose supervisor died.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from procledger.cli._app import (
    IdArgument,
    JsonOption,
    cli_state,
    dump,
    open_ledger,
    parse_grace,
    resolve_id,
    write_json,
)
from procledger.cli._format import command_text, ending
from procledger.cli._owner import cli_notifier, cli_owner
from procledger.supervisor.control import (
    NobodyToStop,
    StillOwned,
    abandon_process,
    live_owner,
    stop_process,
)
from procledger.supervisor.modes import StopMode

if TYPE_CHECKING:
    from procledger import ProcessRecord, ProcessRegistry

__all__ = ["NobodyToStop", "StillOwned", "abandon", "live_owner", "restore", "stop"]


def stop(
    ctx: typer.Context,
    process_id: IdArgument,
    *,
    mode: Annotated[
        StopMode,
        typer.Option(
            "--mode", help="interrupt: SIGINT first; terminate: SIGTERM first; kill: SIGKILL now."
        ),
    ] = StopMode.interrupt,
    grace: Annotated[
        str,
        typer.Option(
            "--grace",
            metavar="S",
            show_default=False,
            help="When its owner is gone and this command stops the tree itself: seconds "
            "before SIGKILL (finite, 0 to 86400).  [default: 10]",
        ),
    ] = "10",
    as_json: JsonOption = False,
) -> None:
    """Stop a process, or say why nobody can.

    Asks its live supervisor (exit 0 once the request is recorded), or -- when the supervisor
    is gone and the child still runs on this host -- stops the tree here and records how it
    ended. With neither, nothing is recorded and it exits 1 (see abandon)."""
    grace_s = parse_grace(grace)
    with open_ledger(cli_state(ctx).url) as registry:
        record = _unended(registry, process_id, as_json)
        if record is None:
            return
        record, asked = stop_process(registry, record, mode, grace_s, cli_owner())
        if asked:
            _tell_agent(registry, record.id)
    if asked:
        message = f"stop requested ({mode.reason.value}) for process {record.id}"
    else:
        message = f"stopped process {record.id} here, its supervisor being gone: {ending(record)}"
    _said(record, message, as_json)


def _tell_agent(registry: ProcessRegistry, process_id: str) -> None:
    """The stop is on record: this host's agent, if it holds the process, acts on it now."""
    from procledger.agent.launch import tell_of_stop
    from procledger.application.outbox import store_key

    tell_of_stop(store_key(registry.location), process_id)


def _unended(registry: ProcessRegistry, process_id: str, as_json: bool) -> ProcessRecord | None:
    """The record the id (or id prefix) names, or ``None`` after saying it already ended
    (stopping or abandoning an ended process is no error: there is nothing left to do)."""
    # A service's earlier attempts have ended: its newest is the one to act on (§15).
    record = registry.newest_attempt(resolve_id(registry, process_id))
    if record.state.is_terminal:
        _said(record, f"process {record.id} already ended: {record.state.value}", as_json)
        return None
    return record


def _said(record: ProcessRecord, message: str, as_json: bool) -> None:
    """A command's result: a sentence for people, or the record as JSON."""
    if as_json:
        write_json(dump(record))
    else:
        sys.stdout.write(message + "\n")


def abandon(
    ctx: typer.Context,
    process_id: IdArgument,
    *,
    reason: Annotated[
        str | None,
        typer.Option("--reason", metavar="TEXT", help="Why, kept in the record's diagnostic."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Record a process nobody owns as abandoned.

    For a process whose supervisor died, or one registered but never started. Refused while a
    live owner holds it or its child still runs (use stop)."""
    with open_ledger(cli_state(ctx).url) as registry:
        record = _unended(registry, process_id, as_json)
        if record is None:
            return
        record = abandon_process(registry, record, cli_owner(), reason)
    _said(record, f"process {record.id} abandoned", as_json)


def restore(
    ctx: typer.Context,
    *,
    keep_orphans: Annotated[
        bool,
        typer.Option(
            "--keep-orphans",
            help="Leave a child that outlived its supervisor running (the record says so); "
            "by default its tree is stopped.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Settle this host's runs whose procledger died.

    Delivers outcomes their supervisor could not write, stops (or, with --keep-orphans, keeps)
    a child still alive, records the rest lost, and republishes each completion notice."""
    from procledger import Supervisor

    with open_ledger(cli_state(ctx).url) as registry:
        owner = cli_owner()
        notifier, _ = cli_notifier(registry, owner)
        with Supervisor(registry, owner=owner, notifier=notifier) as supervisor:
            lost = supervisor.restore(keep_orphans=keep_orphans)
    if as_json:
        write_json([dump(record) for record in lost])
        return
    for record in lost:
        sys.stdout.write(f"{record.id}\t{record.state.value}\t{command_text(record)}\n")
    sys.stdout.write(f"restored {len(lost)} process{'es' if len(lost) != 1 else ''}\n")
