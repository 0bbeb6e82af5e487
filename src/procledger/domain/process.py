"""The Process aggregate: every fact about one process, decided here and kept as events.

Commands (public methods) validate and decide; event ``apply`` bodies only assign, because they
run again on every replay. Events carry JSON-native values only, so an orjson round trip
restores them exactly, and each lifecycle event stores the state it results in, so replaying
old events never consults today's table. Topics are pinned: renaming a class must not orphan
stored data.

Error order for every write: validation, identical replay (a no-op), state, then authority
(the lease, which needs the store, is the registry's last check).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from eventsourcing.domain import Aggregate

from procledger.domain._model import Frozen, assemble, canonical_json
from procledger.domain.errors import (
    AlreadyTerminal,
    AuthorityRejected,
    InvalidTransition,
    ProcessLifecycleValidationError,
    ReplayConflict,
    UndeclaredEventType,
)
from procledger.domain.leases import CompletionAuthority, LeaseOwner, authority_payload
from procledger.domain.lifecycle import check_row, check_transition
from procledger.domain.records import (
    MAX_DIAGNOSTIC_BYTES,
    AbandonRequest,
    ExternalRef,
    Identity,
    OwnerStamp,
    ProcessEvent,
    ProcessRecord,
    WaitState,
)
from procledger.domain.registration import (
    ProcessRegistration,
    SessionScope,
    input_identity,
    registration_hash_of,
)
from procledger.domain.vocabulary import (
    LifecycleKind,
    ProcessState,
    RecoveryDisposition,
    TerminalReason,
    coarse_status,
)

_NAMESPACE = uuid.UUID("6f1c2d7e-5b0a-4c1e-9a53-0d4c6e1f7a21")

TERMINAL_KINDS = frozenset({LifecycleKind.completed, LifecycleKind.lost, LifecycleKind.abandoned})


@functools.lru_cache(maxsize=4096)
def process_uuid(process_id: str) -> uuid.UUID:
    """Deterministic aggregate id: registering one id twice collides in the store."""
    return uuid.uuid5(_NAMESPACE, process_id)


def timestamp_of(at_ms: int) -> datetime:
    """eventsourcing's own timestamp, from our clock (exact to the millisecond until 2100)."""
    return datetime.fromtimestamp(at_ms / 1000, UTC)


def _fingerprint(*parts: Any) -> str:
    return canonical_json(list(parts)).decode()


def check_diagnostic(diagnostic: str | None) -> None:
    if diagnostic is not None and len(diagnostic.encode()) > MAX_DIAGNOSTIC_BYTES:
        raise ProcessLifecycleValidationError(
            "diagnostic", f"must be at most {MAX_DIAGNOSTIC_BYTES} UTF-8 bytes"
        )


#: Value → member maps: a dict lookup is ~10× cheaper than ``Enum.__call__`` on the hot path.
_STATES: dict[str, ProcessState] = {state.value: state for state in ProcessState}
_REASONS: dict[str, TerminalReason] = {reason.value: reason for reason in TerminalReason}
_DISPOSITIONS = {disposition.value: disposition for disposition in RecoveryDisposition}


def _as_state(value: ProcessState | str) -> ProcessState:
    try:
        return _STATES[value]
    except (KeyError, TypeError):
        raise ProcessLifecycleValidationError("state_reason", f"unknown state {value!r}") from None


def _as_reason(value: TerminalReason | str | None) -> TerminalReason | None:
    if value is None:
        return None
    try:
        return _REASONS[value]
    except (KeyError, TypeError):
        raise ProcessLifecycleValidationError("state_reason", f"unknown reason {value!r}") from None


