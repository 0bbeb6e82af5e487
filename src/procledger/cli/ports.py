"""`ports`: who holds which leased port (docs/design.md §19); and which process `stop :PORT`
stops -- the one holding that port of this host, and only if procledger started it.

`stop :PORT` looks first for a live lease of the port on this host: its service is what
`stop NAME` would stop. Without one, it asks /proc who listens on the port
(``adapters.port_owners``) and looks for a process of this ledger that is that listener or one
of its parents -- a recorded child, by its pid *and* start time on this host, so a pid that
passed to a stranger never names a record. What procledger did not start is never signalled:
the command says whose it is and stops nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from procledger.cli._app import JsonOption, cli_state, open_ledger
from procledger.cli._format import short_id, to_terminal, write_table
from procledger.cli.lines import warn, write_json
from procledger.domain.errors import NotFound, ProcledgerError

if TYPE_CHECKING:
    from procledger import ProcessRecord, ProcessRegistry
    from procledger.application.service_book import PortLease

__all__ = ["NotProcledgers", "PortRow", "port_holder", "ports"]


class NotProcledgers(ProcledgerError):
    """`stop :PORT` refused: what listens on the port is no process of this ledger (or one
    this user cannot look into). Nothing was signalled, nothing recorded."""


@dataclass(frozen=True, slots=True)
class PortRow:
    """A lease as `ports` lists it: the holder's newest attempt (``process_id``), its name
    and state -- ``reserved`` while a start has reserved the port but not registered,
    ``lapsed`` once such a reservation has run out -- and whether the lease holds."""

    port: int
    process_id: str
    name: str | None
    state: str
    live: bool
    host_id: str
    this_host: bool
    claimed_at_ms: int


def ports(
    ctx: typer.Context,
    *,
    show_all: Annotated[
        bool,
        typer.Option("--all", "-a", help="Also the leases that were released or lapsed."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """List leased ports: which process holds each.

    Live leases, this host's first, as PORT, PROCESS, NAME, STATE and HOST (--json: a list of
    objects). A lease is released when its process (its service) ends; a port reserved by a
    start that never registered lapses after a minute."""
    from procledger.adapters.proc_facts import host_id

    here = host_id()
    with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
        leases = [lease for lease in registry.services.ports() if show_all or lease.live]
        rows = [_port_row(registry, lease, here) for lease in leases]
    rows.sort(key=lambda row: (not row.this_host, row.host_id, row.port))
    if as_json:
        write_json([asdict(row) for row in rows])
    elif not rows:
        warn("no live leases (ports --all lists released ones)" if not show_all else "no leases")
    else:
        _print_rows(rows)


def _port_row(registry: ProcessRegistry, lease: PortLease, here: str) -> PortRow:
    try:
        record: ProcessRecord | None = registry.get(lease.process_id)
    except NotFound:  # a reservation not registered (yet), or a pruned holder
        record = None
    unregistered = "reserved" if lease.live else "lapsed"
    return PortRow(
        port=lease.port,
        process_id=lease.process_id,
        name=None if record is None else record.name,
        state=unregistered if record is None else record.state.value,
        live=lease.live,
        host_id=lease.host_id,
        this_host=lease.host_id == here,
        claimed_at_ms=lease.claimed_at_ms,
    )


def _print_rows(rows: list[PortRow]) -> None:
    """As `ps`: on a terminal short ids and ``this host``; into a pipe, whole values."""
    terminal = to_terminal()
    table = [
        (
            str(row.port),
            short_id(row.process_id) if terminal else row.process_id,
            row.name or "-",
            row.state,
            "this host" if terminal and row.this_host else row.host_id,
        )
        for row in rows
    ]
    write_table(("PORT", "PROCESS", "NAME", "STATE", "HOST"), table)


def port_holder(registry: ProcessRegistry, port: int) -> str:
    """The process `stop :PORT` stops: the holder of a live lease of ``port`` on this host
    (its newest attempt: a service is stopped whole), else the process of this ledger that
    listens on the port here or is a parent of the one that does.

    Raises:
        NotFound: nothing listens on the port, or it is reserved for a start that has not
            registered yet.
        NotProcledgers: what listens was not started by procledger, or cannot be looked into.
    """
    from procledger.adapters.port_owners import command_line, listeners
    from procledger.adapters.proc_facts import host_id

    for lease in registry.services.ports(host_id(), port):
        if lease.live:
            return _leased(registry, lease)
    found = listeners(port)
    if not found.inodes:
        raise NotFound(f"nothing listens on port {port}")
    if not found.pids:
        raise NotProcledgers(
            f"port {port} is held by a process procledger cannot look into (another user's?); "
            "nothing was stopped"
        )
    record = _started_here(registry, found.pids)
    if record is None:
        pid = found.pids[0]
        raise NotProcledgers(
            f"port {port} is held by pid {pid} ({command_line(pid)}), which procledger did not "
            "start; nothing was stopped"
        )
    return record.id


def _leased(registry: ProcessRegistry, lease: PortLease) -> str:
    """The leaseholder, once its start has registered."""
    try:
        return registry.get(lease.process_id).id
    except NotFound:
        raise NotFound(
            f"port {lease.port} is reserved for process {lease.process_id}, whose start has not "
            "registered yet; nothing was stopped"
        ) from None


def _started_here(registry: ProcessRegistry, pids: tuple[int, ...]) -> ProcessRecord | None:
    """The record whose child (running, or a kept orphan) is one of ``pids`` or a parent of
    one, by pid and start time on this host; the nearest parent wins."""
    from procledger.adapters.port_owners import ancestry

    chains = [ancestry(pid) for pid in pids]
    wanted = {pid for chain in chains for pid in chain}
    for candidates in (_running, _kept_orphans):
        children = _children(candidates(registry), wanted)
        for chain in chains:
            for pid in chain:
                if pid in children:
                    return children[pid]
    return None


def _children(records: list[ProcessRecord], pids: set[int]) -> dict[int, ProcessRecord]:
    """The records among ``records`` whose recorded child is alive here as one of ``pids``."""
    from procledger.adapters.proc_facts import runs_here

    return {
        facts.pid: record
        for record in records
        if (facts := record.os) is not None
        and facts.pid in pids
        and runs_here(facts.pid, facts.start_time, facts.host_id)
    }


def _running(registry: ProcessRegistry) -> list[ProcessRecord]:
    return registry.list_processes()


def _kept_orphans(registry: ProcessRegistry) -> list[ProcessRecord]:
    """Processes recorded lost whose child still runs here (``restore --keep-orphans``)."""
    from procledger.supervisor.control import orphan_running

    lost = registry.list_processes({"status": "abandoned"})
    return [record for record in lost if orphan_running(record)]
