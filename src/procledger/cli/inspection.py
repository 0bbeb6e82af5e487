"""Commands that read the ledger and change nothing: `ps`, `show` and `feed`."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from procledger import ProcessState
from procledger.cli._app import (
    EXIT_STOPPED,
    IdArgument,
    JsonOption,
    cli_state,
    count_option,
    dump,
    open_ledger,
    option_errors,
    resolve_id,
    warn,
    write_json,
)
from procledger.cli._format import (
    command_text,
    local_time,
    outcome,
    short_time,
    to_terminal,
    write_table,
)
from procledger.domain.wording import event_details

if TYPE_CHECKING:
    from procledger import LeaseOwner, ProcessListFilter, ProcessRecord, ProcessRegistry

_FEED_PAGE = 500
_FEED_POLL_S = 0.25
_STATES = ", ".join(state.value for state in ProcessState)


def parse_age(text: str, option: str) -> int:
    """``--since 2h``, ``--older-than 30d``: milliseconds ago, or a usage error naming
    ``option``."""
    from procledger.domain.service import age_ms  # pydantic: only when a filter needs it

    with option_errors():
        return age_ms(text, option=option)


def parse_states(values: list[str]) -> set[ProcessState]:
    """``--state``: repeatable, or comma-separated; each a state of the lifecycle table."""
    states: set[ProcessState] = set()
    for value in values:
        for name in filter(None, (part.strip() for part in value.split(","))):
            try:
                states.add(ProcessState(name))
            except ValueError:
                message = f"{name!r} is not a state (one of: {_STATES})"
                raise typer.BadParameter(message, param_hint="--state") from None
    return states


_FILTER_OPTIONS = {"status": "--status", "identity_label": "--label"}


def decode_filter(keys: dict[str, object]) -> ProcessListFilter:
    """The list filter the options name; a value it refuses (``--status bogus``) is a usage
    error naming the option, like a bad ``--state``."""
    from procledger import FilterError, ProcessListFilter

    try:
        return ProcessListFilter.decode(keys)
    except FilterError as error:
        message = str(error).removeprefix(f"filter key {error.key!r}: ")
        raise typer.BadParameter(message, param_hint=_FILTER_OPTIONS.get(error.key)) from None


def list_options(
    *, show_all: bool, states: list[str], status: str | None, label: str | None, since: str | None
) -> tuple[dict[str, object], set[ProcessState]]:
    """The filter keys `ps`'s options name, and the states to keep. A state or a status given
    widens the default (running processes) to every process of that state or status."""
    wanted = parse_states(states)
    keys: dict[str, object] = {"status": status or ("any" if show_all or wanted else "running")}
    if label is not None:
        keys["identity_label"] = label
    if since is not None:
        keys["created_at_start_ms"] = int(time.time() * 1000) - parse_age(since, "--since")
    return keys, wanted


_StateOption = Annotated[
    list[str] | None,
    typer.Option("--state", metavar="STATE", help="Only this state (repeatable; a,b)."),
]
_StatusOption = Annotated[
    str | None,
    typer.Option(
        "--status",
        metavar="STATUS",
        help="Only this status: running, completed, failed, cancelled, abandoned or any.",
    ),
]
_SinceOption = Annotated[
    str | None,
    typer.Option("--since", metavar="DURATION", help="Only created in the last 90s/15m/2h/3d."),
]


def ps(
    ctx: typer.Context,
    *,
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Every process, not only running ones.")
    ] = False,
    state: _StateOption = None,
    status: _StatusOption = None,
    label: Annotated[
        str | None, typer.Option("--label", metavar="TEXT", help="Only this identity label.")
    ] = None,
    since: _SinceOption = None,
    limit: Annotated[
        int | None,
        count_option("--limit", "N", "Only the N newest."),
    ] = None,
    attempts: Annotated[
        bool, typer.Option("--attempts", help="Every attempt of a service, not only its newest.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help='{"records": [...], "damaged": [ids]}.')
    ] = False,
) -> None:
    """List processes (running ones by default).

    Running ones unless --all, --state or --status; oldest first, with full ids. Into a pipe,
    tab-separated columns. Records that cannot be read are named on stderr and never hide
    the others."""
    keys, wanted = list_options(
        show_all=show_all, states=state or [], status=status, label=label, since=since
    )
    selection = decode_filter(keys)
    running_view = keys["status"] == "running" and not wanted
    with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
        records, damaged = _listing(
            registry, selection, wanted=wanted, limit=limit, attempts=attempts
        )
        if running_view:
            records = _with_kept_orphans(registry, keys, records, limit=limit, attempts=attempts)
        marks = {} if as_json else _marks(registry, records)[0]
    if as_json:
        write_json({"records": [dump(record) for record in records], "damaged": damaged})
        return
    if damaged:
        warn(f"{len(damaged)} damaged record(s) not listed: {', '.join(damaged)} (see verify)")
    _print_processes(records, everything=not running_view, marks=marks)
    _warn_marked(marks)


def _listing(
    registry: ProcessRegistry,
    selection: ProcessListFilter,
    *,
    wanted: set[ProcessState],
    limit: int | None,
    attempts: bool,
) -> tuple[list[ProcessRecord], list[str]]:
    """What `ps` lists, oldest first, and the damaged ids: the one list selection (states
    kept after reading, a service as one row; docs/design.md §5.2) read newest first."""
    from procledger.application.listing import select_processes

    scan = select_processes(registry, selection, states=wanted, limit=limit, attempts=attempts)
    return scan.records[::-1], scan.damaged


def _with_kept_orphans(
    registry: ProcessRegistry,
    keys: dict[str, object],
    records: list[ProcessRecord],
    *,
    limit: int | None,
    attempts: bool,
) -> list[ProcessRecord]:
    """The running processes and, among them by id, the kept orphans: processes recorded
    ``lost`` whose child still runs here (``restore --keep-orphans``), so none is invisible.
    Read among the abandoned ones (lost or abandoned: few), with the same other filters."""
    from procledger.application.listing import select_processes
    from procledger.supervisor.control import orphan_running

    lost = select_processes(
        registry,
        decode_filter({**keys, "status": "abandoned"}),
        states={ProcessState.lost_on_restore},
        attempts=attempts,
    )
    kept = [record for record in lost.records if orphan_running(record)]
    if not kept:
        return records
    rows = {record.id: record for record in (*records, *kept)}
    listed = sorted(rows.values(), key=lambda record: record.id)  # oldest first, as ps lists
    return listed if limit is None else listed[-limit:] if limit else []


_SUPERVISOR_GONE = "supervisor gone"
_AGENT_ROLE = "procledger-agent"  # agent.host.AGENT_ROLE, without importing the agent
_ORPHAN_RUNNING = "orphan running"


def _marks(
    registry: ProcessRegistry, records: list[ProcessRecord]
) -> tuple[dict[str, str], dict[str, LeaseOwner]]:
    """What `ps` and `show` add to a record's state for people (the JSON stays the stored
    record): ``supervisor gone`` where its lease holder is provably dead on this host,
    ``orphan running`` where a ``lost`` record's child still runs here; and those holders."""
    from procledger.cli._owner import cli_owner
    from procledger.supervisor.control import holders_gone, orphan_running

    gone = holders_gone(registry, records, cli_owner())
    marks = dict.fromkeys(gone, _SUPERVISOR_GONE)
    marks |= {record.id: _ORPHAN_RUNNING for record in records if orphan_running(record)}
    return marks, gone


