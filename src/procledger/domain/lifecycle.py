"""The closed lifecycle table, defined once as a strict python-statemachine class.

The class is the single source of legality. It is never instantiated on a hot path: at import
time its transitions are read into frozen sets, and every check in the aggregate is a set
lookup (~0.1 µs instead of ~0.5 ms for building a machine). Reasons are not a state-machine
concept, so the (kind, resulting state) → reasons map sits beside the class and is checked
against it at import time: a transition without reasons, or reasons without a transition, fails
the import.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from statemachine import State, StateMachine

from procledger.domain.errors import InvalidTransition, ProcessLifecycleValidationError
from procledger.domain.vocabulary import LifecycleKind, ProcessState, TerminalReason

_S = ProcessState
_K = LifecycleKind
_R = TerminalReason


class ProcessLifecycle(StateMachine):
    """States and transitions of one process. Introspected, never run per aggregate."""

    starting = State(initial=True, value=_S.starting.value)
    running = State(value=_S.running.value)
    exited = State(final=True, value=_S.exited.value)
    failed = State(final=True, value=_S.failed.value)
    timed_out = State(final=True, value=_S.timed_out.value)
    interrupted = State(final=True, value=_S.interrupted.value)
    terminated = State(final=True, value=_S.terminated.value)
    killed = State(final=True, value=_S.killed.value)
    lost_on_restore = State(final=True, value=_S.lost_on_restore.value)
    abandoned = State(final=True, value=_S.abandoned.value)

    started = starting.to(running)
    backgrounded = starting.to(running) | running.to.itself()  # type: ignore[no-untyped-call]
    stop_requested = starting.to.itself() | running.to.itself()  # type: ignore[no-untyped-call]
    completed = starting.to(failed, terminated, killed) | running.to(
        exited, failed, timed_out, interrupted, terminated, killed
    )
    lost = starting.to(lost_on_restore) | running.to(lost_on_restore)
    abandon = starting.to(abandoned) | running.to(abandoned)


# The machine's event names are identifiers; ``abandon`` avoids clashing with the state.
_EVENT_KIND = MappingProxyType(
    {
        "started": _K.started,
        "backgrounded": _K.backgrounded,
        "stop_requested": _K.stop_requested,
        "completed": _K.completed,
        "lost": _K.lost,
        "abandon": _K.abandoned,
    }
)

_STOP_REASONS = (_R.interrupted, _R.terminated, _R.killed)

#: Reasons allowed for a (kind, resulting state). ``None`` means "no reason".
_REASONS: Mapping[tuple[LifecycleKind, ProcessState], tuple[TerminalReason | None, ...]] = (
    MappingProxyType(
        {
            (_K.started, _S.running): (None,),
            (_K.backgrounded, _S.running): (None,),
            (_K.stop_requested, _S.starting): _STOP_REASONS,
            (_K.stop_requested, _S.running): _STOP_REASONS,
            (_K.completed, _S.exited): (_R.exited,),
            (_K.completed, _S.failed): (_R.failed,),
            (_K.completed, _S.timed_out): (_R.timed_out,),
            (_K.completed, _S.interrupted): (_R.interrupted,),
            (_K.completed, _S.terminated): (_R.terminated, _R.runner_shutdown, _R.output_limit),
            (_K.completed, _S.killed): (_R.killed, _R.runner_shutdown, _R.output_limit),
            (_K.lost, _S.lost_on_restore): (_R.lost_on_restore,),
            (_K.abandoned, _S.abandoned): (_R.owner_drain, _R.owner_dead, _R.abandon_requested),
        }
    )
)


class LifecycleRow(NamedTuple):
    """One valid ``(kind, state, reason)`` triple of the closed table."""

    kind: LifecycleKind
    state: ProcessState
    reason: TerminalReason | None


def _read_transitions() -> frozenset[tuple[ProcessState, LifecycleKind, ProcessState]]:
    found: set[tuple[ProcessState, LifecycleKind, ProcessState]] = set()
    for state in ProcessLifecycle.states_map.values():
        for transition in state.transitions:
            for event in transition.events:
                found.add(
                    (
                        ProcessState(transition.source.value),
                        _EVENT_KIND[str(event)],
                        ProcessState(transition.target.value),
                    )
                )
    return frozenset(found)


#: Every legal ``(from_state, kind, to_state)``, read from the machine class at import time.
TRANSITIONS = _read_transitions()

_TARGETS = frozenset((kind, to) for _, kind, to in TRANSITIONS)
if frozenset(_REASONS) != _TARGETS:  # pragma: no cover - a broken edit of this module
    raise RuntimeError(f"reasons and transitions disagree: {_TARGETS ^ frozenset(_REASONS)}")

_ROWS: tuple[LifecycleRow, ...] = tuple(
    LifecycleRow(kind, state, reason)
    for kind in LifecycleKind
    for state in ProcessState
    for reason in _REASONS.get((kind, state), ())
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
