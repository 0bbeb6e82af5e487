"""The closed lifecycle table, defined once as a strict python-statemachine class.

The class is the single source of legality; reasons are not a state-machine concept, so the
(kind, resulting state) → reasons map is plain data, written once as ``REASONS`` in
``domain/lifecycle_table.py``, and checked against the class at import time here (a transition
without reasons, or reasons without a transition, fails the import).

Nothing at run time imports this module: python-statemachine costs ~23 ms of start-up (asyncio
included) for what is a frozen set. ``render_table_block`` writes the machine's states and
transitions out as the plain data of ``domain/lifecycle_table.py``, which the aggregate,
``procledger table`` and the notification DTO use; a test holds that block equal to this
rendering, and ``tests/domain/regenerate_lifecycle_table.py`` rewrites it after the machine
changes (docs/design.md §2.2). The run-time names are re-exported here for callers that predate
it.
"""

from __future__ import annotations

from types import MappingProxyType

from statemachine import State, StateMachine

from procledger.domain.lifecycle_table import (
    GENERATED_BEGIN,
    GENERATED_END,
    NOTIFICATION_ROWS,
    REASONS,
    TRANSITIONS,
    LifecycleRow,
    ReasonMap,
    check_row,
    check_transition,
    is_allowed,
    is_valid_row,
    lifecycle_table,
    render_markdown,
    render_mermaid,
)
from procledger.domain.vocabulary import LifecycleKind, ProcessState, TerminalReason

__all__ = [
    "NOTIFICATION_ROWS",
    "TRANSITIONS",
    "LifecycleRow",
    "ProcessLifecycle",
    "check_row",
    "check_transition",
    "is_allowed",
    "is_valid_row",
    "lifecycle_table",
    "machine_reasons",
    "machine_states",
    "machine_transitions",
    "render_markdown",
    "render_mermaid",
    "render_table_block",
    "replace_table_block",
]

_S = ProcessState
_K = LifecycleKind


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
    signaled = State(final=True, value=_S.signaled.value)
    lost_on_restore = State(final=True, value=_S.lost_on_restore.value)
    abandoned = State(final=True, value=_S.abandoned.value)

    started = starting.to(running)
    backgrounded = starting.to(running) | running.to.itself()  # type: ignore[no-untyped-call]
    stop_requested = starting.to.itself() | running.to.itself()  # type: ignore[no-untyped-call]
    # ``signaled`` only from running, like ``exited``: a signal death needs a child that ran,
    # and every executor records ``started`` before it waits for one; ``failed`` (a spawn
    # that failed), ``terminated`` and ``killed`` (stopped before it ran) need no child.
    completed = starting.to(failed, terminated, killed) | running.to(
        exited, failed, timed_out, interrupted, terminated, killed, signaled
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


def machine_transitions() -> frozenset[tuple[ProcessState, LifecycleKind, ProcessState]]:
    """Every ``(from_state, kind, to_state)`` the machine class declares."""
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


def machine_reasons() -> ReasonMap:
    """The reasons per (kind, resulting state), in their declared order: the plain data of
    ``lifecycle_table.REASONS``, whose keys this module's import holds equal to the machine's."""
    return REASONS


_TARGETS = frozenset((kind, to) for _, kind, to in machine_transitions())
if frozenset(REASONS) != _TARGETS:  # pragma: no cover - a broken edit of the machine or table
    raise RuntimeError(f"reasons and transitions disagree: {_TARGETS ^ frozenset(REASONS)}")


def _member(prefix: str, member: ProcessState | LifecycleKind | TerminalReason | None) -> str:
    return "None" if member is None else f"{prefix}.{member.name}"


def machine_states() -> tuple[list[ProcessState], frozenset[ProcessState]]:
    """The machine's states (the initial one first, then in declaration order) and its finals."""
    states = sorted(ProcessLifecycle.states_map.values(), key=lambda state: not state.initial)
    listed = [ProcessState(state.value) for state in states]
    return listed, frozenset(ProcessState(state.value) for state in states if state.final)


def _state_lines() -> list[str]:
    """``STATES`` listed, then ``FINAL_STATES`` as all of them but the few that are not final:
    a second list would repeat nine of the eleven."""
    listed, finals = machine_states()
    going = ", ".join(_member("_S", state) for state in listed if state not in finals)
    return [
        "STATES: tuple[ProcessState, ...] = (",
        *(f"    {_member('_S', state)}," for state in listed),
        ")",
        f"FINAL_STATES: frozenset[ProcessState] = frozenset(STATES) - {{{going}}}",
    ]


def _transition_lines() -> list[str]:
    order = {state: index for index, state in enumerate(ProcessState)}
    kinds = list(LifecycleKind)
    moves = sorted(
        machine_transitions(), key=lambda t: (order[t[0]], kinds.index(t[1]), order[t[2]])
    )
    return [
        f"        ({_member('_S', f)}, {_member('_K', k)}, {_member('_S', t)}),"
        for f, k, t in moves
    ]


def replace_table_block(module_text: str) -> str:
    """``module_text`` (the source of ``domain/lifecycle_table.py``) with its generated block
    replaced by ``render_table_block()``; equal to the input when the block is current."""
    # Anchored at line starts: the markers' own definitions hold the same text.
    head, begin, rest = module_text.partition(f"\n{GENERATED_BEGIN}\n")
    _, end, tail = rest.partition(f"\n{GENERATED_END}\n")
    if not begin or not end:
        raise ValueError("lifecycle_table.py has lost the markers of its generated block")
    return f"{head}\n{render_table_block()}\n{tail}"


def render_table_block() -> str:
    """The generated block of ``domain/lifecycle_table.py``, from its first marker line to its
    last, as the machine's states and transitions say it must read (ruff-formatted)."""
    return "\n".join(
        [
            GENERATED_BEGIN,
            "#: The machine's states, the initial one first, and those that are final.",
            *_state_lines(),
            "#: Every legal ``(from_state, kind, to_state)``.",
            "TRANSITIONS: frozenset[Move] = frozenset(",
            "    {",
            *_transition_lines(),
            "    }",
            ")",
            GENERATED_END,
        ]
    )
