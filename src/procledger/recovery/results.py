"""What an attempt and a pass come to: the runner's contract (``Runner``, ``RunResult``,
``RunFailed``), the report of a pass (``SweepReport``) and how a failure is written down
(docs/design.md §3.6, §14).

Kept apart from the worker so that a runner -- the default one or a user's -- depends on these
values only, never on the worker that calls it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import final

from pydantic import Field, JsonValue

from procledger.domain.diagnostics import clip_diagnostic
from procledger.domain.errors import ExecutionError
from procledger.domain.leases import Lease
from procledger.domain.model import Frozen
from procledger.domain.records import OutputSummary, ProcessRecord
from procledger.domain.vocabulary import TerminalReason
from procledger.supervisor.readiness import NotReadyInTime

__all__ = [
    "Engine",
    "RunFailed",
    "RunOutput",
    "RunResult",
    "Runner",
    "SweepReport",
    "Tally",
    "diagnostic_of",
    "failure_output",
    "failure_reason",
]


@final
class RunResult(Frozen):
    """What a runner returns: recorded as ``completed/exited`` with this code and value, and
    (the default runner's commands) the run's captured output facts (docs/design.md §14):
    ``output`` the summary, ``tails`` the base64 last bytes of each stream."""

    exit_code: int = 0
    value: JsonValue = None
    output: OutputSummary | None = None
    tails: dict[str, str] = Field(default_factory=dict)


RunOutput = tuple[OutputSummary | None, dict[str, str]]
"""A run's output summary (None: not captured here) and base64 tails, for its terminal."""


@final
class RunFailed(ExecutionError):
    """A runner's failure that comes with the output its run captured (docs/design.md §14):
    the attempt is recorded as the failure of ``cause`` -- the same diagnostic, the same
    stand-down when the worker stops -- and its terminal carries ``output`` and ``tails``, as a
    run that exited would. The default runner raises it for every failure after the command
    started: a signal death nobody asked for, an interruption, a read failure."""

    def __init__(
        self, cause: Exception, output: OutputSummary | None, tails: dict[str, str]
    ) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.output = output
        self.tails = tails


@final
class SweepReport(Frozen):
    """Process ids by outcome of one pass, each in the order the pass reached it.

    - ``ran``: run to completion and recorded ``completed/exited``;
    - ``abandoned``: recorded ``abandoned`` by this pass;
    - ``skipped``: looked at and left untouched (including those another worker holds);
    - ``failed``: the runner raised, recorded ``completed/failed`` with the error as diagnostic;
    - ``lost``: attempts this worker did not finish: its lease was lost (nothing written; the
      new holder owns the process now), or the worker was stopped mid-run (``stop()``): a
      rerunnable process's lease is released for another worker, an owner_bound one is recorded
      ``completed/terminated/runner_shutdown`` because it may never run again.
    """

    ran: list[str] = Field(default_factory=list)
    abandoned: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)
    lost: list[str] = Field(default_factory=list)


@dataclass
class Tally:
    """A pass's outcomes as it goes: a ``SweepReport`` is frozen, so it is made at the end."""

    ran: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    def report(self) -> SweepReport:
        return SweepReport(
            ran=self.ran,
            abandoned=self.abandoned,
            skipped=self.skipped,
            failed=self.failed,
            lost=self.lost,
        )


Runner = Callable[[ProcessRecord, Lease, threading.Event], RunResult]
"""``runner(record, lease, cancel) -> RunResult``; it should return or raise soon after
``cancel`` is set (the default runner stops the process tree)."""

Engine = Runner
"""Runs ``engine`` inputs of one ``kind``: ``RecoveryWorker(..., engines={"kind": engine})``."""


def failure_reason(error: Exception) -> TerminalReason:
    """``ready_timeout`` for a re-run stopped past its ready timeout, else ``failed``."""
    if isinstance(error, RunFailed):
        error = error.cause
    if isinstance(error, NotReadyInTime):
        return TerminalReason.ready_timeout
    return TerminalReason.failed


def diagnostic_of(error: BaseException) -> str:
    """``"<Type>: <message>"`` as a record can hold it (``clip_diagnostic``); a ``RunFailed``
    is described by its cause."""
    if isinstance(error, RunFailed):
        error = error.cause
    return clip_diagnostic(f"{type(error).__name__}: {error}".rstrip(": "))


def failure_output(error: BaseException | None) -> RunOutput:
    """The output facts a failure carries (none but a ``RunFailed``'s)."""
    if isinstance(error, RunFailed):
        return error.output, error.tails
    return None, {}
