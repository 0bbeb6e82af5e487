"""procledger: supervise OS processes and keep their lifecycle as an event-sourced ledger."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from procledger.domain.errors import (
    AlreadyTerminal,
    AmbiguousProcessId,
    AuthorityRejected,
    CipherError,
    DeliveryStopped,
    FilterError,
    IdempotencyCollision,
    Interrupted,
    InvalidTransition,
    LeaseLost,
    LoopNotFound,
    NotFound,
    OptionError,
    OutputUnavailable,
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
from procledger.domain.vocabulary import (
    LifecycleKind,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    TerminalReason,
)

__version__ = "0.2.0.dev0"
"""The installed distribution's version (a test keeps it equal to the package metadata)."""

if TYPE_CHECKING:
    from procledger.application.bootstrap import open_registry
    from procledger.application.registry import ProcessRegistry
    from procledger.application.verify import VerifyReport
    from procledger.domain.leases import (
        Acquired,
        Busy,
        CompletionAuthority,
        Lease,
        LeaseOwner,
        LeaseTimings,
    )
    from procledger.domain.lifecycle_table import LifecycleRow, lifecycle_table
    from procledger.domain.notification import ProcessCompletionNotification
    from procledger.domain.records import (
        MAX_DIAGNOSTIC_BYTES,
        MAX_PROCESS_HANDLE_BYTES,
        ExternalRef,
        OsFacts,
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
    from procledger.domain.service import Readiness, RestartMode, RestartPolicy
    from procledger.notifications import Delivery, LoopInbox, NotificationDisposition, Notifier
    from procledger.projections import (
        ChangeCursor,
        HandleSummary,
        ProcessListFilter,
        PruneReport,
        SessionDeleteReport,
    )
    from procledger.projections.feed import FeedPage
    from procledger.projections.records import ProcessScan
    from procledger.projections.reports import RebuildReport
    from procledger.recovery import RecoveryWorker, RunResult, SweepReport
    from procledger.supervisor.execution import (
        CapturedOutput,
        StopPolicy,
        Streamed,
        run_captured,
        run_streaming,
    )
    from procledger.supervisor.supervisor import ProcessHandle, StopMode, Supervisor

# Imported above, eagerly: the errors and the vocabulary (plain classes and enums, no pydantic).
# The rest is imported on first use, so that `procledger --version`, `procledger table`, or a
# program that needs only the domain, does not load pydantic, the stores, psycopg, the
# supervisor and recovery (docs/design.md §1.2, cheap start-up).
_LAZY: dict[str, str] = {
    "Acquired": "procledger.domain.leases",
    "Busy": "procledger.domain.leases",
    "CompletionAuthority": "procledger.domain.leases",
    "Lease": "procledger.domain.leases",
    "LeaseOwner": "procledger.domain.leases",
    "LeaseTimings": "procledger.domain.leases",
    "LifecycleRow": "procledger.domain.lifecycle_table",
    "lifecycle_table": "procledger.domain.lifecycle_table",
    "ProcessCompletionNotification": "procledger.domain.notification",
    "MAX_DIAGNOSTIC_BYTES": "procledger.domain.records",
    "MAX_PROCESS_HANDLE_BYTES": "procledger.domain.records",
    "ExternalRef": "procledger.domain.records",
    "ProcessEvent": "procledger.domain.records",
    "ProcessRecord": "procledger.domain.records",
    "WaitState": "procledger.domain.records",
    "OsFacts": "procledger.domain.records",
    "Readiness": "procledger.domain.service",
    "RestartMode": "procledger.domain.service",
    "RestartPolicy": "procledger.domain.service",
    "ProcessScan": "procledger.projections.records",
    "FeedPage": "procledger.projections.feed",
    "RebuildReport": "procledger.projections.reports",
    "VerifyReport": "procledger.application.verify",
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


_NEEDS_IDENTITY = "procledger.domain.leases"
"""The lease models: ``LeaseOwner.local_process`` asks the /proc identity source, which the
liveness adapter installs when it is imported -- so it is imported with them, not before."""


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module == _NEEDS_IDENTITY:
        importlib.import_module("procledger.adapters.liveness")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
    "OsFacts",
    "Readiness",
    "RestartMode",
    "RestartPolicy",
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
    "ProcessScan",
    "FeedPage",
    "RebuildReport",
    "VerifyReport",
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
    "CipherError",
    "AuthorityRejected",
    "DeliveryStopped",
    "FilterError",
    "IdempotencyCollision",
    "Interrupted",
    "InvalidTransition",
    "LeaseLost",
    "LoopNotFound",
    "NotFound",
    "OptionError",
    "OutputUnavailable",
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
