"""The Process aggregate: every fact about one process, decided here and kept as events.

Commands (public methods) validate and decide; event ``apply`` bodies only assign, because they
run again on every replay. Events carry JSON-native values only, so an orjson round trip
restores them exactly, and each lifecycle event stores the state it results in, so replaying
old events never consults today's table. Topics are pinned: renaming a class must not orphan
stored data.

Shapes evolve by version: each event class declares ``class_version``, and one whose stored
JSON changed carries ``upcast_vN_vN+1`` static methods the codec applies to older state.

Error order for every write: validation, identical replay (a no-op), state, then authority
(the lease, which needs the store, is the registry's last check).

How a completion ended is one value, ``domain/outcome.py``'s ``Outcome``: checked and
fingerprinted there, turned into the ``Completed`` event here by ``end`` (docs/design.md §6.2).

Reading lives elsewhere, so this module stays about decisions: ``rendering`` turns an
aggregate into its record and log entries, ``caches`` keeps per-registration work.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar, overload

from eventsourcing.domain import Aggregate
from eventsourcing.utils import get_topic
from pydantic import BaseModel

from procledger.domain.caches import (
    check_registration_hash,
    checked_registration_document,
    parsed_registration,
    remember_hashed,
    remember_registration,
)
from procledger.domain.errors import (
    AlreadyTerminal,
    AuthorityRejected,
    InvalidTransition,
    ProcessLifecycleValidationError,
    ReplayConflict,
    UndeclaredEventType,
)
from procledger.domain.input import InputWait, SentInput
from procledger.domain.leases import CompletionAuthority, LeaseOwner, authority_payload
from procledger.domain.lifecycle_table import check_row, check_transition
from procledger.domain.outcome import (
    MAX_SIGNAL,
    REASONS,
    SIGNAL_STATES,
    STATES,
    Outcome,
    as_reason,
    check_diagnostic,
    fingerprint,
)
from procledger.domain.process_keys import process_key_hex, process_uuid
from procledger.domain.records import (
    AbandonRequest,
    ExternalRef,
    OsFacts,
    OutputSummary,
    OwnerStamp,
    ResourceUse,
    StoppedOrphan,
    WaitState,
)
from procledger.domain.registration import ProcessRegistration, SessionScope
from procledger.domain.vocabulary import (
    LifecycleKind,
    ProcessState,
    RecoveryDisposition,
    TerminalReason,
)

__all__ = [
    "MAX_SIGNAL",
    "SIGNAL_STATES",
    "TERMINAL_KINDS",
    "Process",
    "os_document",
    "process_key_hex",
    "process_uuid",
    "running_fingerprint",
    "timestamp_of",
]


TERMINAL_KINDS = frozenset({LifecycleKind.completed, LifecycleKind.lost, LifecycleKind.abandoned})


def timestamp_of(at_ms: int) -> datetime:
    """eventsourcing's own timestamp, from our clock (exact to the millisecond until 2100)."""
    return datetime.fromtimestamp(at_ms / 1000, UTC)


#: Value → member map: a dict lookup is ~10× cheaper than ``Enum.__call__`` on the hot path.
_DISPOSITIONS = {disposition.value: disposition for disposition in RecoveryDisposition}


_Model = TypeVar("_Model", bound=BaseModel)


class Parsed(Generic[_Model]):
    """An aggregate's ``<name>``: the JSON its events stored as ``<name>_json``, parsed as
    ``model`` only when a reader asks for it, and once (kept in ``_<name>``). Replay assigns
    the JSON and never pays for a validation nobody reads."""

    def __init__(self, model: type[_Model]) -> None:
        self.model = model
        self.source = self.cache = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.source, self.cache = f"{name}_json", f"_{name}"

    @overload
    def __get__(self, process: None, owner: type) -> Parsed[_Model]: ...
    @overload
    def __get__(self, process: object, owner: type | None = None) -> _Model | None: ...
    def __get__(self, process: object, owner: type | None = None) -> Parsed[_Model] | _Model | None:
        if process is None:
            return self  # asked of the class: the descriptor, as a property answers
        document = getattr(process, self.source)
        if document is None:
            return None
        parsed: _Model | None = getattr(process, self.cache)
        if parsed is None:
            parsed = self.model.model_validate(document)
            setattr(process, self.cache, parsed)
        return parsed


