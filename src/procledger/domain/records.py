"""The read side of one process: its record and its log entries (DESIGN.md §3.3)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, JsonValue

from procledger.domain._model import Frozen
from procledger.domain.leases import LeaseOwner
from procledger.domain.registration import (
    EventType,
    HandleDescriptor,
    Originator,
    ProcessInput,
    SessionScope,
)
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
    diagnostic: str | None
    value: JsonValue
    status: ProcessStatus
    stop_requested: list[TerminalReason]
    backgrounded: bool
    created_at_ms: int
    updated_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    first_started: OwnerStamp | None
    abandon_request: AbandonRequest | None
    abandon_evidence: OwnerStamp | None
    wait: WaitState | None
    external_ref: ExternalRef | None
    change_seq: int

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal


class ProcessEvent(Frozen):
    """One entry of a process's log; ``sequence`` is 1-based and contiguous per process."""

    process_id: str
    sequence: int
    kind: str
    payload: dict[str, Any]
    event_id: str | None
    occurred_at_ms: int
