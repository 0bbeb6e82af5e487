"""procledger: supervise OS processes and keep their lifecycle as an event-sourced ledger."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import procledger.adapters.liveness as _liveness  # installs the /proc identity source
from procledger.domain.errors import (
    AlreadyTerminal,
    AmbiguousProcessId,
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
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    StoreURLError,
    SupervisorClosed,
    UndeclaredEventType,
    UnsupportedLoop,
    WriteConflict,
)
from procledger.domain.leases import (
    Acquired,
    Busy,
    CompletionAuthority,
    Lease,
    LeaseOwner,
    LeaseTimings,
)
from procledger.domain.vocabulary import (
    LifecycleKind,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    TerminalReason,
)

if TYPE_CHECKING:
    from procledger.application.bootstrap import open_registry
    from procledger.application.registry import ProcessRegistry
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
    from procledger.notifications import Delivery, LoopInbox, NotificationDisposition, Notifier
    from procledger.projections import (
        ChangeCursor,
        HandleSummary,
        ProcessListFilter,
        PruneReport,
        SessionDeleteReport,
    )
    from procledger.recovery import RecoveryWorker, RunResult, SweepReport
    from procledger.supervisor.execution import (
        CapturedOutput,
        StopPolicy,
        Streamed,
        run_captured,
        run_streaming,
    )
    from procledger.supervisor.supervisor import ProcessHandle, StopMode, Supervisor

# Imported above, eagerly: the errors, the vocabulary and the lease models (the liveness adapter
# needs them, and it must install the /proc identity source before anything asks for one). The
# rest is imported on first use, so that `procledger table`, or a program that needs only the
# domain, does not load the stores, psycopg, the supervisor and recovery.
_LAZY: dict[str, str] = {
    "LifecycleRow": "procledger.domain.lifecycle",
    "lifecycle_table": "procledger.domain.lifecycle",
    "ProcessCompletionNotification": "procledger.domain.notification",
    "MAX_DIAGNOSTIC_BYTES": "procledger.domain.records",
    "MAX_PROCESS_HANDLE_BYTES": "procledger.domain.records",
    "ExternalRef": "procledger.domain.records",
    "ProcessEvent": "procledger.domain.records",
    "ProcessRecord": "procledger.domain.records",
    "WaitState": "procledger.domain.records",
    "EventType": "procledger.domain.registration",
    "HandleDescriptor": "procledger.domain.registration",
    "Originator": "procledger.domain.registration",
    "ProcessInput": "procledger.domain.registration",
    "ProcessRegistration": "procledger.domain.registration",
    "SessionScope": "procledger.domain.registration",
    "Delivery": "procledger.notifications",
    "LoopInbox": "procledger.notifications",
    "NotificationDisposition": "procledger.notifications",
    "Notifier": "procledger.notifications",
    "ChangeCursor": "procledger.projections",
    "HandleSummary": "procledger.projections",
    "ProcessListFilter": "procledger.projections",
    "PruneReport": "procledger.projections",
    "SessionDeleteReport": "procledger.projections",
    "RecoveryWorker": "procledger.recovery",
    "RunResult": "procledger.recovery",
    "SweepReport": "procledger.recovery",
    "ProcessRegistry": "procledger.application.registry",
    "open_registry": "procledger.application.bootstrap",
    "CapturedOutput": "procledger.supervisor.execution",
    "StopPolicy": "procledger.supervisor.execution",
    "Streamed": "procledger.supervisor.execution",
    "run_captured": "procledger.supervisor.execution",
    "run_streaming": "procledger.supervisor.execution",
    "ProcessHandle": "procledger.supervisor.supervisor",
    "StopMode": "procledger.supervisor.supervisor",
    "Supervisor": "procledger.supervisor.supervisor",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


del _liveness

__all__ = [  # noqa: RUF022  (grouped as in docs/design.md §10, not sorted)
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
    "AmbiguousProcessId",
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
    "StoreCorrupt",
    "StoreError",
    "StoreURLError",
    "StoreUnavailable",
    "SupervisorClosed",
    "UndeclaredEventType",
    "UnsupportedLoop",
    "WriteConflict",
]
