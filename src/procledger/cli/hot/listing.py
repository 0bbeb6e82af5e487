"""`ps` and `feed`: lists of records, read as stored (docs/design.md §8, §8.1)."""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from typing import Any

from procledger.application.document_reads import Condition, Document, LedgerReads
from procledger.cli._format import short_id, state_text, to_terminal, when, write_table
from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading
from procledger.cli.lines import EXIT_STOPPED, warn, write_json
from procledger.cli.values import UsageError
from procledger.domain.wording import command_text, listed_outcome, outcome

_STATES = (
    "starting",
    "running",
    "exited",
    "failed",
    "timed_out",
    "interrupted",
    "terminated",
    "killed",
    "signaled",
    "lost_on_restore",
    "abandoned",
)
"""The lifecycle table's states (``ProcessState``; a test holds them equal)."""
_STATUSES = ("running", "completed", "failed", "cancelled", "abandoned", "any")
"""``ProcessListFilter``'s statuses (``STATUS_VALUES``; a test holds them equal)."""
_FEED_PAGE = 500
_FEED_POLL_S = 0.25


def parse_states(values: list[str]) -> set[str]:
    """``--state``: repeatable, or comma-separated; each a state of the lifecycle table."""
    states: set[str] = set()
    for value in values:
        for name in filter(None, (part.strip() for part in value.split(","))):
            if name not in _STATES:
                message = f"{name!r} is not a state (one of: {', '.join(_STATES)})"
                raise UsageError(message, "--state")
            states.add(name)
    return states


def list_conditions(options: Namespace, wanted: set[str]) -> tuple[list[Condition], bool]:
    """The conditions `ps`'s options name, and whether it shows the running view (the
    default): a state, a status or a name given widens it to every process of that state or
    status, or every service of that name."""
    widened = options.show_all or wanted or options.name is not None
    status = options.status or ("any" if widened else "running")
    if status not in _STATUSES:
        message = f"must be one of {', '.join(_STATUSES)}, not {status!r}"
        raise UsageError(message, "--status")
    conditions: list[Condition] = [] if status == "any" else [("status", "=", status)]
    if options.label is not None:
        conditions.append(("identity_label", "=", options.label))
    if options.since is not None:
        from procledger.domain.durations import age_ms
        from procledger.domain.errors import OptionError

        try:
            ago = age_ms(options.since, option="--since")
        except OptionError as error:
            raise UsageError(str(error).removeprefix("--since: "), "--since") from None
        conditions.append(("created_at_ms", ">=", int(time.time() * 1000) - ago))
    return conditions, status == "running" and not (wanted or options.name is not None)


def ps(options: Namespace, url: str | None, *, fast: bool) -> int:
    wanted = parse_states(options.state or [])
    conditions, running_view = list_conditions(options, wanted)
    with reading(url, fast=fast) as reads:
        records, damaged = select(
            reads, conditions, wanted, options.limit, options.attempts, name=options.name
        )
        if running_view:
            records = _with_kept_orphans(reads, conditions, records, options)
        marks = {} if options.as_json else marking.marks(reads, records)[0]
    samples = _live_resources(url, records) if options.resources else None
    if options.as_json:
        extra = {} if samples is None else {"resources": samples}
        write_json({"records": records, "damaged": damaged, **extra})
        return 0
    if damaged:
        warn(f"{len(damaged)} damaged record(s) not listed: {', '.join(damaged)} (see verify)")
    _print_processes(records, everything=not running_view, marks=marks, samples=samples)
    _warn_marked(marks)
    return 0


def select(
    reads: LedgerReads,
    conditions: list[Condition],
    wanted: set[str],
    limit: int | None,
    attempts: bool,
    *,
    name: str | None = None,
) -> tuple[list[Document], list[str]]:
    """What `ps` lists, oldest created first, and the damaged ids: pages read newest first;
    states (and a service's name) kept after reading; a service as one row, its newest attempt
    (§5.2, §15.4)."""
    rows: dict[str, Document] = {}
    damaged: list[str] = []
    before = None
    while limit != 0:
        page, bad, before = reads.newest_first(conditions, limit, before)
        damaged += bad
        if not _take(rows, page, (wanted, name), attempts, limit) or before is None:
            break
    return list(rows.values())[::-1], damaged


def _take(
    rows: dict[str, Document],
    page: list[Document],
    keep: tuple[set[str], str | None],
    attempts: bool,
    limit: int | None,
) -> bool:
    """Add ``page`` to ``rows``, those of the states and name ``keep`` names (if any); whether
    more pages are wanted."""
    wanted, name = keep
    for record in page:
        if wanted and record["state"] not in wanted:
            continue
        if name is not None and record.get("name") != name:
            continue
        key = record["id"] if attempts else (record.get("attempt_of") or record["id"])
        held = rows.get(key)
        if held is not None:
            if (record.get("attempt") or 0) > (held.get("attempt") or 0):
                rows[key] = record
        elif limit is not None and len(rows) >= limit:
            return False
        else:
            rows[key] = record
    return True


