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
from procledger.registry import ProcessRegistry, open_registry

del _liveness
