"""The Process aggregate, command by command (docs/design.md §2.2, §3.2's rules, §3.3, §3.4).

Commands validate and decide; a refused command appends nothing. Error order: validation, an
identical replay (a no-op), state, then authority.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from procledger.adapters.codec import OrjsonMapper
from procledger.domain.errors import (
    AlreadyTerminal,
    AuthorityRejected,
    InvalidTransition,
    ProcessLifecycleValidationError,
    ReplayConflict,
    StoreCorrupt,
    UndeclaredEventType,
)
from procledger.domain.leases import CompletionAuthority, LeaseOwner, Liveness
from procledger.domain.lifecycle_table import lifecycle_table
from procledger.domain.notification import ProcessCompletionNotification
from procledger.domain.process import Process, process_key_hex, process_uuid
from procledger.domain.records import ExternalRef, OsFacts, WaitState
from procledger.domain.registration import ProcessRegistration, env_ref_for
from procledger.domain.rendering import render_record, to_process_event
from procledger.domain.vocabulary import (
    LifecycleKind,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    TerminalReason,
)

S = ProcessState
R = TerminalReason
WORKFLOW = CompletionAuthority.workflow_key("wf")
EXTERNAL = CompletionAuthority.external_owner("ops")
OWNER = LeaseOwner(owner_id="worker", incarnation_id="inc")
OTHER = LeaseOwner(owner_id="other", incarnation_id="inc-2")
E1 = "2b1c1e1e-0000-4000-8000-000000000001"
E2 = "2b1c1e1e-0000-4000-8000-000000000002"


def registration(**overrides: Any) -> ProcessRegistration:
    fields: dict[str, Any] = {
        "id": "job-1",
        "input": {"type": "command", "argv": ["/bin/build", "--all"]},
        "disposition": "owner_bound",
        "originator": {"type": "host", "scope": "ci"},
        "env_ref": env_ref_for({"A": "1"}),
        "event_types": [{"name": "signal.ready"}],
        "definition": {"step": "build"},
    }
    fields.update(overrides)
    return ProcessRegistration.model_validate(fields)


def new(**overrides: Any) -> Process:
    process = Process.register(registration(**overrides), at_ms=100)
    process.collect_events()
    return process


def running(**overrides: Any) -> Process:
    process = new(**overrides)
    assert process.record_started(150, at_ms=200, event_id=None)
    process.collect_events()
    return process


def complete(process: Process, state: Any, reason: Any, **fields: Any) -> bool:
    arguments: dict[str, Any] = {
        "exit_code": None,
        "diagnostic": None,
        "value": None,
        "event_id": None,
        "authority": WORKFLOW,
        "at_ms": 900,
    }
    arguments.update(fields)
    return process.complete(state, reason, **arguments)


def lose(process: Process, **fields: Any) -> bool:
    arguments: dict[str, Any] = {
        "diagnostic": None,
        "event_id": None,
        "authority": WORKFLOW,
        "at_ms": 900,
    }
    arguments.update(fields)
    return process.lose(**arguments)


def abandon(process: Process, reason: Any, **fields: Any) -> bool:
    arguments: dict[str, Any] = {
        "owner": None,
        "evidence_at_ms": None,
        "diagnostic": None,
        "event_id": None,
        "authority": WORKFLOW,
        "at_ms": 900,
    }
    arguments.update(fields)
    return process.abandon(reason, **arguments)


def exited(process: Process, code: int = 0, **fields: Any) -> bool:
    return complete(process, "exited", "exited", exit_code=code, **fields)


def refuses(process: Process, error: type[Exception], call: Any) -> Exception:
    """``call()`` raises ``error`` and leaves the aggregate exactly as it was."""
    version, record = process.version, render_record(process, change_seq=0)
    pending = len(process.pending_events)
    with pytest.raises(error) as caught:
        call()
    assert process.version == version
    assert len(process.pending_events) == pending
    assert render_record(process, change_seq=0) == record
    return caught.value


def no_op(process: Process, call: Any) -> None:
    """``call()`` returns False and appends nothing."""
    version, record = process.version, render_record(process, change_seq=0)
    pending = len(process.pending_events)
    assert call() is False
    assert process.version == version
    assert len(process.pending_events) == pending
    assert render_record(process, change_seq=0) == record


# -- registration ------------------------------------------------------------------------------


def test_registration_creates_the_aggregate_in_starting() -> None:
    reg = registration()
    process = Process.register(reg, at_ms=100)
    events = process.collect_events()
    assert [type(e) for e in events] == [Process.Registered]
    assert process.id == process_uuid("job-1")
    assert process.version == 1
    assert process.state is S.starting
    assert process.registration == reg
    assert process.registration_hash == reg.registration_hash()
    assert events[0].registration == reg.model_dump(mode="json")


def test_registration_builds_what_eventsourcing_would() -> None:
    """``register`` builds its ``Registered`` event and aggregate directly; both are what
    eventsourcing's ``_create`` makes of the same fields, and the event replays to them."""
    reg = registration()
    fast = Process.register(reg, at_ms=100)
    document = reg.model_dump(mode="json")
    slow = Process._create(
        Process.Registered,
        id=process_uuid(reg.id),
        registration=document,
        registration_hash=reg.registration_hash(),
        at_ms=100,
        timestamp=fast.created_on,
    )
    (fast_event,), (slow_event,) = fast.collect_events(), slow.collect_events()
    assert type(fast_event) is type(slow_event)
    assert list(vars(fast_event).items()) == list(vars(slow_event).items())
    mapper = OrjsonMapper()
    assert mapper.to_stored_event(fast_event) == mapper.to_stored_event(slow_event)
    replayed = fast_event.mutate(None)
    assert replayed is not None
    for aggregate in (slow, replayed):
        mine = {k: v for k, v in vars(fast).items() if k != "_registration"}
        assert mine == {k: v for k, v in vars(aggregate).items() if k != "_registration"}


