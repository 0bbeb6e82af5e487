"""`logs`: a process's captured output (docs/design.md §14), and `prune`: retention."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from procledger.cli._app import (
    cli_state,
    open_ledger,
)
from procledger.cli.inspection import decode_filter, parse_age

if TYPE_CHECKING:
    pass


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
) -> None:
    """Delete ended processes last updated long ago, with their events and output."""
    cutoff = int(time.time() * 1000) - parse_age(older_than, "--older-than")
    selection = decode_filter({"status": status or "any"})
    with open_ledger(cli_state(ctx).url, create=False) as registry:
        report = registry.prune_terminal(cutoff, selection)
    sys.stdout.write(f"pruned {len(report.processes)} processes ({report.events} events)\n")
