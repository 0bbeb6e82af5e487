"""Commands that look after the ledger rather than processes: `table` prints the lifecycle
table the ledger enforces, `rebuild` rebuilds the read models (docs/design.md §5)."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer

from procledger.cli._app import cli_state, open_ledger


class TableFormat(StrEnum):
    markdown = "markdown"
    mermaid = "mermaid"


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
    # The renderers are looked up on the package at call time: `procledger.cli.render_markdown`
    # is the seam where the error handler's tests substitute a failing one.
    import procledger.cli as package

    render = package.render_markdown if fmt is TableFormat.markdown else package.render_mermaid
    sys.stdout.write(render())


def rebuild(ctx: typer.Context) -> None:
    """Rebuild every read model from the event log (with a progress bar). Exits 1, naming
    them, when some processes could not be rebuilt: their events cannot be decoded, or their
    log does not verify (then their rows are marked damaged, never rebuilt as healthy)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with open_ledger(cli_state(ctx).url, create=False) as registry:
        columns = (
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=Console(stderr=True)) as bar:
            task = bar.add_task("rebuilding read models", total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            report = registry.rebuild(progress=progress)
    sys.stdout.write(f"rebuilt the read models from {report.applied} events\n")
    if report.damaged:
        names = ", ".join(report.damaged)
        marked = (
            f" ({len(report.marked)} marked damaged: their log does not verify)"
            if report.marked
            else ""
        )
        sys.stderr.write(
            f"procledger rebuild: did not rebuild {len(report.damaged)} damaged process(es)"
            f"{marked}: {names}; procledger verify says why\n"
        )
        raise typer.Exit(1)