def test_the_aggregate_id_is_deterministic_per_process_id() -> None:
    assert process_uuid("a") == process_uuid("a")
    assert process_uuid("a") != process_uuid("b")


def test_a_fresh_record() -> None:
    record = render_record(new(), change_seq=1)
    assert record.id == "job-1"
    assert record.state is S.starting
    assert record.status is ProcessStatus.running
    assert record.reason is None
    assert record.exit_code is None
    assert record.stop_requested == []
    assert record.backgrounded is False
    assert record.created_at_ms == record.updated_at_ms == 100
    assert record.started_at_ms is None
    assert record.finished_at_ms is None
    assert record.first_started is None
    assert record.identity.model_dump() == {
        "kind": "command",
        "label": "build",
        "definition": {"step": "build"},
    }
    assert record.originator.scope_id == "host:ci"
    assert record.change_seq == 1


# -- started and backgrounded -----------------------------------------------------------------


def test_started_moves_starting_to_running() -> None:
    process = new()
    assert process.record_started(150, at_ms=200, event_id=None)
    (event,) = process.collect_events()
    assert isinstance(event, Process.Started)
    assert event.state == "running"
    record = render_record(process, change_seq=2)
    assert record.state is S.running
    assert record.started_at_ms == 150  # the caller's time
    assert record.updated_at_ms == 200  # the clock's
    assert record.backgrounded is False


def test_started_twice_is_an_invalid_transition() -> None:
    process = running()
    error = refuses(
        process, InvalidTransition, lambda: process.record_started(1, at_ms=2, event_id=None)
    )
    assert isinstance(error, InvalidTransition)
    assert (error.from_state, error.kind, error.to_state) == ("running", "started", "running")
    assert "job-1" in str(error)


def test_backgrounded_from_starting_also_starts() -> None:
    process = new()
    assert process.record_backgrounded(160, at_ms=210, event_id=None)
    (event,) = process.collect_events()
    assert event.state == "running"
    record = render_record(process, change_seq=2)
    assert (record.state, record.backgrounded, record.started_at_ms) == (S.running, True, 160)
    refuses(process, InvalidTransition, lambda: process.record_started(1, at_ms=2, event_id=None))


def test_a_running_process_is_backgrounded_at_most_once() -> None:
    process = running()
    assert process.record_backgrounded(300, at_ms=310, event_id=None)
    process.collect_events()
    record = render_record(process, change_seq=0)
    assert record.backgrounded is True
    assert record.started_at_ms == 150  # not moved by backgrounding
    refuses(
        process, InvalidTransition, lambda: process.record_backgrounded(1, at_ms=2, event_id=None)
    )


@pytest.mark.parametrize("kind", ["started", "backgrounded"])
def test_non_terminal_writes_on_a_terminal_process_are_invalid_transitions(kind: str) -> None:
    process = running()
    assert exited(process)
    process.collect_events()
    command = getattr(process, f"record_{kind}")
    error = refuses(process, InvalidTransition, lambda: command(1, at_ms=2, event_id=None))
    assert isinstance(error, InvalidTransition)
    assert error.from_state == "exited"


# -- stop_requested -------------------------------------------------------------------------------


@pytest.mark.parametrize("start", ["starting", "running"])
@pytest.mark.parametrize("reason", ["interrupted", "terminated", "killed"])
def test_stop_requested_keeps_the_state(start: str, reason: str) -> None:
    process = new() if start == "starting" else running()
    assert process.request_stop(reason, at_ms=300, event_id=None)
    (event,) = process.collect_events()
    assert (event.state, event.reason) == (start, reason)
    record = render_record(process, change_seq=0)
    assert record.state is S(start)
    assert record.stop_requested == [R(reason)]
    assert record.status is ProcessStatus.running


def test_each_signal_is_recorded_once_in_request_order() -> None:
    process = running()
    assert process.request_stop(R.interrupted, at_ms=300, event_id=None)
    process.collect_events()
    no_op(process, lambda: process.request_stop("interrupted", at_ms=301, event_id=None))
    no_op(process, lambda: process.request_stop("interrupted", at_ms=302, event_id=E1))
    assert process.request_stop("killed", at_ms=303, event_id=None)
    assert process.request_stop("terminated", at_ms=304, event_id=None)
    assert len(process.collect_events()) == 2
    assert render_record(process, change_seq=0).stop_requested == [
        R.interrupted,
        R.killed,
        R.terminated,
    ]


@pytest.mark.parametrize(
    "reason",
    [None, "exited", "failed", "runner_shutdown", "output_limit", "owner_dead", "bogus", ""],
)
def test_stop_reasons_outside_the_table_are_validation_errors(reason: Any) -> None:
    process = running()
    error = refuses(
        process,
        ProcessLifecycleValidationError,
        lambda: process.request_stop(reason, at_ms=1, event_id=None),
    )
    assert isinstance(error, ProcessLifecycleValidationError)
    assert error.field == "state_reason"


def test_stop_requested_on_a_terminal_process_is_an_invalid_transition() -> None:
    process = running()
    assert complete(process, "killed", "killed")
    process.collect_events()
    refuses(
        process,
        InvalidTransition,
        lambda: process.request_stop("killed", at_ms=1, event_id=None),
    )


# -- completed: every row, from each live state ----------------------------------------------------

COMPLETED_ROWS = [row for row in lifecycle_table() if row.kind is LifecycleKind.completed]
FROM_STARTING = {S.failed, S.terminated, S.killed}


def fields_for(state: ProcessState) -> dict[str, Any]:
    if state is S.exited:
        return {"exit_code": 3, "value": {"out": [1, 2]}}
    if state is S.failed:
        return {"diagnostic": "spawn failed: ENOENT"}
    if state is S.signaled:
        return {"signal": 11}
    return {}


