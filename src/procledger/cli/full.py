"""The full CLI: the typer app with every command, ``procledger [--url URL] COMMAND ...``
(docs/design.md §8). ``procledger.cli.entry`` answers the hot commands before this module is
imported; here they are listed (``procledger --help``) and hand their words, unparsed, to the
same parser and body (``cli.table``, ``cli.hot``) on the full path.

How to add a command: a hot one (run all the time) is a ``CommandSpec`` in ``cli.table`` with
its body in ``cli.hot``; any other is written in the module of its group -- taking ``ctx:
typer.Context`` when it needs the global options (``cli_state(ctx).url``, then
``open_ledger``) -- lets library errors propagate, and is registered below. ``main`` is the
one place that turns an error into exactly one line on stderr and exit code 1 (never a
traceback); a usage error is one line and exit 2; a closed pipe (``| head``) ends quietly with
0. Machine output goes to stdout as plain text; nothing here opens a store unless the command
needs one.

Start-up time: a command imports what it uses (the store, the supervisor, recovery, rich) in its
own body -- ``procledger table`` must not pay for PostgreSQL drivers and process trees. typer
reads every command's annotations on each invocation, so those name only cheap types.

- ``_app``: the Typer app, global options, error handling, opening the ledger, JSON output.
- ``_format``: output for people (aligned columns, times, outcomes, command lines).
- ``_owner``: the host's CLI owner and its notification session.
- ``maintenance``: ``table``, ``rebuild``.
- ``recovery``: ``sweep``, ``worker``.
- ``running``: ``run`` in the foreground, and ``--wait-ready``'s wait; ``run_options``: its
  options, each defined once (flags, help, parsing) on a field of ``RunOptions``.
- ``retention``: ``prune``.
- ``control``: ``abandon``, ``restore``, and ``stop``'s full path.
- ``serve``: ``serve``, the web view (``procledger.web``).
- ``keys``: ``keygen``.
- ``agent``: ``agent start|stop|run|unit`` (the host agent, docs/design.md §18; ``status``
  is hot).
"""

from collections.abc import Callable
from functools import partial

import typer

from procledger.cli import (
    agent,
    config,
    control,
    keys,
    maintenance,
    ports,
    recovery,
    retention,
    serve,
    services,
    table,
    verify,
)
from procledger.cli._app import CliState, Command, app, cli_state, main
from procledger.cli.table import CommandSpec


def _hot(spec: CommandSpec) -> Callable[[typer.Context], None]:
    """The typer face of a hot command: its words, unparsed, to the table's parser and body."""

    def command(ctx: typer.Context) -> None:
        from procledger.cli.dispatch import run_hot

        run_hot(spec, list(ctx.args), cli_state(ctx).url, fast=False)

    return command


def _add_hot(typer_app: typer.Typer, spec: CommandSpec) -> None:
    typer_app.command(
        name=spec.words[-1],
        help=spec.summary,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )(_hot(spec))


# The order of registration is the order of `procledger --help`: the order a person uses them.
command = partial(app.command, cls=Command)
for spec in (table.RUN, table.WAIT, table.PS, table.SHOW, table.LOGS, table.STOP, table.SEND):
    _add_hot(app, spec)
_add_hot(app, table.ATTACH)
command(short_help="Start the service file's services (converge).")(services.up)
command(short_help="Stop the service file's services.")(services.down)
command(short_help="Stop services and start them again.")(services.restart)
command()(control.abandon)
command()(ports.ports)
_add_hot(app, table.FEED)
command(short_help="Serve a live web view of the ledger.")(serve.serve)
command()(control.restore)
command()(recovery.sweep)
command()(recovery.worker)
command(short_help="Delete ended processes and their output.")(retention.prune)
command(short_help="Rebuild the read models from the event log.")(maintenance.rebuild)
command(short_help="Check the ledger's integrity, chains and read models.")(verify.verify)
command()(maintenance.table)
command()(keys.keygen)
_add_hot(agent.agent_app, table.AGENT_STATUS)
app.add_typer(agent.agent_app, name="agent")  # a group: typer lists groups after commands
app.add_typer(config.config_app, name="config")


__all__ = ["CliState", "app", "main"]