def _warn_marked(marks: dict[str, str]) -> None:
    """`ps`'s hint, on stderr, for the marked rows: what to do about each kind."""
    gone = sum(1 for mark in marks.values() if mark == _SUPERVISOR_GONE)
    orphans = len(marks) - gone
    if gone:
        what = "procledger show ID says what to do"
        warn(f"{gone} process(es) marked 'supervisor gone' are supervised by nobody: {what}")
    if orphans:
        what = "procledger stop ID stops one"
        warn(f"{orphans} process(es) recorded lost still run unsupervised (kept orphans): {what}")


def _print_processes(
    records: list[ProcessRecord], *, everything: bool, marks: dict[str, str]
) -> None:
    if not records:
        what = "processes match" if everything else "running processes (ps --all lists every one)"
        warn(f"no {what}")
        return
    when = short_time if to_terminal() else local_time
    rows = [
        (
            record.id,
            _state_text(record, marks.get(record.id)),
            record.status.value,
            outcome(record) + _attempt_note(record),
            when(record.updated_at_ms),
            command_text(record),
        )
        for record in records
    ]
    write_table(("ID", "STATE", "STATUS", "OUTCOME", "UPDATED", "COMMAND"), rows)


def _state_text(record: ProcessRecord, mark: str | None) -> str:
    return record.state.value if mark is None else f"{record.state.value} ({mark})"