@pytest.mark.parametrize("row", COMPLETED_ROWS, ids=lambda r: f"{r.state.value}-{r.reason.value}")
def test_every_completed_row_from_running(row: Any) -> None:
    process = running()
    extra = fields_for(row.state)
    assert complete(process, row.state.value, row.reason.value, **extra)
    (event,) = process.collect_events()
    assert isinstance(event, Process.Completed)
    assert (event.state, event.reason) == (row.state.value, row.reason.value)
    record = render_record(process, change_seq=0)
    assert (record.state, record.reason) == (row.state, row.reason)
    assert record.exit_code == extra.get("exit_code")
    assert record.value == extra.get("value")
    assert record.diagnostic == extra.get("diagnostic")
    assert record.signal == extra.get("signal")
    assert record.survivors == []
    assert record.finished_at_ms == record.updated_at_ms == 900


@pytest.mark.parametrize("row", COMPLETED_ROWS, ids=lambda r: f"{r.state.value}-{r.reason.value}")
def test_completed_rows_from_starting(row: Any) -> None:
    process = new()
    call = lambda: complete(process, row.state, row.reason, **fields_for(row.state))  # noqa: E731
    if row.state in FROM_STARTING:
        assert call()
        assert process.state is row.state
        return
    error = refuses(process, InvalidTransition, call)
    assert isinstance(error, InvalidTransition)
    assert not isinstance(error, AlreadyTerminal)
    assert (error.from_state, error.kind, error.to_state) == (
        "starting",
        "completed",
        row.state.value,
    )


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("exited", "killed"),
        ("killed", "exited"),
        ("interrupted", "runner_shutdown"),
        ("failed", "output_limit"),
        ("running", None),
        ("starting", "failed"),
        ("abandoned", "owner_dead"),
        ("lost_on_restore", "lost_on_restore"),
        ("exited", None),
        ("bogus", "exited"),
        ("exited", "bogus"),
    ],
)
def test_completions_outside_the_table_are_validation_errors(state: Any, reason: Any) -> None:
    process = running()
    error = refuses(
        process,
        ProcessLifecycleValidationError,
        lambda: complete(process, state, reason, exit_code=0 if state == "exited" else None),
    )
    assert isinstance(error, ProcessLifecycleValidationError)
    assert error.field == "state_reason"


# -- field rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "reason", "fields", "field"),
    [
        ("exited", "exited", {}, "exit_code"),
        ("failed", "failed", {"exit_code": 1}, "exit_code"),
        ("killed", "killed", {"exit_code": -9}, "exit_code"),
        ("exited", "exited", {"exit_code": 0, "diagnostic": "x"}, "diagnostic"),
        ("killed", "killed", {"diagnostic": "x"}, "diagnostic"),
        ("timed_out", "timed_out", {"diagnostic": "x"}, "diagnostic"),
        ("terminated", "output_limit", {"diagnostic": "x"}, "diagnostic"),
        ("failed", "failed", {"diagnostic": "x" * 513}, "diagnostic"),
        ("failed", "failed", {"diagnostic": "é" * 257}, "diagnostic"),  # 514 bytes
        ("failed", "failed", {"value": 1}, "value"),
        ("interrupted", "interrupted", {"value": {"a": 1}}, "value"),
        ("signaled", "signaled", {}, "signal"),
        ("signaled", "signaled", {"signal": 0}, "signal"),
        ("signaled", "signaled", {"signal": 65}, "signal"),
        ("signaled", "signaled", {"signal": -11}, "signal"),
        ("signaled", "signaled", {"signal": True}, "signal"),
        ("signaled", "signaled", {"signal": 11.0}, "signal"),
        ("signaled", "signaled", {"signal": 11, "exit_code": 139}, "exit_code"),
        ("signaled", "signaled", {"signal": 11, "diagnostic": "segv"}, "diagnostic"),
        ("exited", "exited", {"exit_code": 0, "signal": 15}, "signal"),
        ("failed", "failed", {"signal": 9}, "signal"),
        ("timed_out", "timed_out", {"signal": 9}, "signal"),
        ("killed", "killed", {"signal": 99}, "signal"),
        ("killed", "killed", {"survivors": [0]}, "survivors"),
        ("killed", "killed", {"survivors": [-4]}, "survivors"),
        ("killed", "killed", {"survivors": [True]}, "survivors"),
        ("killed", "killed", {"survivors": ["4242"]}, "survivors"),
        ("killed", "killed", {"survivors": "4242"}, "survivors"),
        ("exited", "exited", {"exit_code": 0, "survivors": 4242}, "survivors"),
    ],
)
def test_completion_field_rules(
    state: str, reason: str, fields: dict[str, Any], field: str
) -> None:
    process = running()
    error = refuses(
        process,
        ProcessLifecycleValidationError,
        lambda: complete(process, state, reason, **fields),
    )
    assert isinstance(error, ProcessLifecycleValidationError)
    assert error.field == field
    assert field in str(error)


# -- signals and survivors (issue #14) -------------------------------------------------------------


@pytest.mark.parametrize("signal", [1, 6, 11, 13, 64])
def test_a_signal_nobody_sent_is_signaled_and_failed(signal: int) -> None:
    process = running()
    assert complete(process, "signaled", "signaled", signal=signal)
    (event,) = process.collect_events()
    assert (event.signal, event.exit_code, event.survivors) == (signal, None, [])
    record = render_record(process, change_seq=0)
    assert (record.state, record.reason, record.signal) == (S.signaled, R.signaled, signal)
    assert record.exit_code is None
    assert record.status is ProcessStatus.failed


