"""What the web view shows of a process, and which processes a list selects.

A row is computed once per change on the server (the hub) and sent as JSON; the page's script
writes it with ``textContent``, never as HTML, so nothing a process says can become markup.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from procledger.domain.attempts import first_attempt_id
from procledger.domain.service import age_ms
from procledger.domain.vocabulary import ProcessState
from procledger.domain.wording import command_text, listed_outcome, local_time, shown_state

if TYPE_CHECKING:
    from procledger import ProcessListFilter, ProcessScan
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.records import ProcessRecord

PAGE_SIZE = 50
"""Rows per page of the processes list: the first page of a large ledger stays fast."""
STATUSES = ("any", "running", "completed", "failed", "cancelled", "abandoned")


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
