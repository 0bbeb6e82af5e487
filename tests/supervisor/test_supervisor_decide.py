"""The Supervisor's pure decisions (``procledger.supervisor.decide``): which terminal a finished
child gets, which signals carry out a stop, and the ids derived at registration."""

from __future__ import annotations

import signal
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procledger.domain.lifecycle import check_row
from procledger.domain.outcome import check_completion_fields
from procledger.domain.records import MAX_DIAGNOSTIC_BYTES
from procledger.domain.vocabulary import LifecycleKind, ProcessState, TerminalReason
from procledger.supervisor.decide import (
    STOP_REASONS,
    event_ids,
    mode_policy,
    outcome,
    request_policy,
)
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.modes import StopMode

S, R = ProcessState, TerminalReason
returncodes = st.one_of(st.integers(0, 255), st.sampled_from([-s for s in signal.Signals]))
requests = st.lists(st.sampled_from(STOP_REASONS), unique=True, max_size=3).map(tuple)


@given(returncodes, requests, st.booleans(), st.one_of(st.none(), st.text(max_size=700)))
def test_every_outcome_is_a_valid_completed_row(
    returncode: int, requested: tuple[R, ...], shutdown: bool, failure: str | None
) -> None:
    result = outcome(returncode, requested=requested, shutdown=shutdown, failure=failure)
    check_row(LifecycleKind.completed, result.state, result.reason)
    check_completion_fields(result.state, result.exit_code, result.diagnostic, None, result.signal)
    if returncode < 0 and failure is None:
        assert result.signal == -returncode  # whoever sent it, the record names the signal
    assert result.diagnostic is None or len(result.diagnostic.encode()) <= MAX_DIAGNOSTIC_BYTES


@given(returncodes, requests, st.booleans())
def test_the_status_is_cancelled_after_a_stop_unless_it_exited_zero(
    returncode: int, requested: tuple[R, ...], shutdown: bool
) -> None:
    result = outcome(returncode, requested=requested, shutdown=shutdown)
    if returncode == 0:
        assert (result.state, result.exit_code) == (S.exited, 0)
    elif requested or shutdown:
        assert result.state in {S.interrupted, S.terminated, S.killed}
    elif returncode < 0:  # a signal nobody here sent: a crash is not a cancellation
        assert (result.state, result.signal) == (S.signaled, -returncode)


@pytest.mark.parametrize(
    ("returncode", "requested", "shutdown", "expected"),
    [
        (0, (), False, (S.exited, R.exited, 0)),
        (3, (), False, (S.exited, R.exited, 3)),
        (-signal.SIGINT, (), False, (S.signaled, R.signaled, None)),
        (-signal.SIGKILL, (), False, (S.signaled, R.signaled, None)),
        (-signal.SIGSEGV, (), False, (S.signaled, R.signaled, None)),
        (-signal.SIGPIPE, (), False, (S.signaled, R.signaled, None)),
        (-signal.SIGINT, (R.interrupted,), False, (S.interrupted, R.interrupted, None)),
        (-signal.SIGKILL, (R.terminated,), False, (S.killed, R.killed, None)),
        (-signal.SIGTERM, (R.terminated,), False, (S.terminated, R.terminated, None)),
        (-signal.SIGHUP, (R.killed,), False, (S.terminated, R.terminated, None)),
        (130, (R.interrupted,), False, (S.interrupted, R.interrupted, None)),
        (1, (R.interrupted, R.killed), False, (S.killed, R.killed, None)),
        (0, (R.terminated,), False, (S.exited, R.exited, 0)),
        (-signal.SIGTERM, (), True, (S.terminated, R.runner_shutdown, None)),
        (-signal.SIGKILL, (), True, (S.killed, R.runner_shutdown, None)),
        (143, (), True, (S.terminated, R.runner_shutdown, None)),
        (0, (), True, (S.exited, R.exited, 0)),
    ],
)
def test_the_terminal_follows_how_the_child_ended(
    returncode: int,
    requested: tuple[R, ...],
    shutdown: bool,
    expected: tuple[S, R, int | None],
) -> None:
    result = outcome(returncode, requested=requested, shutdown=shutdown)
    assert (result.state, result.reason, result.exit_code) == expected


def test_a_failed_output_consumer_is_failed_with_its_diagnostic() -> None:
    result = outcome(-signal.SIGTERM, failure="ValueError: boom")
    assert (result.state, result.reason, result.diagnostic) == (
        S.failed,
        R.failed,
        "ValueError: boom",
    )


def test_stop_modes_have_their_exact_policies() -> None:
    assert mode_policy(StopMode.interrupt, 2.0) == (StopPolicy((signal.SIGINT,), 2.0), False)
    assert mode_policy(StopMode.terminate, 2.0) == (StopPolicy((signal.SIGTERM,), 2.0), True)
    assert mode_policy(StopMode.kill, 2.0) == (StopPolicy((signal.SIGKILL,), 0.0), True)
    assert [mode.reason for mode in StopMode] == list(STOP_REASONS)
    assert StopMode("kill") is StopMode.kill


def test_requests_are_carried_out_with_the_supervisors_policy() -> None:
    cli = StopPolicy((signal.SIGINT, signal.SIGUSR2), 3.0)
    assert request_policy(R.interrupted, cli) == cli
    assert request_policy(R.terminated, cli) == StopPolicy((signal.SIGUSR2,), 3.0)
    assert request_policy(R.killed, cli) == StopPolicy((signal.SIGKILL,), 0.0)
    default = StopPolicy()
    assert request_policy(R.interrupted, default).signals == (signal.SIGINT, signal.SIGTERM)
    assert request_policy(R.terminated, default).signals == (signal.SIGTERM,)
    only_int = StopPolicy((signal.SIGINT,), 1.0)
    assert request_policy(R.terminated, only_int).signals == (signal.SIGTERM,)


@given(st.text(min_size=1, max_size=256), st.text(min_size=1, max_size=80))
def test_event_ids_are_stable_distinct_uuids(process_id: str, registration_hash: str) -> None:
    ids = event_ids(process_id, registration_hash)
    assert ids == event_ids(process_id, registration_hash)
    every = [
        ids.started,
        ids.backgrounded,
        *ids.stop.values(),
        ids.completed,
        ids.lost,
        ids.run_marker,
    ]
    assert len({*every, str(ids.command_id)}) == len(every) + 1
    assert all(uuid.UUID(value).version == 5 for value in every)
    assert event_ids(process_id + "x", registration_hash).command_id != ids.command_id
    assert event_ids(process_id, registration_hash + "x").completed != ids.completed
