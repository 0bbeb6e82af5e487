"""What the web view shows of a process, and which processes a list selects.

A row is computed once per change on the server (the hub) and sent as JSON; the page's script
writes it with ``textContent``, never as HTML, so nothing a process says can become markup.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from procledger.domain.attempts import first_attempt_id
from procledger.domain.service import age_ms
from procledger.domain.vocabulary import ProcessState, ProcessStatus
from procledger.domain.wording import (
    command_text,
    listed_outcome,
    local_time,
    shown_state,
    size_text,
)

if TYPE_CHECKING:
    from procledger import ProcessListFilter, ProcessScan
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.records import ProcessRecord

PAGE_SIZE = 50
"""Rows per page of the processes list: the first page of a large ledger stays fast."""
STATUSES = ("any", *(status.value for status in ProcessStatus))


class QueryError(ValueError):
    """A list filter in a URL that names no state, status or duration."""


def row(record: ProcessRecord, now_ms: int | None = None) -> dict[str, Any]:
    """A record as a row of the processes table: what ``ps`` prints (a service's name, its
    newest attempt, ``backoff`` while that waits), plus the times the page's script needs to
    show ages and to count a backoff down (``starts_at_ms``). A service's row links to the
    service (its first id), whose page follows every attempt."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    starting = record.state is ProcessState.starting
    return {
        "id": record.id,
        "service": first_attempt_id(record),
        "attempt": record.attempt or 0,
        "name": record.name or "",
        "state": record.state.value,
        "shown_state": shown_state(record, now),
        "starts_at_ms": record.starts_at_ms if starting else None,
        "status": record.status.value,
        "outcome": listed_outcome(record, now),
        "created_ms": record.created_at_ms,
        "updated": local_time(record.updated_at_ms),
        "command": command_text(record),
        "ended": record.state.is_terminal,
        "change_seq": record.change_seq,
    }


def row_json(record: ProcessRecord) -> str:
    return orjson.dumps(row(record)).decode()


def scoped(registry: ProcessRegistry, text: str) -> tuple[str, bool]:
    """The process ``text`` names and whether it stands for its whole service, by the rule
    ``show`` and ``logs`` follow (``LedgerReads.scoped``, docs/design.md §15.4): a service's
    name or first id is the service, ``ID.N`` one attempt."""
    from procledger.application.document_reads import LedgerReads

    reads = LedgerReads(registry.run_read, store_key="", close=lambda: None, registry=registry)
    record, whole = reads.scoped(text)
    return str(record["id"]), whole


@dataclass(frozen=True)
class ListQuery:
    """The processes a list shows: ``ps``'s filters (status, state, label, since) and a page,
    newest first, before the id ``before``."""

    selection: ProcessListFilter
    states: frozenset[ProcessState]
    before: str | None
    limit: int
    params: dict[str, str]
    """The filters as query parameters, for the stream's URL and the next page's link."""

    def matches(self, record: ProcessRecord) -> bool:
        """Whether a changed record belongs in this list (the stream decides per change)."""
        if self.states and record.state not in self.states:
            return False
        return self.selection.matches(record)

    def page(self, registry: ProcessRegistry) -> ProcessScan:
        """This page, newest first, a service as one row (its newest attempt), as ``ps`` lists
        it: read backwards along the ids a page at a time, so its cost is its rows
        (docs/design.md §5.2, §16). The next page starts before the last row's service."""
        from procledger.application.listing import select_processes

        return select_processes(
            registry, self.selection, states=self.states, limit=self.limit, before=self.before
        )

    def listing(self, registry: ProcessRegistry, limit: int | None) -> ProcessScan:
        """``ps --json``'s records (a service as one row, oldest first): every match, or the
        newest ``limit``, through the same selection as ``ps``."""
        from procledger import ProcessScan
        from procledger.application.listing import select_processes

        scan = select_processes(registry, self.selection, states=self.states, limit=limit)
        return ProcessScan(scan.records[::-1], scan.damaged)


def list_query(query: Mapping[str, str], now_ms: int | None = None) -> ListQuery:
    """The list a URL asks for; ``QueryError`` for a filter that names nothing. Every process
    by default (a page that only listed running ones would drop a row as it ends); a
    ``since`` duration becomes an absolute ``from_ms`` so a stream keeps the page's window."""
    from procledger import ProcessListFilter

    status = query.get("status") or "any"
    if status not in STATUSES:
        raise QueryError(f"{status!r} is not a status (one of: {', '.join(STATUSES)})")
    keys: dict[str, object] = {"status": status}
    params = {"status": status}
    if query.get("label"):
        keys["identity_label"] = params["label"] = query["label"]
    start = _start_ms(query, now_ms)
    if start is not None:
        keys["created_at_start_ms"] = start
        params["from_ms"] = str(start)
    states = _states(query.get("state", ""))
    if states:
        params["state"] = ",".join(sorted(s.value for s in states))
    return ListQuery(
        selection=ProcessListFilter.decode(keys),
        states=states,
        before=query.get("before") or None,
        limit=_limit(query.get("limit")),
        params=params,
    )


