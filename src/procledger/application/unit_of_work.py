"""The one way procledger writes: load, decide, append with side effects, in one transaction.

A write unit carries everything that must commit with an event append or not at all: the lease
check before it, then the read-model rows, the tracking position and the lease release after
it. A deciding unit loads the process and lets the aggregate decide *inside* the write
transaction, so load, decision and append see one state. An optimistic-concurrency conflict
(another writer appended first) is retried by ``retry_on_conflict``, which re-reads and
re-decides, so a decision that is no longer valid raises its own typed error.

Every process event after the first is chained to its predecessor: the unit encodes it inside
the write transaction, where the predecessor's stored bytes are known, and adds
``prev_digest`` (``event_digest`` of the predecessor) to its stored state; the same
transaction records the new last event in ``heads`` (docs/design.md §13).
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import Any, Concatenate, NamedTuple, ParamSpec, Protocol, TypeVar
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from procledger.adapters.codec import OrjsonMapper
from procledger.adapters.sql import event_rows, head_rows, lease_rows, record_rows
from procledger.adapters.sql.damage import damaged_process, event_digest
from procledger.adapters.sql.store import Store, Tx, is_stored_int
from procledger.application.retry import retry_on_conflict
from procledger.application.waiting import ChangeSignal
from procledger.domain.errors import (
    LeaseLost,
    NotFound,
    ProcledgerError,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
)
from procledger.domain.leases import Lease
from procledger.domain.process import Process, process_uuid
from procledger.domain.records import ProcessRecord
from procledger.domain.rendering import record_forms
from procledger.domain.session import Session, session_uuid
from procledger.projections.grants import apply_session_event
from procledger.projections.queries import ReadModels

Clock = Callable[[], int]
Decision = Callable[[Process, int], Any]


class Write(NamedTuple):
    """One deciding write, not yet made: ``Ledger.make`` makes one, ``Ledger.write_all``
    several in one transaction."""

    process_id: str
    decide: Decision
    lease: Lease | None = None


AGGREGATES_KEPT = 1024
"""Processes whose last written state a registry keeps for reuse..."""
LOG_KEPT = 32
"""...if their logs are no longer than this (the copy keeps each event's bytes)."""


MISSING: Any = object()


def chained(stored: StoredEvent, prev_digest: str | None) -> StoredEvent:
    """``stored`` with ``prev_digest`` in its state (the first event of a stream has none).

    The key goes where the codec would write it back after decoding (the digest becomes a
    plain attribute of the decoded event): last of the event's own fields, before the
    ``class_version`` the codec always writes last. Splicing the bytes keeps them exactly the
    codec's, so a decoded event encodes to the stored bytes again.
    """
    if prev_digest is None:
        return stored
    state = bytes(stored.state)
    version = _CLASS_VERSION_TAIL.search(state)
    cut = version.start() if version is not None else len(state) - 1  # before ``}``
    link = b',"prev_digest":"' + prev_digest.encode() + b'"'
    return StoredEvent(
        originator_id=stored.originator_id,
        originator_version=stored.originator_version,
        topic=stored.topic,
        state=state[:cut] + link + state[cut:],
    )


_CLASS_VERSION_TAIL = re.compile(rb',"class_version":\d+\}$')


class Loaded(NamedTuple):
    """A process, and the notification id and stored bytes of each event it reflects: what
    must still be in the log, unchanged, for this copy to be reused; ``head`` is the digest of
    its last stored event when it was read from the log (what the next event chains to)."""

    process: Process
    log: tuple[tuple[int, bytes], ...]
    head: str | None = None

    def still_matches(self, rows: Sequence[Any]) -> bool:
        if len(rows) < len(self.log):
            return False
        for row, (position, state) in zip(rows, self.log, strict=False):
            if row["position"] != position or row["state"] != state:
                return False
        return True


def check_live_lease(tx: Tx, lease: Lease, now_ms: int, row: Any = MISSING) -> None:
    """Raise ``LeaseLost`` unless ``lease`` is the process's live lease at ``now_ms``;
    ``row``: its lease row as this transaction already read it locked."""
    if row is MISSING:
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


class Ahead(NamedTuple):
    """Reads a deciding write sends before its log read in a batched transaction, so that on
    PostgreSQL they travel with it (one round trip while the events table is locked, not
    three): the process's ``records`` row and, for a fenced write, its lease row, both locked
    until commit. The lease is then checked, and a found record row updated without a row
    count, from these answers -- the same checks in the same transaction, only read sooner.
    Locking the record row before the lease row is the order ``claim_next_free`` takes them
    in, so the two never wait for each other crosswise."""

    process_id: str
    record: Tx
    lease: Tx | None
    head: Tx | None = None
    """The process's ``heads`` row, which the log read is checked against (a chained ledger)."""

    @classmethod
    def send(cls, tx: Tx, process_id: str, lease: Lease | None, *, head: bool) -> Ahead:
        return cls(
            process_id,
            record_rows.lock_record(tx, process_id),
            None if lease is None else lease_rows.select_lease(tx.side(), process_id, lock=True),
            head_rows.select_head(tx.side(), process_id) if head else None,
        )


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
        also: Callable[[Tx], None] | None = None,
    ) -> None:
        self.ledger = ledger
        self.processes = processes
        self.sessions = sessions
        self.lease = lease
        self.now_ms = now_ms
        self.also = also
        self.stored: list[StoredEvent] = []
        self.records: dict[str, ProcessRecord] = {}
        self.appended: dict[str, tuple[tuple[int, bytes], ...]] = {}  # see ``Loaded.log``
        self.heads: list[tuple[str, int, str]] = []
        self.ahead: Ahead | None = None

    def decide(self, tx: Tx) -> list[StoredEvent]:
        """Encode the events inside the write transaction: each process event after a stream's
        first is chained to its predecessor as stored (read here, under the write lock)."""
        self.stored = self.encode(tx, {})
        return self.stored

    def encode(self, tx: Tx, heads: dict[str, str | None]) -> list[StoredEvent]:
        """The stored events; ``heads`` gives a process's last digest where already known."""
        to_stored_event = self.ledger.mapper.to_stored_event
        stored: list[StoredEvent] = []
        self.heads = []
        for process, events in self.processes:
            if not events:
                continue
            head: str | None = heads.get(process.process_id, MISSING)
            if head is MISSING:
                head = predecessor_digest(tx, process.process_id, events[0].originator_version)
            for event in events:
                item = chained(to_stored_event(event), head)
                head = digest = event_digest(item.topic, item.originator_version, item.state)
                stored.append(item)
            self.heads.append((process.process_id, events[-1].originator_version, digest))
        stored.extend(to_stored_event(e) for _, events in self.sessions for e in events)
        return stored

    def before(self, tx: Tx) -> None:
        if self.lease is None:
            return
        sent = None if self.ahead is None else self.ahead.lease
        check_live_lease(tx, self.lease, self.now_ms, MISSING if sent is None else sent.one())

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
            document, self.records[process.process_id] = record_forms(process, log[-1][0])
            documents.append(document)
            self.appended[process.process_id] = log
            if events[0].originator_version > 1:
                loaded.add(process.process_id)
        for session, events in self.sessions:
            for event in events:
                apply_session_event(tx, session.session_id, event)
        if self.ahead is not None and self.ahead.record.one() is not None:
            loaded.discard(self.ahead.process_id)  # its row is locked here: no count needed
        record_rows.upsert_records(tx, documents, must_exist=loaded)
        head_rows.upsert(tx, self.heads)
        record_rows.advance_tracking(tx, max(notification_ids, default=0))
        if self.lease is not None:
            release_lease_row(tx, self.lease)
        if self.also is not None:
            self.also(tx)