def _attempt_note(record: ProcessRecord) -> str:
    """A service's row says which attempt it shows, and whether it was given up."""
    if record.attempt is None:
        return ""
    gave_up = f", gave up ({record.gave_up})" if record.gave_up else ""
    return f" · attempt {record.attempt}{gave_up}"


def show(ctx: typer.Context, process_id: IdArgument, *, as_json: JsonOption = False) -> None:
    """Show one process's record and its whole event history.

    The record includes the child's OS pid and process group, and the signal that ended it."""
    with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
        found = resolve_id(registry, process_id)
        record = registry.get(found)
        events = registry.events(found)
        attempts = registry.attempts(found) if record.attempt is not None else []
        marks, gone = ({}, {}) if as_json else _marks(registry, [record])
    if as_json:
        document = {"record": dump(record), "events": [dump(e) for e in events]}
        write_json(document | ({"attempts": [dump(a) for a in attempts]} if attempts else {}))
        return
    hint = None if record.id not in marks else _hint(record, marks[record.id], gone.get(record.id))
    _print_summary(record, marks.get(record.id), attempts[0] if attempts else None, hint)
    sys.stdout.write("\n")
    if attempts:
        _print_attempts(attempts)
    rows = [
        (str(e.sequence), local_time(e.occurred_at_ms), e.kind, event_details(e)) for e in events
    ]
    write_table(("SEQ", "AT", "KIND", "DETAILS"), rows)


def _print_attempts(attempts: list[ProcessRecord]) -> None:
    """Every attempt of the service, with its exit code or signal (docs/design.md §15)."""
    rows = [
        (str(a.attempt or 1), a.id, a.state.value, outcome(a), local_time(a.updated_at_ms))
        for a in attempts
    ]
    write_table(("ATTEMPT", "ID", "STATE", "OUTCOME", "UPDATED"), rows)
    sys.stdout.write("\n")


def _print_summary(
    record: ProcessRecord,
    mark: str | None = None,
    first: ProcessRecord | None = None,
    hint: str | None = None,
) -> None:
    """`show`'s header: one ``name  value`` line for each thing that happened; ``mark`` what
    this host sees of it beyond the record (``_marks``) and ``hint`` what to do about it,
    ``first`` its service's first attempt."""
    status = record.status.value + (f"; {mark}" if mark else "")
    rows = [
        ("id", record.id),
        ("command", command_text(record)),
        ("state", f"{record.state.value} ({status})"),
        ("outcome", outcome(record)),
        ("disposition", record.disposition.value),
    ]
    if record.os is not None:
        facts = record.os
        rows.append(("os pid", f"{facts.pid} (process group {facts.pgid}, host {facts.host_id})"))
    survivors = getattr(record, "survivors", None)
    if survivors:
        rows.append(("survivors", " ".join(str(pid) for pid in survivors)))
    if record.stop_requested:
        rows.append(("stop requested", ", ".join(r.value for r in record.stop_requested)))
    if record.first_started is not None:
        rows.append(("first started by", record.first_started.owner.owner_id))
    if record.diagnostic:
        rows.append(("diagnostic", " ".join(record.diagnostic.split())))
    if record.output is not None:
        rows.append(("output", _output_line(record)))
    rows += _service_lines(record, first)
    if hint is not None:
        rows.append(("hint", hint))
    width = max(len(name) for name, _ in rows)
    sys.stdout.write("".join(f"{name.ljust(width)}  {value}\n" for name, value in rows))