@pytest.mark.parametrize(
    ("state", "signal"), [("interrupted", 2), ("terminated", 15), ("killed", 9), ("killed", None)]
)
def test_a_requested_stop_may_name_the_signal_that_ended_it(state: str, signal: int | None) -> None:
    process = running()
    assert complete(process, state, state, signal=signal)
    record = render_record(process, change_seq=0)
    assert (record.state.value, record.signal) == (state, signal)
    assert record.status is ProcessStatus.cancelled


def test_survivors_are_stored_sorted_once_on_any_completion() -> None:
    process = running()
    assert complete(process, "killed", "killed", signal=9, survivors=(4242, 17, 4242))
    (event,) = process.collect_events()
    assert event.survivors == [17, 4242]
    assert render_record(process, change_seq=0).survivors == [17, 4242]
    other = running()
    assert exited(other, 0, survivors=[99])
    assert render_record(other, change_seq=0).survivors == [99]


def test_signal_and_survivors_join_the_replay_fingerprint() -> None:
    process = running()
    assert complete(process, "signaled", "signaled", signal=11, survivors=[5, 3], event_id=E1)
    process.collect_events()
    # The same write (survivors in another order) is an identical replay…
    no_op(process, lambda: complete(process, "signaled", "signaled", signal=11, survivors=[3, 5]))
    no_op(
        process,
        lambda: complete(
            process, "signaled", "signaled", signal=11, survivors=[3, 5, 5], event_id=E1
        ),
    )
    # …another signal or other survivors are not.
    refuses(
        process,
        ReplayConflict,
        lambda: complete(process, "signaled", "signaled", signal=6, event_id=E1),
    )
    refuses(
        process,
        AlreadyTerminal,
        lambda: complete(process, "signaled", "signaled", signal=11, survivors=[3]),
    )
    refuses(process, AlreadyTerminal, lambda: complete(process, "signaled", "signaled", signal=6))


def test_without_signal_or_survivors_the_fingerprint_is_0_1_0s() -> None:
    """A completion 0.1.0 recorded (read back with ``signal=None``, ``survivors=[]``) keeps the
    fingerprint 0.1.0 gave it, so a retry from 0.1.0-era code still matches it."""
    process = running()
    assert exited(process, 3, event_id=E1)
    (event,) = process.collect_events()
    assert event.fingerprint() == '["completed","exited","exited",3,null,null]'
    with_signal = running()
    assert complete(with_signal, "killed", "killed", signal=9)
    (signalled,) = with_signal.collect_events()
    assert signalled.fingerprint() == '["completed","killed","killed",null,null,null,9,[]]'


@pytest.mark.parametrize("diagnostic", ["x" * 512, "é" * 256, "☃" * 170, ""])
def test_diagnostics_up_to_512_bytes_are_kept(diagnostic: str) -> None:
    process = running()
    assert complete(process, "failed", "failed", diagnostic=diagnostic)
    assert render_record(process, change_seq=0).diagnostic == diagnostic


@pytest.mark.parametrize("code", [0, 1, 255, -15])
def test_exit_code_and_value_belong_to_exited(code: int) -> None:
    process = running()
    assert exited(process, code, value=["result", {"n": code}])
    record = render_record(process, change_seq=0)
    assert (record.exit_code, record.value) == (code, ["result", {"n": code}])
    assert record.status is (ProcessStatus.completed if code == 0 else ProcessStatus.failed)


def test_lost_carries_an_optional_diagnostic() -> None:
    process = running()
    assert lose(process, diagnostic="host rebooted")
    (event,) = process.collect_events()
    assert isinstance(event, Process.Lost)
    record = render_record(process, change_seq=0)
    assert (record.state, record.reason) == (S.lost_on_restore, R.lost_on_restore)
    assert record.diagnostic == "host rebooted"
    assert record.status is ProcessStatus.abandoned
    assert record.exit_code is None


def test_lost_from_starting() -> None:
    process = new()
    assert lose(process)
    assert process.state is S.lost_on_restore


def test_a_lost_diagnostic_is_at_most_512_bytes() -> None:
    process = running()
    error = refuses(
        process, ProcessLifecycleValidationError, lambda: lose(process, diagnostic="x" * 513)
    )
    assert isinstance(error, ProcessLifecycleValidationError)
    assert error.field == "diagnostic"


@pytest.mark.parametrize("reason", ["owner_drain", "owner_dead", "abandon_requested"])
@pytest.mark.parametrize("start", ["starting", "running"])
def test_abandoned_rows(reason: str, start: str) -> None:
    process = new() if start == "starting" else running()
    assert abandon(process, reason, diagnostic="owner gone")
    record = render_record(process, change_seq=0)
    assert (record.state, record.reason) == (S.abandoned, R(reason))
    assert record.diagnostic == "owner gone"
    assert record.status is ProcessStatus.abandoned
    assert record.abandon_evidence is None


@pytest.mark.parametrize("reason", [None, "exited", "killed", "lost_on_restore", "bogus"])
def test_abandon_reasons_outside_the_table_are_validation_errors(reason: Any) -> None:
    process = running()
    error = refuses(process, ProcessLifecycleValidationError, lambda: abandon(process, reason))
    assert isinstance(error, ProcessLifecycleValidationError)
    assert error.field == "state_reason"


def test_an_abandon_diagnostic_is_at_most_512_bytes() -> None:
    process = running()
    error = refuses(
        process,
        ProcessLifecycleValidationError,
        lambda: abandon(process, "owner_dead", diagnostic="é" * 257),
    )
    assert isinstance(error, ProcessLifecycleValidationError)
    assert error.field == "diagnostic"


