"""Commands that act on processes other `procledger` instances supervise: `stop` records a
request their supervisor carries out; `restore` settles the runs whose supervisor died."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from procledger.cli._app import JsonOption, cli_state, dump, open_ledger, write_json
from procledger.cli._format import command_text
from procledger.cli._owner import cli_notifier, cli_owner
from procledger.supervisor.modes import StopMode


def stop(
    ctx: typer.Context,
    process_id: Annotated[str, typer.Argument(metavar="ID")],
    *,
    mode: Annotated[
        StopMode,
        typer.Option(
            "--mode", help="interrupt: SIGINT first; terminate: SIGTERM first; kill: SIGKILL now."
        ),
    ] = StopMode.interrupt,
) -> None:
    """Record a stop request and return: the `procledger run` supervising the process carries
    it out with its own grace."""
    with open_ledger(cli_state(ctx).url) as registry:
        record = registry.get(process_id)
        if not record.state.is_terminal:
            record = registry.request_stop(process_id, mode.reason)
    if record.state.is_terminal:
        sys.stdout.write(f"process {record.id} already ended: {record.state.value}\n")
    else:
        sys.stdout.write(f"stop requested ({mode.reason.value}) for process {record.id}\n")


def restore(ctx: typer.Context, *, as_json: JsonOption = False) -> None:
    """Record as lost every running process whose `procledger run` on this host is gone (its
    recorded pid is never signalled), and republish its completion notification."""
    from procledger import Supervisor

    with open_ledger(cli_state(ctx).url) as registry:
        owner = cli_owner()
        notifier, _ = cli_notifier(registry, owner)
        with Supervisor(registry, owner=owner, notifier=notifier) as supervisor:
            lost = supervisor.restore()
    if as_json:
        write_json([dump(record) for record in lost])
        return
    for record in lost:
        sys.stdout.write(f"{record.id}\t{record.state.value}\t{command_text(record)}\n")
    sys.stdout.write(f"restored {len(lost)} process{'es' if len(lost) != 1 else ''}\n")