def check_completion_fields(
    state: ProcessState, exit_code: int | None, diagnostic: str | None, value: Any
) -> None:
    """Field rules of a completion: which state may carry which detail."""
    if (exit_code is None) == (state is ProcessState.exited):
        raise ProcessLifecycleValidationError(
            "exit_code", "is required for 'exited' and only allowed there"
        )
    if diagnostic is not None and state is not ProcessState.failed:
        raise ProcessLifecycleValidationError(
            "diagnostic", "is only allowed on failed completions, lost and abandoned"
        )
    if value is not None and state is not ProcessState.exited:
        raise ProcessLifecycleValidationError("value", "is only allowed for 'exited'")
    check_diagnostic(diagnostic)


class Process(Aggregate):
    TOPIC = "procledger:Process"

    class Event(Aggregate.Event):
        TOPIC = "procledger:Process.Event"
        at_ms: int

        def apply(self, aggregate: Any) -> None:
            aggregate.updated_at_ms = self.at_ms
            self.evolve(aggregate)

        def evolve(self, process: Process) -> None:
            """Assign this event's facts to the aggregate (runs on every replay)."""

    class Registered(Event, Aggregate.Created):
        TOPIC = "procledger:Process.Registered"
        registration: dict[str, Any]
        registration_hash: str

    class Started(Event):
        TOPIC = "procledger:Process.Started"
        state: str
        started_at_ms: int
        event_id: str | None

        def evolve(self, process: Process) -> None:
            process.state = _STATES[self.state]
            process.started_at_ms = self.started_at_ms
            process.remember(self)

        def fingerprint(self) -> str:
            return _fingerprint("started", self.started_at_ms)

    class Backgrounded(Event):
        TOPIC = "procledger:Process.Backgrounded"
        state: str
        backgrounded_at_ms: int
        event_id: str | None

        def evolve(self, process: Process) -> None:
            if process.started_at_ms is None:
                process.started_at_ms = self.backgrounded_at_ms
            process.state = _STATES[self.state]
            process.backgrounded = True
            process.remember(self)

        def fingerprint(self) -> str:
            return _fingerprint("backgrounded", self.backgrounded_at_ms)

    class StopRequested(Event):
        TOPIC = "procledger:Process.StopRequested"
        state: str
        reason: str
        event_id: str | None

        def evolve(self, process: Process) -> None:
            process.stop_requested.append(_REASONS[self.reason])
            process.remember(self)

        def fingerprint(self) -> str:
            return _fingerprint("stop_requested", self.reason)

    class Terminal(Event):
        """Base of the three terminal events; the fields compared for identical replays."""

        TOPIC = "procledger:Process.Terminal"
        state: str
        reason: str
        event_id: str | None
        authority: dict[str, Any] | None

        def evolve(self, process: Process) -> None:
            process.state = _STATES[self.state]
            process.reason = _REASONS[self.reason]
            process.finished_at_ms = self.at_ms
            process.wait = None
            process.terminal_event = self
            process.remember(self)

        def fingerprint(self) -> str:
            raise NotImplementedError

    class Completed(Terminal):
        TOPIC = "procledger:Process.Completed"
        exit_code: int | None
        diagnostic: str | None
        value: Any

        def evolve(self, process: Process) -> None:
            super().evolve(process)
            process.exit_code = self.exit_code
            process.diagnostic = self.diagnostic
            process.value = self.value

        def fingerprint(self) -> str:
            return _completed_fingerprint(
                self.state, self.reason, self.exit_code, self.diagnostic, self.value
            )

    class Lost(Terminal):
        TOPIC = "procledger:Process.Lost"
        diagnostic: str | None

        def evolve(self, process: Process) -> None:
            super().evolve(process)
            process.diagnostic = self.diagnostic

        def fingerprint(self) -> str:
            return _fingerprint("lost", self.diagnostic)

    class Abandoned(Terminal):
        TOPIC = "procledger:Process.Abandoned"
        diagnostic: str | None
        owner: dict[str, Any] | None
        evidence_at_ms: int | None

        def evolve(self, process: Process) -> None:
            super().evolve(process)
            process.diagnostic = self.diagnostic
            if self.owner is not None and self.evidence_at_ms is not None:
                process.abandon_evidence = OwnerStamp(
                    owner=LeaseOwner.model_validate(self.owner), at_ms=self.evidence_at_ms
                )

        def fingerprint(self) -> str:
            return _fingerprint("abandoned", self.reason, self.diagnostic, self.owner)

    class ProducerEvent(Event):
        TOPIC = "procledger:Process.ProducerEvent"
        event_type: str
        payload: Any
        replay_key: str

        def evolve(self, process: Process) -> None:
            process.replay_keys[self.replay_key] = (
                _fingerprint(self.event_type, self.payload),
                self.originator_version,
            )

    class FirstStarted(Event):
        TOPIC = "procledger:Process.FirstStarted"
        owner: dict[str, Any]
        first_started_at_ms: int

        def evolve(self, process: Process) -> None:
            process.first_started_json = {"owner": self.owner, "at_ms": self.first_started_at_ms}

    class AbandonRequested(Event):
        TOPIC = "procledger:Process.AbandonRequested"
        requested_by: str
        reason: str | None

        def evolve(self, process: Process) -> None:
            process.abandon_request = AbandonRequest(
                requested_by=self.requested_by, requested_at_ms=self.at_ms, reason=self.reason
            )

    class WaitSet(Event):
        TOPIC = "procledger:Process.WaitSet"
        wait: dict[str, Any]

        def evolve(self, process: Process) -> None:
            process.wait = WaitState.model_validate(self.wait)

    class WaitCleared(Event):
        TOPIC = "procledger:Process.WaitCleared"

        def evolve(self, process: Process) -> None:
            process.wait = None

    class ExternalRefSet(Event):
        TOPIC = "procledger:Process.ExternalRefSet"
        ref: dict[str, Any]

        def evolve(self, process: Process) -> None:
            process.external_ref = ExternalRef.model_validate(self.ref)

    class WakeTargetCleared(Event):
        TOPIC = "procledger:Process.WakeTargetCleared"
        session_id: str

        def evolve(self, process: Process) -> None:
            process.wake_target_cleared = True

    # -- creation -------------------------------------------------------------------------

    def __init__(self, registration: dict[str, Any], registration_hash: str, at_ms: int) -> None:
        # Kept as stored (JSON); parsed into a ProcessRegistration only when a command needs
        # it, so replaying for a read model never pays for validation it does not use.
        self.registration_json = _checked_registration_document(registration)
        self._registration: ProcessRegistration | None = None
        self._registration_fields: dict[str, Any] | None = None
        self._identity_model: Identity | None = None
        self.registration_hash = registration_hash
        self.created_at_ms = at_ms
        self.updated_at_ms = at_ms
        self.state = ProcessState.starting
        self.reason: TerminalReason | None = None
        self.exit_code: int | None = None
        self.diagnostic: str | None = None
        self.value: Any = None
        self.stop_requested: list[TerminalReason] = []
        self.backgrounded = False
        self.started_at_ms: int | None = None
        self.finished_at_ms: int | None = None
        self.first_started_json: dict[str, Any] | None = None
        self._first_started: OwnerStamp | None = None
        self.abandon_request: AbandonRequest | None = None
        self.abandon_evidence: OwnerStamp | None = None
        self.wait: WaitState | None = None
        self.external_ref: ExternalRef | None = None
        self.wake_target_cleared = False
        self.terminal_event: Process.Terminal | None = None
        self.event_ids: dict[str, str] = {}
        self.replay_keys: dict[str, tuple[str, int]] = {}

    @classmethod
    def register(cls, registration: ProcessRegistration, *, at_ms: int) -> Process:
        document = registration.model_dump(mode="json")
        process: Process = cls._create(
            cls.Registered,
            id=process_uuid(registration.id),
            registration=document,
            registration_hash=registration_hash_of(document),
            at_ms=at_ms,
            timestamp=timestamp_of(at_ms),
        )
        process._registration = registration
        _remember_registration(process.registration_hash, registration)
        return process

    # -- helpers used by events -------------------------------------------------------------

    @property
    def registration(self) -> ProcessRegistration:
        if self._registration is None:
            self._registration = _parsed_registration(
                self.registration_json, self.registration_hash
            )
        return self._registration

    @property
    def process_id(self) -> str:
        process_id: str = self.registration_json["id"]
        return process_id

    @property
    def first_started(self) -> OwnerStamp | None:
        if self.first_started_json is None:
            return None
        if self._first_started is None:
            self._first_started = OwnerStamp.model_validate(self.first_started_json)
        return self._first_started

    @property
    def disposition(self) -> RecoveryDisposition:
        known = _DISPOSITIONS.get(self.registration_json["disposition"])
        return known if known is not None else self.registration.disposition

    def remember(self, event: Any) -> None:
        """Index an event by its caller-supplied id (fingerprinted only when there is one)."""
        if event.event_id is not None:
            self.event_ids[event.event_id] = event.fingerprint()

    @property
    def terminal_fingerprint(self) -> str | None:
        """What an identical terminal repeat must match; computed only when asked."""
        return None if self.terminal_event is None else self.terminal_event.fingerprint()

    def _emit(self, event_class: type[Process.Event], at_ms: int, **fields: Any) -> None:
        # What ``trigger_event`` does, minus its per-call topic lookup (our topics are pinned
        # and registered when the class is created): this is the hot path of every command.
        # Built as the codec rebuilds stored events (no frozen-dataclass ``__init__``): every
        # field is supplied here, by our own code, from values already validated.
        event = object.__new__(event_class)
        event.__dict__.update(
            originator_id=self.id,
            originator_version=self.version + 1,
            timestamp=timestamp_of(at_ms),
            at_ms=at_ms,
            **fields,
        )
        # ``mutate`` would re-check the id and version we just set; replay still goes through it.
        event.apply(self)
        self.version = event.originator_version
        self.modified_on = event.timestamp
        self.pending_events.append(event)

    def _is_replay(self, event_id: str | None, fingerprint: Callable[[], str]) -> bool:
        """True for an identical retry; ``ReplayConflict`` for a reused id with other content."""
        if event_id is None or event_id not in self.event_ids:
            return False
        if self.event_ids[event_id] != fingerprint():
            raise ReplayConflict(
                f"process {self.process_id!r}: event_id {event_id} was used for another write"
            )
        return True

    def _refuse_if_terminal(self, what: str) -> None:
        if self.state.is_terminal:
            raise AlreadyTerminal(
                self.state.value,
                what,
                self.state.value,
                process_id=self.process_id,
            )

    # -- non-terminal lifecycle ---------------------------------------------------------------

    def record_started(self, started_at_ms: int, *, at_ms: int, event_id: str | None) -> bool:
        if self._is_replay(event_id, lambda: _fingerprint("started", started_at_ms)):
            return False
        check_transition(
            self.state, LifecycleKind.started, ProcessState.running, process_id=self.process_id
        )
        self._emit(
            self.Started,
            at_ms,
            state=ProcessState.running.value,
            started_at_ms=started_at_ms,
            event_id=event_id,
        )
        return True

    def record_backgrounded(
        self, backgrounded_at_ms: int, *, at_ms: int, event_id: str | None
    ) -> bool:
        if self._is_replay(event_id, lambda: _fingerprint("backgrounded", backgrounded_at_ms)):
            return False
        kind, target = LifecycleKind.backgrounded, ProcessState.running
        check_transition(self.state, kind, target, process_id=self.process_id)
        if self.backgrounded:
            raise InvalidTransition(
                self.state.value, kind.value, target.value, process_id=self.process_id
            )
        self._emit(
            self.Backgrounded,
            at_ms,
            state=target.value,
            backgrounded_at_ms=backgrounded_at_ms,
            event_id=event_id,
        )
        return True

    def request_stop(
        self, reason: TerminalReason | str, *, at_ms: int, event_id: str | None
    ) -> bool:
        stop_reason = _as_reason(reason)
        check_row(LifecycleKind.stop_requested, ProcessState.running, stop_reason)
        assert stop_reason is not None
        if self._is_replay(event_id, lambda: _fingerprint("stop_requested", stop_reason.value)):
            return False
        check_transition(
            self.state, LifecycleKind.stop_requested, self.state, process_id=self.process_id
        )
        if stop_reason in self.stop_requested:
            return False
        self._emit(
            self.StopRequested,
            at_ms,
            state=self.state.value,
            reason=stop_reason.value,
            event_id=event_id,
        )
        return True

    # -- terminals ------------------------------------------------------------------------------

    def _decide_terminal(
        self,
        kind: LifecycleKind,
        state: ProcessState,
        event_id: str | None,
        fingerprint: Callable[[], str],
    ) -> bool:
        """Replay, then state: True when the terminal must be appended."""
        if event_id is not None and self._is_replay(event_id, fingerprint):
            return False
        if self.state.is_terminal:
            if self.terminal_fingerprint == fingerprint():
                return False
            raise AlreadyTerminal(
                self.state.value, kind.value, state.value, process_id=self.process_id
            )
        check_transition(self.state, kind, state, process_id=self.process_id)
        return True

    def check_authority(
        self, authority: CompletionAuthority, *, reason: TerminalReason | None
    ) -> None:
        allowed = authority.allows(
            self.disposition,
            abandon_requested_reason=reason is TerminalReason.abandon_requested,
            abandon_pending=self.abandon_request is not None,
        )
        if not allowed:
            raise AuthorityRejected(
                f"process {self.process_id!r} ({self.disposition.value}): authority "
                f"{authority.authority!r} may not record this terminal"
            )

    def complete(
        self,
        state: ProcessState | str,
        reason: TerminalReason | str,
        *,
        exit_code: int | None,
        diagnostic: str | None,
        value: Any,
        event_id: str | None,
        authority: CompletionAuthority | None,
        at_ms: int,
    ) -> bool:
        to_state, terminal_reason = _as_state(state), _as_reason(reason)
        check_row(LifecycleKind.completed, to_state, terminal_reason)
        assert terminal_reason is not None
        check_completion_fields(to_state, exit_code, diagnostic, value)

        def fingerprint() -> str:
            assert terminal_reason is not None
            return _completed_fingerprint(
                to_state.value, terminal_reason.value, exit_code, diagnostic, value
            )

        if not self._decide_terminal(LifecycleKind.completed, to_state, event_id, fingerprint):
            return False
        if authority is not None:
            self.check_authority(authority, reason=terminal_reason)
        self._emit(
            self.Completed,
            at_ms,
            state=to_state.value,
            reason=terminal_reason.value,
            exit_code=exit_code,
            diagnostic=diagnostic,
            value=value,
            event_id=event_id,
            authority=authority_payload(authority),
        )
        return True

    def lose(
        self,
        *,
        diagnostic: str | None,
        event_id: str | None,
        authority: CompletionAuthority | None,
        at_ms: int,
    ) -> bool:
        check_diagnostic(diagnostic)
        state = ProcessState.lost_on_restore
        if not self._decide_terminal(
            LifecycleKind.lost, state, event_id, lambda: _fingerprint("lost", diagnostic)
        ):
            return False
        if authority is not None:
            self.check_authority(authority, reason=TerminalReason.lost_on_restore)
        self._emit(
            self.Lost,
            at_ms,
            state=state.value,
            reason=TerminalReason.lost_on_restore.value,
            diagnostic=diagnostic,
            event_id=event_id,
            authority=authority_payload(authority),
        )
        return True

    def abandon(
        self,
        reason: TerminalReason | str,
        *,
        owner: LeaseOwner | None,
        evidence_at_ms: int | None,
        diagnostic: str | None,
        event_id: str | None,
        authority: CompletionAuthority | None,
        at_ms: int,
    ) -> bool:
        abandon_reason = _as_reason(reason)
        check_row(LifecycleKind.abandoned, ProcessState.abandoned, abandon_reason)
        assert abandon_reason is not None
        check_diagnostic(diagnostic)
        owner_json = owner.model_dump(mode="json") if owner is not None else None
        reason_value = abandon_reason.value
        if not self._decide_terminal(
            LifecycleKind.abandoned,
            ProcessState.abandoned,
            event_id,
            lambda: _fingerprint("abandoned", reason_value, diagnostic, owner_json),
        ):
            return False
        if authority is not None:
            self.check_authority(authority, reason=abandon_reason)
        self._emit(
            self.Abandoned,
            at_ms,
            state=ProcessState.abandoned.value,
            reason=abandon_reason.value,
            diagnostic=diagnostic,
            owner=owner_json,
            evidence_at_ms=(evidence_at_ms if evidence_at_ms is not None else at_ms)
            if owner is not None
            else None,
            event_id=event_id,
            authority=authority_payload(authority),
        )
        return True

    # -- other facts ------------------------------------------------------------------------------

    def append_producer_event(
        self, event_type: str, payload: Any, *, replay_key: str, at_ms: int
    ) -> int:
        """Append a declared producer event; returns its sequence (the original one on replay)."""
        if not self.registration.declares(event_type):
            raise UndeclaredEventType(
                f"process {self.process_id!r} did not declare event type {event_type!r}"
            )
        fingerprint = _fingerprint(event_type, payload)
        if replay_key in self.replay_keys:
            recorded, sequence = self.replay_keys[replay_key]
            if recorded != fingerprint:
                raise ReplayConflict(
                    f"process {self.process_id!r}: replay_key {replay_key!r} was used "
                    "with another payload"
                )
            return sequence
        self._refuse_if_terminal(event_type)
        self._emit(
            self.ProducerEvent,
            at_ms,
            event_type=event_type,
            payload=payload,
            replay_key=replay_key,
        )
        return self.version

    def record_first_started(
        self, owner: LeaseOwner, first_started_at_ms: int, *, at_ms: int
    ) -> bool:
        if self.first_started is not None or self.state.is_terminal:
            return False
        self._emit(
            self.FirstStarted,
            at_ms,
            owner=owner.model_dump(mode="json"),
            first_started_at_ms=first_started_at_ms,
        )
        return True

    def request_abandon(self, requested_by: str, reason: str | None, *, at_ms: int) -> bool:
        self._refuse_if_terminal("abandon_requested")
        if self.abandon_request is not None:
            return False
        self._emit(self.AbandonRequested, at_ms, requested_by=requested_by, reason=reason)
        return True

    def set_wait(self, wait: WaitState, *, at_ms: int) -> bool:
        self._refuse_if_terminal("wait_set")
        if self.wait == wait:
            return False
        self._emit(self.WaitSet, at_ms, wait=wait.model_dump(mode="json"))
        return True

    def clear_wait(self, *, at_ms: int) -> bool:
        if self.wait is None:
            return False
        self._emit(self.WaitCleared, at_ms)
        return True

    def set_external_ref(self, ref: ExternalRef, *, at_ms: int) -> bool:
        if self.external_ref is not None:
            if self.external_ref == ref:
                return False
            raise ReplayConflict(
                f"process {self.process_id!r} already has external ref "
                f"{self.external_ref.backend}:{self.external_ref.id}"
            )
        self._emit(self.ExternalRefSet, at_ms, ref=ref.model_dump(mode="json"))
        return True

    def clear_wake_target(self, session_id: str, *, at_ms: int) -> bool:
        target = self.wake_target
        if target is None or target.session_id != session_id:
            return False
        self._emit(self.WakeTargetCleared, at_ms, session_id=session_id)
        return True

    # -- reading ----------------------------------------------------------------------------------

    @property
    def wake_target(self) -> SessionScope | None:
        return None if self.wake_target_cleared else self.registration.wake_target

    def record_document(self, change_seq: int) -> dict[str, Any]:
        """The record as JSON, built from what the events stored (no model round trip).

        This is what the read model stores and what ``to_record`` validates, so the row and
        the returned record can never disagree. Field order follows ``ProcessRecord``.
        """
        return {
            **self._registration_part(),
            "wake_target": (
                None if self.wake_target_cleared else self.registration_json["wake_target"]
            ),
            "env_ref": self.registration_json["env_ref"],
            "event_types": self.registration_json["event_types"],
            "descriptor": self.registration_json["descriptor"],
            "state": self.state.value,
            "reason": None if self.reason is None else self.reason.value,
            "exit_code": self.exit_code,
            "diagnostic": self.diagnostic,
            "value": self.value,
            "status": coarse_status(self.state, self.reason, self.exit_code).value,
            "stop_requested": [reason.value for reason in self.stop_requested],
            "backgrounded": self.backgrounded,
            "created_at_ms": self.created_at_ms,
            "updated_at_ms": self.updated_at_ms,
            "started_at_ms": self.started_at_ms,
            "finished_at_ms": self.finished_at_ms,
            "first_started": self.first_started_json,
            "abandon_request": _json_or_none(self.abandon_request),
            "abandon_evidence": _json_or_none(self.abandon_evidence),
            "wait": _json_or_none(self.wait),
            "external_ref": _json_or_none(self.external_ref),
            "change_seq": change_seq,
        }

    def _registration_part(self) -> dict[str, Any]:
        """The leading record fields, which only the registration decides: built once per
        aggregate, since a registry reuses an aggregate across its writes."""
        part = self._registration_fields
        if part is None:
            registration = self.registration_json
            kind, label = input_identity(registration["input"])
            part = self._registration_fields = {
                "id": registration["id"],
                "registration_hash": self.registration_hash,
                "input": registration["input"],
                "disposition": registration["disposition"],
                "identity": {
                    "kind": kind,
                    "label": label,
                    "definition": registration["definition"],
                },
                "originator": registration["originator"],
            }
        return part

    def to_record(self, change_seq: int) -> ProcessRecord:
        """The record as a model, assembled from parts that are already validated (the
        registration, the facts); ``record_document`` is its JSON form, and a property test
        holds the two equal."""
        registration = self.registration
        return assemble(
            ProcessRecord,
            {
                "id": registration.id,
                "registration_hash": self.registration_hash,
                "input": registration.input,
                "disposition": registration.disposition,
                "identity": self._identity(),
                "originator": registration.originator,
                "wake_target": self.wake_target,
                "env_ref": registration.env_ref,
                "event_types": registration.event_types,
                "descriptor": registration.descriptor,
                "state": self.state,
                "reason": self.reason,
                "exit_code": self.exit_code,
                "diagnostic": self.diagnostic,
                "value": self.value,
                "status": coarse_status(self.state, self.reason, self.exit_code),
                "stop_requested": list(self.stop_requested),
                "backgrounded": self.backgrounded,
                "created_at_ms": self.created_at_ms,
                "updated_at_ms": self.updated_at_ms,
                "started_at_ms": self.started_at_ms,
                "finished_at_ms": self.finished_at_ms,
                "first_started": self.first_started,
                "abandon_request": self.abandon_request,
                "abandon_evidence": self.abandon_evidence,
                "wait": self.wait,
                "external_ref": self.external_ref,
                "change_seq": change_seq,
            },
        )

    def _identity(self) -> Identity:
        """The record's identity, from the same fields as the document's (built once)."""
        if self._identity_model is None:
            fields = dict(self._registration_part()["identity"])
            self._identity_model = assemble(Identity, fields)
        return self._identity_model