def test_abandon_records_the_owner_as_evidence() -> None:
    local = Liveness(kind="local_process", host_id="h", boot_id="b", pid=7, process_start="1")
    dead = LeaseOwner(owner_id="w", incarnation_id="i", liveness=local)
    process = running()
    assert abandon(process, "owner_dead", owner=dead, evidence_at_ms=850)
    evidence = render_record(process, change_seq=0).abandon_evidence
    assert evidence is not None
    assert (evidence.owner, evidence.at_ms) == (dead, 850)
    other = running()
    assert abandon(other, "owner_drain", owner=OWNER)
    evidence = render_record(other, change_seq=0).abandon_evidence
    assert evidence is not None
    assert (evidence.owner, evidence.at_ms) == (OWNER, 900)  # defaults to the write's time


# -- terminals absorb ------------------------------------------------------------------------------


def test_an_identical_terminal_is_a_no_op_and_a_different_one_already_terminal() -> None:
    process = running()
    assert exited(process, 0, value={"ok": True})
    process.collect_events()
    no_op(process, lambda: exited(process, 0, value={"ok": True}, at_ms=950))
    for call in (
        lambda: exited(process, 1),
        lambda: exited(process, 0),
        lambda: complete(process, "killed", "killed"),
        lambda: lose(process),
        lambda: abandon(process, "owner_dead"),
    ):
        error = refuses(process, AlreadyTerminal, call)
        assert isinstance(error, AlreadyTerminal)
        assert isinstance(error, InvalidTransition)
        assert error.from_state == "exited"
        assert "job-1" in str(error)


def test_identical_lost_and_abandoned_repeats_are_no_ops() -> None:
    process = running()
    assert lose(process, diagnostic="d")
    no_op(process, lambda: lose(process, diagnostic="d"))
    refuses(process, AlreadyTerminal, lambda: lose(process, diagnostic="other"))
    other = running()
    assert abandon(other, "owner_drain", owner=OWNER)
    no_op(other, lambda: abandon(other, "owner_drain", owner=OWNER))
    refuses(other, AlreadyTerminal, lambda: abandon(other, "owner_drain", owner=OTHER))
    refuses(other, AlreadyTerminal, lambda: abandon(other, "owner_dead", owner=OWNER))


@pytest.mark.parametrize(
    "terminal",
    [
        lambda p: exited(p, 0),
        lambda p: complete(p, "failed", "failed"),
        lambda p: complete(p, "terminated", "runner_shutdown"),
        lose,
        lambda p: abandon(p, "owner_drain"),
    ],
)
def test_a_terminal_process_accepts_no_other_lifecycle_write(terminal: Any) -> None:
    process = running()
    assert terminal(process)
    process.collect_events()
    for call in (
        lambda: process.record_started(1, at_ms=2, event_id=None),
        lambda: process.record_backgrounded(1, at_ms=2, event_id=None),
        lambda: process.request_stop("interrupted", at_ms=2, event_id=None),
        lambda: complete(process, "timed_out", "timed_out"),
    ):
        refuses(process, InvalidTransition, call)


# -- idempotent event ids --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "same", "different"),
    [
        (
            lambda p: p.record_started(150, at_ms=200, event_id=E1),
            lambda p: p.record_started(150, at_ms=999, event_id=E1),
            lambda p: p.record_started(151, at_ms=200, event_id=E1),
        ),
        (
            lambda p: p.record_backgrounded(150, at_ms=200, event_id=E1),
            lambda p: p.record_backgrounded(150, at_ms=999, event_id=E1),
            lambda p: p.record_backgrounded(151, at_ms=200, event_id=E1),
        ),
        (
            lambda p: p.request_stop("terminated", at_ms=200, event_id=E1),
            lambda p: p.request_stop("terminated", at_ms=999, event_id=E1),
            lambda p: p.request_stop("killed", at_ms=200, event_id=E1),
        ),
    ],
)
def test_non_terminal_event_ids(first: Any, same: Any, different: Any) -> None:
    process = new()
    assert first(process)
    process.collect_events()
    no_op(process, lambda: same(process))
    error = refuses(process, ReplayConflict, lambda: different(process))
    assert "job-1" in str(error)
    assert E1 in str(error)


def test_terminal_event_ids() -> None:
    process = running()
    assert exited(process, 0, event_id=E1)
    process.collect_events()
    no_op(process, lambda: exited(process, 0, event_id=E1, at_ms=5_000))
    refuses(process, ReplayConflict, lambda: exited(process, 1, event_id=E1))
    refuses(process, ReplayConflict, lambda: lose(process, event_id=E1))
    # A new id on an identical terminal is still the identical terminal.
    no_op(process, lambda: exited(process, 0, event_id=E2))


def test_an_event_id_names_one_write_across_kinds() -> None:
    process = new()
    assert process.record_started(150, at_ms=200, event_id=E1)
    process.collect_events()
    refuses(process, ReplayConflict, lambda: process.request_stop("killed", at_ms=1, event_id=E1))
    refuses(process, ReplayConflict, lambda: exited(process, 0, event_id=E1))


def test_a_retried_start_after_the_terminal_is_still_a_no_op() -> None:
    process = new()
    assert process.record_started(150, at_ms=200, event_id=E1)
    assert exited(process, 0)
    process.collect_events()
    no_op(process, lambda: process.record_started(150, at_ms=300, event_id=E1))


# -- OS facts of the child -------------------------------------------------------------------------

FACTS = OsFacts(pid=4242, pgid=4242, start_time=987654, host_id="host-a")
OTHER_CHILD = OsFacts(pid=4243, pgid=4243, start_time=987655, host_id="host-a")


def replayed(process: Process) -> Process:
    """The aggregate as a load rebuilds it: every event through the stored JSON form."""
    mapper = OrjsonMapper()
    aggregate: Any = None
    for event in process.collect_events():
        aggregate = mapper.to_domain_event(mapper.to_stored_event(event)).mutate(aggregate)
    rebuilt: Process = aggregate
    return rebuilt