def predecessor_digest(tx: Tx, process_id: str, version: int) -> str | None:
    """The digest an event at ``version`` chains to: none for a stream's first event.

    Raises:
        NotFound: the predecessor is gone (the process was pruned since it was loaded).
    """
    if version <= 1:
        return None
    row = head_rows.last_event(tx, process_uuid(process_id), version - 1)
    if row is None:
        raise NotFound(f"process {process_id!r} not found")
    return event_digest(row["topic"], version - 1, row["state"])


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
        ahead = None
        if tx.batching:  # no round trips to save on SQLite: its writes stay as they were
            chained = self.ledger.chain_since(tx) is not None
            ahead = self.ahead = Ahead.send(tx, self.process_id, self.lease, head=chained)
        head = None if ahead is None else ahead.head
        self.loaded = loaded = self.ledger.checkout(tx, self.process_id, head)
        process = loaded.process
        self.decide_on(process, self.now_ms)
        self.processes = [(process, list(process.collect_events()))]
        self.stored = self.encode(tx, {self.process_id: loaded.head})
        if not self.stored and self.lease is not None and process.state.is_terminal:
            # An identical terminal replayed with its lease (the writer died between commit
            # and acknowledgement): nothing is appended, but the lease must not outlive the
            # process (docs/design.md §3.5).
            release_lease_row(tx, self.lease)
        return self.stored

    def committed(self) -> Loaded:
        """The process as this write left it (call only after the commit)."""
        assert self.loaded is not None
        process, log = self.loaded.process, self.loaded.log
        return Loaded(process, log + self.appended.get(self.process_id, ()))


