"""Restart policies (docs/design.md §15): every attempt its own process, backoff, crash loops
and stops, with real processes."""

from __future__ import annotations

import itertools

import pytest

from _shared import Processes, wait_until
from procledger import (
    NotFound,
    ProcessHandle,
    ProcessRecord,
    ProcessRegistry,
    ProcessState,
    RestartMode,
    RestartPolicy,
    TerminalReason,
)
from procledger.supervisor.supervisor import Supervisor

SCHEDULE = [0.2, 0.4, 0.8, 1.6, 1.6]
ISSUE_POLICY = RestartPolicy(
    mode=RestartMode.on_failure,
    max_restarts=5,
    window_s=60,
    backoff_initial_s=0.2,
    backoff_max_s=1.6,
)


def attempts(registry: ProcessRegistry, first: str) -> list[ProcessRecord]:
    found = [registry.get(first)]
    while True:
        try:
            found.append(registry.get(f"{first}.{len(found) + 1}"))
        except NotFound:
            return found


@pytest.mark.slow
def test_an_always_failing_child_backs_off_then_crash_loops(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    handle = supervisor.start(["sh", "-c", "exit 3"], restart=ISSUE_POLICY)
    last = supervisor.wait(handle, timeout=60)
    records = attempts(registry, handle.process_id)
    assert len(records) == 6
    assert [r.attempt for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r.attempt_of for r in records] == [None, *[handle.process_id] * 5]
    assert all((r.state, r.exit_code) == (ProcessState.exited, 3) for r in records)
    # The backoff: from one attempt's end to the next one's start.
    gaps = []
    for before, after in itertools.pairwise(records):
        assert before.finished_at_ms is not None
        assert after.started_at_ms is not None
        gaps.append((after.started_at_ms - before.finished_at_ms) / 1000)
    for gap, planned in zip(gaps, SCHEDULE, strict=True):
        # ±10% jitter, 5% slack, and up to 0.25 s for the next attempt's registration and
        # spawn on a loaded machine (the gap is measured from record to record).
        assert planned * 0.85 <= gap <= planned * 1.15 + 0.25, (gaps, SCHEDULE)
    # The sixth failure spent the budget: a crash_loop fact on the last attempt only.
    assert last.id == records[-1].id
    assert last.gave_up == "crash_loop"
    assert [r.gave_up for r in records[:-1]] == [None] * 5
    facts = [e for e in registry.events(last.id) if e.kind == "crash_loop"]
    assert [(f.payload["attempt"], f.payload["restarts"]) for f in facts] == [(6, 5)]


def test_a_stop_during_the_backoff_starts_nothing_more(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    handle, second = _in_backoff(registry, supervisor)
    assert registry.get(second).state is ProcessState.starting
    record = supervisor.stop(handle, "terminate")
    assert record.id == second
    assert (record.state, record.reason) == (ProcessState.terminated, TerminalReason.terminated)
    assert record.started_at_ms is None
    assert record.stop_requested == [TerminalReason.terminated]
    assert supervisor.wait(handle, timeout=5).id == second
    assert not _exists(registry, f"{handle.process_id}.3")
    assert registry.get_lease(second) is None or registry.get_lease(second).released


def test_a_stop_recorded_elsewhere_during_the_backoff_is_honoured(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    """What `procledger stop` does from another process: a request on the newest attempt."""
    handle, second = _in_backoff(registry, supervisor)
    registry.request_stop(second, "terminated")
    record = supervisor.wait(handle, timeout=10)
    assert (record.id, record.state) == (second, ProcessState.terminated)
    assert not _exists(registry, f"{handle.process_id}.3")


def test_stopping_a_running_attempt_cancels_restarts(
    registry: ProcessRegistry, supervisor: Supervisor, procs: Processes
) -> None:
    pidfile = procs.pidfile("svc.pid")
    command = ["sh", "-c", f'echo $$ > "{pidfile}.tmp" && mv "{pidfile}.tmp" "{pidfile}" && '
               "exec sleep 60"]  # fmt: skip
    policy = RestartPolicy(mode=RestartMode.always, backoff_initial_s=0, backoff_max_s=0)
    handle = supervisor.start(command, restart=policy)
    process = procs.await_pid(pidfile)
    record = supervisor.stop(handle, "terminate", grace_s=5)
    assert (record.id, record.state) == (handle.process_id, ProcessState.terminated)
    procs.assert_dead(process)
    assert supervisor.wait(handle, timeout=5).id == handle.process_id
    assert not _exists(registry, f"{handle.process_id}.2")


@pytest.mark.parametrize(
    ("mode", "command", "expected"),
    [
        (RestartMode.on_failure, "exit 0", 1),
        (RestartMode.never, "exit 1", 1),
        (RestartMode.always, "exit 0", 3),
    ],
)
def test_the_policy_decides_which_ends_restart(
    registry: ProcessRegistry,
    supervisor: Supervisor,
    mode: RestartMode,
    command: str,
    expected: int,
) -> None:
    policy = RestartPolicy(mode=mode, max_restarts=2, backoff_initial_s=0, backoff_max_s=0)
    handle = supervisor.start(["sh", "-c", command], restart=policy)
    last = supervisor.wait(handle, timeout=30)
    assert len(attempts(registry, handle.process_id)) == expected
    assert last.gave_up == ("crash_loop" if expected == 3 else None)


def _in_backoff(registry: ProcessRegistry, supervisor: Supervisor) -> tuple[ProcessHandle, str]:
    """A service that always fails, waiting 30 s before its second attempt: its handle and
    the id of that attempt, registered (``starting``) before the wait."""
    policy = RestartPolicy(mode=RestartMode.always, backoff_initial_s=30, backoff_max_s=30)
    handle = supervisor.start(["sh", "-c", "exit 1"], restart=policy)
    second = f"{handle.process_id}.2"
    wait_until(lambda: _exists(registry, second), 30, "the second attempt to be registered")
    return handle, second


def _exists(registry: ProcessRegistry, pid: str) -> bool:
    try:
        registry.get(pid)
    except NotFound:
        return False
    return True


def test_a_shutdown_during_the_backoff_ends_the_pending_attempt(
    registry: ProcessRegistry, supervisor: Supervisor
) -> None:
    handle, second = _in_backoff(registry, supervisor)
    supervisor.shutdown(grace_s=1.0)
    record = registry.get(second)
    assert (record.state, record.reason) == (
        ProcessState.terminated,
        TerminalReason.runner_shutdown,
    )
    assert not _exists(registry, f"{handle.process_id}.3")
