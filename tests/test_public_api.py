"""The public names of ``procledger`` are exactly those of docs/design.md §10, pinned here.

Adding a public name is a deliberate act: extend docs/design.md §10 and this list together.
"""

from __future__ import annotations

import importlib

import pytest

import procledger
from _shared import run_python

VOCABULARY = [
    "ProcessState", "TerminalReason", "LifecycleKind", "RecoveryDisposition", "ProcessStatus",
    "lifecycle_table", "LifecycleRow", "MAX_PROCESS_HANDLE_BYTES", "MAX_DIAGNOSTIC_BYTES",
]  # fmt: skip
REGISTRATION_AND_RECORDS = [
    "ProcessRegistration", "ProcessInput", "Originator", "SessionScope", "EventType",
    "HandleDescriptor", "ProcessRecord", "ProcessEvent", "ExternalRef", "WaitState", "OsFacts",
    "Readiness", "RestartMode", "RestartPolicy",
]  # fmt: skip
LEASES = ["LeaseOwner", "Lease", "Acquired", "Busy", "LeaseTimings", "CompletionAuthority"]
REGISTRY = ["ProcessRegistry", "open_registry"]
PROJECTIONS = [
    "ChangeCursor", "ProcessListFilter", "HandleSummary", "SessionDeleteReport", "PruneReport",
    "ProcessScan", "FeedPage", "RebuildReport", "VerifyReport",
]  # fmt: skip
NOTIFICATIONS = [
    "ProcessCompletionNotification", "NotificationDisposition", "Delivery", "Notifier",
    "LoopInbox",
]  # fmt: skip
SUPERVISOR = [
    "run_captured", "run_streaming", "CapturedOutput", "Streamed", "StopPolicy", "StopMode",
    "Supervisor", "ProcessHandle",
]  # fmt: skip
RECOVERY = ["RecoveryWorker", "SweepReport", "RunResult"]
# §9: the root and every error it lists.
ERRORS = [
    "ProcledgerError", "InvalidTransition", "AlreadyTerminal",
    "AmbiguousProcessId", "OutputUnavailable", "ReplayConflict",
    "RegistrationConflict", "RegistrationError", "UndeclaredEventType", "NotFound", "LeaseLost",
    "AuthorityRejected", "ProcessLifecycleValidationError", "OwnerMismatch", "LoopNotFound",
    "UnsupportedLoop", "DeliveryStopped", "IdempotencyCollision", "FilterError", "SpawnError",
    "StdinError", "Interrupted", "SupervisorClosed", "StoreError", "StoreURLError",
    "StoreUnavailable", "StoreCorrupt", "WriteConflict", "CipherError", "OptionError",
]  # fmt: skip

EXPECTED = [
    *VOCABULARY,
    *REGISTRATION_AND_RECORDS,
    *LEASES,
    *REGISTRY,
    *PROJECTIONS,
    *NOTIFICATIONS,
    *SUPERVISOR,
    *RECOVERY,
    *ERRORS,
]


def test_the_expected_list_has_no_duplicates() -> None:
    assert len(EXPECTED) == len(set(EXPECTED)) == 86


def test_all_is_exactly_the_names_of_the_design() -> None:
    exported = getattr(procledger, "__all__", None)
    assert exported is not None, "procledger.__init__ must define __all__"
    assert len(exported) == len(set(exported)), "__all__ lists a name twice"
    missing = sorted(set(EXPECTED) - set(exported))
    extra = sorted(set(exported) - set(EXPECTED))
    assert (missing, extra) == ([], [])


@pytest.mark.parametrize("name", EXPECTED)
def test_every_public_name_is_importable_from_the_package(name: str) -> None:
    module = importlib.import_module("procledger")
    assert hasattr(module, name), f"procledger.{name} is missing"
    assert getattr(module, name) is not None


def test_every_name_in_all_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from procledger import *", namespace)  # the star import is the subject
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(getattr(procledger, "__all__", ()))


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_is_a_procledger_error(name: str) -> None:
    error = getattr(procledger, name)
    assert isinstance(error, type)
    assert issubclass(error, Exception)
    assert issubclass(error, procledger.ProcledgerError)


def test_not_found_is_also_a_lookup_error() -> None:
    assert issubclass(procledger.NotFound, LookupError)
    with pytest.raises(LookupError):
        raise procledger.NotFound("process 'x' not found")


def test_the_lifecycle_validation_error_is_not_a_value_error() -> None:
    # pydantic wraps ValueError raised in validators; the notification contract promises this
    # error unwrapped.
    assert not issubclass(procledger.ProcessLifecycleValidationError, ValueError)
    error = procledger.ProcessLifecycleValidationError("process_handle", "too long")
    assert error.field == "process_handle"
    assert "process_handle" in str(error)


def test_the_byte_limits_are_the_designed_values() -> None:
    assert procledger.MAX_PROCESS_HANDLE_BYTES == 128
    assert procledger.MAX_DIAGNOSTIC_BYTES == 512


def test_the_property_test_kit_is_importable_without_pytest() -> None:
    code = (
        "import sys; sys.modules['pytest'] = None; sys.modules['_pytest'] = None\n"
        "import procledger.testing as t\n"
        "assert issubclass(t.ProcessMachine, __import__('hypothesis').stateful"
        ".RuleBasedStateMachine)\n"
        "assert 'pytest' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
    )
    done = run_python(code, timeout=120)
    assert done.returncode == 0, done.stderr