def _start_ms(query: Mapping[str, str], now_ms: int | None) -> int | None:
    if query.get("from_ms"):
        return _integer(query["from_ms"], "from_ms")
    if not query.get("since"):
        return None
    try:
        ago = age_ms(query["since"], option="since")
    except ValueError as exc:
        raise QueryError(str(exc)) from None
    return (now_ms if now_ms is not None else int(time.time() * 1000)) - ago


def _states(text: str) -> frozenset[ProcessState]:
    states = set()
    for name in filter(None, (part.strip() for part in text.split(","))):
        try:
            states.add(ProcessState(name))
        except ValueError:
            raise QueryError(f"{name!r} is not a state") from None
    return frozenset(states)


def _limit(text: str | None) -> int:
    if not text:
        return PAGE_SIZE
    return max(1, min(_integer(text, "limit"), 1000))


def _integer(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise QueryError(f"{name} must be an integer, not {text!r}") from None


class StatusCounts:
    """How many rows the processes list shows for each status, over the whole ledger: what the
    counts above the table say, each linking to the list filtered by its status (docs/design.md
    §16.4). A row is a process, or a service (its first id): a service counts once under each
    status any of its attempts has, as the filtered list shows it once -- so a crash-looping
    service with a running attempt counts under ``running`` and ``failed``.

    Kept up to date one changed record at a time (``add``, O(1)), from the change feed the hub
    reads anyway; a record's older copy never replaces a newer one, so the first reading of the
    whole feed and the live changes may arrive in any order. ``version`` grows when a count
    changes: a stream sends the counts only then."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, str, str]] = {}  # id -> (change_seq, row, status)
        self._pairs: Counter[tuple[str, str]] = Counter()  # (status, row) -> its records
        self._rows: Counter[str] = Counter()  # row -> its records
        self._counts: Counter[str] = Counter()  # status -> rows with a record of it
        self.version = 0

    def add(self, record: ProcessRecord) -> None:
        """Count ``record`` at its change, in place of the copy held of it (if older)."""
        held = self._held.get(record.id)
        if held is not None and held[0] >= record.change_seq:
            return
        key, status = first_attempt_id(record), record.status.value
        if held is not None and held[1:] == (key, status):  # most changes: the same status
            self._held[record.id] = (record.change_seq, key, status)
            return
        before = self.counts()
        if held is not None:
            self._forget(held[1], held[2])
        self._held[record.id] = (record.change_seq, key, status)
        self._rows[key] += 1
        self._pairs[status, key] += 1
        if self._pairs[status, key] == 1:
            self._counts[status] += 1
        if self.counts() != before:
            self.version += 1

    def ids(self) -> list[str]:
        """The records counted."""
        return list(self._held)

    def discard(self, process_id: str) -> None:
        """Count ``process_id`` no more: the ledger pruned it."""
        held = self._held.pop(process_id, None)
        if held is None:
            return
        before = self.counts()
        self._forget(held[1], held[2])
        if self.counts() != before:
            self.version += 1

    def _forget(self, key: str, status: str) -> None:
        self._rows[key] -= 1
        if not self._rows[key]:
            del self._rows[key]
        self._pairs[status, key] -= 1
        if not self._pairs[status, key]:
            del self._pairs[status, key]
            self._counts[status] -= 1

    def counts(self) -> dict[str, int]:
        """``{"any": rows, STATUS: rows, ...}``: every status the filter offers, in its order."""
        return {"any": len(self._rows)} | {s.value: self._counts[s.value] for s in ProcessStatus}


def counts_json(counts: StatusCounts | None) -> str:
    """The counts as the page's script reads them; ``null`` while they are not known yet."""
    return "null" if counts is None else orjson.dumps(counts.counts()).decode()


def ledger_label(masked: str, sqlite_path: str, *, default: bool, home: str) -> str:
    """The ledger as the page's header names it: short, since it heads every page (its whole
    URL is the header's title). A SQLite file by its folder and name -- ``~`` for the home
    folder, ``…/`` for what lies above its folder -- the per-user default as such, PostgreSQL
    by its URL (no password)."""
    if default:
        return "the default ledger"
    if not sqlite_path or sqlite_path.startswith("file:") or ":memory:" in sqlite_path:
        return masked
    path = os.path.abspath(sqlite_path)
    if home and path.startswith(home.rstrip("/") + "/"):
        path = "~" + path[len(home.rstrip("/")) :]
    parts = path.split("/")
    return path if len(parts) <= 3 else "…/" + "/".join(parts[-2:])


def live_resources_line(sample: Mapping[str, Any]) -> str:
    """The agent's latest sample of a running child's tree (its ``resources`` op), as a line of
    the process page: what it uses now, and its peak so far."""
    return (
        f"CPU {sample['cpu_s']:.2f} s, RSS {size_text(int(sample['rss_bytes']))} "
        f"(peak {size_text(int(sample['peak_rss_bytes']))}), {sample['open_files']} open "
        f"files, {sample['threads']} threads (sampled {local_time(sample['sampled_at_ms'])})"
    )
