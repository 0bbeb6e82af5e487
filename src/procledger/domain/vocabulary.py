"""The words of the model. Values are snake_case because they are the JSON form."""

from __future__ import annotations

from enum import StrEnum


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
        return self not in (ProcessState.starting, ProcessState.running)


class TerminalReason(StrEnum):
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


def coarse_status(
    state: ProcessState, reason: TerminalReason | None, exit_code: int | None
) -> ProcessStatus:
    """Fold a precise state into what a person scanning a list cares about."""
    if not state.is_terminal:
        return ProcessStatus.running
    if state is ProcessState.exited:
        return ProcessStatus.completed if exit_code == 0 else ProcessStatus.failed
    if state in (ProcessState.failed, ProcessState.timed_out, ProcessState.signaled):
        return ProcessStatus.failed
    if state in (ProcessState.interrupted, ProcessState.terminated, ProcessState.killed):
        return ProcessStatus.failed if reason in _FAILURE_REASONS else ProcessStatus.cancelled
    return ProcessStatus.abandoned
