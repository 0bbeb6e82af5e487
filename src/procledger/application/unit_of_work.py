"""The one way procledger writes: load, decide, append with side effects, in one transaction.

A write unit carries everything that must commit with an event append or not at all: the lease
check before it, then the read-model rows, the tracking position and the lease release after
it. A deciding unit loads the process and lets the aggregate decide *inside* the write
transaction, so load, decision and append see one state. An optimistic-concurrency conflict
(another writer appended first) is retried by ``retry_on_conflict``, which re-reads and
re-decides, so a decision that is no longer valid raises its own typed error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any, NamedTuple
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from procledger.adapters.codec import OrjsonMapper
from procledger.adapters.sql import events as event_rows
from procledger.adapters.sql import leases as lease_rows
from procledger.adapters.sql import records as record_rows
from procledger.adapters.sql.store import Store, Tx
from procledger.application.retry import retry_on_conflict
from procledger.application.waiting import ChangeSignal
from procledger.domain.errors import LeaseLost, NotFound, StoreCorrupt, StoreError
from procledger.domain.leases import Lease
from procledger.domain.process import Process, process_uuid
from procledger.domain.records import ProcessRecord
from procledger.domain.rendering import record_document, render_record
from procledger.domain.session import Session, session_uuid
from procledger.projections.grants import apply_session_event
from procledger.projections.records import read_record

Clock = Callable[[], int]
Decision = Callable[[Process, int], Any]

AGGREGATES_KEPT = 1024
"""Processes whose last written state a registry keeps for reuse..."""
LOG_KEPT = 32
"""...if their logs are no longer than this (the copy keeps each event's bytes)."""


class Loaded(NamedTuple):
    """A process, and the notification id and stored bytes of each event it reflects: what
    must still be in the log, unchanged, for this copy to be reused."""

    process: Process
    log: tuple[tuple[int, bytes], ...]

    def still_matches(self, rows: Sequence[Any]) -> bool:
        if len(rows) < len(self.log):
            return False
        for row, (position, state) in zip(rows, self.log, strict=False):
            if row["position"] != position or row["state"] != state:
                return False
        return True


def check_live_lease(tx: Tx, lease: Lease, now_ms: int) -> None:
    """Raise ``LeaseLost`` unless ``lease`` is the process's live lease at ``now_ms``."""
    row = lease_rows.lease_row(tx, lease.process_id, lock=True)
    if (
        row is None
        or row["released"]
        or row["lease_token"] != lease.lease_token
        or int(row["fencing_token"]) != lease.fencing_token
        or int(row["expires_at_ms"]) <= now_ms
    ):
        raise LeaseLost(
            f"process {lease.process_id!r}: lease (fence {lease.fencing_token}) is missing, "
            "expired or superseded"
        )


def release_lease_row(tx: Tx, lease: Lease) -> None:
    lease_rows.release(tx, lease.process_id, lease.lease_token, lease.fencing_token)


class AppendUnit:
    """Side effects of one append: check the lease first, then project and release."""

    def __init__(
        self,
        ledger: Ledger,
        processes: Sequence[tuple[Process, list[Any]]],
        sessions: Sequence[tuple[Session, list[Any]]],
        *,
        lease: Lease | None,
        now_ms: int,
    ) -> None:
        self.ledger = ledger
        self.processes = processes
        self.sessions = sessions
        self.lease = lease
        self.now_ms = now_ms
        self.stored = self.encode()
        self.records: dict[str, ProcessRecord] = {}
        self.appended: dict[str, tuple[tuple[int, bytes], ...]] = {}  # see ``Loaded.log``

    def encode(self) -> list[StoredEvent]:
        to_stored_event = self.ledger.mapper.to_stored_event
        return [
            to_stored_event(event)
            for _, events in (*self.processes, *self.sessions)
            for event in events
        ]

    def before(self, tx: Tx) -> None:
        if self.lease is not None:
            check_live_lease(tx, self.lease, self.now_ms)

    def after(self, tx: Tx, notification_ids: Sequence[int]) -> None:
        appended = zip(notification_ids, self.stored, strict=True)
        documents = []
        loaded = set()
        for process, events in self.processes:
            if not events:
                continue
            log = tuple(
                (position, stored.state) for position, stored in islice(appended, len(events))
            )
            last = log[-1][0]
            documents.append(record_document(process, last))
            self.records[process.process_id] = render_record(process, last)
            self.appended[process.process_id] = log
            if events[0].originator_version > 1:
                loaded.add(process.process_id)
        for session, events in self.sessions:
            for event in events:
                apply_session_event(tx, session.session_id, event)
        record_rows.upsert_records(tx, documents, must_exist=loaded)
        record_rows.advance_tracking(tx, max(notification_ids, default=0))
        if self.lease is not None:
            release_lease_row(tx, self.lease)


class DecideUnit(AppendUnit):
    """An ``AppendUnit`` that loads and decides inside the write transaction itself."""

    def __init__(
        self, ledger: Ledger, process_id: str, decide: Decision, *, lease: Lease | None
    ) -> None:
        super().__init__(ledger, [], [], lease=lease, now_ms=ledger.now_ms())
        self.process_id = process_id
        self.decide_on = decide
        self.loaded: Loaded | None = None

    def decide(self, tx: Tx) -> list[StoredEvent]:
        self.loaded = loaded = self.ledger.checkout(tx, self.process_id)
        process = loaded.process
        self.decide_on(process, self.now_ms)
        self.processes = [(process, list(process.collect_events()))]
        self.stored = self.encode()
        return self.stored

    def committed(self) -> Loaded:
        """The process as this write left it (call only after the commit)."""
        assert self.loaded is not None
        process, log = self.loaded
        return Loaded(process, log + self.appended.get(self.process_id, ()))


class Ledger:
    """The write side of one opened store: loading aggregates, and saving their events with
    side effects. Application commands are built on it; nothing else writes events."""

    def __init__(self, store: Store, recorder: Any, clock: Clock, changes: ChangeSignal) -> None:
        self.store = store
        self.recorder = recorder
        self.mapper = OrjsonMapper()
        self.clock = clock
        self.changes = changes
        self._aggregates: dict[str, Loaded] = {}

    def now_ms(self) -> int:
        return int(self.clock())

    # -- loading ----------------------------------------------------------------------------

    def load_process(self, process_id: str) -> Process:
        """Replay a process from its log (``NotFound`` if it has none)."""
        with self.store.read() as tx:
            return self.replay(tx, process_id, None).process

    def checkout(self, tx: Tx, process_id: str) -> Loaded:
        """The process as its log stands, for a write in the open transaction ``tx``.

        The log is read whole, as always, but decoding and applying it is most of loading: the
        ledger keeps the copy its last write of the process left, and reuses it when every
        event that copy reflects is still in the log with the same notification id and bytes
        (a prune, a re-registration or a damaged event would differ); only newer events are
        then applied. A checked-out copy is out of the cache until its write commits, so a
        decision that fails half-way never leaves a half-mutated aggregate behind.
        """
        return self.replay(tx, process_id, self._aggregates.pop(process_id, None))

    def keep(self, loaded: Loaded) -> None:
        if len(loaded.log) > LOG_KEPT:
            return
        if len(self._aggregates) >= AGGREGATES_KEPT:
            self._aggregates.clear()
        self._aggregates[loaded.process.process_id] = loaded

    def replay(self, tx: Tx, process_id: str, cached: Loaded | None) -> Loaded:
        key = process_uuid(process_id)
        rows = event_rows.aggregate_rows(tx, key)
        if not rows:
            raise NotFound(f"process {process_id!r} not found")
        process: Any = None
        reused = 0
        if cached is not None and cached.still_matches(rows):
            process, reused = cached.process, len(cached.log)
        for row in rows[reused:]:
            process = self.decode(stored_event(key, row), process_id).mutate(process)
        return Loaded(process, tuple((row["position"], row["state"]) for row in rows))

    def stored_events(self, tx: Tx, key: UUID, after: int = 0) -> list[StoredEvent]:
        return [stored_event(key, row) for row in event_rows.aggregate_rows(tx, key, after)]

    def decode(self, stored: StoredEvent, process_id: str | None = None) -> Any:
        """One stored event; a corrupt one is a ``StoreCorrupt`` naming its process."""
        try:
            return self.mapper.to_domain_event(stored)
        except StoreError as error:
            if process_id is None:
                raise
            raise StoreCorrupt(
                f"process {process_id!r}: {error}", process_id=process_id
            ) from error.__cause__

    def load_session(self, session_id: str) -> Session | None:
        with self.store.read() as tx:
            stored = self.stored_events(tx, session_uuid(session_id))
        aggregate: Any = None
        for item in stored:
            aggregate = self.decode(item).mutate(aggregate)
        return aggregate  # type: ignore[no-any-return]

    # -- saving -----------------------------------------------------------------------------

    def save(
        self,
        processes: Sequence[Process] = (),
        sessions: Sequence[Session] = (),
        *,
        lease: Lease | None = None,
        now_ms: int,
    ) -> AppendUnit:
        """Append the aggregates' pending events with their side effects (one transaction).

        Raises:
            WriteConflict: another writer appended to one of these logs first.
        """
        collected = [(p, list(p.collect_events())) for p in processes]
        session_events = [(s, list(s.collect_events())) for s in sessions]
        unit = AppendUnit(self, collected, session_events, lease=lease, now_ms=now_ms)
        self.append(unit.stored, unit)
        return unit

    def append(self, stored: Sequence[StoredEvent], unit: Any) -> list[int]:
        """Append ``stored`` (and whatever a deciding ``unit`` adds) with the unit's side
        effects; wakes local waiters when something was written."""
        ids: list[int] = self.recorder.insert_events(stored, unit=unit)
        if ids:
            self.changes.notify()
        return ids

    def write(
        self, process_id: str, decide: Decision, *, lease: Lease | None = None
    ) -> ProcessRecord:
        """Load, decide and save in one write transaction (a conflict re-reads and re-decides).

        Returns the record as the write left it (unchanged when the decision wrote nothing).
        """

        def attempt() -> ProcessRecord | None:
            unit = DecideUnit(self, process_id, decide, lease=lease)
            self.append([], unit)
            self.keep(unit.committed())
            return unit.records.get(process_id)

        record = retry_on_conflict(attempt, f"process {process_id!r}")
        return record if record is not None else self.read_record(process_id)

    def read_record(self, process_id: str) -> ProcessRecord:
        """The process's current record (``NotFound`` if unknown)."""
        with self.store.read() as tx:
            record = read_record(tx, process_id)
        if record is None:
            raise NotFound(f"process {process_id!r} not found")
        return record


def stored_event(key: UUID, row: Any) -> StoredEvent:
    """An events-table row of one aggregate as eventsourcing's ``StoredEvent``."""
    return StoredEvent(
        originator_id=key,
        originator_version=row["originator_version"],
        topic=row["topic"],
        state=row["state"],
    )