@pytest.mark.parametrize("command", ["record_started", "record_backgrounded"])
def test_an_identical_retry_with_os_facts_is_a_no_op(command: str) -> None:
    process = Process.register(registration(), at_ms=100)
    assert getattr(process, command)(150, at_ms=200, event_id=E1, os=FACTS)
    rebuilt = replayed(process)
    for aggregate in (process, rebuilt):
        retry = getattr(aggregate, command)
        same = OsFacts.model_validate(FACTS.model_dump(mode="json"))
        no_op(aggregate, lambda retry=retry, same=same: retry(150, at_ms=999, event_id=E1, os=same))
        for other in (OTHER_CHILD, None):
            refuses(
                aggregate,
                ReplayConflict,
                lambda retry=retry, other=other: retry(150, at_ms=999, event_id=E1, os=other),
            )
    assert render_record(rebuilt, change_seq=0) == render_record(process, change_seq=0)


def test_the_event_that_made_it_running_gives_the_os_facts() -> None:
    process = Process.register(registration(), at_ms=100)
    process.record_started(150, at_ms=200, event_id=None, os=FACTS)
    process.record_backgrounded(160, at_ms=210, event_id=None, os=OTHER_CHILD)
    record = render_record(process, change_seq=0)
    assert (record.os, record.os_pid) == (FACTS, FACTS.pid)
    assert render_record(replayed(process), change_seq=0) == record

    background = new()
    background.record_backgrounded(160, at_ms=210, event_id=None, os=FACTS)
    assert render_record(background, change_seq=0).os == FACTS


def test_a_later_backgrounded_fills_facts_a_start_lacked() -> None:
    process = new()
    process.record_started(150, at_ms=200, event_id=None)
    assert render_record(process, change_seq=0).os is None
    process.record_backgrounded(160, at_ms=210, event_id=None, os=FACTS)
    assert render_record(process, change_seq=0).os_pid == FACTS.pid


def test_os_facts_stay_through_the_terminal() -> None:
    process = new()
    process.record_started(150, at_ms=200, event_id=None, os=FACTS)
    exited(process, 0)
    assert render_record(process, change_seq=0).os == FACTS


def test_a_completion_notification_has_no_place_for_os_facts() -> None:
    fields = set(ProcessCompletionNotification.model_fields)
    assert fields.isdisjoint({"os", "os_pid", "pid", "pgid", "start_time", "host_id"})


# -- error order: validation, identical replay, state, authority -----------------------------------


def test_validation_comes_before_replay() -> None:
    process = running()
    assert exited(process, 0, event_id=E1)
    refuses(
        process,
        ProcessLifecycleValidationError,
        lambda: complete(process, "exited", "killed", exit_code=0, event_id=E1),
    )
    refuses(
        process,
        ProcessLifecycleValidationError,
        lambda: process.request_stop("exited", at_ms=1, event_id=E1),
    )


def test_validation_comes_before_state() -> None:
    process = running()
    assert exited(process, 0)
    error = refuses(
        process,
        ProcessLifecycleValidationError,
        lambda: complete(process, "failed", "failed", exit_code=3),
    )
    assert isinstance(error, ProcessLifecycleValidationError)
    assert error.field == "exit_code"
    refuses(process, ProcessLifecycleValidationError, lambda: lose(process, diagnostic="x" * 600))


def test_replay_comes_before_state_and_authority() -> None:
    process = running(disposition="externally_owned", input={"type": "external"}, env_ref=None)
    assert exited(process, 0, event_id=E1, authority=EXTERNAL)
    process.collect_events()
    # The workflow key is not valid for externally_owned, but an identical replay never gets
    # that far.
    no_op(process, lambda: exited(process, 0, event_id=E1, authority=WORKFLOW))
    no_op(process, lambda: exited(process, 0, authority=WORKFLOW))


def test_state_comes_before_authority() -> None:
    process = running(disposition="externally_owned", input={"type": "external"}, env_ref=None)
    assert exited(process, 0, authority=EXTERNAL)
    refuses(process, AlreadyTerminal, lambda: exited(process, 1, authority=WORKFLOW))
    fresh = new(disposition="externally_owned", input={"type": "external"}, env_ref=None)
    refuses(fresh, InvalidTransition, lambda: exited(fresh, 0, authority=WORKFLOW))


@pytest.mark.parametrize(
    ("disposition", "authority", "allowed"),
    [
        ("externally_owned", EXTERNAL, True),
        ("externally_owned", WORKFLOW, False),
        ("rerunnable", WORKFLOW, True),
        ("owner_bound", WORKFLOW, True),
        ("rerunnable", EXTERNAL, False),
        ("owner_bound", EXTERNAL, False),
        ("externally_owned", CompletionAuthority.reconciled_abandon(), False),
        ("owner_bound", CompletionAuthority.reconciled_abandon(), False),
    ],
)
def test_authority_is_checked_last_against_the_disposition(
    disposition: str, authority: CompletionAuthority, allowed: bool
) -> None:
    process = running(disposition=disposition)
    call = lambda: exited(process, 0, authority=authority)  # noqa: E731
    if allowed:
        assert call()
        return
    error = refuses(process, AuthorityRejected, call)
    assert "job-1" in str(error)
    assert authority.authority in str(error)


def test_reconciled_abandon_needs_a_pending_abandon_request() -> None:
    external: dict[str, Any] = {
        "disposition": "externally_owned",
        "input": {"type": "external"},
        "env_ref": None,
    }
    reconciled = CompletionAuthority.reconciled_abandon()
    process = running(**external)
    refuses(
        process,
        AuthorityRejected,
        lambda: abandon(process, "abandon_requested", authority=reconciled),
    )
    assert process.request_abandon("operator", None, at_ms=300)
    refuses(
        process, AuthorityRejected, lambda: abandon(process, "owner_dead", authority=reconciled)
    )
    assert abandon(process, "abandon_requested", authority=reconciled)
    (_, event) = process.collect_events()
    assert event.authority == {"authority": "reconciled_abandon"}


