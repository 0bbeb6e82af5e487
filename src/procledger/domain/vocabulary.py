"""The words of the model. Values are snake_case because they are the JSON form."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

MAX_LEDGER_INT: Final = 2**63 - 1
"""The largest integer the ledger keeps (SQLite's INTEGER, PostgreSQL's bigint, a JSON int64):
a count, cursor or size beyond it is refused where it is given, before anything is written."""


class ProcessState(StrEnum):
    starting = "starting"
    running = "running"
    exited = "exited"
    failed = "failed"
    timed_out = "timed_out"
    interrupted = "interrupted"
    terminated = "terminated"
    killed = "killed"
    #: Ended by a signal procledger did not send (a crash, an OOM kill, SIGPIPE…).
    signaled = "signaled"
    lost_on_restore = "lost_on_restore"
    abandoned = "abandoned"

    @property
    def is_terminal(self) -> bool:
        return self not in _GOING_STATES


# Sets built once: spelling the members out at each call looks every one of them up on its
# class, several times the cost of the test (these run for every write and every record read).
_GOING_STATES = frozenset({ProcessState.starting, ProcessState.running})


class TerminalReason(StrEnum):
    """Why a process ended. The first seven, and ``lost_on_restore``, are named like the state
    they end in on purpose: each is that state's plain reason (docs/design.md §2.1), and the
    supervisor finds one from the other by value (``TerminalReason(state.value)``). The words
    are shared, not the enum: each is its own closed JSON vocabulary, spelled out for mypy."""

    exited = "exited"
    failed = "failed"
    timed_out = "timed_out"
    interrupted = "interrupted"
    terminated = "terminated"
    killed = "killed"
    signaled = "signaled"
    runner_shutdown = "runner_shutdown"
    output_limit = "output_limit"
    ready_timeout = "ready_timeout"
    lost_on_restore = "lost_on_restore"
    owner_drain = "owner_drain"
    owner_dead = "owner_dead"
    abandon_requested = "abandon_requested"


class LifecycleKind(StrEnum):
    started = "started"
    backgrounded = "backgrounded"
    stop_requested = "stop_requested"
    completed = "completed"
    lost = "lost"
    abandoned = "abandoned"


class RecoveryDisposition(StrEnum):
    """How a process may be recovered when its worker disappears; declared, never defaulted."""

    rerunnable = "rerunnable"
    owner_bound = "owner_bound"
    externally_owned = "externally_owned"


class ProcessStatus(StrEnum):
    """Coarse status for lists and summaries (docs/design.md §3.4)."""

    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"
    abandoned = "abandoned"


_FAILURE_REASONS = frozenset({TerminalReason.output_limit})
_STATUS_OF_STATE: dict[ProcessState, ProcessStatus] = {
    ProcessState.starting: ProcessStatus.running,
    ProcessState.running: ProcessStatus.running,
    ProcessState.failed: ProcessStatus.failed,
    ProcessState.timed_out: ProcessStatus.failed,
    ProcessState.signaled: ProcessStatus.failed,
    ProcessState.lost_on_restore: ProcessStatus.abandoned,
    ProcessState.abandoned: ProcessStatus.abandoned,
}
"""The states whose coarse status is theirs alone; ``exited`` depends on the exit code, and a
stopped one (interrupted, terminated, killed) on why it was stopped."""


def coarse_status(
    state: ProcessState, reason: TerminalReason | None, exit_code: int | None
) -> ProcessStatus:
    """Fold a precise state into what a person scanning a list cares about."""
    status = _STATUS_OF_STATE.get(state)
    if status is not None:
        return status
    if state is ProcessState.exited:
        return ProcessStatus.completed if exit_code == 0 else ProcessStatus.failed
    return ProcessStatus.failed if reason in _FAILURE_REASONS else ProcessStatus.cancelled
