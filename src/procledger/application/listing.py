"""Which processes a list shows: the one selection behind `ps`, the web view's table and its
JSON API (docs/design.md §5.2, §8, §16).

Two things a list does that the filter cannot: keep only some states (a state is not a column
of ``records``, so it is kept after reading), and show a service as one row, its newest
attempt (§15.4). Both are done here, once, over pages read newest first through the id index,
so a short list costs its own rows however long the ledger.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from procledger.domain.attempts import first_attempt_id
from procledger.projections.records import ProcessScan

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.records import ProcessRecord
    from procledger.domain.vocabulary import ProcessState
    from procledger.projections.filters import ProcessListFilter

__all__ = ["select_processes"]


def select_processes(
    registry: ProcessRegistry,
    selection: ProcessListFilter | None = None,
    *,
    states: Collection[ProcessState] = (),
    limit: int | None = None,
    before: str | None = None,
    attempts: bool = False,
) -> ProcessScan:
    """The records a list shows, newest first, and the ids of the matching damaged ones.

    ``selection`` filters in the store; ``states`` (when given) keeps only those states;
    unless ``attempts``, a service is one row, its newest attempt among those kept. At most
    ``limit`` rows (every one without), starting before the id ``before``. Pages are read
    until the rows are full and the last service's older attempts are passed."""
    rows = _Rows(states, attempts, limit)
    damaged: list[str] = []
    after = before
    while not rows.done:
        scan = registry.scan_processes(selection, limit=limit, after=after, newest_first=True)
        damaged.extend(scan.damaged)
        rows.take(scan.records)
        if limit is None or len(scan.records) + len(scan.damaged) < limit:
            break
        after = min([record.id for record in scan.records] + scan.damaged)
    return ProcessScan(rows.records(), damaged)


class _Rows:
    """The rows of a list as pages arrive: one per process, or per service (keyed by its
    first attempt's id, holding its newest attempt), until ``limit`` rows are taken and a
    record of another row comes."""

    def __init__(self, states: Collection[ProcessState], attempts: bool, limit: int | None):
        self._states = frozenset(states)
        self._attempts = attempts
        self._limit = limit
        self._rows: dict[str, ProcessRecord] = {}
        self.done = limit == 0

    def take(self, records: list[ProcessRecord]) -> None:
        for record in records:
            if self._states and record.state not in self._states:
                continue
            key = record.id if self._attempts else first_attempt_id(record)
            held = self._rows.get(key)
            if held is not None:
                if (record.attempt or 0) > (held.attempt or 0):
                    self._rows[key] = record
            elif self._limit is not None and len(self._rows) >= self._limit:
                self.done = True
                return
            else:
                self._rows[key] = record

    def records(self) -> list[ProcessRecord]:
        return list(self._rows.values())
