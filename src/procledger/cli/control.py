"""Commands that act on processes other `procledger` instances supervise (docs/design.md §8).

`stop` tells the truth: it succeeds only when someone will carry the stop out -- a live owner
holding the lease, which it asks through the ledger -- or when it carried it out itself: the
owner is gone and the recorded child is alive on this host, so it stops that tree and records
the outcome. Otherwise it records nothing, exits 1 and says what to do: `abandon` records a
process nobody owns as given up. A service is stopped as a whole (no attempt starts after the
stop is recorded), and a `lost` record whose child still runs here (a kept orphan) has that
child stopped (`supervisor.control.stop_target`). `restore` settles this host's runs whose
supervisor died.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from procledger.cli._app import IdArgument, JsonOption, cli_state, dump, open_ledger, resolve_id
from procledger.cli._format import command_text, ending
from procledger.cli._owner import cli_notifier, cli_owner
from procledger.cli.lines import write_json
from procledger.cli.ports import port_holder
from procledger.supervisor.control import (
    NobodyToStop,
    StillOwned,
    Stopped,
    abandon_process,
    live_owner,
    stop_target,
)
from procledger.supervisor.modes import StopMode

if TYPE_CHECKING:
    from procledger import ProcessRecord, ProcessRegistry

__all__ = [
    "NobodyToStop",
    "StillOwned",
    "abandon",
    "live_owner",
    "restore",
    "stop_here",
    "tell_agent",
]


def stop_here(options: Any, url: str | None, port: int | None = None) -> int:
    """`stop`'s full path (``cli.hot.stopping``): ask the live supervisor, or stop the orphaned
    tree here, or say why nobody can; with ``--wait``, then wait until it has ended. ``port``
    (``stop :PORT``): the process holding that port here, if procledger started it
    (``cli.ports.port_holder``), instead of the id."""
    mode = StopMode(options.mode)
    with open_ledger(url, create=False) as registry:
        if port is None:
            found = resolve_id(registry, options.process_id)
        else:
            found = port_holder(registry, port)
        done = stop_target(registry, found, mode, options.grace, cli_owner())
        if done.how == "asked":
            tell_agent(registry, done.record.id)
        said, record = _stop_message(done, mode), done.record
        if port is not None:
            said = f"port {port}: {said}"
        if options.wait and done.how == "asked":
            if not options.as_json:
                sys.stdout.write(said + "\n")
                sys.stdout.flush()
            record = registry.await_end(record.id)
            said = f"process {record.id} ended: {ending(record)}"
    _said(record, said, options.as_json)
    return 0


def _stop_message(done: Stopped, mode: StopMode) -> str:
    """What `stop` did, in a sentence; for a service, what became of the service first."""
    record, asked = done.record, f"stop requested ({mode.reason.value})"
    gone = f"its supervisor being gone: {ending(record)}"
    if done.how == "orphan":
        return _orphan_message(done)
    if done.service is not None:
        service = done.service if record.name is None else f"{record.name} ({done.service})"
        said = f"service {service} stopped: no further attempt starts; "
        if done.how == "ended":
            return said + f"its newest attempt {record.id} had ended: {ending(record)}"
        if done.how == "asked":
            return said + f"{asked} for its attempt {record.id}"
        return said + f"stopped its attempt {record.id} here, {gone}"
    if done.how == "ended" and record.attempt is not None:
        first = record.attempt_of or record.id
        return f"service {first} already ended: its newest attempt {record.id} {ending(record)}"
    if done.how == "ended":
        return f"process {record.id} already ended: {record.state.value}"
    named = "" if record.name is None else f" ({record.name})"
    if done.how == "asked":
        return f"{asked} for process {record.id}{named}"
    return f"stopped process {record.id}{named} here, {gone}"


def _orphan_message(done: Stopped) -> str:
    """A kept orphan's stop: what was sent, and whether its child is gone."""
    import signal

    record, stop = done.record, done.orphan
    assert stop is not None
    assert record.os is not None
    sent = ", ".join(signal.Signals(number).name for number in stop.sent)
    who = f"the orphaned child (OS pid {record.os.pid}) of process {record.id}"
    if not stop.gone:
        return f"sent {sent} to {who}: it is still running (try --mode terminate)"
    ended = f"; it ended after {signal.Signals(stop.ended_by).name}" if stop.ended_by else ""
    survivors = f"; survivors: {' '.join(map(str, stop.survivors))}" if stop.survivors else ""
    return f"stopped {who} here by its recorded identity (sent {sent}{ended}{survivors})"


def tell_agent(registry: ProcessRegistry, process_id: str) -> None:
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
    with open_ledger(cli_state(ctx).url, create=False) as registry:
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

    with open_ledger(cli_state(ctx).url, create=False) as registry:
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
