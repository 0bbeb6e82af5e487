"""The closed lifecycle table, defined once as a strict python-statemachine class.

The class is the single source of legality; reasons are not a state-machine concept, so the
(kind, resulting state) → reasons map sits beside it and is checked against it at import time
(a transition without reasons, or reasons without a transition, fails the import).

Nothing at run time imports this module: python-statemachine costs ~23 ms of start-up (asyncio
included) for what is a frozen set. ``render_table_block`` writes the machine out as the plain
data of ``domain/lifecycle_table.py``, which the aggregate, ``procledger table`` and the
notification DTO use; a test holds that block equal to this rendering, and
``tests/domain/regenerate_lifecycle_table.py`` rewrites it after the machine changes
(docs/design.md §2.2). The run-time names are re-exported here for callers that predate it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from statemachine import State, StateMachine

from procledger.domain.lifecycle_table import (
    GENERATED_BEGIN,
    GENERATED_END,
    NOTIFICATION_ROWS,
    TRANSITIONS,
    LifecycleRow,
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


def machine_reasons() -> Mapping[
    tuple[LifecycleKind, ProcessState], tuple[TerminalReason | None, ...]
]:
    """The reasons beside the machine, per (kind, resulting state), in their declared order."""
    return _REASONS


_TARGETS = frozenset((kind, to) for _, kind, to in machine_transitions())
if frozenset(_REASONS) != _TARGETS:  # pragma: no cover - a broken edit of this module
    raise RuntimeError(f"reasons and transitions disagree: {_TARGETS ^ frozenset(_REASONS)}")


def _member(prefix: str, member: ProcessState | LifecycleKind | TerminalReason | None) -> str:
    return "None" if member is None else f"{prefix}.{member.name}"


def machine_states() -> tuple[list[ProcessState], frozenset[ProcessState]]:
    """The machine's states (the initial one first, then in declaration order) and its finals."""
    states = sorted(ProcessLifecycle.states_map.values(), key=lambda state: not state.initial)
    listed = [ProcessState(state.value) for state in states]
    return listed, frozenset(ProcessState(state.value) for state in states if state.final)


def _states(indent: str, *, final: bool | None) -> list[str]:
    listed, finals = machine_states()
    chosen = [state for state in listed if final is None or state in finals]
    return [f"{indent}{_member('_S', state)}," for state in chosen]


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


def _reason_lines() -> list[str]:
    lines = []
    for (kind, state), reasons in _REASONS.items():
        listed = ", ".join(_member("_R", reason) for reason in reasons)
        if len(reasons) == 1:
            listed += ","
        lines.append(f"        ({_member('_K', kind)}, {_member('_S', state)}): ({listed}),")
    return lines


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
    last, as the machine and its reasons say it must read (ruff-formatted)."""
    return "\n".join(
        [
            GENERATED_BEGIN,
            "#: The machine's states, the initial one first, and those that are final.",
            "STATES: tuple[ProcessState, ...] = (",
            *_states("    ", final=None),
            ")",
            "FINAL_STATES: frozenset[ProcessState] = frozenset(",
            "    {",
            *_states("        ", final=True),
            "    }",
            ")",
            "#: Every legal ``(from_state, kind, to_state)``.",
            "TRANSITIONS: frozenset[Move] = frozenset(",
            "    {",
            *_transition_lines(),
            "    }",
            ")",
            '#: Reasons allowed for a (kind, resulting state), in order; ``None``: "no reason".',
            "REASONS: ReasonMap = MappingProxyType(",
            "    {",
            *_reason_lines(),
            "    }",
            ")",
            GENERATED_END,
        ]
    )
