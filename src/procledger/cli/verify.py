"""`procledger verify`: is the ledger what procledger wrote, and do its read models follow from
the log? (docs/design.md §13). Exit 0 only when every check holds; otherwise 1, with one line per
problem naming the process and what failed."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from procledger.cli._app import JsonOption, cli_state, open_ledger
from procledger.cli.lines import EXIT_FAILURE, write_json

if TYPE_CHECKING:
    from procledger.application.verify import VerifyReport


def verify(ctx: typer.Context, json: JsonOption = False) -> None:
    """Check the ledger: database integrity, every hash chain, every registration, and that
    the read models equal a rebuild (a dry run: nothing is changed). Exits 1 on any problem."""
    with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
        report = registry.verify()
    if json:
        write_json(report.as_json())
    else:
        _print(report)
    if not report.ok:
        raise typer.Exit(EXIT_FAILURE)


def _print(report: VerifyReport) -> None:
    out = sys.stdout
    out.write(f"database: {report.database}\n")
    out.write(f"checked {report.processes} processes, {report.events} events\n")
    if report.unchained:
        out.write(
            f"unchained (written before hash chains; not a failure): "
            f"{len(report.unchained)} processes\n"
        )
    for problem in report.problems:
        out.write(f"FAILED {problem.describe()}\n")
    if report.ok:
        out.write("ok: the ledger verifies\n")
    else:
        out.write(f"failed: {len(report.failed)} processes, {len(report.problems)} problems\n")