def test_the_authority_is_recorded_in_the_terminal_event() -> None:
    process = running()
    assert exited(process, 0)
    (event,) = process.collect_events()
    assert event.authority == {"authority": "workflow_key", "key": "wf"}
    process = running()
    assert exited(process, 0, authority=None)
    (event,) = process.collect_events()
    assert event.authority is None


# -- first-writer-wins facts -----------------------------------------------------------------------


def test_first_started_first_writer_wins() -> None:
    process = new()
    assert process.record_first_started(OWNER, 120, at_ms=130)
    no_op(process, lambda: process.record_first_started(OTHER, 140, at_ms=150))
    first = render_record(process, change_seq=0).first_started
    assert first is not None
    assert (first.owner, first.at_ms) == (OWNER, 120)


def test_first_started_on_a_terminal_process_changes_nothing() -> None:
    process = running()
    assert exited(process, 0)
    no_op(process, lambda: process.record_first_started(OWNER, 1, at_ms=2))


def test_abandon_request_first_writer_wins_and_is_refused_when_terminal() -> None:
    process = running()
    assert process.request_abandon("alice", "stuck", at_ms=300)
    no_op(process, lambda: process.request_abandon("bob", None, at_ms=301))
    request = render_record(process, change_seq=0).abandon_request
    assert request is not None
    assert request.model_dump() == {
        "requested_by": "alice",
        "requested_at_ms": 300,
        "reason": "stuck",
    }
    assert exited(process, 0)
    refuses(process, AlreadyTerminal, lambda: process.request_abandon("carol", None, at_ms=1))


def test_external_ref_first_writer_wins() -> None:
    ref = ExternalRef(backend="k8s", id="job/1")
    process = running()
    assert process.set_external_ref(ref, at_ms=300)
    no_op(process, lambda: process.set_external_ref(ref, at_ms=301))
    refuses(
        process,
        ReplayConflict,
        lambda: process.set_external_ref(ExternalRef(backend="k8s", id="job/2"), at_ms=302),
    )
    assert render_record(process, change_seq=0).external_ref == ref


def test_wait_is_set_cleared_and_dropped_by_any_terminal() -> None:
    wait = WaitState(name="ready", event_type="signal.ready", since_ms=250)
    process = running()
    assert process.set_wait(wait, at_ms=300)
    no_op(process, lambda: process.set_wait(wait, at_ms=301))
    assert render_record(process, change_seq=0).wait == wait
    assert process.clear_wait(at_ms=302)
    no_op(process, lambda: process.clear_wait(at_ms=303))
    assert process.set_wait(wait, at_ms=304)
    assert complete(process, "killed", "killed")
    assert render_record(process, change_seq=0).wait is None
    refuses(process, AlreadyTerminal, lambda: process.set_wait(wait, at_ms=305))


# -- producer events ------------------------------------------------------------------------------


def test_producer_events_are_declared_and_deduplicated_by_replay_key() -> None:
    process = running()
    sequence = process.append_producer_event(
        "signal.ready", {"port": 80}, replay_key="k1", at_ms=300
    )
    assert sequence == process.version == 3
    assert (
        process.append_producer_event("signal.ready", {"port": 80}, replay_key="k1", at_ms=301)
        == sequence
    )
    assert process.version == 3
    refuses(
        process,
        ReplayConflict,
        lambda: process.append_producer_event(
            "signal.ready", {"port": 81}, replay_key="k1", at_ms=302
        ),
    )
    refuses(
        process,
        UndeclaredEventType,
        lambda: process.append_producer_event("signal.other", {}, replay_key="k2", at_ms=303),
    )


# -- the record and the log -----------------------------------------------------------------------


def test_updated_at_follows_the_latest_event_and_change_seq_is_passed_through() -> None:
    process = running()
    process.request_stop("interrupted", at_ms=400, event_id=None)
    complete(process, "interrupted", "interrupted", at_ms=500)
    record = render_record(process, change_seq=42)
    assert (record.created_at_ms, record.started_at_ms) == (100, 150)
    assert (record.updated_at_ms, record.finished_at_ms) == (500, 500)
    assert record.change_seq == 42
    assert record.status is ProcessStatus.cancelled


TERMINAL_ROWS = [row for row in lifecycle_table() if row.state.is_terminal]
STATUS = {
    S.failed: ProcessStatus.failed,
    S.timed_out: ProcessStatus.failed,
    S.signaled: ProcessStatus.failed,
    S.interrupted: ProcessStatus.cancelled,
    S.lost_on_restore: ProcessStatus.abandoned,
    S.abandoned: ProcessStatus.abandoned,
}


@pytest.mark.parametrize(
    "row", TERMINAL_ROWS, ids=lambda r: f"{r.kind.value}-{r.state.value}-{r.reason.value}"
)
def test_every_terminal_row_has_its_coarse_status(row: Any) -> None:
    process = running()
    if row.kind is LifecycleKind.completed:
        assert complete(process, row.state, row.reason, **fields_for(row.state))
    elif row.kind is LifecycleKind.lost:
        assert lose(process)
    else:
        assert abandon(process, row.reason)
    record = render_record(process, change_seq=0)
    if row.state is S.exited:
        expected = ProcessStatus.failed  # fields_for gives exit code 3
    elif row.state in (S.terminated, S.killed):
        output_limit = row.reason is R.output_limit
        expected = ProcessStatus.failed if output_limit else ProcessStatus.cancelled
    else:
        expected = STATUS[row.state]
    assert record.status is expected
    assert record.is_terminal