def _json_or_none(model: Frozen | None) -> dict[str, Any] | None:
    return None if model is None else model.model_dump(mode="json")


_REGISTRATION_KEYS = frozenset(ProcessRegistration.model_fields)


def _checked_registration_document(document: dict[str, Any]) -> dict[str, Any]:
    """A stored registration must have every field (``disposition`` has no default anywhere).

    The full validation runs when a command first needs the parsed registration; this cheap
    check makes a damaged event fail on replay, where the codec reports it with its process.
    """
    missing = _REGISTRATION_KEYS - document.keys()
    if missing:
        raise ValueError(f"stored registration lacks {', '.join(sorted(missing))}")
    return document


_REGISTRATIONS: dict[str, ProcessRegistration] = {}
_REGISTRATIONS_KEPT = 4096


def _keep(cache: dict[str, Any], registration_hash: str, value: Any) -> None:
    """Per-registration caches stay bounded: past the limit, start again from empty."""
    if len(cache) >= _REGISTRATIONS_KEPT:
        cache.clear()
    cache[registration_hash] = value


def _remember_registration(registration_hash: str, registration: ProcessRegistration) -> None:
    _keep(_REGISTRATIONS, registration_hash, registration)


def _parsed_registration(data: dict[str, Any], registration_hash: str) -> ProcessRegistration:
    """The registration of a ``Registered`` event, validated once per content hash.

    Every load of a process replays its ``Registered`` event; validating the same registration
    again was a fifth of a load. The model is frozen, so sharing one instance is safe.
    """
    parsed = _REGISTRATIONS.get(registration_hash)
    if parsed is None:
        parsed = ProcessRegistration.model_validate(data)
        _remember_registration(registration_hash, parsed)
    return parsed


