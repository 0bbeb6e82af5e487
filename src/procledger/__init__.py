"""procledger: supervise OS processes and keep their lifecycle as an event-sourced ledger."""

from __future__ import annotations

import procledger.adapters.liveness as _liveness  # installs the /proc identity source
from procledger.domain.errors import (
    AlreadyTerminal,
    AuthorityRejected,
    DeliveryStopped,
    FilterError,
    IdempotencyCollision,
    Interrupted,
    InvalidTransition,
    LeaseLost,
    LoopNotFound,
    NotFound,
    OwnerMismatch,
    ProcessLifecycleValidationError,
    ProcledgerError,
    RegistrationConflict,
    RegistrationError,
    ReplayConflict,
    SpawnError,
    StdinError,
    StoreError,
    SupervisorClosed,
    UndeclaredEventType,
    UnsupportedLoop,
)
from procledger.domain.leases import (
    Acquired,
    Busy,
    CompletionAuthority,
    Lease,
    LeaseOwner,
    LeaseTimings,
)
from procledger.domain.lifecycle import LifecycleRow, lifecycle_table
from procledger.domain.notification import ProcessCompletionNotification
from procledger.domain.records import (
    MAX_DIAGNOSTIC_BYTES,
    MAX_PROCESS_HANDLE_BYTES,
    ExternalRef,
    ProcessEvent,
    ProcessRecord,
    WaitState,
)
from procledger.domain.registration import (
    EventType,
    HandleDescriptor,
    Originator,
    ProcessInput,
    ProcessRegistration,
    SessionScope,
)
from procledger.domain.vocabulary import (
    LifecycleKind,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    TerminalReason,
)
from procledger.notifications import Delivery, LoopInbox, NotificationDisposition, Notifier
from procledger.projections import (
    ChangeCursor,
    HandleSummary,
    ProcessListFilter,
    PruneReport,
    SessionDeleteReport,
)
from procledger.recovery import RecoveryWorker, RunResult, SweepReport
from procledger.registry import ProcessRegistry, open_registry
from procledger.supervisor.execution import (
    CapturedOutput,
    StopPolicy,
    Streamed,
    run_captured,
    run_streaming,
)
from procledger.supervisor.supervisor import ProcessHandle, StopMode, Supervisor

del _liveness

__all__ = [  # noqa: RUF022  (grouped as in DESIGN.md §10, not sorted)
    # vocabulary
    "MAX_DIAGNOSTIC_BYTES",
    "MAX_PROCESS_HANDLE_BYTES",
    "LifecycleKind",
    "LifecycleRow",
    "ProcessState",
    "ProcessStatus",
    "RecoveryDisposition",
    "TerminalReason",
    "lifecycle_table",
    # registration and records
    "EventType",
    "ExternalRef",
    "HandleDescriptor",
    "Originator",
    "ProcessEvent",
    "ProcessInput",
    "ProcessRecord",
    "ProcessRegistration",
    "SessionScope",
    "WaitState",
    # leases
    "Acquired",
    "Busy",
    "CompletionAuthority",
    "Lease",
    "LeaseOwner",
    "LeaseTimings",
    # registry
    "ProcessRegistry",
    "open_registry",
    # projections
    "ChangeCursor",
    "HandleSummary",
    "ProcessListFilter",
    "PruneReport",
    "SessionDeleteReport",
    # notifications
    "Delivery",
    "LoopInbox",
    "NotificationDisposition",
    "Notifier",
    "ProcessCompletionNotification",
    # supervisor
    "CapturedOutput",
    "ProcessHandle",
    "StopMode",
    "StopPolicy",
    "Streamed",
    "Supervisor",
    "run_captured",
    "run_streaming",
    # recovery
    "RecoveryWorker",
    "RunResult",
    "SweepReport",
    # errors
    "AlreadyTerminal",
    "AuthorityRejected",
    "DeliveryStopped",
    "FilterError",
    "IdempotencyCollision",
    "Interrupted",
    "InvalidTransition",
    "LeaseLost",
    "LoopNotFound",
    "NotFound",
    "OwnerMismatch",
    "ProcessLifecycleValidationError",
    "ProcledgerError",
    "RegistrationConflict",
    "RegistrationError",
    "ReplayConflict",
    "SpawnError",
    "StdinError",
    "StoreError",
    "SupervisorClosed",
    "UndeclaredEventType",
    "UnsupportedLoop",
]
