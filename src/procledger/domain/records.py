"""The read side of one process: its record and its log entries (docs/design.md §3.3)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, JsonValue

from procledger.domain.leases import LeaseOwner
from procledger.domain.model import Frozen
from procledger.domain.registration import (
    EventType,
    HandleDescriptor,
    Originator,
    ProcessInput,
    SessionScope,
)
from procledger.domain.service import Readiness, RestartPolicy
from procledger.domain.vocabulary import (
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    TerminalReason,
)

MAX_DIAGNOSTIC_BYTES = 512
MAX_PROCESS_HANDLE_BYTES = 128


class Identity(Frozen):
    kind: str
    label: str | None
    definition: JsonValue = None


class OwnerStamp(Frozen):
    """An owner and when it did something: first started, or stopped executing a process."""

    owner: LeaseOwner
    at_ms: int


class AbandonRequest(Frozen):
    requested_by: str
    requested_at_ms: int
    reason: str | None = None


class WaitState(Frozen):
    """What a process is waiting for; cleared by any terminal."""

    kind: str = "signal"
    name: str
    event_type: str
    key: str | None = None
    ordinal: int = 0
    since_ms: int


class ExternalRef(Frozen):
    backend: str = Field(min_length=1)
    id: str = Field(min_length=1)
    metadata: JsonValue = None


class OsFacts(Frozen):
    """Which OS process a run is, as the supervisor saw it when the child started.

    A pid alone is reused by the OS; the pid with its start time (the ``starttime`` field of
    ``/proc/PID/stat``, in clock ticks, as the liveness probe reads it) on one host names one
    child for good, which is what recovery needs to tell a survivor from a stranger. Strict, so
    a bool or a NaN never reaches the stored event, whose JSON must round-trip exactly.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    pid: Annotated[int, Field(gt=0)]
    pgid: Annotated[int, Field(gt=0)]
    start_time: Annotated[int, Field(ge=0)] | Annotated[float, Field(ge=0, allow_inf_nan=False)]
    host_id: Annotated[str, Field(min_length=1)]


class StoppedOrphan(Frozen):
    """How the child a ``lost`` record left running was stopped by its recorded identity
    (docs/design.md §6.2): its OS ``pid``, the stop's ``reason`` (``interrupted``,
    ``terminated`` or ``killed``), the signals ``sent`` in order, the ``signal`` after which it
    was gone (null: it was gone before any), the ``survivors`` of the final SIGKILL, and who
    stopped it (``by``, an owner id). Strict: it becomes a stored event."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    pid: Annotated[int, Field(gt=0)]
    reason: TerminalReason
    sent: list[Annotated[int, Field(ge=1, le=64)]]
    signal: Annotated[int, Field(ge=1, le=64)] | None
    survivors: list[Annotated[int, Field(gt=0)]]
    by: Annotated[str, Field(min_length=1)]

    def payload(self) -> dict[str, Any]:
        """The stored event's fields (JSON-native)."""
        return self.model_dump(mode="json")


class StreamOutput(Frozen):
    """One captured stream of a run: bytes the child wrote, kept on disk, and dropped (the
    oldest first, so always the prefix ``[0, dropped)``) (docs/design.md §14)."""

    written: int = 0
    kept: int = 0
    dropped: int = 0


class OutputSummary(Frozen):
    """Where a run's output lives and how much of it: ``capture`` false when it was run
    without capture; ``host_id`` and ``folder`` the host and the folder that hold the files;
    ``stopped`` why capture stopped early (a full disk, a vanished folder, a supervisor that
    died), else null; ``limit`` null when not known (output salvaged after its supervisor
    died: the limit it was given is not in the ledger)."""

    capture: bool
    host_id: str | None = None
    folder: str | None = None
    limit: int | None = 0
    stdout: StreamOutput = Field(default_factory=StreamOutput)
    stderr: StreamOutput = Field(default_factory=StreamOutput)
    stopped: str | None = None


class InputWaitState(Frozen):
    """A process blocked reading its input, as the ``waiting_for_input`` fact told it."""

    kind: str
    last_line: str
    since_ms: int