def _hint(record: ProcessRecord, mark: str, holder: LeaseOwner | None) -> str:
    """What to do about a marked process (docs/design.md §8): stop a kept orphan; have the
    gone holder's successor account for the process -- a new agent for an agent's run,
    `restore` for a `procledger run`'s -- or else stop or abandon it."""
    from procledger.adapters.liveness import runs_here
    from procledger.cli._owner import cli_owner
    from procledger.supervisor.control import host_id

    facts = record.os
    pid = facts.pid if facts is not None else None
    if mark == _ORPHAN_RUNNING:
        what = f"procledger stop {record.id} stops its tree and records how it ended"
        return f"its child (OS pid {pid}) still runs unsupervised on this host: {what}"
    runs = facts is not None and runs_here(facts.pid, facts.start_time, facts.host_id)
    holder_id = holder.owner_id if holder is not None else ""
    if holder_id == f"{_AGENT_ROLE}@{host_id()}":
        what = "procledger agent start: a new agent takes it over"
    elif holder_id == cli_owner().owner_id:
        what = "procledger restore accounts for it"
    elif runs:
        what = f"procledger stop {record.id} stops its child (OS pid {pid}) and records it"
    else:
        what = f"its child is gone too: procledger abandon {record.id} records it given up"
    return f"its supervisor is gone, so nothing will record how it ends: {what}"


def _service_lines(
    record: ProcessRecord, first: ProcessRecord | None = None
) -> list[tuple[str, str]]:
    """`show`'s readiness and restart lines (docs/design.md §15); ``first``, the service's
    first attempt, carries a stop of the whole service."""
    rows: list[tuple[str, str]] = []
    stopped = (first or record).service_stop_requested
    if stopped:
        asked = ", ".join(reason.value for reason in stopped)
        rows.append(("service stop", f"requested ({asked}): no further attempt starts"))
    if record.readiness is not None:
        ready = "not ready" if record.ready_at_ms is None else local_time(record.ready_at_ms)
        rows.append(("ready", f"{ready} (probes: {', '.join(record.readiness.probes)})"))
    if record.attempt is not None:
        of = f" of {record.attempt_of}" if record.attempt_of else ""
        rows.append(("attempt", f"{record.attempt}{of}"))
    if record.restart is not None:
        policy = record.restart
        rows.append(("restart", f"{policy.mode.value}, at most {policy.max_restarts} per "
                                f"{policy.window_s:g} s"))  # fmt: skip
    if record.gave_up:
        rows.append(("gave up", record.gave_up))
    return rows


def _output_line(record: ProcessRecord) -> str:
    """`show`'s output summary: bytes per stream, what was dropped, where the rest lives."""
    output = record.output
    assert output is not None
    if not output.capture:
        return "not captured (--no-capture)"
    streams = ", ".join(
        f"{name} {s.written} bytes ({s.kept} kept, {s.dropped} dropped)"
        for name, s in (("stdout", output.stdout), ("stderr", output.stderr))
    )
    where = f" on host {output.host_id} in {output.folder}" if output.folder else ""
    stopped = f"; capture stopped: {output.stopped}" if output.stopped else ""
    return f"{streams}{where}{stopped}"


def feed(
    ctx: typer.Context,
    *,
    since: Annotated[
        int,
        count_option("--since", "N", "Print changes after cursor N."),
    ] = 0,
    limit: Annotated[
        int | None,
        count_option("--limit", "N", "Print at most N changes, then exit."),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing changes as they happen.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help='JSON lines: {"record": ..., "cursor": N}.')
    ] = False,
) -> None:
    """Print what changed after a cursor.

    One line per changed process, with its cursor; --follow keeps printing."""
    with open_ledger(cli_state(ctx).url, create=False, read_only=True) as registry:
        try:
            _print_feed(registry, since, limit, follow=follow, as_json=as_json)
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_STOPPED) from None


def _print_feed(
    registry: ProcessRegistry, since: int, limit: int | None, *, follow: bool, as_json: bool
) -> None:
    """Page through the change feed, so a large backlog never sits in memory; with ``follow``,
    poll once the feed is drained."""
    from procledger import ChangeCursor

    cursor = ChangeCursor(since)
    left = limit
    while left is None or left > 0:
        page_size = _FEED_PAGE if left is None else min(left, _FEED_PAGE)
        records, cursor = registry.changes_since(cursor, page_size)
        for record in records:
            _print_change(record, as_json)
        sys.stdout.flush()
        if left is not None:
            left -= len(records)
        if not records:
            if not follow:
                return
            time.sleep(_FEED_POLL_S)


def _print_change(record: ProcessRecord, as_json: bool) -> None:
    if as_json:
        write_json({"record": dump(record), "cursor": record.change_seq})
    else:
        line = f"{record.change_seq}\t{record.id}\t{record.state.value}\t{outcome(record)}"
        sys.stdout.write(line + "\n")
