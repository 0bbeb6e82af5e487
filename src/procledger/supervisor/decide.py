"""The Supervisor's decisions, as pure functions: no I/O, no clock, no threads.

- ``event_ids``: the stable id of every lifecycle write and of the completion command, derived
  from the process id and its registration hash, so every retry (a re-sent write, a restarted
  ``start``, a ``restore``) reuses them.
- ``outcome``: which terminal a finished child gets, from how it ended and what was asked of it:
  an ``Outcome`` (``domain/outcome.py``), the one value that carries it to the event
  (docs/design.md §6.2).
- ``start_refusal``: whether a registration may be started at all.
- ``mode_policy`` / ``request_policy``: which signals carry out a stop.
"""

from __future__ import annotations

import functools
import signal
import uuid
from typing import Final

from procledger.domain.diagnostics import clip_diagnostic
from procledger.domain.errors import AlreadyTerminal, InvalidTransition
from procledger.domain.outcome import Outcome
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import ProcessState, TerminalReason
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.modes import StopMode

__all__ = [
    "ID_NAMESPACE",
    "STOP_REASONS",
    "EventIds",
    "Outcome",
    "event_ids",
    "mode_policy",
    "outcome",
    "request_policy",
    "spawn_failure",
    "start_refusal",
]

ID_NAMESPACE: Final = uuid.UUID("6b0f8e46-3f2c-4f69-9a0e-5d1c2b7a9e41")
"""The uuid5 namespace of the ids the Supervisor derives (never change it: stored ids use it)."""

STOP_REASONS: Final = (
    TerminalReason.interrupted,
    TerminalReason.terminated,
    TerminalReason.killed,
)
"""The reasons a stop may be requested with, weakest first."""


class EventIds:
    """The ids one process's writes use; the same for every attempt at the same registration.

    Each is derived when first asked for (a uuid5 costs ~5 µs, and a run that is not stopped
    needs three of the nine): ``started``, ``backgrounded``, ``stop`` (by reason),
    ``completed``, ``lost``, ``command_id`` (the completion notification's command id) and
    ``run_marker`` (what the child's environment names its run with, ``os_seam.RUN_MARKER``,
    so a stop -- this supervisor's or, after it died, ``restore``'s -- finds descendants that
    escaped). Equal when derived from the same process id and registration hash."""

    def __init__(self, process_id: str, registration_hash: str) -> None:
        self._base = f"{process_id}\x00{registration_hash}\x00"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EventIds) and other._base == self._base

    def __hash__(self) -> int:
        return hash(self._base)

    def _derive(self, kind: str) -> uuid.UUID:
        return uuid.uuid5(ID_NAMESPACE, self._base + kind)

    @functools.cached_property
    def started(self) -> str:
        return str(self._derive("started"))

    @functools.cached_property
    def backgrounded(self) -> str:
        return str(self._derive("backgrounded"))

    @functools.cached_property
    def stop(self) -> dict[TerminalReason, str]:
        return {r: str(self._derive(f"stop_requested:{r.value}")) for r in STOP_REASONS}

    @functools.cached_property
    def completed(self) -> str:
        return str(self._derive("completed"))

    @functools.cached_property
    def lost(self) -> str:
        return str(self._derive("lost"))

    @functools.cached_property
    def command_id(self) -> uuid.UUID:
        return self._derive("completion-command")

    @functools.cached_property
    def run_marker(self) -> str:
        return str(self._derive("run-marker"))


def event_ids(process_id: str, registration_hash: str) -> EventIds:
    """The ids of one registration's writes: uuid5 of the process id, its registration hash
    and the write's kind, so a retried or restored write reuses the id of the first try."""
    return EventIds(process_id, registration_hash)


_SIGNAL_STATES: Final[dict[int, ProcessState]] = {
    signal.SIGINT: ProcessState.interrupted,
    signal.SIGKILL: ProcessState.killed,
}