def _completed_fingerprint(
    state: str, reason: str, exit_code: int | None, diagnostic: str | None, value: Any
) -> str:
    return _fingerprint("completed", state, reason, exit_code, diagnostic, value)


_EVENT_KINDS: dict[type[Process.Event], str] = {
    Process.Registered: "registered",
    Process.Started: LifecycleKind.started.value,
    Process.Backgrounded: LifecycleKind.backgrounded.value,
    Process.StopRequested: LifecycleKind.stop_requested.value,
    Process.Completed: LifecycleKind.completed.value,
    Process.Lost: LifecycleKind.lost.value,
    Process.Abandoned: LifecycleKind.abandoned.value,
    Process.FirstStarted: "first_started",
    Process.AbandonRequested: "abandon_requested",
    Process.WaitSet: "wait_set",
    Process.WaitCleared: "wait_cleared",
    Process.ExternalRefSet: "external_ref_set",
    Process.WakeTargetCleared: "wake_target_cleared",
}

_BOOKKEEPING = frozenset({"originator_id", "originator_version", "timestamp", "originator_topic"})


def event_kind(event: Process.Event) -> str:
    if isinstance(event, Process.ProducerEvent):
        return event.event_type
    return _EVENT_KINDS[type(event)]


def to_process_event(process_id: str, event: Process.Event) -> ProcessEvent:
    """The log entry a caller sees: kind, payload (no bookkeeping), event id, time."""
    fields = {k: v for k, v in vars(event).items() if k not in _BOOKKEEPING}
    at_ms = fields.pop("at_ms")
    event_id = fields.pop("event_id", None)
    if isinstance(event, Process.ProducerEvent):
        event_id = None
        fields = {"payload": event.payload, "replay_key": event.replay_key}
    return ProcessEvent(
        process_id=process_id,
        sequence=event.originator_version,
        kind=event_kind(event),
        payload=fields,
        event_id=event_id,
        occurred_at_ms=at_ms,
    )
