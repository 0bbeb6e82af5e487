"""The ``procledger`` command: ``procledger [--url URL] COMMAND ...`` (docs/design.md §8).

How to add a command: write it in the module of its group -- taking ``ctx: typer.Context``
when it needs the global options (``cli_state(ctx).url``, then ``open_ledger``) -- let library
errors propagate, and register it below. ``main`` is the one place that turns an error into
exactly one line on stderr and exit code 1 (never a traceback); a usage error is one line and
exit 2; a closed pipe (``| head``) ends quietly with 0. Machine output goes to stdout as plain text;
nothing here opens a store unless the command needs one.

Start-up time: a command imports what it uses (the store, the supervisor, recovery, rich) in its
own body -- ``procledger table`` must not pay for PostgreSQL drivers and process trees. typer
reads every command's annotations on each invocation, so those name only cheap types.

- ``_app``: the Typer app, global options, error handling, opening the ledger, JSON output.
- ``_format``: output for people (rich tables, times, outcomes, command lines).
- ``_owner``: the host's CLI owner and its notification session.
- ``maintenance``: ``table``, ``rebuild``.
- ``recovery``: ``sweep``, ``worker``.
- ``running``: ``run``, in the foreground or through the host agent; ``run_options``: its
  options, each defined once (flags, help, parsing) on a field of ``RunOptions``.
- ``waiting``: ``wait`` (readiness or the end of a process or service).
- ``inspection``: ``ps``, ``show``, ``feed``.
- ``logs``: ``logs`` (captured output), ``prune`` (retention).
- ``control``: ``stop``, ``abandon``, ``restore``.
- ``serve``: ``serve``, the web view (``procledger.web``).
- ``keys``: ``keygen``.
- ``agent``: ``agent start|stop|status|run|unit`` (the host agent, docs/design.md §18).
"""

from functools import partial
from typing import TYPE_CHECKING, Any

from procledger.cli import (
    agent,
    control,
    inspection,
    keys,
    logs,
    maintenance,
    recovery,
    running,
    serve,
    verify,
    waiting,
)
from procledger.cli._app import CliState, Command, app, main

if TYPE_CHECKING:
    from procledger.domain.lifecycle_table import render_markdown, render_mermaid

# The order of registration is the order of `procledger --help`: the order a person uses them.
command = partial(app.command, cls=Command)
command(context_settings=running.RUN_CONTEXT_SETTINGS, cls=running.RunCommand)(running.run)
command()(waiting.wait)
command()(inspection.ps)
command()(inspection.show)
command(short_help="Print a process's captured output.")(logs.logs)
command()(control.stop)
command()(control.abandon)
command()(inspection.feed)
command(short_help="Serve a live web view of the ledger.")(serve.serve)
command()(control.restore)
command()(recovery.sweep)
command()(recovery.worker)
command(short_help="Delete ended processes and their output.")(logs.prune)
command(short_help="Rebuild the read models from the event log.")(maintenance.rebuild)
command(short_help="Check the ledger's integrity, chains and read models.")(verify.verify)
command()(maintenance.table)
command()(keys.keygen)
app.add_typer(agent.agent_app, name="agent")  # a group: typer lists groups after commands


def __getattr__(name: str) -> Any:
    """``render_markdown``/``render_mermaid``: `table` renders through these names, so that
    they can be replaced here (see `table`); imported on first use, as the lifecycle table's
    module is not needed by any other command (docs/design.md §1.2, cheap start-up)."""
    if name in ("render_markdown", "render_mermaid"):
        from procledger.domain import lifecycle_table  # the frozen table: no state machine

        return getattr(lifecycle_table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CliState", "app", "main", "render_markdown", "render_mermaid"]
