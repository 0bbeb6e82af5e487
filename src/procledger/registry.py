"""The application service: every registry command, read, lease and projection query.

A command loads the process, lets the aggregate decide, and saves the new events together with
their side effects (lease check and release, read-model rows, tracking) in one transaction. An
optimistic-concurrency conflict (another writer appended first) is retried by re-reading and
re-deciding, so a decision that is no longer valid raises its own typed error, never a raw
store error.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast
from uuid import UUID

import orjson
from eventsourcing.application import Application
from eventsourcing.persistence import IntegrityError, StoredEvent
from eventsourcing.utils import Environment

from procledger.adapters.codec import OrjsonMapper
from procledger.adapters.liveness import ProcProbe
from procledger.adapters.schema import create_tables
from procledger.adapters.store import (
    APPLICATION_NAME,
    SQLITE_LOCK_TIMEOUT_S,
    SQLiteConnections,
    Store,
    StoreLocation,
    Tx,
    application_env,
    default_url,
    opening_lock,
    parse_store_url,
    prepare_location,
)
from procledger.domain.errors import (
    AuthorityRejected,
    LeaseLost,
    NotFound,
    ProcledgerError,
    RegistrationConflict,
    StoreError,
)
from procledger.domain.leases import (
    Acquired,
    Busy,
    CompletionAuthority,
    Lease,
    LeaseOwner,
)
from procledger.domain.process import Process, process_uuid, to_process_event
from procledger.domain.records import ExternalRef, ProcessEvent, ProcessRecord, WaitState
from procledger.domain.registration import HandleDescriptor, ProcessRegistration, env_ref_for
from procledger.domain.session import Session, session_uuid
from procledger.domain.vocabulary import ProcessState, TerminalReason
from procledger.notifications.journal import JournalMixin
from procledger.projections.grants import apply_session_event
from procledger.projections.queries import ProjectionQueries
from procledger.projections.records import (
    advance_tracking,
    read_record,
    upsert_records,
)

Clock = Callable[[], int]
T = TypeVar("T")
_CONFLICT_RETRIES = 50
_AGGREGATES_KEPT = 1024  # processes whose last written state a registry keeps for reuse
_LOG_KEPT = 32  # ...if their logs are no longer than this (the copy keeps each event's bytes)


def system_clock() -> int:
    return time.time_ns() // 1_000_000


class _SaveUnit:
    """Side effects of one append: check the lease first, then project and release."""

    def __init__(
        self,
        registry: ProcessRegistry,
        processes: Sequence[tuple[Process, list[Any]]],
        sessions: Sequence[tuple[Session, list[Any]]],
        *,
        lease: Lease | None,
        now_ms: int,
    ) -> None:
        self.registry = registry
        self.store = registry.store
        self.processes = processes
        self.sessions = sessions
        self.lease = lease
        self.now_ms = now_ms
        self.stored = self._encode()
        self.records: dict[str, ProcessRecord] = {}
        self.appended: dict[str, tuple[tuple[int, bytes], ...]] = {}  # see ``_Loaded.log``

    def _encode(self) -> list[StoredEvent]:
        to_stored_event = self.registry.mapper.to_stored_event
        return [
            to_stored_event(event)
            for _, events in (*self.processes, *self.sessions)
            for event in events
        ]

    def before(self, tx: Tx) -> None:
        if self.lease is not None:
            check_live_lease(tx, self.store, self.lease, self.now_ms)

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
            documents.append(process.record_document(change_seq=last))
            self.records[process.process_id] = process.to_record(change_seq=last)
            self.appended[process.process_id] = log
            if events[0].originator_version > 1:
                loaded.add(process.process_id)
        for session, events in self.sessions:
            for event in events:
                apply_session_event(tx, self.store, session.session_id, event)
        upsert_records(tx, self.store, documents, must_exist=loaded)
        advance_tracking(tx, self.store, max(notification_ids, default=0))
        if self.lease is not None:
            release_lease_row(tx, self.store, self.lease)


class _DecideUnit(_SaveUnit):
    """A ``_SaveUnit`` that loads and decides inside the write transaction itself."""

    def __init__(
        self,
        registry: ProcessRegistry,
        process_id: str,
        decide: Callable[[Process, int], Any],
        *,
        lease: Lease | None,
        now_ms: int,
    ) -> None:
        super().__init__(registry, [], [], lease=lease, now_ms=now_ms)
        self.process_id = process_id
        self.decide_on = decide
        self.loaded: _Loaded | None = None

    def decide(self, tx: Tx) -> list[StoredEvent]:
        self.loaded = loaded = self.registry._checkout(tx, self.process_id)
        process = loaded.process
        self.decide_on(process, self.now_ms)
        self.processes = [(process, list(process.collect_events()))]
        self.stored = self._encode()
        return self.stored

    def committed(self) -> _Loaded:
        """The process as this write left it (call only after the commit)."""
        assert self.loaded is not None
        process, log = self.loaded
        return _Loaded(process, log + self.appended.get(self.process_id, ()))


class _Loaded(NamedTuple):
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


def _stored(key: UUID, row: Any) -> StoredEvent:
    return StoredEvent(
        originator_id=key,
        originator_version=row["originator_version"],
        topic=row["topic"],
        state=row["state"],
    )


def lease_from_row(process_id: str, row: Any) -> Lease:
    """A ``leases`` table row as a ``Lease`` (the row's ``released`` flag is not checked)."""
    return Lease(
        process_id=process_id,
        owner=LeaseOwner.model_validate_json(row["owner"]),
        lease_token=row["lease_token"],
        fencing_token=int(row["fencing_token"]),
        claimed_at_ms=int(row["claimed_at_ms"]),
        expires_at_ms=int(row["expires_at_ms"]),
    )


def _lock_suffix(store: Store) -> str:
    return " FOR UPDATE" if store.dialect == "postgresql" else ""


def _lease_row(tx: Tx, store: Store, process_id: str) -> Any:
    return tx.execute(
        f"SELECT * FROM {store.table('leases')} WHERE process_id=?{_lock_suffix(store)}",
        (process_id,),
    ).one()


def check_live_lease(tx: Tx, store: Store, lease: Lease, now_ms: int) -> None:
    row = _lease_row(tx, store, lease.process_id)
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


def release_lease_row(tx: Tx, store: Store, lease: Lease) -> None:
    tx.execute(
        f"UPDATE {store.table('leases')} SET released=1 "
        "WHERE process_id=? AND lease_token=? AND fencing_token=?",
        (lease.process_id, lease.lease_token, lease.fencing_token),
    )


class ProcessRegistry(ProjectionQueries, JournalMixin, Application[UUID]):
    """One ledger of processes; open it with ``open_registry``."""

    name = APPLICATION_NAME

    def __init__(self, location: StoreLocation, *, clock: Clock | None = None) -> None:
        self.location = location
        self.store = Store(location)
        self._clock: Clock = clock or system_clock
        self.probe = ProcProbe()
        self._changed = threading.Condition()
        self._waiters = 0  # how many ``_wait_for`` calls are in progress (changed under the lock)
        self._aggregates: dict[str, _Loaded] = {}
        super().__init__(env=application_env(location))
        # eventsourcing keeps its EventStore in ``self.events``; our contract names a method
        # ``events``. We append through the recorder directly, so move the store aside.
        self.event_store = self.__dict__.pop("events")
        create_tables(self.store)

    # -- eventsourcing wiring -------------------------------------------------------------------

    def construct_env(self, name: str, env: Mapping[str, str] | None = None) -> Environment:
        return Environment(name, dict(env or {}))

    def construct_mapper(self) -> OrjsonMapper:
        return OrjsonMapper()

    def construct_recorder(self) -> Any:
        recorder: Any = self.factory.application_recorder()
        recorder.store = self.store
        datastore = cast(Any, self.factory).datastore
        if self.store.dialect == "postgresql":
            self.store.postgres = datastore
        else:
            self.store.sqlite = SQLiteConnections(
                datastore.pool.db_name,
                in_memory=self.location.in_memory,
                timeout=SQLITE_LOCK_TIMEOUT_S,
            )
        return recorder

    def close(self) -> None:
        super().close()
        self.store.close()

    def now_ms(self) -> int:
        return int(self._clock())

    # -- loading and saving ---------------------------------------------------------------------

    def _load(self, process_id: str) -> Process:
        with self.store.read() as tx:
            return self._load_in(tx, process_id)

    def _load_in(self, tx: Tx, process_id: str) -> Process:
        """Replay a process from its log, read in the open transaction ``tx``."""
        return self._replay(tx, process_id, None).process

    def _checkout(self, tx: Tx, process_id: str) -> _Loaded:
        """The process as its log stands, for a write in the open transaction ``tx``.

        The log is read whole, as always, but decoding and applying it is most of loading: this
        registry keeps the copy its last write of the process left, and reuses it when every
        event that copy reflects is still in the log with the same notification id and bytes
        (a prune, a re-registration or a damaged event would differ); only newer events are
        then applied. A checked-out copy is out of the cache until its write commits, so a
        decision that fails half-way never leaves a half-mutated aggregate behind.
        """
        return self._replay(tx, process_id, self._aggregates.pop(process_id, None))

    def _keep(self, loaded: _Loaded) -> None:
        if len(loaded.log) > _LOG_KEPT:
            return
        if len(self._aggregates) >= _AGGREGATES_KEPT:
            self._aggregates.clear()
        self._aggregates[loaded.process.process_id] = loaded

    def _replay(self, tx: Tx, process_id: str, cached: _Loaded | None) -> _Loaded:
        key = process_uuid(process_id)
        rows = self._event_rows(tx, key, 0)
        if not rows:
            raise NotFound(f"process {process_id!r} not found")
        process: Any = None
        reused = 0
        if cached is not None and cached.still_matches(rows):
            process, reused = cached.process, len(cached.log)
        for row in rows[reused:]:
            process = self._decode(_stored(key, row), process_id).mutate(process)
        return _Loaded(process, tuple((row["position"], row["state"]) for row in rows))

    def _event_rows(self, tx: Tx, key: UUID, after: int) -> list[Any]:
        """One aggregate's stored events after version ``after``, in order, with positions."""
        return tx.execute(
            f"SELECT {self.store.notification_id_column} AS position, originator_version, "
            f"topic, state FROM {self.store.events_table} "
            "WHERE originator_id=? AND originator_version>? ORDER BY originator_version",
            (key if self.store.dialect == "postgresql" else key.hex, after),
        ).all()

    def _stored_events(self, tx: Tx, key: UUID, after: int = 0) -> list[StoredEvent]:
        return [_stored(key, row) for row in self._event_rows(tx, key, after)]

    def _decode(self, stored: Any, process_id: str | None = None) -> Any:
        """One stored event; a corrupt one is a ``StoreError`` naming its process."""
        try:
            return self.mapper.to_domain_event(stored)
        except StoreError as error:
            if process_id is None:
                raise
            raise StoreError(f"process {process_id!r}: {error}") from error.__cause__

    def _load_session(self, session_id: str) -> Session | None:
        with self.store.read() as tx:
            stored = self._stored_events(tx, session_uuid(session_id))
        aggregate: Any = None
        for item in stored:
            aggregate = self._decode(item).mutate(aggregate)
        return aggregate  # type: ignore[no-any-return]

    def _save(
        self,
        processes: Sequence[Process] = (),
        sessions: Sequence[Session] = (),
        *,
        lease: Lease | None = None,
        now_ms: int,
    ) -> _SaveUnit:
        collected = [(p, list(p.collect_events())) for p in processes]
        session_events = [(s, list(s.collect_events())) for s in sessions]
        unit = _SaveUnit(self, collected, session_events, lease=lease, now_ms=now_ms)
        if unit.stored:
            self.recorder.insert_events(unit.stored, unit=unit)
            self._notify_changed()
        return unit

    def _notify_changed(self) -> None:
        # A waiter counts itself in before its first look, so one that this skips looks after
        # the write committed; writers nobody waits for never touch the lock.
        if self._waiters:
            with self._changed:
                self._changed.notify_all()

    def _write(
        self,
        process_id: str,
        decide: Callable[[Process, int], Any],
        *,
        lease: Lease | None = None,
    ) -> ProcessRecord:
        """Load, decide and save in one write transaction (a conflict re-reads and re-decides)."""
        for _ in range(_CONFLICT_RETRIES):
            unit = _DecideUnit(self, process_id, decide, lease=lease, now_ms=self.now_ms())
            try:
                self.recorder.insert_events([], unit=unit)
            except IntegrityError:
                continue
            self._keep(unit.committed())
            if process_id not in unit.records:  # decided to write nothing
                return self.get(process_id)
            self._notify_changed()
            return unit.records[process_id]
        raise StoreError(f"process {process_id!r}: gave up after {_CONFLICT_RETRIES} conflicts")

    # -- registration and reads -----------------------------------------------------------------

    def register(self, registration: ProcessRegistration) -> ProcessRecord:
        for _ in range(_CONFLICT_RETRIES):
            # Insert first: a new id (the common case) costs no read; a known id collides.
            now = self.now_ms()
            process = Process.register(registration, at_ms=now)
            new_hash = process.registration_hash
            try:
                unit = self._save([process], now_ms=now)
            except IntegrityError:
                pass
            else:
                self._keep(_Loaded(process, unit.appended[registration.id]))
                return unit.records[registration.id]
            try:
                existing = self.get(registration.id)
            except NotFound:  # pruned in between: register afresh
                continue
            if existing.registration_hash != new_hash:
                raise RegistrationConflict(registration.id, existing.registration_hash, new_hash)
            return existing
        raise StoreError(f"process {registration.id!r}: registration kept conflicting")

    def get(self, process_id: str) -> ProcessRecord:
        with self.store.read() as tx:
            record = read_record(tx, self.store, process_id)
        if record is None:
            raise NotFound(f"process {process_id!r} not found")
        return record

    def events(  # type: ignore[override]  # Application.events is moved to event_store
        self, process_id: str, after: int = 0
    ) -> list[ProcessEvent]:
        with self.store.read() as tx:
            stored = self._stored_events(tx, process_uuid(process_id), after)
        if not stored and after == 0:
            raise NotFound(f"process {process_id!r} not found")
        if not stored:
            self.get(process_id)
        return [to_process_event(process_id, self._decode(s, process_id)) for s in stored]

    # -- environments ---------------------------------------------------------------------------

    def store_env(self, env: Mapping[str, str]) -> str:
        values = {str(k): str(v) for k, v in env.items()}
        env_ref = env_ref_for(values)
        with self.store.write() as tx:
            tx.execute(
                f"INSERT INTO {self.store.table('envs')} (env_ref, env) VALUES (?,?) "
                "ON CONFLICT (env_ref) DO NOTHING",
                (env_ref, orjson.dumps(values, option=orjson.OPT_SORT_KEYS).decode()),
            )
        return env_ref

    def load_env(self, env_ref: str) -> dict[str, str]:
        with self.store.read() as tx:
            row = tx.execute(
                f"SELECT env FROM {self.store.table('envs')} WHERE env_ref=?", (env_ref,)
            ).one()
        if row is None:
            raise NotFound(f"environment {env_ref!r} was never stored")
        return dict(orjson.loads(row["env"]))

    # -- lifecycle ------------------------------------------------------------------------------

    def record_started(
        self, process_id: str, started_at_ms: int, *, event_id: str | None = None
    ) -> ProcessRecord:
        return self._write(
            process_id,
            lambda p, now: p.record_started(started_at_ms, at_ms=now, event_id=_id(event_id)),
        )

    def record_backgrounded(
        self, process_id: str, at_ms: int, *, event_id: str | None = None
    ) -> ProcessRecord:
        return self._write(
            process_id,
            lambda p, now: p.record_backgrounded(at_ms, at_ms=now, event_id=_id(event_id)),
        )

    def request_stop(
        self, process_id: str, reason: TerminalReason | str, *, event_id: str | None = None
    ) -> ProcessRecord:
        return self._write(
            process_id,
            lambda p, now: p.request_stop(reason, at_ms=now, event_id=_id(event_id)),
        )

    def record_completed(
        self,
        process_id: str,
        state: ProcessState | str,
        reason: TerminalReason | str,
        *,
        exit_code: int | None = None,
        diagnostic: str | None = None,
        value: Any = None,
        event_id: str | None = None,
        lease: Lease | None = None,
        authority: CompletionAuthority | None = None,
    ) -> ProcessRecord:
        return self._write_terminal(
            process_id,
            lease,
            authority,
            lambda process, now: process.complete(
                state,
                reason,
                exit_code=exit_code,
                diagnostic=diagnostic,
                value=value,
                event_id=_id(event_id),
                authority=authority,
                at_ms=now,
            ),
        )

    def record_lost(
        self,
        process_id: str,
        *,
        diagnostic: str | None = None,
        event_id: str | None = None,
        lease: Lease | None = None,
        authority: CompletionAuthority | None = None,
    ) -> ProcessRecord:
        return self._write_terminal(
            process_id,
            lease,
            authority,
            lambda process, now: process.lose(
                diagnostic=diagnostic, event_id=_id(event_id), authority=authority, at_ms=now
            ),
        )

    def record_abandoned(
        self,
        process_id: str,
        reason: TerminalReason | str,
        *,
        owner: LeaseOwner | None = None,
        at_ms: int | None = None,
        diagnostic: str | None = None,
        event_id: str | None = None,
        lease: Lease | None = None,
        authority: CompletionAuthority | None = None,
    ) -> ProcessRecord:
        return self._write_terminal(
            process_id,
            lease,
            authority,
            lambda process, now: process.abandon(
                reason,
                owner=owner,
                evidence_at_ms=at_ms,
                diagnostic=diagnostic,
                event_id=_id(event_id),
                authority=authority,
                at_ms=now,
            ),
        )

    def _write_terminal(
        self,
        process_id: str,
        lease: Lease | None,
        authority: CompletionAuthority | None,
        command: Callable[[Process, int], bool],
    ) -> ProcessRecord:
        """A terminal write: the aggregate decides, then (only if it appends) the lease or
        authority is required; with a lease, the append also checks and releases it."""

        def decide(process: Process, now: int) -> None:
            if command(process, now):
                self._require_lease_or_authority(process, lease, authority)

        return self._write(process_id, decide, lease=lease)

    def _require_lease_or_authority(
        self, process: Process, lease: Lease | None, authority: CompletionAuthority | None
    ) -> None:
        """The last check of a terminal write (the aggregate already checked the authority)."""
        if lease is None and authority is None:
            raise AuthorityRejected(
                f"process {process.process_id!r}: a terminal write needs a live lease "
                "or a completion authority"
            )
        if lease is not None and lease.process_id != process.process_id:
            raise LeaseLost(
                f"process {process.process_id!r}: the lease is for {lease.process_id!r}"
            )

    # -- producer events and other facts --------------------------------------------------------

    def append_event(
        self, process_id: str, event_type: str, payload: Any, *, replay_key: str
    ) -> ProcessEvent:
        sequence_box: list[int] = []

        def decide(process: Process, now: int) -> None:
            sequence_box[:] = [
                process.append_producer_event(event_type, payload, replay_key=replay_key, at_ms=now)
            ]

        self._write(process_id, decide)
        sequence = sequence_box[0]
        return self.events(process_id, after=sequence - 1)[0]

    def record_first_started(self, process_id: str, owner: LeaseOwner, at_ms: int) -> ProcessRecord:
        return self._write(
            process_id, lambda p, now: p.record_first_started(owner, at_ms, at_ms=now)
        )

    def request_abandon(
        self, process_id: str, requested_by: str, *, reason: str | None = None
    ) -> ProcessRecord:
        return self._write(
            process_id, lambda p, now: p.request_abandon(requested_by, reason, at_ms=now)
        )

    def set_wait(self, process_id: str, wait: WaitState) -> ProcessRecord:
        return self._write(process_id, lambda p, now: p.set_wait(wait, at_ms=now))

    def clear_wait(self, process_id: str) -> ProcessRecord:
        return self._write(process_id, lambda p, now: p.clear_wait(at_ms=now))

    def set_external_ref(self, process_id: str, ref: ExternalRef) -> ProcessRecord:
        return self._write(process_id, lambda p, now: p.set_external_ref(ref, at_ms=now))

    # -- waiting --------------------------------------------------------------------------------

    def await_event(
        self,
        process_id: str,
        event_type: str,
        *,
        after: int = 0,
        timeout: float | None = None,
    ) -> ProcessEvent:
        def find() -> ProcessEvent | None:
            for event in self.events(process_id, after=after):
                if event.kind == event_type and event.sequence > after:
                    return event
            return None

        return self._wait_for(find, timeout, f"{event_type!r} on process {process_id!r}")

    def await_terminal(self, process_id: str, *, timeout: float | None = None) -> ProcessRecord:
        def find() -> ProcessRecord | None:
            record = self.get(process_id)
            return record if record.state.is_terminal else None

        return self._wait_for(find, timeout, f"the terminal of process {process_id!r}")

    def _wait_for(self, find: Callable[[], T | None], timeout: float | None, what: str) -> T:
        """Re-check on every local write, and poll with backoff for other processes' writes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        with self._changed:
            self._waiters += 1
        try:
            while True:
                with self._changed:
                    found = find()
                    if found is not None:
                        return found
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"timed out waiting for {what}")
                    self._changed.wait(pause if remaining is None else min(pause, remaining))
                pause = min(pause * 2, 0.1)
        finally:
            with self._changed:
                self._waiters -= 1

    # -- leases ---------------------------------------------------------------------------------

    def claim_lease(self, process_id: str, owner: LeaseOwner, ttl_ms: int) -> Acquired | Busy:
        return self._take_lease(process_id, owner, ttl_ms, observed=None)

    def reclaim_lease(
        self, process_id: str, claimant: LeaseOwner, observed: Lease, ttl_ms: int
    ) -> Acquired | Busy:
        return self._take_lease(process_id, claimant, ttl_ms, observed=observed)

    def _take_lease(
        self, process_id: str, owner: LeaseOwner, ttl_ms: int, *, observed: Lease | None
    ) -> Acquired | Busy:
        _check_ttl(ttl_ms)
        self.get(process_id)
        now = self.now_ms()
        table = self.store.table("leases")
        with self.store.write() as tx:
            tx.execute(
                f"INSERT INTO {table} (process_id, owner, lease_token, fencing_token, "
                "claimed_at_ms, expires_at_ms, released) VALUES (?, '{}', '', 0, 0, 0, 1) "
                "ON CONFLICT (process_id) DO NOTHING",
                (process_id,),
            )
            row = _lease_row(tx, self.store, process_id)
            live = not row["released"] and int(row["expires_at_ms"]) > now
            if live:
                holder = lease_from_row(process_id, row)
                if observed is None and holder.owner.same_incarnation(owner):
                    return Acquired(lease=self._extend(tx, holder, now + ttl_ms))
                if observed is None or holder != observed:
                    return Busy(holder=holder)
                if not self.probe.provably_dead(holder.owner, owner):
                    return Busy(holder=holder)
            lease = Lease(
                process_id=process_id,
                owner=owner,
                lease_token=secrets.token_urlsafe(16),
                fencing_token=int(row["fencing_token"]) + 1,
                claimed_at_ms=now,
                expires_at_ms=now + ttl_ms,
            )
            tx.execute(
                f"UPDATE {table} SET owner=?, lease_token=?, fencing_token=?, claimed_at_ms=?, "
                "expires_at_ms=?, released=0 WHERE process_id=?",
                (
                    lease.owner.model_dump_json(),
                    lease.lease_token,
                    lease.fencing_token,
                    lease.claimed_at_ms,
                    lease.expires_at_ms,
                    process_id,
                ),
            )
            return Acquired(lease=lease)

    def _extend(self, tx: Tx, lease: Lease, expires_at_ms: int) -> Lease:
        tx.execute(
            f"UPDATE {self.store.table('leases')} SET expires_at_ms=? "
            "WHERE process_id=? AND lease_token=? AND fencing_token=?",
            (expires_at_ms, lease.process_id, lease.lease_token, lease.fencing_token),
        )
        return lease.model_copy(update={"expires_at_ms": expires_at_ms})

    def get_lease(self, process_id: str) -> Lease | None:
        with self.store.read() as tx:
            row = tx.execute(
                f"SELECT * FROM {self.store.table('leases')} WHERE process_id=?", (process_id,)
            ).one()
        if row is None:
            self.get(process_id)  # an unknown process is NotFound, not "never claimed"
            return None
        if row["released"]:
            return None
        return lease_from_row(process_id, row)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        _check_ttl(ttl_ms)
        now = self.now_ms()
        with self.store.write() as tx:
            check_live_lease(tx, self.store, lease, now)
            return self._extend(tx, lease, now + ttl_ms)

    def release_lease(self, lease: Lease) -> None:
        with self.store.write() as tx:
            release_lease_row(tx, self.store, lease)

    # -- grants ---------------------------------------------------------------------------------

    def _save_sessions(
        self, sessions: Sequence[Session], processes: Sequence[Process] = ()
    ) -> None:
        self._save(processes, sessions, now_ms=self.now_ms())

    def _session(self, session_id: str, now: int) -> Session:
        return self._load_session(session_id) or Session.open(session_id, at_ms=now)

    def grant_handle(self, session_id: str, process_id: str, descriptor: Any = None) -> None:
        record = self.get(process_id)
        descriptor_json = _descriptor_json(descriptor, record)
        for _ in range(_CONFLICT_RETRIES):
            now = self.now_ms()
            session = self._session(session_id, now)
            if not session.grant(process_id, descriptor_json, at_ms=now):
                return
            try:
                self._save_sessions([session])
                return
            except IntegrityError:
                continue
        raise StoreError(f"session {session_id!r}: grant kept conflicting")

    def revoke_handle(self, session_id: str, process_id: str) -> None:
        for _ in range(_CONFLICT_RETRIES):
            session = self._load_session(session_id)
            if session is None or not session.revoke(process_id, at_ms=self.now_ms()):
                raise _not_granted(process_id)
            try:
                self._save_sessions([session])
                return
            except IntegrityError:
                continue
        raise StoreError(f"session {session_id!r}: revoke kept conflicting")

    def transfer_handles(
        self, from_session: str, to_session: str, process_ids: Sequence[str]
    ) -> None:
        process_ids = list(dict.fromkeys(process_ids))  # a repeated id moves once
        for _ in range(_CONFLICT_RETRIES):
            now = self.now_ms()
            source = self._load_session(from_session)
            for process_id in process_ids:
                if source is None or not source.holds(process_id):
                    raise _not_granted(process_id)
            if source is None or from_session == to_session:
                return  # nothing to move (no ids, or to itself)
            target = self._session(to_session, now)
            for process_id in process_ids:
                descriptor = source.grants[process_id]
                source.revoke(process_id, at_ms=now)
                target.grant(process_id, descriptor, at_ms=now)
            try:
                self._save_sessions([source, target])
                return
            except IntegrityError:
                continue
        raise StoreError(f"session {from_session!r}: transfer kept conflicting")


def _not_granted(process_id: str) -> NotFound:
    """The same message for "ungranted" and "unknown": a session learns nothing it can't see."""
    return NotFound(f"process {process_id!r} not found")


def _descriptor_json(descriptor: Any, record: ProcessRecord) -> dict[str, Any]:
    if descriptor is None:
        descriptor = record.descriptor or HandleDescriptor(
            kind=record.identity.kind, label=record.identity.label
        )
    if not isinstance(descriptor, HandleDescriptor):
        descriptor = HandleDescriptor.model_validate(descriptor)
    dumped: dict[str, Any] = descriptor.model_dump(mode="json")
    return dumped


def _check_ttl(ttl_ms: int) -> None:
    if ttl_ms < 1:
        raise ValueError(f"ttl_ms must be at least 1, not {ttl_ms}")


def _id(event_id: Any) -> str | None:
    return None if event_id is None else str(event_id)


def open_registry(url: str | None = None, *, clock: Clock | None = None) -> ProcessRegistry:
    """Open (creating if needed) the ledger at ``url``; ``StoreError`` names a bad URL."""
    location = parse_store_url(url or default_url())
    if not url and location.dialect == "sqlite" and not location.in_memory:
        Path(location.sqlite_path).parent.mkdir(parents=True, exist_ok=True)
    prepare_location(location)
    last_error: Exception | None = None
    for _ in range(3):
        try:
            with opening_lock(location):
                return ProcessRegistry(location, clock=clock)
        except ProcledgerError:
            raise
        except IntegrityError as error:  # two processes creating the same tables at once
            last_error = error
            continue
        except Exception as error:
            raise StoreError(f"store URL {location.masked!r}: cannot open: {error}") from None
    raise StoreError(f"store URL {location.masked!r}: cannot open: {last_error}")
