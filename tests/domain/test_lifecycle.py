"""The closed lifecycle table (docs/design.md §2.1) and its transitions (§2.2), exhaustively;
and the plain-data table the run time uses (``lifecycle_table.py``) equal to the one machine."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from statemachine import StateMachine

import procledger.domain.lifecycle_table as table
from _design import DESIGN_ROWS, DESIGN_TRANSITIONS
from _shared import run_python
from procledger.domain.errors import InvalidTransition, ProcessLifecycleValidationError
from procledger.domain.lifecycle import (
    ProcessLifecycle,
    machine_reasons,
    machine_states,
    machine_transitions,
    render_table_block,
    replace_table_block,
)
from procledger.domain.lifecycle_table import (
    NOTIFICATION_ROWS,
    TRANSITIONS,
    LifecycleRow,
    check_row,
    check_transition,
    is_allowed,
    is_valid_row,
    lifecycle_table,
)
from procledger.domain.vocabulary import LifecycleKind, ProcessState, TerminalReason

# docs/design.md §2.1 and §2.2, written out (tests/_design.py).
EXPECTED_ROWS = DESIGN_ROWS
EXPECTED_TRANSITIONS = DESIGN_TRANSITIONS

TERMINAL_STATES = [
    s for s in ProcessState if s not in (ProcessState.starting, ProcessState.running)
]
ALL_TRIPLES = list(itertools.product(LifecycleKind, ProcessState, [None, *TerminalReason]))
ALL_MOVES = list(itertools.product(ProcessState, LifecycleKind, ProcessState))


def _plain(row: LifecycleRow) -> tuple[str, str, str | None]:
    return (row.kind.value, row.state.value, None if row.reason is None else row.reason.value)


def _expected_row(kind: LifecycleKind, state: ProcessState, reason: TerminalReason | None) -> bool:
    return (kind.value, state.value, None if reason is None else reason.value) in EXPECTED_ROWS


def _expected_move(from_state: ProcessState, kind: LifecycleKind, to: ProcessState) -> bool:
    return (from_state.value, kind.value, to.value) in EXPECTED_TRANSITIONS


def test_the_table_has_exactly_the_rows_of_the_design() -> None:
    rows = lifecycle_table()
    assert len(EXPECTED_ROWS) == 24
    assert len(rows) == len(set(rows)) == 24
    assert sorted(map(_plain, rows), key=repr) == sorted(EXPECTED_ROWS, key=repr)


def test_rows_are_named_tuples_of_the_vocabulary() -> None:
    for row in lifecycle_table():
        assert isinstance(row, LifecycleRow)
        assert isinstance(row.kind, LifecycleKind)
        assert isinstance(row.state, ProcessState)
        assert row.reason is None or isinstance(row.reason, TerminalReason)
        assert row == (row.kind, row.state, row.reason)


def test_the_table_is_a_copy_callers_cannot_corrupt() -> None:
    lifecycle_table().clear()
    assert len(lifecycle_table()) == 24


@pytest.mark.parametrize(("kind", "state", "reason"), ALL_TRIPLES)
def test_only_rows_of_the_table_are_valid(
    kind: LifecycleKind, state: ProcessState, reason: TerminalReason | None
) -> None:
    valid = _expected_row(kind, state, reason)
    assert is_valid_row(kind, state, reason) is valid
    if valid:
        check_row(kind, state, reason)
    else:
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            check_row(kind, state, reason)
        assert caught.value.field == "state_reason"


def test_notifications_accept_exactly_the_completed_and_lost_rows() -> None:
    expected = {
        (ProcessState(state), TerminalReason(reason))
        for kind, state, reason in EXPECTED_ROWS
        if kind in ("completed", "lost") and reason is not None
    }
    assert set(NOTIFICATION_ROWS) == expected
    assert len(expected) == 13


def test_the_transitions_are_exactly_those_of_the_design() -> None:
    plain = {(f.value, k.value, t.value) for f, k, t in TRANSITIONS}
    assert plain == EXPECTED_TRANSITIONS


@pytest.mark.parametrize(("from_state", "kind", "to_state"), ALL_MOVES)
def test_every_transition_is_allowed_or_refused_as_designed(
    from_state: ProcessState, kind: LifecycleKind, to_state: ProcessState
) -> None:
    allowed = _expected_move(from_state, kind, to_state)
    assert is_allowed(from_state, kind, to_state) is allowed
    if allowed:
        check_transition(from_state, kind, to_state, process_id="p-1")
        return
    with pytest.raises(InvalidTransition) as caught:
        check_transition(from_state, kind, to_state, process_id="p-1")
    error = caught.value
    assert (error.from_state, error.kind, error.to_state) == (
        from_state.value,
        kind.value,
        to_state.value,
    )
    assert error.process_id == "p-1"
    message = str(error)
    assert "p-1" in message
    assert from_state.value in message
    assert kind.value in message
    assert to_state.value in message


@pytest.mark.parametrize("state", TERMINAL_STATES)
def test_terminal_states_accept_nothing(state: ProcessState) -> None:
    assert state.is_terminal
    for kind, to_state in itertools.product(LifecycleKind, ProcessState):
        assert not is_allowed(state, kind, to_state)
        with pytest.raises(InvalidTransition):
            check_transition(state, kind, to_state)


def test_invalid_transition_without_a_process_id() -> None:
    with pytest.raises(InvalidTransition) as caught:
        check_transition(ProcessState.starting, LifecycleKind.completed, ProcessState.exited)
    assert caught.value.process_id is None
    assert (caught.value.from_state, caught.value.kind, caught.value.to_state) == (
        "starting",
        "completed",
        "exited",
    )


def test_every_row_has_a_transition_and_every_transition_a_row() -> None:
    row_targets = {(kind.value, state.value) for kind, state, _ in lifecycle_table()}
    move_targets = {(kind, to) for _, kind, to in EXPECTED_TRANSITIONS}
    assert row_targets == move_targets


def test_stop_requested_never_changes_the_state() -> None:
    for from_state, kind, to_state in TRANSITIONS:
        if kind is LifecycleKind.stop_requested:
            assert from_state is to_state


def test_the_machine_is_a_strict_state_machine_with_the_vocabulary_states() -> None:
    assert issubclass(ProcessLifecycle, StateMachine)
    values = {state.value for state in ProcessLifecycle.states_map.values()}
    assert values == {state.value for state in ProcessState}
    initial = [s for s in ProcessLifecycle.states_map.values() if s.initial]
    assert [s.value for s in initial] == ["starting"]
    finals = {s.value for s in ProcessLifecycle.states_map.values() if s.final}
    assert finals == {state.value for state in TERMINAL_STATES}


# -- signaled (issue #14): a signal procledger did not send ------------------------------------


def test_signaled_is_a_completion_from_running_only() -> None:
    """Like ``exited``: a signal death needs a child that ran, and ``started`` is recorded
    before anyone waits for one; ``failed``/``terminated``/``killed`` need no child."""
    signaled = ProcessState.signaled
    assert signaled.is_terminal
    assert is_allowed(ProcessState.running, LifecycleKind.completed, signaled)
    assert not is_allowed(ProcessState.starting, LifecycleKind.completed, signaled)
    assert [row for row in lifecycle_table() if row.state is signaled] == [
        LifecycleRow(LifecycleKind.completed, signaled, TerminalReason.signaled)
    ]
    assert (signaled, TerminalReason.signaled) in NOTIFICATION_ROWS


# -- the plain-data table equals the machine ----------------------------------------------------

TABLE_SOURCE = Path(table.__file__)


def test_the_generated_block_is_the_machine_written_out() -> None:
    text = TABLE_SOURCE.read_text(encoding="utf-8")
    assert render_table_block() in text
    stale = "lifecycle_table.py is stale: run tests/domain/regenerate_lifecycle_table.py"
    assert replace_table_block(text) == text, stale


def test_the_plain_data_has_exactly_the_machines_states_transitions_and_reasons() -> None:
    states, finals = machine_states()
    assert tuple(states) == table.STATES
    assert finals == table.FINAL_STATES
    assert set(table.STATES) == set(ProcessState)
    assert table.STATES[0] is ProcessState.starting
    assert {state for state in ProcessState if state.is_terminal} == table.FINAL_STATES
    assert machine_transitions() == table.TRANSITIONS
    # The reasons are written once, in the table module; the machine's moves decide their keys.
    assert machine_reasons() is table.REASONS
    assert set(table.REASONS) == {(kind, to) for _, kind, to in machine_transitions()}


def test_a_changed_machine_makes_the_block_stale() -> None:
    text = TABLE_SOURCE.read_text(encoding="utf-8")
    edited = text.replace("(_S.running, _K.completed, _S.signaled),\n", "", 1)
    assert edited != text
    assert replace_table_block(edited) == text
    with pytest.raises(ValueError, match="markers"):
        replace_table_block(text.replace(table.GENERATED_END, "# gone"))


# Runs in a fresh interpreter: what loading the aggregate and the table costs in modules.
_IMPORTS = """
import json, sys
import procledger.domain.process, procledger.domain.lifecycle_table, procledger.domain.rendering
import procledger.domain.notification
print(json.dumps(sorted(sys.modules)))
"""


def test_the_run_time_never_imports_python_statemachine() -> None:
    done = run_python(_IMPORTS, "-X", "importtime")
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout)
    assert [m for m in modules if m.split(".")[0] == "statemachine"] == []
    assert "procledger.domain.lifecycle" not in modules
    assert "statemachine" not in done.stderr  # -X importtime lists every import on stderr
