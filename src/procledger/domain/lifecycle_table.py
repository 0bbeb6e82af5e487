"""The closed lifecycle table as plain data, and every check and rendering made of it
(docs/design.md §2.1, §2.2).

The machine -- its states and transitions -- is defined once, as the strict python-statemachine
class in ``domain/lifecycle.py``. Importing python-statemachine costs ~23 ms of start-up (asyncio
included) for what is a frozen set, so the generated block below is that class written out as
data (by ``tests/domain/regenerate_lifecycle_table.py``; a test holds the two equal) and nothing
on a run-time path imports the machine: the aggregate, ``procledger table`` and the notification
DTO use this module. Reasons are not a state-machine concept, so ``REASONS`` is written here
once, by hand, and ``domain/lifecycle.py`` refuses to import when they and the machine's
transitions disagree. Every check is a set lookup (~0.1 µs, against ~0.5 ms to build a machine).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from procledger.domain.errors import InvalidTransition, ProcessLifecycleValidationError
from procledger.domain.vocabulary import LifecycleKind, ProcessState, TerminalReason

_S = ProcessState
_K = LifecycleKind
_R = TerminalReason

#: A legal move: ``(from_state, kind, to_state)``.
Move = tuple[ProcessState, LifecycleKind, ProcessState]
#: The reasons allowed per ``(kind, resulting state)``.
ReasonMap = Mapping[tuple[LifecycleKind, ProcessState], tuple[TerminalReason | None, ...]]

#: The first and last lines of the generated block (what the regeneration replaces).
GENERATED_BEGIN = (
    "# -- generated from domain/lifecycle.py by tests/domain/regenerate_lifecycle_table.py"
)
GENERATED_END = "# -- end of the generated block"

_STOP_REASONS = (_R.interrupted, _R.terminated, _R.killed)

#: Reasons allowed for a (kind, resulting state), in order; ``None``: "no reason". Written here
#: once, not generated: ``domain/lifecycle.py`` holds the keys equal to the machine's moves.
REASONS: ReasonMap = MappingProxyType(
    {
        (_K.started, _S.running): (None,),
        (_K.backgrounded, _S.running): (None,),
        (_K.stop_requested, _S.starting): _STOP_REASONS,
        (_K.stop_requested, _S.running): _STOP_REASONS,
        (_K.completed, _S.exited): (_R.exited,),
        (_K.completed, _S.failed): (_R.failed, _R.ready_timeout),
        (_K.completed, _S.timed_out): (_R.timed_out,),
        (_K.completed, _S.interrupted): (_R.interrupted,),
        (_K.completed, _S.terminated): (_R.terminated, _R.runner_shutdown, _R.output_limit),
        (_K.completed, _S.killed): (_R.killed, _R.runner_shutdown, _R.output_limit),
        (_K.completed, _S.signaled): (_R.signaled,),
        (_K.lost, _S.lost_on_restore): (_R.lost_on_restore,),
        (_K.abandoned, _S.abandoned): (_R.owner_drain, _R.owner_dead, _R.abandon_requested),
    }
)

# -- generated from domain/lifecycle.py by tests/domain/regenerate_lifecycle_table.py
#: The machine's states, the initial one first, and those that are final.
STATES: tuple[ProcessState, ...] = (
    _S.starting,
    _S.running,
    _S.exited,
    _S.failed,
    _S.timed_out,
    _S.interrupted,
    _S.terminated,
    _S.killed,
    _S.signaled,
    _S.lost_on_restore,
    _S.abandoned,
)
FINAL_STATES: frozenset[ProcessState] = frozenset(STATES) - {_S.starting, _S.running}
#: Every legal ``(from_state, kind, to_state)``.
TRANSITIONS: frozenset[Move] = frozenset(
    {
        (_S.starting, _K.started, _S.running),
        (_S.starting, _K.backgrounded, _S.running),
        (_S.starting, _K.stop_requested, _S.starting),
        (_S.starting, _K.completed, _S.failed),
        (_S.starting, _K.completed, _S.terminated),
        (_S.starting, _K.completed, _S.killed),
        (_S.starting, _K.lost, _S.lost_on_restore),
        (_S.starting, _K.abandoned, _S.abandoned),
        (_S.running, _K.backgrounded, _S.running),
        (_S.running, _K.stop_requested, _S.running),
        (_S.running, _K.completed, _S.exited),
        (_S.running, _K.completed, _S.failed),
        (_S.running, _K.completed, _S.timed_out),
        (_S.running, _K.completed, _S.interrupted),
        (_S.running, _K.completed, _S.terminated),
        (_S.running, _K.completed, _S.killed),
        (_S.running, _K.completed, _S.signaled),
        (_S.running, _K.lost, _S.lost_on_restore),
        (_S.running, _K.abandoned, _S.abandoned),
    }
)
# -- end of the generated block


class LifecycleRow(NamedTuple):
    """One valid ``(kind, state, reason)`` triple of the closed table."""

    kind: LifecycleKind
    state: ProcessState
    reason: TerminalReason | None


_ROWS: tuple[LifecycleRow, ...] = tuple(
    LifecycleRow(kind, state, reason)
    for kind in LifecycleKind
    for state in ProcessState
    for reason in REASONS.get((kind, state), ())
)
_ROW_SET = frozenset(_ROWS)

#: Rows a completion notification may carry: the completed and lost rows.
NOTIFICATION_ROWS = frozenset(
    (row.state, row.reason)
    for row in _ROWS
    if row.kind in (_K.completed, _K.lost) and row.reason is not None
)


def lifecycle_table() -> list[LifecycleRow]:
    """The closed table, one row per valid triple, in vocabulary order."""
    return list(_ROWS)


def is_valid_row(kind: LifecycleKind, state: ProcessState, reason: TerminalReason | None) -> bool:
    return (kind, state, reason) in _ROW_SET


def check_row(kind: LifecycleKind, state: ProcessState, reason: TerminalReason | None) -> None:
    """Refuse a triple outside the closed table, naming it."""
    if not is_valid_row(kind, state, reason):
        raise ProcessLifecycleValidationError(
            "state_reason",
            f"({kind.value}, {state.value}, {reason.value if reason else None}) "
            "is not a row of the lifecycle table",
        )


def is_allowed(from_state: ProcessState, kind: LifecycleKind, to_state: ProcessState) -> bool:
    return (from_state, kind, to_state) in TRANSITIONS


def check_transition(
    from_state: ProcessState,
    kind: LifecycleKind,
    to_state: ProcessState,
    *,
    process_id: str | None = None,
) -> None:
    if not is_allowed(from_state, kind, to_state):
        raise InvalidTransition(from_state.value, kind.value, to_state.value, process_id=process_id)


def render_markdown() -> str:
    """The table for people: one Markdown row per valid triple."""
    lines = ["| kind | state | reason |", "|---|---|---|"]
    for row in _ROWS:
        reason = row.reason.value if row.reason is not None else "none"
        lines.append(f"| {row.kind.value} | {row.state.value} | {reason} |")
    return "\n".join(lines) + "\n"


def render_mermaid() -> str:
    """A Mermaid state diagram drawn from the same transitions the aggregate checks."""
    lines = ["stateDiagram-v2", f"    [*] --> {_S.starting.value}"]
    order = {state: index for index, state in enumerate(ProcessState)}
    for from_state, kind, to_state in sorted(
        TRANSITIONS, key=lambda t: (order[t[0]], list(LifecycleKind).index(t[1]), order[t[2]])
    ):
        lines.append(f"    {from_state.value} --> {to_state.value}: {kind.value}")
    lines.extend(f"    {state.value} --> [*]" for state in ProcessState if state.is_terminal)
    return "\n".join(lines) + "\n"