class Batch:
    """Several write units of distinct processes as one: each decides, is checked and
    projects as it would alone, in one transaction. A batch is one member of a group commit
    and one call through the store, where each write alone cost as much again as its own
    work (docs/design.md §3.7); a unit that raises ends the whole batch, and its writes are
    then made one by one (``Ledger.write_all``)."""

    def __init__(self, units: Sequence[DecideUnit]) -> None:
        self.units = units
        self._counts: list[int] = []

    def decide(self, tx: Tx) -> list[StoredEvent]:
        stored: list[StoredEvent] = []
        self._counts = []
        for unit in self.units:
            decided = unit.decide(tx)
            stored.extend(decided)
            self._counts.append(len(decided))
        return stored

    def _deciding(self) -> Iterator[tuple[DecideUnit, int]]:
        """The units that append, with how many events each (one that decided nothing is
        neither checked nor projected, as alone)."""
        return ((u, n) for u, n in zip(self.units, self._counts, strict=True) if n)

    def before(self, tx: Tx) -> None:
        for unit, _ in self._deciding():
            unit.before(tx)

    def after(self, tx: Tx, notification_ids: Sequence[int]) -> None:
        start = 0
        for unit, count in self._deciding():
            unit.after(tx, notification_ids[start : start + count])
            start += count