def test_every_lifecycle_event_stores_the_state_it_results_in() -> None:
    process = new()
    process.request_stop("interrupted", at_ms=101, event_id=None)
    process.record_started(1, at_ms=102, event_id=None)
    process.record_backgrounded(2, at_ms=103, event_id=None)
    process.request_stop("killed", at_ms=104, event_id=None)
    complete(process, "killed", "killed", at_ms=105)
    states = [event.state for event in process.collect_events()]
    assert states == ["starting", "running", "running", "running", "killed"]


def test_process_events_as_callers_see_them() -> None:
    process = Process.register(registration(), at_ms=100)
    process.record_started(150, at_ms=200, event_id=E1)
    process.append_producer_event("signal.ready", {"port": 1}, replay_key="r", at_ms=250)
    exited(process, 0)
    events = [to_process_event("job-1", e) for e in process.collect_events()]
    assert [(e.sequence, e.kind) for e in events] == [
        (1, "registered"),
        (2, "started"),
        (3, "signal.ready"),
        (4, "completed"),
    ]
    assert [e.occurred_at_ms for e in events] == [100, 200, 250, 900]
    assert events[1].event_id == E1
    assert events[1].payload == {"state": "running", "started_at_ms": 150, "os": None}
    # A producer event reads back as its producer wrote it (issue #14); the key beside it.
    assert events[2].payload == {"port": 1}
    assert (events[2].replay_key, events[2].event_id) == ("r", None)
    assert events[3].payload["exit_code"] == 0
    assert events[3].payload["signal"] is None
    assert events[3].payload["survivors"] == []
    assert [e.replay_key for e in events] == [None, None, "r", None]
    assert all(e.process_id == "job-1" for e in events)


@pytest.mark.parametrize("payload", [{"n": 2}, [1, "two"], 3, "text", None, {"payload": 1}])
def test_a_producer_payload_of_any_json_shape_reads_back_unchanged(payload: Any) -> None:
    process = running()
    sequence = process.append_producer_event("signal.ready", payload, replay_key="p2", at_ms=300)
    (event,) = process.collect_events()
    entry = to_process_event("job-1", event)
    assert (entry.sequence, entry.kind) == (sequence, "signal.ready")
    assert entry.payload == payload
    assert type(entry.payload) is type(payload)
    assert entry.replay_key == "p2"
    assert entry.model_dump(mode="json")["payload"] == payload


# -- tamper evidence (issue #13) -----------------------------------------------------------------


def test_a_registration_that_still_hashes_to_its_hash_loads() -> None:
    process = Process.register(registration(), at_ms=100)
    process.record_started(150, at_ms=200, event_id=None)
    loaded = replayed(process)
    assert loaded.registration == process.registration
    assert render_record(loaded, change_seq=0) == render_record(process, change_seq=0)


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r["input"].update(argv=["evil"]),
        lambda r: r.update(disposition="rerunnable"),
        lambda r: r.update(definition={"step": "deploy"}),
        lambda r: r.update(definition={"step": "build", "extra": True}),
        lambda r: r.update(env_ref=env_ref_for({"A": "2"})),
    ],
)
def test_an_edited_registration_is_store_corrupt_naming_its_process(edit: Any) -> None:
    mapper = OrjsonMapper()
    process = Process.register(registration(), at_ms=100)
    (created,) = process.collect_events()
    stored = mapper.to_stored_event(created)
    state = orjson.loads(stored.state)
    edit(state["registration"])
    tampered = dataclasses.replace(stored, state=orjson.dumps(state))
    with pytest.raises(StoreCorrupt) as caught:
        mapper.to_domain_event(tampered).mutate(None)
    assert caught.value.process_id == "job-1"
    assert str(caught.value) == "process 'job-1': registration does not match its hash"


def test_an_edited_hash_is_store_corrupt_too() -> None:
    mapper = OrjsonMapper()
    (created,) = Process.register(registration(), at_ms=100).collect_events()
    stored = mapper.to_stored_event(created)
    state = orjson.loads(stored.state)
    state["registration_hash"] = "sha256:" + "0" * 64
    with pytest.raises(StoreCorrupt, match="'job-1'"):
        mapper.to_domain_event(dataclasses.replace(stored, state=orjson.dumps(state))).mutate(None)


def test_the_hash_is_computed_once_per_registration_and_per_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from procledger.domain import caches

    calls: list[str] = []
    real = caches.registration_hash_of

    def counting(document: Any) -> str:
        calls.append(document["id"])
        return real(document)

    monkeypatch.setattr(caches, "registration_hash_of", counting)
    process = Process.register(registration(), at_ms=100)
    assert calls == ["job-1"]  # register: hashed once, its creation reuses it
    process.record_started(150, at_ms=200, event_id=None)
    exited(process, 0)
    replayed(process)
    assert calls == ["job-1", "job-1"]  # a load: once, for its Registered event


@pytest.mark.parametrize("disposition", list(RecoveryDisposition))
def test_the_disposition_is_the_registrations(disposition: RecoveryDisposition) -> None:
    process = new(disposition=disposition.value)
    assert process.disposition is disposition
    assert render_record(process, change_seq=0).disposition is disposition


@given(st.text())
def test_a_process_stream_key_is_the_name_based_uuid_of_its_id(process_id: str) -> None:
    """The stream key is computed without ``uuid.uuid5`` (a rebuild asks it of every record);
    it must be exactly the UUID every ledger already stores, for any id."""
    namespace = uuid.UUID("6f1c2d7e-5b0a-4c1e-9a53-0d4c6e1f7a21")
    try:
        expected = uuid.uuid5(namespace, process_id)
    except UnicodeEncodeError:  # a lone surrogate: no id at all, for either
        with pytest.raises(UnicodeEncodeError):
            process_key_hex(process_id)
        return
    assert process_uuid(process_id) == expected
    assert process_key_hex(process_id) == expected.hex
