"""The words of the model (docs/design.md §2) and the coarse status (§3.4)."""

from __future__ import annotations

import re
from enum import StrEnum

import pytest

from procledger.domain.lifecycle_table import lifecycle_table
from procledger.domain.vocabulary import (
    LifecycleKind,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    TerminalReason,
    coarse_status,
)

S = ProcessState
R = TerminalReason
C = ProcessStatus


@pytest.mark.parametrize(
    ("enum", "values"),
    [
        (
            ProcessState,
            "starting running exited failed timed_out interrupted terminated killed "
            "signaled lost_on_restore abandoned",
        ),
        (
            TerminalReason,
            "exited failed timed_out interrupted terminated killed signaled "
            "runner_shutdown output_limit ready_timeout lost_on_restore owner_drain owner_dead "
            "abandon_requested",
        ),
        (LifecycleKind, "started backgrounded stop_requested completed lost abandoned"),
        (RecoveryDisposition, "rerunnable owner_bound externally_owned"),
        (ProcessStatus, "running completed failed cancelled abandoned"),
    ],
)
def test_enums_have_exactly_the_designed_snake_case_values(
    enum: type[StrEnum], values: str
) -> None:
    assert issubclass(enum, StrEnum)
    assert [member.value for member in enum] == values.split()
    for member in enum:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", member.value)
        assert member.name == member.value
        assert str(member) == member.value
        assert enum(member.value) is member


@pytest.mark.parametrize("state", list(ProcessState))
def test_is_terminal_is_every_state_but_starting_and_running(state: ProcessState) -> None:
    assert state.is_terminal is (state not in (S.starting, S.running))


# §3.4, case by case: (state, reason, exit_code) -> coarse status.
COARSE_CASES = [
    (S.starting, None, None, C.running),
    (S.running, None, None, C.running),
    (S.exited, R.exited, 0, C.completed),
    (S.exited, R.exited, 1, C.failed),
    (S.exited, R.exited, 255, C.failed),
    (S.exited, R.exited, -9, C.failed),
    (S.failed, R.failed, None, C.failed),
    (S.failed, R.ready_timeout, None, C.failed),
    (S.timed_out, R.timed_out, None, C.failed),
    (S.signaled, R.signaled, None, C.failed),
    (S.terminated, R.output_limit, None, C.failed),
    (S.killed, R.output_limit, None, C.failed),
    (S.interrupted, R.interrupted, None, C.cancelled),
    (S.terminated, R.terminated, None, C.cancelled),
    (S.terminated, R.runner_shutdown, None, C.cancelled),
    (S.killed, R.killed, None, C.cancelled),
    (S.killed, R.runner_shutdown, None, C.cancelled),
    (S.lost_on_restore, R.lost_on_restore, None, C.abandoned),
    (S.abandoned, R.owner_drain, None, C.abandoned),
    (S.abandoned, R.owner_dead, None, C.abandoned),
    (S.abandoned, R.abandon_requested, None, C.abandoned),
]


@pytest.mark.parametrize(("state", "reason", "exit_code", "expected"), COARSE_CASES)
def test_coarse_status(
    state: ProcessState,
    reason: TerminalReason | None,
    exit_code: int | None,
    expected: ProcessStatus,
) -> None:
    assert coarse_status(state, reason, exit_code) is expected


def test_coarse_status_cases_cover_every_live_state_and_terminal_row() -> None:
    covered = {(state, reason) for state, reason, _, _ in COARSE_CASES}
    assert {state for state, _ in covered if not state.is_terminal} == {S.starting, S.running}
    terminal_rows = {(row.state, row.reason) for row in lifecycle_table() if row.state.is_terminal}
    assert len(terminal_rows) == 16
    assert {pair for pair in covered if pair[0].is_terminal} == terminal_rows