class Ledger:
    """The write side of one opened store: loading aggregates, and saving their events with
    side effects. Application commands are built on it; nothing else writes events."""

    def __init__(self, store: Store, recorder: Any, clock: Clock, changes: ChangeSignal) -> None:
        self.store = store
        self.recorder = recorder
        self.mapper = OrjsonMapper()
        self.clock = clock
        self.changes = changes
        self.reads = ReadModels(store)
        self._aggregates: dict[str, Loaded] = {}
        self.aggregates_kept = AGGREGATES_KEPT
        self._since: Any = MISSING

    def now_ms(self) -> int:
        return int(self.clock())

    # -- loading ----------------------------------------------------------------------------

    def load_process(self, process_id: str) -> Process:
        """Replay a process from its log (``NotFound`` if it has none). A read, so a
        transaction lost mid-way simply runs again (``Store.attempt``, docs/design.md §7.3)."""
        return self.store.attempt(lambda tx: self.replay(tx, process_id, None).process)

    def checkout(self, tx: Tx, process_id: str, head: Tx | None = None) -> Loaded:
        """The process as its log stands, for a write in the open transaction ``tx``.

        The log is read whole, as always, but decoding and applying it is most of loading: the
        ledger keeps the copy its last write of the process left, and reuses it when every
        event that copy reflects is still in the log with the same notification id and bytes
        (a prune, a re-registration or a damaged event would differ); only newer events are
        then applied. A checked-out copy is out of the cache until its write commits, so a
        decision that fails half-way never leaves a half-mutated aggregate behind.
        """
        return self.replay(tx, process_id, self._aggregates.pop(process_id, None), head)

    def keep(self, loaded: Loaded) -> None:
        if len(loaded.log) > LOG_KEPT:
            return
        if len(self._aggregates) >= self.aggregates_kept:
            self._aggregates.clear()
        self._aggregates[loaded.process.process_id] = loaded

    def replay(
        self, tx: Tx, process_id: str, cached: Loaded | None, head: Tx | None = None
    ) -> Loaded:
        """The process from its log, reusing ``cached`` while the log still holds its events;
        its hash chain is checked from the last reused event on (``head``: its ``heads`` row,
        already sent), so a process whose log does not verify is never written to -- a write
        would chain the next event to an edited one and hide the edit (docs/design.md §13.1).
        """
        key = process_uuid(process_id)
        rows = event_rows.aggregate_rows(tx, key)
        if not rows:
            raise NotFound(f"process {process_id!r} not found")
        process: Any = None
        reused = 0
        if cached is not None and cached.still_matches(rows):
            process, reused = cached.process, len(cached.log)
        for row in rows[reused:]:
            event = self.decode(stored_event(key, row), process_id)
            process = apply_stored(event, process, f"process {process_id!r}", process_id)
        first = max(reused - 1, 0)  # after the fold: its errors are the more telling
        self.verify_chain(tx, process_id, rows[first:], whole=first == 0, head=head)
        last = rows[-1]
        digest = event_digest(last["topic"], last["originator_version"], last["state"])
        return Loaded(process, tuple((row["position"], row["state"]) for row in rows), digest)

    def chain_since(self, tx: Tx) -> int | None:
        """The log position at or before which events predate chains, read once (it is set
        when a chaining procledger first opens the ledger, and never moves): ``None`` for a
        ledger without chains at all (0.1.0's, opened read-only); a damaged value reads as 0,
        every event chained, the strictest reading."""
        if self._since is MISSING:
            since = head_rows.chain_since(tx)
            self._since = since if since is None or is_stored_int(since) else 0
        return self._since  # type: ignore[no-any-return]

    def verify_chain(
        self, tx: Tx, process_id: str, rows: Sequence[Any], *, whole: bool, head: Tx | None = None
    ) -> None:
        """Raise ``StoreCorrupt`` naming the process unless its events ``rows`` (to the end of
        its log; ``whole``: from its first) verify against each other and its head
        (``damage.chain_fault``; ``head``: the head row's read, already sent)."""
        fault = head_rows.log_fault(
            tx, process_id, rows, self.chain_since(tx), whole=whole, head=head
        )
        if fault is not None:
            raise damaged_process(process_id, f"its log does not verify: {fault}")

    def verified_events(self, tx: Tx, process_id: str, after: int) -> list[StoredEvent]:
        """The process's stored events after version ``after``, once its log from the one
        before them to its end has verified (``verify_chain``)."""
        key = process_uuid(process_id)
        rows = event_rows.aggregate_rows(tx, key, max(after - 1, 0))
        if rows:
            self.verify_chain(tx, process_id, rows, whole=after <= 1)
        return [stored_event(key, row) for row in rows if row["originator_version"] > after]

    def stored_events(self, tx: Tx, key: UUID, after: int = 0) -> list[StoredEvent]:
        return [stored_event(key, row) for row in event_rows.aggregate_rows(tx, key, after)]

    def decode(self, stored: StoredEvent, process_id: str | None = None) -> Any:
        """One stored event; a corrupt one is a ``StoreCorrupt`` naming its process. The chain
        link (``prev_digest``) is the store's, not the domain's: it is dropped here."""
        version = stored.originator_version
        if not is_stored_int(version):  # a damaged SQLite file
            where = "a stored event" if process_id is None else f"process {process_id!r}"
            raise StoreCorrupt(
                f"{where}: an event's version is damaged ({version!r})", process_id=process_id
            )
        try:
            event = self.mapper.to_domain_event(stored)
            event.__dict__.pop("prev_digest", None)
            return event
        except StoreError as error:
            if process_id is None:
                raise
            raise StoreCorrupt(
                f"process {process_id!r}: {error}", process_id=process_id
            ) from error.__cause__

    def load_session(self, session_id: str) -> Session | None:
        key = session_uuid(session_id)
        stored = self.store.attempt(lambda tx: self.stored_events(tx, key))
        aggregate: Any = None
        for item in stored:
            stream = f"session {session_id!r}"
            aggregate = apply_stored(self.decode(item), aggregate, stream, None)
        return aggregate  # type: ignore[no-any-return]

    # -- saving -----------------------------------------------------------------------------

    def save(
        self,
        processes: Sequence[Process] = (),
        sessions: Sequence[Session] = (),
        *,
        lease: Lease | None = None,
        now_ms: int,
        also: Callable[[Tx], None] | None = None,
    ) -> AppendUnit:
        """Append the aggregates' pending events with their side effects (one transaction);
        ``also`` writes more in that transaction, after the read models (e.g. a lease).

        Raises:
            WriteConflict: another writer appended to one of these logs first.
        """
        collected = [(p, list(p.collect_events())) for p in processes]
        session_events = [(s, list(s.collect_events())) for s in sessions]
        unit = AppendUnit(self, collected, session_events, lease=lease, now_ms=now_ms, also=also)
        self.append([], unit)
        return unit

    def append(self, stored: Sequence[StoredEvent], unit: Any) -> list[int]:
        """Append ``stored`` (and whatever a deciding ``unit`` adds) with the unit's side
        effects; wakes local waiters when something was written."""
        ids: list[int] = self.recorder.insert_events(stored, unit=unit)
        if ids:
            self.changes.notify()
        return ids

    def make(self, write: Write) -> ProcessRecord:
        """``write`` (a ``Write``) alone."""
        return self.write(write.process_id, write.decide, lease=write.lease)

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

    def write_all(self, writes: Sequence[Write]) -> list[ProcessRecord | Exception]:
        """Each write as ``write`` makes it, in one transaction when they are of distinct
        processes; if that transaction fails, one by one. Each write's record, or the error
        it alone raised (as ``write`` would).
        """
        if len(writes) > 1 and len({w.process_id for w in writes}) == len(writes):
            units = [DecideUnit(self, w.process_id, w.decide, lease=w.lease) for w in writes]
            try:  # in id order: two batches on PostgreSQL lock their rows in the same order
                self.append([], Batch(sorted(units, key=lambda unit: unit.process_id)))
            except StoreUnavailable as error:  # each would have met it: not one wait each
                return list(each_its_own(error, len(writes)))
            except Exception:  # each write then meets its own error alone
                pass
            else:
                for unit in units:
                    self.keep(unit.committed())
                return [self._written(unit) for unit in units]
        return [outcome_of(partial(self.make, write)) for write in writes]

    def _written(self, unit: DecideUnit) -> ProcessRecord | Exception:
        record = unit.records.get(unit.process_id)
        if record is not None:
            return record
        return outcome_of(lambda: self.read_record(unit.process_id))

    def read_record(self, process_id: str) -> ProcessRecord:
        """The process's current record (``NotFound`` if unknown)."""
        return self.reads.record(process_id)


