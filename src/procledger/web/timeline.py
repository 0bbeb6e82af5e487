"""The timeline page's data: each attempt of each process as a span of time (docs/design.md
§16.3).

A person asking "what happened overnight" wants the shape of it -- which service kept dying,
how long the backoffs grew, when someone asked for a stop -- not rows. The ledger already
holds every attempt's start, end, readiness and outcome; ``spans`` turns records into the
spans the page's script draws (pure, so a test gives it records and reads the spans), and
the readers find the records of a window without scanning the ledger: the change feed is
ordered by time, so a bisection of one-row reads finds where the window starts, and what is
still running is read from the running index.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from procledger.domain.attempts import first_attempt_id
from procledger.domain.durations import parse_duration
from procledger.domain.errors import NotFound, OptionError
from procledger.domain.vocabulary import ProcessState
from procledger.domain.wording import command_text, outcome
from procledger.web.views import QueryError

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.records import ProcessRecord

WINDOWS: Final = ("5m", "15m", "1h", "6h", "24h")
"""The windows the page offers; ``?window=`` takes any duration from 10 s (a crash loop seen
close up) to a week."""
DEFAULT_WINDOW: Final = "1h"
SHORTEST_WINDOW_MS: Final = 10_000
LONGEST_WINDOW_MS: Final = 7 * 86_400_000
MOST_CHANGES: Final = 5_000
"""At most the records of the newest 5,000 changes of the feed are read for a window: a window
of a crash loop at full speed would otherwise be read whole; beyond it the newest are drawn
(and what still runs) and the page says so."""
MOST_IDS: Final = 200
"""At most this many processes per ``?ids=`` read (the script asks for what a batch changed)."""
PAGE: Final = 500

_OUTCOMES: Final = {
    ProcessState.failed: "failed",
    ProcessState.timed_out: "failed",
    ProcessState.signaled: "signaled",
    ProcessState.interrupted: "stopped",
    ProcessState.terminated: "stopped",
    ProcessState.killed: "stopped",
    ProcessState.lost_on_restore: "lost",
    ProcessState.abandoned: "abandoned",
}


def outcome_class(record: ProcessRecord) -> str:
    """The bar's colour: ``ok`` (exit 0), ``failed`` (another exit, a failure, a timeout),
    ``signaled`` (a signal nobody sent), ``stopped`` (on request), ``lost``, ``abandoned``,
    ``running``, or ``pending`` (not started yet: a service's next attempt in its backoff)."""
    if not record.is_terminal:
        return "running" if record.started_at_ms is not None else "pending"
    if record.state is ProcessState.exited:
        return "ok" if record.exit_code == 0 else "failed"
    return _OUTCOMES.get(record.state, "failed")


def span(record: ProcessRecord, stop_ms: int | None = None) -> dict[str, Any]:
    """One attempt as the page draws it: from its start to its end (``end_ms`` null while it
    runs; ``start_ms`` null while it waits to start, until ``starts_at_ms``), its outcome, when
    a stop was asked of it (``stop_ms``) and when it became ready (``ready_ms``). A bar links to
    the attempt's own page: ``ID.1`` for a service's first, whose id alone names the service."""
    started = record.started_at_ms
    if started is None and record.is_terminal:  # ended before it ran: a moment at its start
        started = record.created_at_ms
    ended = (record.finished_at_ms or record.updated_at_ms) if record.is_terminal else None
    service = first_attempt_id(record)
    return {
        "id": record.id,
        "service": service,
        "attempt": record.attempt,
        "label": record.name or command_text(record),  # what a person knows it by
        "href": f"/processes/{record.id}" + (".1" if record.attempt == 1 else ""),
        "outcome": outcome_class(record),
        "state": record.state.value,
        "text": outcome(record),
        "start_ms": started,
        "end_ms": ended,
        "starts_at_ms": record.starts_at_ms if started is None else None,
        "stop_ms": stop_ms,
        "ready_ms": record.ready_at_ms,
        "change_seq": record.change_seq,
    }


def spans(
    records: Iterable[ProcessRecord], stop_times: Mapping[str, int], from_ms: int
) -> list[dict[str, Any]]:
    """The spans of ``records`` that reach into the window starting at ``from_ms`` (one still
    running or waiting always does), by service then attempt: the page's rows in order, the
    oldest service first, so a new one is added below and nothing jumps."""
    found = [span(record, stop_times.get(record.id)) for record in records]
    kept = [s for s in found if s["end_ms"] is None or s["end_ms"] >= from_ms]
    return sorted(kept, key=lambda s: (s["service"], s["attempt"] or 0, s["id"]))


def window_ms(text: str | None) -> int:
    """The window a URL asks for (``?window=1h``), in milliseconds: a duration from 10 s to a
    week; ``QueryError`` otherwise."""
    try:
        milliseconds = parse_duration(text or DEFAULT_WINDOW, option="window", longest=math.inf)
    except OptionError as error:
        raise QueryError(str(error)) from None
    if not SHORTEST_WINDOW_MS <= milliseconds * 1000 <= LONGEST_WINDOW_MS:
        raise QueryError(f"window {text!r} must be from 10s to 7d")
    return int(milliseconds * 1000)


def stop_times(registry: ProcessRegistry, records: Iterable[ProcessRecord]) -> dict[str, int]:
    """When a stop was first asked of each record that has one (its ``stop_requested`` event):
    the record says that, not when, and only the stopped few have their events read. A
    service's stop is asked of its running attempt too, so it is marked there."""
    found: dict[str, int] = {}
    for record in records:
        if not record.stop_requested:
            continue
        asked = [e for e in registry.events(record.id) if e.kind == "stop_requested"]
        if asked:
            found[record.id] = asked[0].occurred_at_ms
    return found


def window_start(registry: ProcessRegistry, from_ms: int, head: int) -> int:
    """A feed position at or before the first change made at ``from_ms`` or later: a
    bisection of one-row ``changes_since`` reads (the feed lists each record once, at its last
    change, in the order of time), so the read costs the window, not the ledger."""
    low, high = 0, head
    while high - low > 1:
        middle = (low + high) // 2
        found, _ = registry.changes_since(middle, 1)
        if found and found[0].updated_at_ms < from_ms:
            low = middle
        else:
            high = middle
    return low


def records_in_window(
    registry: ProcessRegistry, from_ms: int, head: int
) -> tuple[list[ProcessRecord], bool]:
    """Every record changed since ``from_ms`` (those of the newest ``MOST_CHANGES`` changes
    at most) and every one not ended, whenever it last changed; and whether some were left
    out."""
    start = window_start(registry, from_ms, head)
    cursor = max(start, head - MOST_CHANGES)
    running = registry.list_processes({"status": "running"})
    held: dict[str, ProcessRecord] = {record.id: record for record in running}
    while True:
        page, _ = registry.changes_since(cursor, PAGE)
        for record in page:
            held[record.id] = record
        if len(page) < PAGE:
            break
        cursor = page[-1].change_seq
    return list(held.values()), head - MOST_CHANGES > start


def read_window(registry: ProcessRegistry, window: int, now_ms: int, head: int) -> dict[str, Any]:
    """``GET /api/timeline?window=``: the spans of the window ending now, and the feed
    position read before them (``cursor``: the page follows the changes after it)."""
    from_ms = now_ms - window
    records, truncated = records_in_window(registry, from_ms, head)
    return {
        "now_ms": now_ms,
        "window_ms": window,
        "cursor": head,
        "truncated": truncated,
        "spans": spans(records, stop_times(registry, records), from_ms),
    }


def read_ids(registry: ProcessRegistry, ids: list[str], now_ms: int) -> dict[str, Any]:
    """``GET /api/timeline?ids=A,B``: the spans of the processes a batch of changes named (one
    pruned meanwhile is left out), whatever their time: the page keeps what its window shows."""
    if len(ids) > MOST_IDS:
        raise QueryError(f"at most {MOST_IDS} ids at a time, not {len(ids)}")
    records = []
    for process_id in ids:
        try:
            records.append(registry.get(process_id))
        except NotFound:
            continue
    return {"now_ms": now_ms, "spans": spans(records, stop_times(registry, records), 0)}