class Process(Aggregate):
    TOPIC = "procledger:Process"

    class Event(Aggregate.Event):
        """Base of every stored event. Each subclass declares its own ``class_version``: the
        shape its stored JSON has; changing a shape means a new version and an
        ``upcast_vN_vN+1`` static method that brings older stored state up to it (the codec
        applies them in order, as eventsourcing's ``Mapper`` does)."""

        TOPIC = "procledger:Process.Event"
        class_version = 1
        at_ms: int

        def apply(self, aggregate: Any) -> None:
            aggregate.updated_at_ms = self.at_ms
            self.evolve(aggregate)

        def evolve(self, process: Process) -> None:
            """Assign this event's facts to the aggregate (runs on every replay)."""

    class Registered(Event, Aggregate.Created):
        TOPIC = "procledger:Process.Registered"
        class_version = 1
        registration: dict[str, Any]
        registration_hash: str

        def mutate(self, aggregate: Any) -> Any:
            """The new process, built directly: eventsourcing's generic creation matches the
            event's fields to ``__init__``'s parameters for every event, a tenth of what a
            rebuild spends per process."""
            process = object.__new__(Process)
            process.__base_init__(self.originator_id, self.originator_version, self.timestamp)
            process.__init__(self.registration, self.registration_hash, self.at_ms)  # type: ignore[misc]
            self.apply(process)
            return process

    class Running(Event):
        """Base of the two events that make a process running, which carry the child's OS
        facts since v2 (0.2.0): ``os``; v1 events read back with ``os=None`` (§11.3)."""

        TOPIC = "procledger:Process.Running"
        class_version = 2
        state: str
        event_id: str | None
        os: dict[str, Any] | None

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["os"] = None

    class Started(Running):
        TOPIC = "procledger:Process.Started"
        class_version = 2
        started_at_ms: int

        def evolve(self, process: Process) -> None:
            process.state = STATES[self.state]
            process.started_at_ms = self.started_at_ms
            process.os_json = self.os
            process.remember(self)

        def fingerprint(self) -> str:
            return running_fingerprint("started", self.started_at_ms, self.os)

    class Backgrounded(Running):
        """A background run is never ``Started``, so this is the event that made it running and
        its facts are the run's; after a ``Started`` it only fills facts that one lacked."""

        TOPIC = "procledger:Process.Backgrounded"
        class_version = 2
        backgrounded_at_ms: int

        def evolve(self, process: Process) -> None:
            if process.started_at_ms is None:
                process.started_at_ms = self.backgrounded_at_ms
            if process.os_json is None:
                process.os_json = self.os
            process.state = STATES[self.state]
            process.backgrounded = True
            process.remember(self)

        def fingerprint(self) -> str:
            return running_fingerprint("backgrounded", self.backgrounded_at_ms, self.os)

    class StopRequested(Event):
        TOPIC = "procledger:Process.StopRequested"
        class_version = 1
        state: str
        reason: str
        event_id: str | None

        def evolve(self, process: Process) -> None:
            process.stop_requested.append(REASONS[self.reason])
            process.remember(self)

        def fingerprint(self) -> str:
            return fingerprint("stop_requested", self.reason)

    class Terminal(Event):
        """Base of the three terminal events; the fields compared for identical replays."""

        TOPIC = "procledger:Process.Terminal"
        class_version = 1
        state: str
        reason: str
        event_id: str | None
        authority: dict[str, Any] | None

        def evolve(self, process: Process) -> None:
            process.state = STATES[self.state]
            process.reason = REASONS[self.reason]
            process.finished_at_ms = self.at_ms
            process.wait = None
            process.waiting_json = None
            process.terminal_event = self
            process.remember(self)

        def fingerprint(self) -> str:
            raise NotImplementedError

    class Completed(Terminal):
        """v2 (0.2.0): ``signal``, the number of the signal that ended the child (or null),
        and ``survivors``, the OS pids a tree stop left alive; v1 events read back with
        ``signal=None`` and ``survivors=[]``."""

        TOPIC = "procledger:Process.Completed"
        class_version = 2
        exit_code: int | None
        diagnostic: str | None
        value: Any
        signal: int | None
        survivors: list[int]

        @staticmethod
        def upcast_v1_v2(state: dict[str, Any]) -> None:
            state["signal"] = None
            state["survivors"] = []

        def evolve(self, process: Process) -> None:
            super().evolve(process)
            process.exit_code = self.exit_code
            process.diagnostic = self.diagnostic
            process.value = self.value
            process.signal = self.signal
            process.survivors = self.survivors

        def fingerprint(self) -> str:
            return Outcome.recorded(self).fingerprint()

    class Lost(Terminal):
        TOPIC = "procledger:Process.Lost"
        class_version = 1
        diagnostic: str | None

        def evolve(self, process: Process) -> None:
            super().evolve(process)
            process.diagnostic = self.diagnostic

        def fingerprint(self) -> str:
            return fingerprint("lost", self.diagnostic)

    class Abandoned(Terminal):
        TOPIC = "procledger:Process.Abandoned"
        class_version = 1
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
            return fingerprint("abandoned", self.reason, self.diagnostic, self.owner)

    class ProducerEvent(Event):
        TOPIC = "procledger:Process.ProducerEvent"
        class_version = 1
        event_type: str
        payload: Any
        replay_key: str

        def evolve(self, process: Process) -> None:
            process.replay_keys[self.replay_key] = (
                fingerprint(self.event_type, self.payload),
                self.originator_version,
            )

    class FirstStarted(Event):
        TOPIC = "procledger:Process.FirstStarted"
        class_version = 1
        owner: dict[str, Any]
        first_started_at_ms: int

        def evolve(self, process: Process) -> None:
            process.first_started_json = {"owner": self.owner, "at_ms": self.first_started_at_ms}

    class AbandonRequested(Event):
        TOPIC = "procledger:Process.AbandonRequested"
        class_version = 1
        requested_by: str
        reason: str | None

        def evolve(self, process: Process) -> None:
            process.abandon_request = AbandonRequest(
                requested_by=self.requested_by, requested_at_ms=self.at_ms, reason=self.reason
            )

    class WaitSet(Event):
        TOPIC = "procledger:Process.WaitSet"
        class_version = 1
        wait: dict[str, Any]

        def evolve(self, process: Process) -> None:
            process.wait = WaitState.model_validate(self.wait)

    class WaitCleared(Event):
        TOPIC = "procledger:Process.WaitCleared"
        class_version = 1

        def evolve(self, process: Process) -> None:
            process.wait = None

    class ExternalRefSet(Event):
        TOPIC = "procledger:Process.ExternalRefSet"
        class_version = 1
        ref: dict[str, Any]

        def evolve(self, process: Process) -> None:
            process.external_ref = ExternalRef.model_validate(self.ref)

    class WakeTargetCleared(Event):
        TOPIC = "procledger:Process.WakeTargetCleared"
        class_version = 1
        session_id: str

        def evolve(self, process: Process) -> None:
            process.wake_target_cleared = True

    class Ready(Event):
        """The readiness probes all held at ``ready_at_ms`` (the supervisor's observation);
        ``probes`` names them (docs/design.md §15). Not a lifecycle move: the state stays."""

        TOPIC = "procledger:Process.Ready"
        class_version = 1
        ready_at_ms: int
        probes: list[str]

        def evolve(self, process: Process) -> None:
            process.ready_at_ms = self.ready_at_ms

    class CrashLoop(Event):
        """The supervisor gave the service up after this (ended) attempt: ``restarts``
        restarts within ``window_s`` spent its budget, so no further attempt starts."""

        TOPIC = "procledger:Process.CrashLoop"
        class_version = 1
        attempt: int
        restarts: int
        window_s: float

        def evolve(self, process: Process) -> None:
            process.gave_up = "crash_loop"

    class ServiceStopRequested(Event):
        """A stop of the whole service, recorded on its first attempt (docs/design.md §15.4):
        its supervisor starts no attempt once it has read it. Not a lifecycle move -- the state
        stays -- and an ended first attempt accepts it too: it is a fact about the service."""

        TOPIC = "procledger:Process.ServiceStopRequested"
        class_version = 1
        reason: str

        def evolve(self, process: Process) -> None:
            process.service_stop_requested.append(REASONS[self.reason])

    class OrphanStopped(Event):
        """The child a ``lost`` record left running (``restore --keep-orphans``) was stopped by
        its recorded identity (docs/design.md §6.2): ``pid``, the stop's ``reason``, the signals
        ``sent``, the ``signal`` it ended after, the ``survivors`` and who did it (``by``). Not
        a lifecycle move: the record stays ``lost_on_restore``; the one such fact it accepts."""

        TOPIC = "procledger:Process.OrphanStopped"
        class_version = 1
        pid: int
        reason: str
        sent: list[int]
        signal: int | None
        survivors: list[int]
        by: str

        def evolve(self, process: Process) -> None:
            process.orphan_stopped = True

    class InputSent(Event):
        """Input was written to the process's terminal or stdin (docs/design.md §20.2): journalled
        before the bytes are written, under the sender's ``command_id``, so a retried send
        finds it here and writes nothing more. ``data`` is the bytes (base64), or null when
        ``redacted`` (the terminal's echo was off: a password); ``size`` is always told;
        ``eof``: the input was closed (Ctrl-D on a terminal) after them."""

        TOPIC = "procledger:Process.InputSent"
        class_version = 1
        command_id: str
        size: int
        digest: str
        data: str | None
        redacted: bool
        eof: bool

        def evolve(self, process: Process) -> None:
            process.input_commands[self.command_id] = self.digest
            process.waiting_json = None

    class WaitingForInput(Event):
        """The process blocked reading its terminal or stdin (docs/design.md §20.3): ``kind``
        (``password``, ``question``, ``prompt``, ``input``), the last line it wrote, and which
        ``pid`` reads, ``how``. Not a lifecycle move; ended by input or ``InputWaitEnded``."""

        TOPIC = "procledger:Process.WaitingForInput"
        class_version = 1
        kind: str
        last_line: str
        pid: int
        how: str

        def evolve(self, process: Process) -> None:
            process.waiting_json = {
                "kind": self.kind,
                "last_line": self.last_line,
                "since_ms": self.at_ms,
            }

    class InputWaitEnded(Event):
        """The process stopped waiting without ``send`` (typed into while attached, or it
        went on by itself): ``waiting_for_input`` is null again."""

        TOPIC = "procledger:Process.InputWaitEnded"
        class_version = 1

        def evolve(self, process: Process) -> None:
            process.waiting_json = None

    class OutputTruncated(Event):
        """Bytes ``[start, end)`` of ``stream`` were dropped past the output limit, the oldest
        first (docs/design.md §14)."""

        TOPIC = "procledger:Process.OutputTruncated"
        class_version = 1
        stream: str
        start: int
        end: int

    class OutputStopped(Event):
        """Capture stopped before the run ended (``reason``: a full disk, a vanished folder);
        the child ran on."""

        TOPIC = "procledger:Process.OutputStopped"
        class_version = 1
        reason: str

    class OutputCaptured(Event):
        """At the end of a supervised run: the output summary (``OutputSummary``'s JSON) and
        the last bytes of each stream, base64 (``tails``), so any host can show them."""

        TOPIC = "procledger:Process.OutputCaptured"
        class_version = 1
        output: dict[str, Any]
        tails: dict[str, str]

        def evolve(self, process: Process) -> None:
            process.output_json = self.output
            process.output_tails = self.tails

    class ResourcesUsed(Event):
        """At the end of a run the host agent sampled: what its process tree used, as the
        agent last saw it (docs/design.md §18.10) -- CPU seconds, the peak RSS over the run,
        open files and threads -- so a finished job still tells how big it was."""

        TOPIC = "procledger:Process.ResourcesUsed"
        class_version = 1
        cpu_s: float
        peak_rss_bytes: int
        open_files: int | None
        threads: int | None
        sampled_at_ms: int

        def evolve(self, process: Process) -> None:
            process.resources_json = {
                "cpu_s": self.cpu_s,
                "peak_rss_bytes": self.peak_rss_bytes,
                "open_files": self.open_files,
                "threads": self.threads,
                "sampled_at_ms": self.sampled_at_ms,
            }

    # -- creation -------------------------------------------------------------------------

    def __init__(self, registration: dict[str, Any], registration_hash: str, at_ms: int) -> None:
        # Kept as stored (JSON); parsed into a ProcessRegistration only when a command needs
        # it, so replaying for a read model never pays for validation it does not use.
        check_registration_hash(registration, registration_hash)
        self.registration_json = checked_registration_document(registration)
        self._registration: ProcessRegistration | None = None
        self.registration_hash = registration_hash
        self.created_at_ms = at_ms
        self.updated_at_ms = at_ms
        self.state = ProcessState.starting
        self.reason: TerminalReason | None = None
        self.exit_code: int | None = None
        self.diagnostic: str | None = None
        self.value: Any = None
        self.signal: int | None = None
        self.survivors: list[int] = []
        self.stop_requested: list[TerminalReason] = []
        self.backgrounded = False
        self.started_at_ms: int | None = None
        self.finished_at_ms: int | None = None
        self.os_json: dict[str, Any] | None = None
        self._os: OsFacts | None = None
        self.first_started_json: dict[str, Any] | None = None
        self._first_started: OwnerStamp | None = None
        self.abandon_request: AbandonRequest | None = None
        self.abandon_evidence: OwnerStamp | None = None
        self.wait: WaitState | None = None
        self.external_ref: ExternalRef | None = None
        self.wake_target_cleared = False
        self.output_json: dict[str, Any] | None = None
        self._output: OutputSummary | None = None
        self.output_tails: dict[str, str] = {}
        self.ready_at_ms: int | None = None
        self.gave_up: str | None = None
        self.service_stop_requested: list[TerminalReason] = []
        self.orphan_stopped = False
        self.terminal_event: Process.Terminal | None = None
        self.event_ids: dict[str, str] = {}
        self.replay_keys: dict[str, tuple[str, int]] = {}
        self.input_commands: dict[str, str] = {}
        self.waiting_json: dict[str, Any] | None = None
        self.resources_json: dict[str, Any] | None = None

    @classmethod
    def register(cls, registration: ProcessRegistration, *, at_ms: int) -> Process:
        document = registration.model_dump(mode="json")
        registration_hash = remember_hashed(document)
        process = cls._created(process_uuid(registration.id), at_ms, document, registration_hash)
        process._registration = registration
        remember_registration(process.registration_hash, registration)
        return process

    @classmethod
    def _created(
        cls, originator_id: uuid.UUID, at_ms: int, document: dict[str, Any], registration_hash: str
    ) -> Process:
        # What ``_create`` does, minus its per-call topic lookups and signature inspection
        # (about a quarter of ``register``'s own work): the event is built as the codec
        # rebuilds stored ones, its fields in the order the dataclass gives them (so it
        # encodes to the same bytes), and creates the aggregate as a replay does.
        event = object.__new__(cls.Registered)
        event.__dict__.update(
            originator_id=originator_id,
            originator_version=cls.INITIAL_VERSION,
            timestamp=timestamp_of(at_ms),
            originator_topic=get_topic(cls),
            at_ms=at_ms,
            registration=document,
            registration_hash=registration_hash,
        )
        process: Process = event.mutate(None)
        process.pending_events.append(event)
        return process

    # -- helpers used by events -------------------------------------------------------------

    @property
    def registration(self) -> ProcessRegistration:
        if self._registration is None:
            self._registration = parsed_registration(self.registration_json, self.registration_hash)
        return self._registration

    @property
    def process_id(self) -> str:
        process_id: str = self.registration_json["id"]
        return process_id

    first_started = Parsed(OwnerStamp)
    """Who started the process first, and when (``first_started_json`` parsed)."""
    os = Parsed(OsFacts)
    """The running child's OS facts (``os_json`` parsed)."""
    output = Parsed(OutputSummary)
    """The run's output summary (``output_json`` parsed)."""

    @property
    def os_pid(self) -> int | None:
        return None if self.os_json is None else int(self.os_json["pid"])

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

    def record_started(
        self,
        started_at_ms: int,
        *,
        at_ms: int,
        event_id: str | None,
        os: OsFacts | None = None,
    ) -> bool:
        os_json = os_document(os)
        if self._is_replay(
            event_id, lambda: running_fingerprint("started", started_at_ms, os_json)
        ):
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
            os=os_json,
        )
        return True

    def record_backgrounded(
        self,
        backgrounded_at_ms: int,
        *,
        at_ms: int,
        event_id: str | None,
        os: OsFacts | None = None,
    ) -> bool:
        os_json = os_document(os)
        if self._is_replay(
            event_id, lambda: running_fingerprint("backgrounded", backgrounded_at_ms, os_json)
        ):
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
            os=os_json,
        )
        return True

    def request_stop(
        self, reason: TerminalReason | str, *, at_ms: int, event_id: str | None
    ) -> bool:
        stop_reason = as_reason(reason)
        check_row(LifecycleKind.stop_requested, ProcessState.running, stop_reason)
        assert stop_reason is not None
        if self._is_replay(event_id, lambda: fingerprint("stop_requested", stop_reason.value)):
            return False
        self._refuse_if_terminal(LifecycleKind.stop_requested.value)
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

    def _ends(
        self,
        kind: LifecycleKind,
        state: ProcessState,
        reason: TerminalReason,
        *,
        event_id: str | None,
        fingerprint: Callable[[], str],
        authority: CompletionAuthority | None,
        output: tuple[OutputSummary, dict[str, str]] | None,
        at_ms: int,
    ) -> bool:
        """What every terminal decides before its event, in §3.2's order (docs/design.md):
        replay, then state, then authority; then the run's output facts go first (§14). True
        when the terminal event must follow."""
        if event_id is not None and self._is_replay(event_id, fingerprint):
            return False
        if self.state.is_terminal:
            if self.terminal_fingerprint == fingerprint():
                return False
            raise AlreadyTerminal(
                self.state.value, kind.value, state.value, process_id=self.process_id
            )
        check_transition(self.state, kind, state, process_id=self.process_id)
        if authority is not None:
            self.check_authority(authority, reason=reason)
        self._emit_output(output, at_ms)
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

    def end(
        self,
        outcome: Outcome,
        *,
        event_id: str | None,
        authority: CompletionAuthority | None,
        at_ms: int,
    ) -> bool:
        """Record ``outcome`` as the ``Completed`` terminal; it was checked when it was made
        (``Outcome``), so only replay, state and authority are left to decide."""
        if not self._ends(
            LifecycleKind.completed,
            outcome.state,
            outcome.reason,
            event_id=event_id,
            fingerprint=outcome.fingerprint,
            authority=authority,
            output=outcome.output_facts,
            at_ms=at_ms,
        ):
            return False
        self._emit(  # the stored fields, in the order 0.1.0 and 0.2.0 wrote them (§11)
            self.Completed,
            at_ms,
            state=outcome.state.value,
            reason=outcome.reason.value,
            exit_code=outcome.exit_code,
            diagnostic=outcome.diagnostic,
            value=outcome.value,
            event_id=event_id,
            authority=authority_payload(authority),
            signal=outcome.signal,
            survivors=list(outcome.survivors),
        )
        return True

    def complete(
        self,
        state: ProcessState | str,
        reason: TerminalReason | str,
        *,
        event_id: str | None,
        authority: CompletionAuthority | None,
        at_ms: int,
        **details: Any,
    ) -> bool:
        """``end`` from the outcome's words (``Outcome``'s fields as keywords): the form
        ``procledger.testing.apply_to_process`` sends a completion in."""
        outcome = Outcome.of(state, reason, **details)
        return self.end(outcome, event_id=event_id, authority=authority, at_ms=at_ms)

    def _emit_output(self, facts: tuple[OutputSummary, dict[str, str]] | None, at_ms: int) -> None:
        if facts is None:
            return
        output, tails = facts
        for name, stream in (("stdout", output.stdout), ("stderr", output.stderr)):
            if stream.dropped:
                self._emit(self.OutputTruncated, at_ms, stream=name, start=0, end=stream.dropped)
        if output.stopped is not None:
            self._emit(self.OutputStopped, at_ms, reason=output.stopped)
        self._emit(
            self.OutputCaptured,
            at_ms,
            output=output.model_dump(mode="json"),
            tails={k: str(v) for k, v in tails.items()},
        )

    def lose(
        self,
        *,
        diagnostic: str | None,
        event_id: str | None,
        authority: CompletionAuthority | None,
        at_ms: int,
        output: tuple[OutputSummary, dict[str, str]] | None = None,
    ) -> bool:
        check_diagnostic(diagnostic)
        state = ProcessState.lost_on_restore
        reason = TerminalReason.lost_on_restore
        if not self._ends(  # output: what the gone supervisor's capture left on disk
            LifecycleKind.lost,
            state,
            reason,
            event_id=event_id,
            fingerprint=lambda: fingerprint("lost", diagnostic),
            authority=authority,
            output=output,
            at_ms=at_ms,
        ):
            return False
        self._emit(
            self.Lost,
            at_ms,
            state=state.value,
            reason=reason.value,
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
        output: tuple[OutputSummary, dict[str, str]] | None = None,
    ) -> bool:
        abandon_reason = as_reason(reason)
        check_row(LifecycleKind.abandoned, ProcessState.abandoned, abandon_reason)
        assert abandon_reason is not None
        check_diagnostic(diagnostic)
        owner_json = owner.model_dump(mode="json") if owner is not None else None
        reason_value = abandon_reason.value
        if not self._ends(
            LifecycleKind.abandoned,
            ProcessState.abandoned,
            abandon_reason,
            event_id=event_id,
            fingerprint=lambda: fingerprint("abandoned", reason_value, diagnostic, owner_json),
            authority=authority,
            output=output,
            at_ms=at_ms,
        ):
            return False
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
        content = fingerprint(event_type, payload)
        if replay_key in self.replay_keys:
            recorded, sequence = self.replay_keys[replay_key]
            if recorded != content:
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

    def record_input(self, sent: SentInput, *, at_ms: int) -> bool:
        """Journal a send before its bytes are written: ``False`` (nothing written) when its
        command id is on record already -- the retry of a send that was made."""
        recorded = self.input_commands.get(sent.command_id)
        if recorded is not None:
            if recorded != sent.digest:
                raise ReplayConflict(
                    f"process {self.process_id!r}: command id {sent.command_id!r} was used "
                    "with other input"
                )
            return False
        self._refuse_if_terminal("input_sent")
        if self.state is not ProcessState.running:
            raise InvalidTransition(
                self.state.value, "input_sent", self.state.value, process_id=self.process_id
            )
        self._emit(self.InputSent, at_ms, **sent.fields())
        return True

    def record_waiting(self, wait: InputWait, *, at_ms: int) -> bool:
        """The process waits for input; a no-op once it ended or while a wait is on record."""
        if self.state.is_terminal or self.waiting_json is not None:
            return False
        self._emit(self.WaitingForInput, at_ms, **wait.fields())
        return True

    def record_wait_ended(self, *, at_ms: int) -> bool:
        """The wait on record is over; a no-op when none is."""
        if self.waiting_json is None:
            return False
        self._emit(self.InputWaitEnded, at_ms)
        return True

    def record_resources(self, used: ResourceUse, *, at_ms: int) -> bool:
        """What the run used, told once at its end (the agent's last sample): a repeat -- the
        retry of a write that was made, or a second agent -- is a no-op."""
        if self.resources_json is not None:
            return False
        self._emit(self.ResourcesUsed, at_ms, **used.model_dump())
        return True

    def record_ready(self, ready_at_ms: int, probes: Sequence[str], *, at_ms: int) -> bool:
        """Readiness is told once, while the process runs (the first report wins)."""
        if self.ready_at_ms is not None:
            return False
        self._refuse_if_terminal("ready")
        if self.state is not ProcessState.running:
            raise InvalidTransition(
                self.state.value, "ready", self.state.value, process_id=self.process_id
            )
        self._emit(self.Ready, at_ms, ready_at_ms=ready_at_ms, probes=list(probes))
        return True

    def record_crash_loop(self, restarts: int, window_s: float, *, at_ms: int) -> bool:
        """The verdict on an ended attempt of a service: given up. Only after its terminal
        (the attempt's own lifecycle is complete; this says nothing follows it); once."""
        if self.gave_up is not None:
            return False
        if not self.state.is_terminal:
            raise InvalidTransition(
                self.state.value, "crash_loop", self.state.value, process_id=self.process_id
            )
        attempt = self.registration.attempt or 1
        self._emit(
            self.CrashLoop, at_ms, attempt=attempt, restarts=restarts, window_s=float(window_s)
        )
        return True

    def request_service_stop(self, reason: TerminalReason | str, *, at_ms: int) -> bool:
        """Stop the service this process is the first attempt of: in any state (an ended first
        attempt still names its service); a repeated reason is a no-op, as for ``request_stop``.
        Its current attempt is stopped by ``request_stop`` on that attempt, not by this."""
        stop_reason = as_reason(reason)
        check_row(LifecycleKind.stop_requested, ProcessState.running, stop_reason)
        assert stop_reason is not None
        registration = self.registration
        if registration.restart is None or registration.attempt_of is not None:
            raise ProcessLifecycleValidationError(
                "restart",
                f"process {self.process_id!r} is not the first attempt of a service "
                "(stop a plain process or one attempt with request_stop)",
            )
        if stop_reason in self.service_stop_requested:
            return False
        self._emit(self.ServiceStopRequested, at_ms, reason=stop_reason.value)
        return True

    def record_orphan_stopped(self, stop: StoppedOrphan, *, at_ms: int) -> bool:
        """The child this ``lost_on_restore`` record left running was stopped by its recorded
        identity (its OS pid must be the record's); once -- a repeat is a no-op."""
        if self.state is not ProcessState.lost_on_restore:
            raise InvalidTransition(
                self.state.value, "orphan_stopped", self.state.value, process_id=self.process_id
            )
        check_row(LifecycleKind.stop_requested, ProcessState.running, stop.reason)
        if stop.pid != self.os_pid:
            raise ProcessLifecycleValidationError(
                "pid", f"process {self.process_id!r} recorded OS pid {self.os_pid}, not {stop.pid}"
            )
        if self.orphan_stopped:
            return False
        self._emit(self.OrphanStopped, at_ms, **stop.payload())
        return True

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


def os_document(os: OsFacts | None) -> dict[str, Any] | None:
    """The stored form of OS facts: the JSON the event carries and its fingerprint hashes."""
    return None if os is None else os.model_dump(mode="json")


def running_fingerprint(kind: str, at_ms: int, os: dict[str, Any] | None) -> str:
    """A ``started``/``backgrounded`` retry is identical when it names the same time and the
    same child; the OS facts join the fingerprint only when present, so a v1 event
    (``os=None``) keeps the fingerprint 0.1.0 gave it and a retry from 0.1.0-era code still
    matches it (docs/design.md §11.3)."""
    if os is None:
        return fingerprint(kind, at_ms)
    return fingerprint(kind, at_ms, os)