T = TypeVar("T")


def each_its_own(error: Exception, count: int) -> list[Exception]:
    """``error`` for each of ``count`` writes a batch held, each a copy of its own (one
    instance raised in several threads would gather all their tracebacks)."""
    return [copy.copy(error) for _ in range(count)]


def outcome_of(call: Callable[[], T]) -> T | Exception:
    """``call()``'s value, or the exception it raised: one outcome of several made at once."""
    try:
        return call()
    except Exception as error:  # handed to the caller it belongs to
        return error


class Maker(Protocol):
    """What makes a ``Write`` alone (``ProcessRegistry.make``)."""

    def make(self, write: Write) -> ProcessRecord: ...


M = TypeVar("M", bound=Maker)
P = ParamSpec("P")


def made(
    write: Callable[Concatenate[M, P], Write], doc: str
) -> Callable[Concatenate[M, P], ProcessRecord]:
    """The ``record_*`` method of a ``*_write`` method: the same parameters, written once
    (one signature instead of two spelled alike), and the write made alone.
    ``help()`` shows those parameters, the record it returns and ``doc``."""

    @functools.wraps(write)
    def record(self: M, /, *args: P.args, **kwargs: P.kwargs) -> ProcessRecord:
        return self.make(write(self, *args, **kwargs))

    record.__doc__ = doc
    record.__name__ = "record_" + write.__name__.removesuffix("_write")
    record.__qualname__ = write.__qualname__.removesuffix(write.__name__) + record.__name__
    record.__signature__ = inspect.signature(write).replace(  # type: ignore[attr-defined]
        return_annotation="ProcessRecord"
    )
    return record


def stored_event(key: UUID, row: Any) -> StoredEvent:
    """An events-table row of one aggregate as eventsourcing's ``StoredEvent``."""
    return StoredEvent(
        originator_id=key,
        originator_version=row["originator_version"],
        topic=row["topic"],
        state=row["state"],
    )


def apply_stored(event: Any, aggregate: Any, stream: str, process_id: str | None) -> Any:
    """``event`` applied to ``aggregate``. A stored event the domain cannot apply (an unknown
    state written by hand, say) is ``StoreCorrupt`` naming its stream, never a bare KeyError."""
    try:
        return event.mutate(aggregate)
    except ProcledgerError:
        raise
    except Exception as error:
        version = getattr(event, "originator_version", "?")
        raise StoreCorrupt(
            f"{stream}: stored event v{version} ({type(event).__name__}) cannot be applied: "
            f"{error!r}",
            process_id=process_id,
        ) from error
