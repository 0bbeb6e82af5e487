"""``ProcessRegistry``: the application service of one ledger.

It composes the parts and adds nothing of its own: writes go through the ``Ledger`` (one
transaction per command: load, decide, append with side effects), leases through ``Leases``,
grants through ``Grants``, reads through the projections' ``ReadModels``. eventsourcing's
infrastructure is composed privately (see ``adapters/sql/opening.py``), so no inherited public
method can bypass our transactions. See docs/design.md §3 for the guarantees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import orjson

from procledger.adapters.liveness import ProcProbe
from procledger.adapters.output_files import remove_process_output
from procledger.adapters.sql import env_rows
from procledger.adapters.sql.listen import ChangeListener, change_listener
from procledger.adapters.sql.location import StoreLocation, store_key
from procledger.adapters.sql.opening import OpenedStore
from procledger.adapters.sql.store import Tx
from procledger.application import cipher, recovery_reads
from procledger.application.grants import Grants
from procledger.application.handle_addresses import (
    HandleRow,
    change_seqs,
    first_handle_row,
    latest_change_seq,
    save_handle_row,
)
from procledger.application.journal import NotificationJournal
from procledger.application.leases import (
    FreeProcess,
    Leases,
    NextFreeClaim,
    check_ttl,
    take_if_free,
)
from procledger.application.retention import prune_filter, prune_terminal, prunes_so_far
from procledger.application.retry import retry_on_conflict
from procledger.application.service_book import ServiceBook, claims
from procledger.application.sessions import delete_session
from procledger.application.unit_of_work import (
    Ledger,
    Loaded,
    Write,
    each_its_own,
    made,
    outcome_of,
)
from procledger.application.verify import VerifyReport, verify_ledger
from procledger.application.waiting import ChangeSignal
from procledger.domain.attempts import attempt_id, first_attempt_id, restart_may_follow
from procledger.domain.caches import limit_caches
from procledger.domain.errors import (
    AuthorityRejected,
    LeaseLost,
    NotFound,
    ProcessLifecycleValidationError,
    RegistrationConflict,
    StoreCorrupt,
    StoreUnavailable,
    WriteConflict,
)
from procledger.domain.input import InputWait, SentInput
from procledger.domain.leases import Acquired, Busy, CompletionAuthority, Lease, LeaseOwner
from procledger.domain.notification import Notification
from procledger.domain.outcome import Outcome
from procledger.domain.process import Process
from procledger.domain.records import (
    ExternalRef,
    OsFacts,
    OutputSummary,
    ProcessEvent,
    ProcessRecord,
    ResourceUse,
    StoppedOrphan,
    WaitState,
)
from procledger.domain.registration import ProcessRegistration, env_ref_for
from procledger.domain.rendering import to_process_event
from procledger.domain.vocabulary import ProcessState, TerminalReason
from procledger.notifications.journal import JournalAppend, JournalEntry
from procledger.projections.feed import ChangeCursor, FeedPage
from procledger.projections.handles import HandleSummary
from procledger.projections.queries import FilterLike
from procledger.projections.rebuild import rebuild_read_models
from procledger.projections.records import Page, ProcessScan
from procledger.projections.reports import PruneReport, RebuildReport, SessionDeleteReport

Clock = Callable[[], int]


def system_clock() -> int:
    """Milliseconds since the epoch: the time the ledger stamps on events."""
    return time.time_ns() // 1_000_000


def _id(event_id: Any) -> str | None:
    return None if event_id is None else str(event_id)


class ProcessRegistry:
    """One ledger of processes; open it with ``procledger.open_registry``.

    Every write command is one transaction that loads the process, lets the aggregate decide,
    and appends its events together with their side effects (lease check and release, read
    models, tracking). Reads see every committed write. Every method raises only
    ``ProcledgerError`` subclasses (``StoreUnavailable``, ``StoreCorrupt`` … when the store
    fails), plus ``TimeoutError`` from the ``await_*`` methods and ``ValueError``/``TypeError``
    for arguments of the wrong kind, as documented per method.
    """

    def __init__(self, opened: OpenedStore, *, clock: Clock | None = None) -> None:
        self._opened = opened
        self._store = opened.store
        self.location: StoreLocation = opened.store.location
        self._changes = ChangeSignal()
        self._ledger = Ledger(self._store, opened.recorder, clock or system_clock, self._changes)
        self._leases = Leases(self._ledger, ProcProbe())
        self._grants = Grants(self._ledger)
        self._journal = NotificationJournal(self._store)
        self._reads = self._ledger.reads
        #: Names, leased ports and the desired state of named services (docs/design.md §19).
        self.services = ServiceBook(self._store, self.now_ms)

    @property
    def probe(self) -> ProcProbe:
        """How this host tells that a lease holder is dead (tests substitute a fake)."""
        return self._leases.probe

    @probe.setter
    def probe(self, probe: ProcProbe) -> None:
        self._leases.probe = probe

    def keep_less(self, entries: int) -> None:
        """Keep at most ``entries`` processes' states and registrations cached for reuse (by
        default 1,024 and 4,096): for a long-lived process holding many runs that it writes
        rarely -- the host agent -- memory matters more than the load a cache hit saves."""
        self._ledger.aggregates_kept = entries
        limit_caches(entries)

    def close(self) -> None:
        """Close every connection; calls in flight finish first."""
        self._opened.close()

    def subscribe_changes(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after every write this registry commits (on the writer's thread;
        it must be quick and never raise) until the returned function is called: how an event
        loop learns of this process's writes without a thread (docs/design.md §17). Writes by
        other processes are not seen here (``procledger.aio.follow`` listens or polls)."""
        return self._changes.subscribe(listener)

    def now_ms(self) -> int:
        """The registry's clock (epoch milliseconds): what events are stamped with."""
        return self._ledger.now_ms()

    def run_read(self, read: Callable[[Tx], Any]) -> Any:
        """``read(tx)`` in a read transaction of this registry's store, riding through an outage
        as every call does: the CLI's hot commands read the tables with the same functions on
        every path -- this store, or a plain SQLite connection (docs/design.md §8.1)."""
        return self._store.attempt(read)

    # -- registration and reads -----------------------------------------------------------------

    def register(self, registration: ProcessRegistration) -> ProcessRecord:
        """Register a process, or return its record if an identical registration exists.

        Idempotent by id and content: registering the same id with the same registration hash
        returns the existing record (whatever its state).

        Raises:
            RegistrationConflict: the id is registered with a different registration.
        """
        return retry_on_conflict(
            lambda: self._register_once(registration), f"process {registration.id!r}"
        )

    def _register_once(self, registration: ProcessRegistration) -> ProcessRecord:
        # Insert first: a new id (the common case) costs no read; a known id collides.
        now = self.now_ms()
        process = Process.register(registration, at_ms=now)
        try:
            unit = self._ledger.save([process], now_ms=now, also=claims([registration], now))
        except WriteConflict:
            pass
        else:
            self._ledger.keep(Loaded(process, unit.appended[registration.id]))
            return unit.records[registration.id]
        try:
            existing = self.get(registration.id)
        except NotFound:  # pruned in between: register afresh
            raise WriteConflict(f"process {registration.id!r} was pruned meanwhile") from None
        if existing.registration_hash != process.registration_hash:
            raise RegistrationConflict(
                registration.id, existing.registration_hash, process.registration_hash
            )
        return existing

    def register_claimed(
        self, registration: ProcessRegistration, owner: LeaseOwner, ttl_ms: int
    ) -> tuple[ProcessRecord, Lease | None]:
        """Register a new process already claimed: in one transaction, the registration,
        ``owner``'s lease for ``ttl_ms`` and ``owner`` stamped as its first starter -- what
        ``register``, ``claim_lease`` and ``record_first_started`` write in three (a supervised
        start's writes before the spawn, docs/design.md §6.2).

        Returns:
            The record and the lease. An id registered already with the same registration
            comes back as ``register`` returns it, with no lease and nothing written: the
            caller goes on as after ``register`` (a retried start decides for itself).

        Raises:
            RegistrationConflict: the id is registered with a different registration.
            ValueError: ``ttl_ms`` is below 1.
        """
        check_ttl(ttl_ms)
        return retry_on_conflict(
            lambda: self._register_claimed_once(registration, owner, ttl_ms),
            f"process {registration.id!r}",
        )

    def register_claimed_all(
        self, registrations: Sequence[ProcessRegistration], owner: LeaseOwner, ttl_ms: int
    ) -> list[tuple[ProcessRecord, Lease | None] | Exception]:
        """``register_claimed`` for each registration, in one transaction when their ids are
        distinct and new (a burst of starts, docs/design.md §3.7); otherwise, or if that
        transaction fails, one by one. Each one's result, or the error it alone raised.

        Raises:
            ValueError: ``ttl_ms`` is below 1.
        """
        check_ttl(ttl_ms)
        if len(registrations) > 1 and len({r.id for r in registrations}) == len(registrations):
            try:
                return list(self._register_claimed_at_once(registrations, owner, ttl_ms))
            except StoreUnavailable as error:  # each would have met it: not one wait each
                return list(each_its_own(error, len(registrations)))
            except Exception:  # each then meets its own error alone
                pass
        return [outcome_of(partial(self.register_claimed, r, owner, ttl_ms)) for r in registrations]

    def _register_claimed_once(
        self, registration: ProcessRegistration, owner: LeaseOwner, ttl_ms: int
    ) -> tuple[ProcessRecord, Lease | None]:
        try:
            return self._register_claimed_at_once([registration], owner, ttl_ms)[0]
        except WriteConflict:
            return self._register_once(registration), None  # known id: as ``register``

    def _register_claimed_at_once(
        self, registrations: Sequence[ProcessRegistration], owner: LeaseOwner, ttl_ms: int
    ) -> list[tuple[ProcessRecord, Lease | None]]:
        """New processes registered, claimed by ``owner`` and stamped, in one transaction.

        Raises:
            WriteConflict: one of the ids is registered already.
        """
        now = self.now_ms()
        processes = []
        for registration in registrations:
            process = Process.register(registration, at_ms=now)
            process.record_first_started(owner, now, at_ms=now)
            processes.append(process)
        taken: dict[str, Lease | None] = {}

        claim = claims(registrations, now)

        def take(tx: Tx) -> None:
            for registration in registrations:
                taken[registration.id] = take_if_free(tx, registration.id, owner, now, ttl_ms)
            if claim is not None:
                claim(tx)

        unit = self._ledger.save(processes, now_ms=now, also=take)
        for process in processes:
            self._ledger.keep(Loaded(process, unit.appended[process.process_id]))
        return [(unit.records[r.id], taken[r.id]) for r in registrations]

    def get(self, process_id: str) -> ProcessRecord:
        """The process's current record.

        Raises:
            NotFound: no such process (never registered, or pruned).
            StoreCorrupt: its stored record cannot be decoded (others stay readable).
        """
        return self._reads.record(process_id)

    def events(self, process_id: str, after: int = 0) -> list[ProcessEvent]:
        """The process's events with a sequence number above ``after``, in order.

        Raises:
            NotFound: no such process.
            StoreCorrupt: one of its stored events cannot be decoded, or its log does not
                verify (an event edited or deleted: docs/design.md §13.1), naming it.
        """
        ledger = self._ledger
        stored = self._store.attempt(lambda tx: ledger.verified_events(tx, process_id, after))
        if not stored and after == 0:
            raise NotFound(f"process {process_id!r} not found")
        if not stored:
            self.get(process_id)
        return [to_process_event(process_id, ledger.decode(s, process_id)) for s in stored]

    # -- environments ---------------------------------------------------------------------------

    def store_env(self, env: Mapping[str, str]) -> str:
        """Keep an environment outside the log and return its reference (the content hash of
        the values); storing the same environment twice returns the same reference. Only what
        the caller passes is stored. With ``PROCLEDGER_CIPHER_KEY`` set the values are stored
        AES-GCM encrypted (the reference is unchanged; a plain row of the same environment is
        replaced by ciphertext).

        Raises:
            CipherError: ``PROCLEDGER_CIPHER_KEY`` is set but not a 32-byte URL-safe base64 key.
        """
        values = {str(k): str(v) for k, v in env.items()}
        env_ref = env_ref_for(values)
        plain = orjson.dumps(values, option=orjson.OPT_SORT_KEYS)
        sealed = cipher.seal(env_ref, plain)
        text = plain.decode() if sealed is None else sealed
        replace_plain = sealed is not None
        # ON CONFLICT: a run repeated after a lost commit finds its own row (docs/design.md §7.3)
        self._store.attempt(
            lambda tx: env_rows.insert(tx, env_ref, text, replace_plain=replace_plain), write=True
        )
        return env_ref

    def load_env(self, env_ref: str) -> dict[str, str]:
        """The environment stored under ``env_ref`` (decrypted when it was stored encrypted).

        Raises:
            NotFound: nothing was stored under that reference.
            CipherError: it is encrypted and ``PROCLEDGER_CIPHER_KEY`` is unset or another key
                (the message names the env ref, never the key).
            StoreCorrupt: the stored environment cannot be decoded.
        """
        stored = self._store.attempt(lambda tx: env_rows.select(tx, env_ref))
        if stored is None:
            raise NotFound(f"environment {env_ref!r} was never stored")
        payload = cipher.unseal(env_ref, stored) if cipher.is_encrypted(stored) else stored
        try:
            values = orjson.loads(payload)
        except orjson.JSONDecodeError as error:
            raise StoreCorrupt(f"environment {env_ref!r} is corrupt: {error}") from None
        if not isinstance(values, dict):
            raise StoreCorrupt(f"environment {env_ref!r} is corrupt: not a JSON object")
        return {str(k): str(v) for k, v in values.items()}

    # -- lifecycle ------------------------------------------------------------------------------

    def record_started(
        self,
        process_id: str,
        started_at_ms: int,
        *,
        event_id: str | None = None,
        os: OsFacts | None = None,
    ) -> ProcessRecord:
        """Record that the process runs in the foreground (``starting`` → ``running``), with
        the child's OS facts (``os``: pid, process group, start time, host) when known.

        Idempotent by ``event_id``: an identical retry returns the record unchanged.

        Raises:
            InvalidTransition: the process is not ``starting`` (``AlreadyTerminal`` if ended).
            ReplayConflict: ``event_id`` was used for a different fact.
        """
        return self._ledger.make(
            self.running_write(process_id, started_at_ms, event_id=event_id, os=os)
        )

    def record_backgrounded(
        self,
        process_id: str,
        at_ms: int,
        *,
        event_id: str | None = None,
        os: OsFacts | None = None,
    ) -> ProcessRecord:
        """Record that the process runs detached from its caller; as ``record_started``."""
        return self._ledger.make(
            self.running_write(process_id, at_ms, background=True, event_id=event_id, os=os)
        )

    def running_write(
        self,
        process_id: str,
        at_ms: int,
        *,
        background: bool = False,
        event_id: str | None = None,
        os: OsFacts | None = None,
    ) -> Write:
        """The write ``record_started`` (``record_backgrounded`` with ``background``) makes,
        for ``write_all``."""
        if background:
            return Write(
                process_id,
                lambda p, now: p.record_backgrounded(
                    at_ms, at_ms=now, event_id=_id(event_id), os=os
                ),
            )
        return Write(
            process_id,
            lambda p, now: p.record_started(at_ms, at_ms=now, event_id=_id(event_id), os=os),
        )

    def make(self, write: Write) -> ProcessRecord:
        """One write (``running_write``, ``completed_write``) alone, as the ``record_*``
        method it came from makes it."""
        return self._ledger.make(write)

    def write_all(self, writes: Sequence[Write]) -> list[ProcessRecord | Exception]:
        """The writes (``running_write``, ``completed_write``) in one transaction when they are
        of distinct processes, each deciding and checked as alone; otherwise, or if that
        transaction fails, one by one. Each one's record, or the error it alone raised."""
        return self._ledger.write_all(writes)

    def request_stop(
        self, process_id: str, reason: TerminalReason | str, *, event_id: str | None = None
    ) -> ProcessRecord:
        """Record a request to stop the process with ``reason``; its owner carries it out.

        Raises:
            AlreadyTerminal: the process has ended.
            ProcessLifecycleValidationError: ``reason`` is not a stop reason.
        """
        return self._ledger.write(
            process_id,
            lambda p, now: p.request_stop(reason, at_ms=now, event_id=_id(event_id)),
        )

    def completed_write(
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
        signal: int | None = None,
        survivors: Sequence[int] = (),
        output: OutputSummary | None = None,
        tails: dict[str, str] | None = None,
    ) -> Write:
        """The write ``record_completed`` makes, for ``write_all``: its ``Outcome``, made once
        from the keywords, written by ``outcome_write``."""
        try:
            outcome = Outcome.of(
                state, reason, exit_code=exit_code, diagnostic=diagnostic, value=value,
                signal=signal, survivors=survivors, output=output, tails=tails,
            )  # fmt: skip
        except ProcessLifecycleValidationError as invalid:
            return self._refused(process_id, invalid)
        return self.outcome_write(
            process_id, outcome, event_id=event_id, lease=lease, authority=authority
        )

    @staticmethod
    def _refused(process_id: str, error: Exception) -> Write:
        """A write that raises ``error`` when made, after the process is loaded: an unknown
        process is still ``NotFound`` and ``write_all`` hands the error to its own write, as
        when the aggregate checked the fields."""

        def decide(process: Process, now: int) -> None:
            raise error

        return Write(process_id, decide)

    record_completed = made(
        completed_write,
        """Record how the process ended (a row of the closed lifecycle table).

        Needs a live ``lease`` (checked and released in the same transaction) or a
        ``CompletionAuthority``; an identical retry (same ``event_id`` and fields) is a no-op.
        ``signal``: the signal that ended the child (``signaled`` needs it; a stop's states may
        have it); ``survivors``: OS pids a tree stop left alive; ``output``/``tails`` (§14).

        Raises:
            ProcessLifecycleValidationError: ``(state, reason, exit_code)`` is not a legal row,
                or ``signal``/``survivors`` break their rules (``.field`` names which).
            AlreadyTerminal: the process ended differently before.
            LeaseLost: the lease is missing, expired or superseded (nothing is written).
            AuthorityRejected: neither a lease nor a valid authority was given.
        """,
    )

    def outcome_write(
        self,
        process_id: str,
        outcome: Outcome,
        *,
        event_id: str | None = None,
        lease: Lease | None = None,
        authority: CompletionAuthority | None = None,
    ) -> Write:
        """The write of a completion whose ``Outcome`` is made (the supervisor's, an outbox
        entry's), for ``make``/``write_all``; as ``record_completed`` otherwise
        (docs/design.md §3.2, §6.3)."""
        return self._terminal_write(
            process_id,
            lease,
            authority,
            lambda process, now: process.end(
                outcome, event_id=_id(event_id), authority=authority, at_ms=now
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
        output: OutputSummary | None = None,
        tails: dict[str, str] | None = None,
    ) -> ProcessRecord:
        """Record that the process's outcome can no longer be known; as ``record_completed``
        (``output``/``tails``: what its capture left on disk, §14)."""
        return self._write_terminal(
            process_id,
            lease,
            authority,
            lambda process, now: process.lose(
                diagnostic=diagnostic,
                event_id=_id(event_id),
                authority=authority,
                at_ms=now,
                output=None if output is None else (output, tails or {}),
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
        output: OutputSummary | None = None,
        tails: dict[str, str] | None = None,
    ) -> ProcessRecord:
        """Record that the process was given up (``reason`` says why; ``owner``/``at_ms`` the
        evidence, e.g. a dead owner); as ``record_completed``."""
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
                output=None if output is None else (output, tails or {}),
            ),
        )

    def _write_terminal(
        self,
        process_id: str,
        lease: Lease | None,
        authority: CompletionAuthority | None,
        command: Callable[[Process, int], bool],
    ) -> ProcessRecord:
        return self._ledger.make(self._terminal_write(process_id, lease, authority, command))

    @staticmethod
    def _terminal_write(
        process_id: str,
        lease: Lease | None,
        authority: CompletionAuthority | None,
        command: Callable[[Process, int], bool],
    ) -> Write:
        """A terminal write: the aggregate decides, then (only if it appends) the lease or
        authority is required; with a lease, the append also checks and releases it."""

        def decide(process: Process, now: int) -> None:
            if command(process, now):
                _require_lease_or_authority(process, lease, authority)

        return Write(process_id, decide, lease)

    # -- producer events and other facts --------------------------------------------------------

    def append_event(
        self, process_id: str, event_type: str, payload: Any, *, replay_key: str
    ) -> ProcessEvent:
        """Append a producer event of a declared type; idempotent by ``replay_key``.

        Raises:
            UndeclaredEventType: the registration did not declare ``event_type``.
            ReplayConflict: ``replay_key`` was used with a different type or payload.
            AlreadyTerminal: the process has ended.
        """
        sequence_box: list[int] = []

        def decide(process: Process, now: int) -> None:
            sequence_box[:] = [
                process.append_producer_event(event_type, payload, replay_key=replay_key, at_ms=now)
            ]

        self._ledger.write(process_id, decide)
        return self.events(process_id, after=sequence_box[0] - 1)[0]

    def record_first_started(self, process_id: str, owner: LeaseOwner, at_ms: int) -> ProcessRecord:
        """Stamp the owner that first started the process (kept once; later calls no-op)."""
        return self._ledger.write(
            process_id, lambda p, now: p.record_first_started(owner, at_ms, at_ms=now)
        )

    def record_ready(
        self, process_id: str, ready_at_ms: int, *, probes: Sequence[str] = ()
    ) -> ProcessRecord:
        """Tell that the running process became ready (its readiness probes, named in
        ``probes``, all held at ``ready_at_ms``), so waiters and the feed learn it from the
        log (docs/design.md §15). Told once: a later report returns the record unchanged.

        Raises:
            InvalidTransition: the process is not running (``AlreadyTerminal``: it ended).
        """
        return self._ledger.write(
            process_id, lambda p, now: p.record_ready(ready_at_ms, probes, at_ms=now)
        )

    def record_input(self, process_id: str, sent: SentInput) -> tuple[ProcessRecord, bool]:
        """Journal a send to the running process's input before its bytes are written
        (docs/design.md §20.2): ``(record, True)`` when it is new, ``(record, False)`` when
        its command id is on record already -- a retry, whose bytes must not be written again.

        Raises:
            ReplayConflict: the command id was used with other input.
            InvalidTransition: the process is not running (``AlreadyTerminal``: it ended).
        """
        applied = False

        def decide(process: Process, now: int) -> None:
            nonlocal applied
            applied = process.record_input(sent, at_ms=now)

        return self._ledger.write(process_id, decide), applied

    def record_waiting(self, process_id: str, wait: InputWait) -> ProcessRecord:
        """Record that the process waits for input (docs/design.md §20.3); a no-op once it
        ended or while a wait is on record."""
        return self._ledger.write(process_id, lambda p, now: p.record_waiting(wait, at_ms=now))

    def record_wait_ended(self, process_id: str) -> ProcessRecord:
        """The wait on record is over without a send; a no-op when none is."""
        return self._ledger.write(process_id, lambda p, now: p.record_wait_ended(at_ms=now))

    def record_resources(self, process_id: str, used: ResourceUse) -> ProcessRecord:
        """Record what a run's process tree used, as the host agent last sampled it
        (docs/design.md §18.10); once, a repeat is a no-op."""
        return self._ledger.write(process_id, lambda p, now: p.record_resources(used, at_ms=now))

    def record_crash_loop(
        self, process_id: str, *, restarts: int, window_s: float
    ) -> ProcessRecord:
        """Record on a service's last (ended) attempt that its supervisor gave it up: the
        restart budget was spent, so nothing will start it again and a reader need not wait
        (the record says ``gave_up: "crash_loop"``). Once; a repeat is a no-op.

        Raises:
            InvalidTransition: the attempt has not ended yet.
        """
        return self._ledger.write(
            process_id,
            lambda p, now: p.record_crash_loop(restarts, window_s, at_ms=now),
        )

    def request_service_stop(self, process_id: str, reason: TerminalReason | str) -> ProcessRecord:
        """Record a stop of the whole service ``process_id`` belongs to (any attempt's id), on
        its first attempt, in any state: its supervisor starts no attempt once it has read it
        (docs/design.md §15.4). The attempt that runs is stopped by ``request_stop`` on it.
        A repeated reason is a no-op. Returns the first attempt's record.

        Raises:
            NotFound: no such process (or its service's first attempt was pruned).
            ProcessLifecycleValidationError: ``reason`` is not a stop reason, or the process
                is not an attempt of a service (``.field`` is ``restart``).
        """
        first = first_attempt_id(self.get(process_id))
        return self._ledger.write(first, lambda p, now: p.request_service_stop(reason, at_ms=now))

    def record_orphan_stopped(self, process_id: str, stop: StoppedOrphan) -> ProcessRecord:
        """Record on a ``lost_on_restore`` process that the child it left running was stopped
        by its recorded identity, and how (docs/design.md §6.2); once, a repeat is a no-op.

        Raises:
            InvalidTransition: the process is not ``lost_on_restore``.
            ProcessLifecycleValidationError: ``stop`` names another OS pid or no stop reason.
        """
        return self._ledger.write(
            process_id, lambda p, now: p.record_orphan_stopped(stop, at_ms=now)
        )

    def request_abandon(
        self, process_id: str, requested_by: str, *, reason: str | None = None
    ) -> ProcessRecord:
        """Ask whoever recovers the process to abandon it instead of re-running it."""
        return self._ledger.write(
            process_id, lambda p, now: p.request_abandon(requested_by, reason, at_ms=now)
        )

    def set_wait(self, process_id: str, wait: WaitState) -> ProcessRecord:
        """Record what the process is waiting for (shown in lists; filterable)."""
        return self._ledger.write(process_id, lambda p, now: p.set_wait(wait, at_ms=now))

    def clear_wait(self, process_id: str) -> ProcessRecord:
        """Clear the process's wait (a no-op when it has none)."""
        return self._ledger.write(process_id, lambda p, now: p.clear_wait(at_ms=now))

    def set_external_ref(self, process_id: str, ref: ExternalRef) -> ProcessRecord:
        """Link the process to an object outside procledger (e.g. a job id elsewhere)."""
        return self._ledger.write(process_id, lambda p, now: p.set_external_ref(ref, at_ms=now))

    # -- waiting --------------------------------------------------------------------------------

    def await_event(
        self,
        process_id: str,
        event_type: str,
        *,
        after: int = 0,
        timeout: float | None = None,
    ) -> ProcessEvent:
        """The first event of kind ``event_type`` with a sequence above ``after``; waits for
        it (woken at once by writes in this process, polling for others').

        Raises:
            TimeoutError: none arrived within ``timeout`` seconds.
            NotFound: no such process.
        """

        def find() -> ProcessEvent | None:
            for event in self.events(process_id, after=after):
                if event.kind == event_type and event.sequence > after:
                    return event
            return None

        return self._changes.wait_for(find, timeout, f"{event_type!r} on process {process_id!r}")

    def await_terminal(self, process_id: str, *, timeout: float | None = None) -> ProcessRecord:
        """The process's record once it has ended; waits as ``await_event`` does.

        Raises:
            TimeoutError: it had not ended within ``timeout`` seconds.
            NotFound: no such process.
        """

        def find() -> ProcessRecord | None:
            record = self.get(process_id)
            return record if record.state.is_terminal else None

        return self._changes.wait_for(find, timeout, f"the terminal of process {process_id!r}")

    def newest_attempt(self, process_id: str) -> ProcessRecord:
        """The newest attempt of the service ``process_id`` belongs to (the record itself for
        a process that is not a service): what ``stop`` and ``wait`` act on, since a
        service's earlier attempts have ended (docs/design.md §15).

        Raises:
            NotFound: no such process.
        """
        record = self.get(process_id)
        if record.attempt is None:
            return record
        first, number = first_attempt_id(record), record.attempt
        while True:
            try:
                later = self.get(attempt_id(first, number + 1))
            except NotFound:
                return record
            if later.attempt_of != first:
                return record
            record, number = later, number + 1

    def attempts(self, process_id: str) -> list[ProcessRecord]:
        """Every attempt of the service ``process_id`` belongs to, first to newest (just the
        record for a process that is not a service): what ``show`` lists (docs/design.md §15).

        Raises:
            NotFound: no such process.
        """
        record = self.get(process_id)
        if record.attempt is None:
            return [record]
        first = first_attempt_id(record)
        found = [record if record.id == first else self.get(first)]
        while True:
            try:
                later = self.get(attempt_id(first, len(found) + 1))
            except NotFound:
                return found
            if later.attempt_of != first:
                return found
            found.append(later)

    def await_ready(self, process_id: str, *, timeout: float | None = None) -> ProcessRecord:
        """The record once the process is ready (``ready_at_ms`` set; without probes: once it
        runs) or has ended without becoming ready -- for a service, once its newest attempt
        is, or no attempt will follow. Lets a caller start dependents without guessing.

        Raises:
            TimeoutError: neither within ``timeout`` seconds.
            NotFound: no such process.
        """

        def find() -> ProcessRecord | None:
            record = self.newest_attempt(process_id)
            if record.ready_at_ms is not None:
                return record
            if record.readiness is None and record.state is ProcessState.running:
                return record
            if self._no_attempt_follows(record):
                return record
            return None

        return self._changes.wait_for(find, timeout, f"process {process_id!r} to be ready")

    def await_end(self, process_id: str, *, timeout: float | None = None) -> ProcessRecord:
        """The terminal record once the process has ended -- for a service, its newest
        attempt once no attempt will follow (its policy, a stop or a ``crash_loop``).

        Raises:
            TimeoutError: not within ``timeout`` seconds.
            NotFound: no such process.
        """

        def find() -> ProcessRecord | None:
            record = self.newest_attempt(process_id)
            return record if self._no_attempt_follows(record) else None

        return self._changes.wait_for(find, timeout, f"process {process_id!r} to end")

    def _no_attempt_follows(self, record: ProcessRecord) -> bool:
        """Whether ``record`` has ended and no attempt of its service will follow it; a later
        attempt reads its first too, which carries a stop of the whole service."""
        if not record.is_terminal:
            return False
        first = None
        if record.attempt_of is not None:
            try:
                first = self.get(record.attempt_of)
            except NotFound:  # pruned: only the attempt's own record can tell
                first = None
        return not restart_may_follow(record, first=first)

    # -- leases ---------------------------------------------------------------------------------

    def claim_lease(self, process_id: str, owner: LeaseOwner, ttl_ms: int) -> Acquired | Busy:
        """Take the process's lease for ``ttl_ms``: ``Acquired`` with a fencing token higher
        than any before, or ``Busy`` naming the live holder. The same incarnation claiming
        again extends its lease. Exactly one of any number of racing claimants wins. A
        terminal process is never leased (checked inside the claim's transaction).

        Raises:
            NotFound: no such process.
            AlreadyTerminal: the process has ended.
            ValueError: ``ttl_ms`` is below 1.
        """
        return self._leases.take(process_id, owner, ttl_ms, observed=None)

    def reclaim_lease(
        self, process_id: str, claimant: LeaseOwner, observed: Lease, ttl_ms: int
    ) -> Acquired | Busy:
        """Take a live lease away from ``observed``'s holder, only if that holder is provably
        dead on this host and still holds exactly ``observed``; otherwise ``Busy``.

        Raises:
            NotFound: no such process.
            AlreadyTerminal: the process has ended.
            ValueError: ``ttl_ms`` is below 1.
        """
        return self._leases.take(process_id, claimant, ttl_ms, observed=observed)

    def claim_next_free(
        self,
        after: str,
        claimant: LeaseOwner,
        ttl_ms: int,
        wants: Callable[[ProcessRecord, Lease | None], bool],
    ) -> FreeProcess | None:
        """Find the first process after ``after`` (in the store's id order) that has not
        ended and whose lease is free -- never claimed, released or expired -- and claim it
        for ``claimant`` in the same transaction if ``wants(record, lapsed)`` says so.

        This is how recovery workers share work: a process another worker is taking at that
        moment is passed over rather than waited for (``SKIP LOCKED`` on PostgreSQL), and a
        process it holds is not free, so no worker visits another's work. Walk a whole pass
        by calling again with the returned ``process_id`` as ``after`` (``""`` to begin).
        ``wants`` may be called again if the transaction is retried.

        Returns:
            The process found, with ``acquired`` set when it was claimed (``record`` is
            ``None`` for a damaged record, which is never claimed); ``None`` past the last.

        Raises:
            ValueError: ``ttl_ms`` is below 1.
        """
        return self._leases.take_next_free(NextFreeClaim(after, claimant, ttl_ms, wants))

    def get_lease(self, process_id: str) -> Lease | None:
        """The live or expired (not released) lease of the process, or ``None``.

        Raises:
            NotFound: no such process.
        """
        return self._leases.get(process_id)

    def renew_lease(self, lease: Lease, ttl_ms: int) -> Lease:
        """Extend a live lease to ``now + ttl_ms`` (same fencing token).

        Raises:
            LeaseLost: the lease expired, was released or was taken over.
        """
        return self._leases.renew(lease, ttl_ms)

    def release_lease(self, lease: Lease) -> None:
        """Give the lease up (a no-op if it is no longer the current one)."""
        self._leases.release(lease)

    # -- grants and sessions --------------------------------------------------------------------

    def grant_handle(self, session_id: str, process_id: str, descriptor: Any = None) -> None:
        """Let ``session_id`` see the process through a handle (idempotent).

        Raises:
            NotFound: no such process.
        """
        self._grants.grant(session_id, process_id, descriptor)

    def revoke_handle(self, session_id: str, process_id: str) -> None:
        """Take the session's handle away.

        Raises:
            NotFound: the session holds no handle to it (alike for an unknown process).
        """
        self._grants.revoke(session_id, process_id)

    def transfer_handles(
        self, from_session: str, to_session: str, process_ids: Sequence[str]
    ) -> None:
        """Move handles between sessions: all of them or none (one write).

        Raises:
            NotFound: ``from_session`` does not hold one of them.
        """
        self._grants.transfer(from_session, to_session, process_ids)

    def delete_session(self, session_id: str) -> SessionDeleteReport:
        """Revoke the session's grants and clear wake targets pointing at it (one write)."""
        return delete_session(self._ledger, session_id)

    # -- projections ----------------------------------------------------------------------------

    def changes_since(
        self, cursor: ChangeCursor | int, limit: int
    ) -> tuple[list[ProcessRecord], ChangeCursor]:
        """Records changed after ``cursor``, in ``(change_seq, id)`` order, at most ``limit``,
        each once at its latest state, and the cursor of the last one (``cursor`` if none).
        Never skips a change, even under concurrent writers; cursors survive ``rebuild``.

        Raises:
            ValueError: ``limit`` is negative.
        """
        return self._reads.changes_since(cursor, limit)

    def list_processes(
        self,
        filter: FilterLike = None,
        *,
        limit: int | None = None,
        after: str | None = None,
        newest_first: bool = False,
    ) -> list[ProcessRecord]:
        """Processes matching ``filter`` (default: running), sorted by id — the healthy ones:
        a process whose stored record is damaged is left out (and logged on the
        ``procledger.store`` logger); ``scan_processes`` names them.

        A page: at most ``limit`` records whose id comes after ``after``; with
        ``newest_first`` the order runs from the last id back (and ``after`` continues it),
        the newest first for ids procledger made. The next page starts after the last id
        returned. Each page is read through an index, however large the ledger.

        Raises:
            FilterError: the filter names an unknown key or a mistyped value.
            ValueError: ``limit`` is negative.
        """
        return self._reads.list_processes(filter, Page(limit, after, newest_first))

    def scan_processes(
        self,
        filter: FilterLike = None,
        *,
        limit: int | None = None,
        after: str | None = None,
        newest_first: bool = False,
    ) -> ProcessScan:
        """``ProcessScan(records, damaged)``: the records ``list_processes`` returns (the same
        page), and the ids of matching processes whose stored record is damaged (``get`` of
        one raises ``StoreCorrupt``; ``rebuild`` repairs it from the log).

        Raises:
            FilterError: the filter names an unknown key or a mistyped value.
            ValueError: ``limit`` is negative.
        """
        return self._reads.scan_processes(filter, Page(limit, after, newest_first))

    def scan_changes(self, cursor: ChangeCursor | int, limit: int) -> FeedPage:
        """``FeedPage(records, cursor, damaged)``: a page of ``changes_since``, with the ids of
        the changed processes whose stored record is damaged. The cursor passes them, so one
        damaged record never stalls a consumer, and they are named rather than skipped
        silently (``changes_since`` logs them on the ``procledger.store`` logger).

        Raises:
            ValueError: ``limit`` is negative.
        """
        return self._reads.scan_changes(cursor, limit)

    def resolve_process_id(self, prefix: str) -> str:
        """The process id that ``prefix`` names: the id itself when a process has exactly
        that id, else the one id that starts with it (an index range query).

        Raises:
            NotFound: no process id starts with ``prefix``.
            AmbiguousProcessId: several do (a ``NotFound``; ``.candidates`` lists a few).
        """
        return self._reads.resolve_process_id(prefix)

    def handle(self, session_id: str, process_id: str) -> HandleSummary:
        """The session's handle to a process.

        Raises:
            NotFound: alike for ungranted and unknown processes.
        """
        return self._reads.handle(session_id, process_id)

    def handles(self, session_id: str, filter: FilterLike = None) -> list[HandleSummary]:
        """The session's handles whose processes match ``filter`` (default: running), by id."""
        return self._reads.handles(session_id, filter)

    def handle_sessions(self, process_id: str) -> list[str]:
        """The sessions holding a handle to the process, sorted.

        Raises:
            NotFound: no such process.
        """
        return self._reads.handle_sessions(process_id)

    def open_change_listener(self) -> ChangeListener | None:
        """A connection of its own, told of every commit by other processes to this store
        (PostgreSQL's LISTEN), or ``None`` where the store has no such channel (SQLite and
        memory: their followers poll, and ``subscribe_changes`` tells of this registry's own
        writes). The caller closes it.

        Raises:
            StoreError: the listening connection could not be opened.
        """
        return change_listener(self._store)

    # -- the handles side table (docs/design.md §6.2) -------------------------------------------

    def save_handle_row(self, row: HandleRow) -> None:
        """Keep where a started process's completion notification goes, so ``restore``
        publishes it with the same handle and command id (an upsert: a retried start)."""
        save_handle_row(self._store, row)

    def handle_row(self, process_id: str) -> HandleRow | None:
        """The process's handle row (the first, if a retried start minted more), or ``None``
        where its start asked for no completion notification."""
        return first_handle_row(self._store, process_id)

    def change_seqs(self, process_ids: Sequence[str]) -> dict[str, int]:
        """The change-feed position of each process's record (absent ones left out): one read
        for a batch, so a supervisor notices stop requests made elsewhere without decoding
        every record."""
        return change_seqs(self._store, process_ids)

    def latest_change_seq(self) -> int:
        """The newest change-feed position of any record (0 in an empty ledger): one indexed
        read, so a supervisor that polls for stop requests asks about each of its runs only
        when something changed at all."""
        return latest_change_seq(self._store)

    def prunes_so_far(self) -> int:
        """How many prunes this ledger has recorded: when it grows, records read before may
        be gone (``change_seqs`` tells which)."""
        return int(self._store.attempt(prunes_so_far))

    def prune_terminal(
        self,
        cutoff_ms: int,
        filter: FilterLike = None,
        up_to: ChangeCursor | int | None = None,
    ) -> PruneReport:
        """Delete terminal processes last updated before ``cutoff_ms`` (and changed at or
        before ``up_to``) that match ``filter`` (default: any status), with their events,
        grants, leases, handles and journal entries, in one transaction; then each one's
        captured output under this user's output folder (docs/design.md §14).

        Raises:
            TypeError: ``cutoff_ms`` is not an int.
            FilterError: the filter is malformed.
        """
        if isinstance(cutoff_ms, bool) or not isinstance(cutoff_ms, int):
            raise TypeError(f"cutoff_ms must be an int (epoch ms), not {cutoff_ms!r}")
        watermark = None if up_to is None else ChangeCursor.of(up_to).value
        report = prune_terminal(self._ledger, cutoff_ms, prune_filter(filter), watermark)
        key = store_key(self.location)
        if key is not None:
            remove_process_output(key, report.processes)
        return report

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> RebuildReport:
        """Rebuild every read model from the log, one transaction per batch of streams:
        each process's record (and each session's grants) is at every moment either the one
        before or the rebuilt one, never half-built. ``progress(done, total)`` is called per
        batch. A process whose hash chain does not verify is never rebuilt as if healthy: its
        row is marked damaged (docs/design.md §13.5); one whose events cannot be decoded or
        applied while its chain holds keeps its old rows; both are named in the report, and
        everything else is rebuilt.

        Returns:
            ``RebuildReport(applied, damaged, marked)``: the events read, the ids of what
            could not be rebuilt (``"stream <uuid>"`` when not even its id can be read), and
            those of them marked damaged.

        Raises:
            StoreCorrupt: the SQLite file is damaged (``.file``): refused when the store was
                opened, or met on the way, saying how far the rebuild got.
        """
        report = rebuild_read_models(self._store, progress)
        self._changes.notify()
        return report

    def verify(self) -> VerifyReport:
        """Check the ledger and write nothing: the database's integrity, every process's hash
        chain and head, every registration against its hash, the read models against a
        rebuild done in memory, and the env rows against their references. ``report.ok`` only
        when all hold; each problem names its process. Processes with events from before
        hash chains existed are listed ``unchained`` (not a failure). It reads one snapshot
        (on PostgreSQL writers wait while it runs), works on a store opened read-only, and in
        a damaged SQLite file reads around the pages SQLite cannot read, naming them and the
        processes they held (docs/design.md §13.3).

        Raises:
            StoreUnavailable: the store cannot be reached.
        """
        return verify_ledger(self._store)

    # -- the notification journal ----------------------------------------------------------------

    def journal_append(self, notification: Notification) -> JournalAppend:
        """Journal ``notification`` (either kind) under its command id (validated again first).

        Returns ``JournalAppend(new=True)`` when this call wrote the row, ``new=False`` for an
        identical retry (with ``consumed`` telling whether the loop handled it already). A call
        whose commit reached the server but whose connection was lost before the answer runs
        again and finds its own row: ``new=False`` then too, and the row is there once.

        Raises:
            IdempotencyCollision: the id is journalled with a different payload.
        """
        return self._journal.append(notification.revalidated())

    def journal_append_checked(self, notification: Notification) -> JournalAppend:
        """``journal_append`` for a notification the caller has just validated."""
        return self._journal.append(notification)

    def journal_get(self, command_id: Any) -> Notification | None:
        """The journalled notification with that command id, of its own kind, or ``None``."""
        return self._journal.get(command_id)

    def journal_mark_consumed(self, session_id: Any, loop_id: Any, command_id: Any) -> bool:
        """Record that the loop handled the command; ``False`` if that loop has no such entry
        (marking twice is harmless)."""
        return self._journal.mark_consumed(session_id, loop_id, command_id)

    def journal_undelivered(self, session_id: Any, loop_id: Any) -> list[Notification]:
        """The session's unconsumed notifications addressed to ``loop_id``, in journal order."""
        return self._journal.undelivered(session_id, loop_id)

    def journal_entries(self, session_id: Any = None) -> list[JournalEntry]:
        """Every journalled command (or one session's), in journal order, consumed included."""
        return self._journal.entries(session_id)

    # -- what recovery walks by (docs/design.md §3.6) ---------------------------------------------

    def non_terminal_ids(self) -> list[str]:
        """Ids of the processes that have not ended, in code point order: every recovery
        worker walks them in the same order, whatever order a PostgreSQL collation would give.
        """
        return recovery_reads.non_terminal_ids(self._store)

    def held_leases(self, now_ms: int) -> list[Lease]:
        """The leases live at ``now_ms`` (neither released nor expired) on processes that have
        not ended, by process id: where a sweep looks for holders that are provably dead."""
        return recovery_reads.held_leases(self._store, now_ms)

    def unreleased_leases(self) -> list[Lease]:
        """The leases not released -- live or expired -- of the processes that have not ended,
        by process id: whose holders ``ps`` and ``show`` judge (a holder killed long ago left
        an expired lease; docs/design.md §8)."""
        return recovery_reads.held_leases(self._store, -1)  # expiring after -1: every one

    def record_and_lease(self, process_id: str) -> tuple[ProcessRecord, Lease | None] | None:
        """The process's record and its stored lease as ``get_lease`` gives it (live or
        expired; ``None`` when released or never claimed, and for a process that has ended),
        in one read transaction -- rather than ``get`` and ``get_lease``: several recovery
        workers look at the same processes, and most of their looks end with this read.

        Returns:
            ``None`` for a process that does not exist (never registered, or pruned).

        Raises:
            StoreCorrupt: its stored record cannot be decoded.
        """
        return recovery_reads.record_and_lease(self._store, process_id)


def _require_lease_or_authority(
    process: Process, lease: Lease | None, authority: CompletionAuthority | None
) -> None:
    """The last check of a terminal write (the aggregate already checked the authority)."""
    if lease is None and authority is None:
        raise AuthorityRejected(
            f"process {process.process_id!r}: a terminal write needs a live lease "
            "or a completion authority"
        )
    if lease is not None and lease.process_id != process.process_id:
        raise LeaseLost(f"process {process.process_id!r}: the lease is for {lease.process_id!r}")
