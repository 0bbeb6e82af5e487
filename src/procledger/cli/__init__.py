"""The ``procledger`` command: ``procledger [--url URL] COMMAND ...`` (docs/design.md §8).

How to add a command: write it in the module of its group -- taking ``ctx: typer.Context``
when it needs the global options (``cli_state(ctx).url``, then ``open_ledger``) -- let library
errors propagate, and register it below. ``main`` is the one place that turns a
``ProcledgerError`` or ``OSError`` into exactly one line on stderr and exit code 1; usage
errors exit 2 (typer/click's own handling). Machine output goes to stdout as plain text;
nothing here opens a store unless the command needs one.

Start-up time: a command imports what it uses (the store, the supervisor, recovery, rich) in its
own body -- ``procledger table`` must not pay for PostgreSQL drivers and process trees. typer
reads every command's annotations on each invocation, so those name only cheap types.

- ``_app``: the Typer app, global options, error handling, opening the ledger, JSON output.
- ``_format``: output for people (rich tables, times, outcomes, command lines).
- ``_owner``: the host's CLI owner and its notification session.
- ``maintenance``: ``table``, ``rebuild``.
- ``recovery``: ``sweep``, ``worker``.
- ``running``: ``run``, in the foreground or detached.
- ``inspection``: ``ps``, ``show``, ``feed``.
- ``control``: ``stop``, ``restore``.
"""

from procledger.cli import control, inspection, maintenance, recovery, running
from procledger.cli._app import CliState, app, main

# `table` renders through these names, so that they can be replaced here (see `table`).
from procledger.domain.lifecycle import render_markdown, render_mermaid

# The order of registration is the order of `procledger --help`.
app.command()(maintenance.table)
app.command()(recovery.sweep)
app.command()(recovery.worker)
app.command()(maintenance.rebuild)
app.command(context_settings=running.RUN_CONTEXT_SETTINGS)(running.run)
app.command()(inspection.ps)
app.command()(inspection.show)
app.command()(inspection.feed)
app.command()(control.stop)
app.command()(control.restore)

__all__ = ["CliState", "app", "main", "render_markdown", "render_mermaid"]