class ResourceUse(Frozen):
    """What a run's process tree used, as the host agent saw it (docs/design.md §18.10): CPU
    seconds (user + system), the peak RSS, open files and threads at the last sample, and when
    that was. Where the agent reaped the child itself, CPU and peak also hold what the kernel
    counted at its exit; a run too short to be sampled has only those (no files, no threads)."""

    cpu_s: float = Field(ge=0)
    peak_rss_bytes: int = Field(ge=0)
    open_files: int | None = Field(default=None, ge=0)
    threads: int | None = Field(default=None, ge=0)
    sampled_at_ms: int = Field(ge=0)


class ProcessRecord(Frozen):
    """One process at its latest state, as lists, the feed and ``get`` return it."""

    id: str
    registration_hash: str
    input: ProcessInput
    disposition: RecoveryDisposition
    identity: Identity
    originator: Originator
    wake_target: SessionScope | None
    env_ref: str | None
    event_types: list[EventType]
    descriptor: HandleDescriptor | None
    state: ProcessState
    reason: TerminalReason | None
    exit_code: int | None
    # Defaults: records written before 0.2.0 lack both, and must still read back.
    #: The number of the signal that ended the child: always for ``signaled``, and for a stop's
    #: states when its signal ended it (docs/design.md §3.3).
    signal: int | None = None
    #: OS pids a tree stop left alive after its final SIGKILL (empty: none, or no stop).
    survivors: list[int] = Field(default_factory=list)
    diagnostic: str | None
    value: JsonValue
    status: ProcessStatus
    stop_requested: list[TerminalReason]
    backgrounded: bool
    created_at_ms: int
    updated_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    # Defaults: rows written before 0.2.0 lack both, and must still read back.
    os_pid: int | None = None
    os: OsFacts | None = None
    first_started: OwnerStamp | None
    abandon_request: AbandonRequest | None
    abandon_evidence: OwnerStamp | None
    wait: WaitState | None
    external_ref: ExternalRef | None
    #: The run's output summary (docs/design.md §14); null while it runs, for work that was
    #: not supervised here and for records written before 0.3.0.
    output: OutputSummary | None = None
    # docs/design.md §15; null for records written before 0.4.0 and for plain processes.
    #: When the readiness probes all held (the supervisor's clock), or null.
    ready_at_ms: int | None = None
    #: A service's attempt number (1 for its first), and the first attempt's id (later ones).
    attempt: int | None = None
    attempt_of: str | None = None
    #: ``crash_loop`` on the last attempt of a service its supervisor gave up; else null.
    gave_up: str | None = None
    #: On a service's first attempt: the stop reasons asked of the whole service, in request
    #: order (no attempt starts once its supervisor has read one; docs/design.md §15.4).
    service_stop_requested: list[TerminalReason] = Field(default_factory=list)
    #: The readiness probes and restart policy it was registered with, or null.
    readiness: Readiness | None = None
    restart: RestartPolicy | None = None
    # docs/design.md §19; null for records written before services had names, and for unnamed ones.
    #: The service's name, the digest of its file definition, its leased port, and when this
    #: (later) attempt's backoff ends.
    name: str | None = None
    digest: str | None = None
    port: int | None = None
    starts_at_ms: int | None = None
    #: Run on a pseudo-terminal: ``stdout`` holds its one merged stream (docs/design.md §20).
    pty: bool | None = None
    #: While it waits for input: what kind, its last line and since when (docs/design.md §20.3).
    waiting_for_input: InputWaitState | None = None
    #: Once it ended under the host agent: what its tree used (docs/design.md §18.10).
    resources: ResourceUse | None = None
    change_seq: int

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal


class ProcessEvent(Frozen):
    """One entry of a process's log; ``sequence`` is 1-based and contiguous per process.

    ``payload`` is the event's fields (an object) for the process's own events, and for a
    producer event exactly the payload its producer gave (any JSON), with the key that
    deduplicates it in ``replay_key`` (``None`` on every other event).
    """

    process_id: str
    sequence: int
    kind: str
    payload: Any
    event_id: str | None
    occurred_at_ms: int
    replay_key: str | None = None