def outcome(
    returncode: int,
    *,
    requested: tuple[TerminalReason, ...] = (),
    shutdown: bool = False,
    failure: str | None = None,
    ready_timeout: str | None = None,
) -> Outcome:
    """The terminal of a child that ended with ``returncode`` (negative: killed by a signal).

    - ``failure`` (the output consumer or a read failed, and the tree was stopped for it) →
      ``failed`` with that diagnostic.
    - ``ready_timeout`` (the readiness probes did not all hold in time, and the tree was
      stopped for it), unless a stop was requested or a shutdown runs → ``failed`` with reason
      ``ready_timeout`` and that diagnostic, however the child then ended (docs/design.md §15).
    - Exit code 0, or any exit code nobody asked to stop → ``exited`` with the code.
    - A signal nobody here sent (no stop requested, no shutdown: a crash, an OOM kill, a
      SIGPIPE) → ``signaled`` with reason ``signaled`` and the signal number.
    - During a shutdown, a signal or a non-zero exit is ``terminated``/``killed`` with reason
      ``runner_shutdown``.
    - After a requested stop, a non-zero exit code is the program's way of saying it was
      stopped (a shell trapping INT, a runtime turning SIGTERM into exit 143): the strongest
      requested stop is the terminal, so the coarse status is ``cancelled`` unless it exited 0.
    - After a requested stop, a signal → ``interrupted`` (SIGINT), ``killed`` (SIGKILL),
      ``terminated`` (any other), carrying the signal number.
    """
    if failure is not None:
        return Outcome(
            ProcessState.failed, TerminalReason.failed, diagnostic=clip_diagnostic(failure)
        )
    if ready_timeout is not None and not requested and not shutdown:
        return Outcome(
            ProcessState.failed,
            TerminalReason.ready_timeout,
            diagnostic=clip_diagnostic(ready_timeout),
        )
    if returncode == 0 or (returncode > 0 and not requested and not shutdown):
        return Outcome(ProcessState.exited, TerminalReason.exited, exit_code=returncode)
    number = -returncode if returncode < 0 else None
    if shutdown:
        killed = returncode == -signal.SIGKILL
        state = ProcessState.killed if killed else ProcessState.terminated
        return Outcome(state, TerminalReason.runner_shutdown, signal=number)
    if returncode > 0:
        strongest = max(requested, key=STOP_REASONS.index)
        return Outcome(ProcessState(strongest.value), strongest)
    if not requested:
        return Outcome(ProcessState.signaled, TerminalReason.signaled, signal=number)
    state = _SIGNAL_STATES.get(-returncode, ProcessState.terminated)
    return Outcome(state, TerminalReason(state.value), signal=number)


def start_refusal(record: ProcessRecord) -> InvalidTransition | None:
    """Why the registered ``record`` must not be started, or ``None`` if it may be.

    Only a process still ``starting`` may be: any other state means a start already ran (a
    retried ``start`` with the same process id), and a process is never run twice.
    """
    if record.state is ProcessState.starting:
        return None
    error = AlreadyTerminal if record.state.is_terminal else InvalidTransition
    return error(record.state.value, "started", ProcessState.running.value, process_id=record.id)


def spawn_failure(message: str) -> Outcome:
    """The terminal of a process whose program could not be started: ``failed``, saying why."""
    return Outcome(ProcessState.failed, TerminalReason.failed, diagnostic=clip_diagnostic(message))


def mode_policy(mode: StopMode, grace_s: float) -> tuple[StopPolicy, bool]:
    """``Supervisor.stop``'s exact semantics: (policy, escalate to SIGKILL afterwards)."""
    if mode is StopMode.interrupt:
        return StopPolicy((signal.SIGINT,), grace_s), False
    if mode is StopMode.terminate:
        return StopPolicy((signal.SIGTERM,), grace_s), True
    return StopPolicy((signal.SIGKILL,), 0.0), True


def request_policy(reason: TerminalReason, policy: StopPolicy) -> StopPolicy:
    """How a supervisor carries out a stop requested with ``reason`` using its own ``policy``
    (always escalating to SIGKILL after the last signal's grace).

    - ``killed``: SIGKILL now.
    - ``interrupted``: SIGINT first, then the policy's other signals.
    - ``terminated``: the policy's signals without SIGINT (SIGTERM if none remain).
    """
    if reason is TerminalReason.killed:
        return StopPolicy((signal.SIGKILL,), 0.0)
    others = tuple(s for s in policy.signals if s != signal.SIGINT)
    if reason is TerminalReason.interrupted:
        return StopPolicy((signal.SIGINT, *others), policy.grace_s)
    return StopPolicy(others or (signal.SIGTERM,), policy.grace_s)
