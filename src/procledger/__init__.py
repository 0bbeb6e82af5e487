"""procledger: supervise OS processes and keep their lifecycle as an event-sourced ledger.

The public names (docs/design.md §10) are the imports below, each written once, anyio-style
(``from M import N as N``: an explicit re-export that mypy and IDEs read with its exact type).
``__all__`` and the map of names imported on first use are derived from those statements as
they run (``_exported``), so the list of names is kept in one place.
"""

from __future__ import annotations

import builtins
import importlib
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

__version__ = "0.2.0.dev0"
"""The installed distribution's version (a test keeps it equal to the package metadata)."""

_PUBLIC: list[str] = []
"""Every public name, in the order the statements below export them."""
_LAZY: dict[str, str] = {}
"""The public names imported on first use, each with its module."""
_NEEDS_IDENTITY = "procledger.domain.leases"
"""The lease models: ``LeaseOwner.local_process`` asks the /proc identity source, which the
liveness adapter installs when it is imported -- so it is imported with them, not before."""


@contextmanager
def _exported(*, now: bool = False) -> Iterator[None]:
    """Record each ``from M import N as N`` of this module run inside as public name ``N``.
    With ``now`` the import happens as written; otherwise ``M`` is not imported: ``N -> M`` is
    kept for ``__getattr__``, which imports it on first use (docs/design.md §1.2, cheap
    start-up). Only this module's own statements are recorded: an import made meanwhile by
    any other code (another thread's) goes to the real ``__import__``, which is back in place
    when the block ends."""
    here = globals()
    real = builtins.__import__

    def record(
        name: str,
        globals: Mapping[str, object] | None = None,
        locals: Mapping[str, object] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> Any:
        if globals is not here or level or not fromlist:
            return real(name, globals, locals, fromlist, level)
        _PUBLIC.extend(fromlist)
        if now:
            return real(name, globals, locals, fromlist, level)
        _LAZY.update(dict.fromkeys(fromlist, name))
        return types.SimpleNamespace(**dict.fromkeys(fromlist))  # what `import ... as` reads

    builtins.__import__ = record
    try:
        yield
    finally:
        builtins.__import__ = real
        for lazy in _LAZY:
            here.pop(lazy, None)  # so that the first use reaches `__getattr__`


with _exported(now=True):  # the errors (§9) and the vocabulary's enums: plain classes
    from procledger.domain.errors import AlreadyTerminal as AlreadyTerminal
    from procledger.domain.errors import AmbiguousProcessId as AmbiguousProcessId
    from procledger.domain.errors import AuthorityRejected as AuthorityRejected
    from procledger.domain.errors import CipherError as CipherError
    from procledger.domain.errors import DeliveryError as DeliveryError
    from procledger.domain.errors import DeliveryStopped as DeliveryStopped
    from procledger.domain.errors import ExecutionError as ExecutionError
    from procledger.domain.errors import FilterError as FilterError
    from procledger.domain.errors import IdempotencyCollision as IdempotencyCollision
    from procledger.domain.errors import InputRefused as InputRefused
    from procledger.domain.errors import Interrupted as Interrupted
    from procledger.domain.errors import InvalidTransition as InvalidTransition
    from procledger.domain.errors import LeaseLost as LeaseLost
    from procledger.domain.errors import LoopNotFound as LoopNotFound
    from procledger.domain.errors import NameTaken as NameTaken
    from procledger.domain.errors import NotFound as NotFound
    from procledger.domain.errors import OptionError as OptionError
    from procledger.domain.errors import OutputUnavailable as OutputUnavailable
    from procledger.domain.errors import OwnerMismatch as OwnerMismatch
    from procledger.domain.errors import PortTaken as PortTaken
    from procledger.domain.errors import (
        ProcessLifecycleValidationError as ProcessLifecycleValidationError,
    )
    from procledger.domain.errors import ProcledgerError as ProcledgerError
    from procledger.domain.errors import RegistrationConflict as RegistrationConflict
    from procledger.domain.errors import RegistrationError as RegistrationError
    from procledger.domain.errors import ReplayConflict as ReplayConflict
    from procledger.domain.errors import SchemaTooNew as SchemaTooNew
    from procledger.domain.errors import ServiceFileError as ServiceFileError
    from procledger.domain.errors import SpawnError as SpawnError
    from procledger.domain.errors import StdinError as StdinError
    from procledger.domain.errors import StoreCorrupt as StoreCorrupt
    from procledger.domain.errors import StoreError as StoreError
    from procledger.domain.errors import StoreReadOnly as StoreReadOnly
    from procledger.domain.errors import StoreUnavailable as StoreUnavailable
    from procledger.domain.errors import StoreURLError as StoreURLError
    from procledger.domain.errors import SupervisorClosed as SupervisorClosed
    from procledger.domain.errors import UndeclaredEventType as UndeclaredEventType
    from procledger.domain.errors import UnsupportedLoop as UnsupportedLoop
    from procledger.domain.errors import WriteConflict as WriteConflict
    from procledger.domain.vocabulary import LifecycleKind as LifecycleKind
    from procledger.domain.vocabulary import ProcessState as ProcessState
    from procledger.domain.vocabulary import ProcessStatus as ProcessStatus
    from procledger.domain.vocabulary import RecoveryDisposition as RecoveryDisposition
    from procledger.domain.vocabulary import TerminalReason as TerminalReason

with _exported():  # the rest (§10), on first use: pydantic, the stores, the supervisor
    from procledger.application.bootstrap import open_registry as open_registry
    from procledger.application.registry import ProcessRegistry as ProcessRegistry
    from procledger.application.verify import VerifyReport as VerifyReport
    from procledger.domain.input import WaitKind as WaitKind
    from procledger.domain.leases import Acquired as Acquired
    from procledger.domain.leases import Busy as Busy
    from procledger.domain.leases import CompletionAuthority as CompletionAuthority
    from procledger.domain.leases import Lease as Lease
    from procledger.domain.leases import LeaseOwner as LeaseOwner
    from procledger.domain.leases import LeaseTimings as LeaseTimings
    from procledger.domain.lifecycle_table import LifecycleRow as LifecycleRow
    from procledger.domain.lifecycle_table import lifecycle_table as lifecycle_table
    from procledger.domain.notification import (
        ProcessCompletionNotification as ProcessCompletionNotification,
    )
    from procledger.domain.notification import (
        ProcessInputNotification as ProcessInputNotification,
    )
    from procledger.domain.records import MAX_DIAGNOSTIC_BYTES as MAX_DIAGNOSTIC_BYTES
    from procledger.domain.records import MAX_PROCESS_HANDLE_BYTES as MAX_PROCESS_HANDLE_BYTES
    from procledger.domain.records import ExternalRef as ExternalRef
    from procledger.domain.records import OsFacts as OsFacts
    from procledger.domain.records import ProcessEvent as ProcessEvent
    from procledger.domain.records import ProcessRecord as ProcessRecord
    from procledger.domain.records import WaitState as WaitState
    from procledger.domain.registration import EventType as EventType
    from procledger.domain.registration import HandleDescriptor as HandleDescriptor
    from procledger.domain.registration import Originator as Originator
    from procledger.domain.registration import ProcessInput as ProcessInput
    from procledger.domain.registration import ProcessRegistration as ProcessRegistration
    from procledger.domain.registration import SessionScope as SessionScope
    from procledger.domain.service import Readiness as Readiness
    from procledger.domain.service import RestartMode as RestartMode
    from procledger.domain.service import RestartPolicy as RestartPolicy
    from procledger.notifications import Delivery as Delivery
    from procledger.notifications import LoopInbox as LoopInbox
    from procledger.notifications import NotificationDisposition as NotificationDisposition
    from procledger.notifications import Notifier as Notifier
    from procledger.projections import ChangeCursor as ChangeCursor
    from procledger.projections import HandleSummary as HandleSummary
    from procledger.projections import ProcessListFilter as ProcessListFilter
    from procledger.projections import PruneReport as PruneReport
    from procledger.projections import SessionDeleteReport as SessionDeleteReport
    from procledger.projections.feed import FeedPage as FeedPage
    from procledger.projections.records import ProcessScan as ProcessScan
    from procledger.projections.reports import RebuildReport as RebuildReport
    from procledger.recovery import RecoveryWorker as RecoveryWorker
    from procledger.recovery import RunResult as RunResult
    from procledger.recovery import SweepReport as SweepReport
    from procledger.supervisor.execution import CapturedOutput as CapturedOutput
    from procledger.supervisor.execution import StopPolicy as StopPolicy
    from procledger.supervisor.execution import Streamed as Streamed
    from procledger.supervisor.execution import run_captured as run_captured
    from procledger.supervisor.execution import run_streaming as run_streaming
    from procledger.supervisor.supervisor import ProcessHandle as ProcessHandle
    from procledger.supervisor.supervisor import StopMode as StopMode
    from procledger.supervisor.supervisor import Supervisor as Supervisor
    from procledger.supervisor.terminal import TerminalSize as TerminalSize

globals()["__all__"] = tuple(_PUBLIC)
# (`__all__`, derived from the statements above, is set so that a type checker does not read it
# as an empty list: `from procledger import *` then has every re-exported name, typed.)


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
    return sorted({*globals(), *_PUBLIC})