def _with_kept_orphans(
    reads: LedgerReads, conditions: list[Condition], records: list[Document], options: Namespace
) -> list[Document]:
    """The running processes and, among them by creation, the kept orphans: processes
    recorded ``lost`` whose child still runs here (``restore --keep-orphans``), so none is
    invisible. Read among the abandoned ones (lost or abandoned: few), with the same filters."""
    others = [c for c in conditions if c[0] != "status"]
    lost = select(
        reads, [*others, ("status", "=", "abandoned")], {"lost_on_restore"}, None, options.attempts
    )[0]
    kept = [record for record in lost if marking.orphan_running(record)]
    if not kept:
        return records
    rows = {record["id"]: record for record in (*records, *kept)}
    listed = sorted(rows.values(), key=lambda record: (record["created_at_ms"], record["id"]))
    limit = options.limit
    return listed if limit is None else listed[-limit:] if limit else []


def _warn_marked(marks: dict[str, str]) -> None:
    """`ps`'s hint, on stderr, for the marked rows: what to do about each kind."""
    gone = sum(1 for mark in marks.values() if mark == marking.SUPERVISOR_GONE)
    orphans = len(marks) - gone
    if gone:
        what = "procledger show ID says what to do"
        warn(f"{gone} process(es) marked 'supervisor gone' are supervised by nobody: {what}")
    if orphans:
        what = "procledger stop ID stops one"
        warn(f"{orphans} process(es) recorded lost still run unsupervised (kept orphans): {what}")


def _live_resources(url: str | None, records: list[Document]) -> dict[str, Any]:
    """``--resources``: the agent's latest sample of each running row (docs/design.md §18.10)."""
    from procledger.cli.hot.live_resources import live_samples

    running = [record["id"] for record in records if record["status"] == "running"]
    return live_samples(url, running)


def _print_processes(
    records: list[Document],
    *,
    everything: bool,
    marks: dict[str, str],
    samples: dict[str, Any] | None = None,
) -> None:
    """The rows for people: a NAME column when any row is a named service (so a ledger without
    names prints as it always did), and a service waiting out its backoff as ``backoff`` with
    when its next attempt starts (docs/design.md §15.4); with ``samples`` (``--resources``),
    each tree's CPU, RSS, open files and threads before the command."""
    if not records:
        what = "processes match" if everything else "running processes (ps --all lists every one)"
        warn(f"no {what}")
        return
    terminal, now_ms = to_terminal(), int(time.time() * 1000)
    named = any(record.get("name") for record in records)
    rows = [
        (
            short_id(record["id"]) if terminal else record["id"],
            *((record.get("name") or "",) if named else ()),
            state_text(record, marks.get(record["id"]), now_ms),
            record["status"],
            listed_outcome(record, now_ms),
            when(record["updated_at_ms"], terminal),
            *(() if samples is None else _resource_cells(samples.get(record["id"]))),
            command_text(record),
        )
        for record in records
    ]
    header = ("ID", *(("NAME",) if named else ()), "STATE", "STATUS", "OUTCOME", "UPDATED")
    if samples is not None:
        header = (*header, *_resource_header())
    write_table((*header, "COMMAND"), rows)


def _resource_cells(sample: Any) -> tuple[str, ...]:
    from procledger.cli.hot.live_resources import resource_cells

    return resource_cells(sample)


def _resource_header() -> tuple[str, ...]:
    from procledger.cli.hot.live_resources import RESOURCE_HEADER

    return RESOURCE_HEADER


def feed(options: Namespace, url: str | None, *, fast: bool) -> int:
    with reading(url, fast=fast) as reads:
        try:
            _print_feed(reads, options.since, options.limit, options)
        except KeyboardInterrupt:
            return EXIT_STOPPED
    return 0


def _print_feed(reads: LedgerReads, cursor: int, limit: int | None, options: Any) -> None:
    """Page through the change feed, so a large backlog never sits in memory; with
    ``--follow``, poll once the feed is drained."""
    left = limit
    while left is None or left > 0:
        page_size = _FEED_PAGE if left is None else min(left, _FEED_PAGE)
        records, cursor = reads.changes_since(cursor, page_size)
        for record in records:
            if options.as_json:
                write_json({"record": record, "cursor": record["change_seq"]})
            else:
                line = f"{record['change_seq']}\t{record['id']}\t{record['state']}"
                sys.stdout.write(f"{line}\t{outcome(record)}\n")
        sys.stdout.flush()
        if left is not None:
            left -= len(records)
        if not records:
            if not options.follow:
                return
            time.sleep(_FEED_POLL_S)
