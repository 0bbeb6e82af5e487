"""How a process ended, as one value: the terminal fields of a completion, carried whole from
the decision that knows them to the ``Completed`` event (docs/design.md §3.2, §6.2, §6.3).

The supervisor decides an ``Outcome`` (``supervisor/decide.py``), saves it in the outbox
(``OutboxEntry.of``/``entry.outcome()``) and writes it (``ProcessRegistry.outcome_write``,
``Process.end``); ``record_completed`` builds one from its keywords. A terminal field is added
here, where it is checked and fingerprinted, and where it is stored (the event, the outbox
entry), instead of in every signature it passes through.

An ``Outcome`` is checked when it is made: a ``completed`` row of the closed lifecycle table
(§2.1) whose fields keep §3.2's rules, so what holds one never checks it again. A stored
``Completed`` is fingerprinted through ``recorded``, which checks nothing: replay never consults
today's table (§2.2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, cast

from procledger.domain.errors import ProcessLifecycleValidationError
from procledger.domain.lifecycle_table import check_row
from procledger.domain.model import canonical_json
from procledger.domain.records import MAX_DIAGNOSTIC_BYTES, OutputSummary
from procledger.domain.vocabulary import LifecycleKind, ProcessState, TerminalReason

__all__ = [
    "MAX_SIGNAL",
    "REASONS",
    "SIGNAL_STATES",
    "STATES",
    "Outcome",
    "as_reason",
    "as_state",
    "check_completion_fields",
    "check_diagnostic",
    "check_signal",
    "checked_survivors",
    "completed_fingerprint",
    "fingerprint",
]

#: Value → member maps: a dict lookup is ~10× cheaper than ``Enum.__call__`` on the hot path.
STATES: Final[dict[str, ProcessState]] = {state.value: state for state in ProcessState}
REASONS: Final[dict[str, TerminalReason]] = {reason.value: reason for reason in TerminalReason}

#: The highest signal number a completion may name (Linux's SIGRTMAX; macOS stops at 31).
MAX_SIGNAL: Final = 64

#: States whose completion may name the signal that ended the child: a requested stop's signal
#: (``interrupted``, ``terminated``, ``killed``), or, for ``signaled``, one nobody asked for.
#: ``exited``, ``failed`` and ``timed_out`` carry none: an exit code, a spawn or consumer
#: failure and a deadline are what ended those, whatever signal the stop then used.
SIGNAL_STATES: Final = frozenset(
    {ProcessState.interrupted, ProcessState.terminated, ProcessState.killed, ProcessState.signaled}
)

#: The fields a ``Completed`` event stores of its outcome, by the same names.
_STORED: Final = ("state", "reason", "exit_code", "diagnostic", "value", "signal", "survivors")


@dataclass(frozen=True, slots=True)
class Outcome:
    """A ``completed`` terminal: its row of the table and the details §3.2 allows on it.

    Strings are accepted for ``state`` and ``reason`` (``Outcome.of`` types that) and kept as
    members; ``survivors`` are kept sorted, each once, so a retry listing them in another
    order is the same write. ``output``/``tails`` are the run's output facts (§14), written
    before the terminal; they are not part of the fingerprint.

    Raises:
        ProcessLifecycleValidationError: not a ``completed`` row, or a field breaks its rule
            (``.field`` names which).
    """

    state: ProcessState
    reason: TerminalReason
    exit_code: int | None = None
    diagnostic: str | None = None
    value: Any = None
    signal: int | None = None
    """The signal that ended the child, whoever sent it (``None``: it exited, or unknown)."""
    survivors: Sequence[int] = ()
    """OS pids of the tree still alive after the final SIGKILL of a stop."""
    output: OutputSummary | None = None
    tails: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        state, reason = as_state(self.state), as_reason(self.reason)
        check_row(LifecycleKind.completed, state, reason)
        check_completion_fields(state, self.exit_code, self.diagnostic, self.value, self.signal)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "survivors", tuple(checked_survivors(self.survivors)))

    @classmethod
    def of(cls, state: ProcessState | str, reason: TerminalReason | str, **details: Any) -> Outcome:
        """From a caller's words (members or their strings): ``__post_init__`` turns them into
        members, or refuses them as the table does."""
        return cls(cast(ProcessState, state), cast(TerminalReason, reason), **details)

    @classmethod
    def recorded(cls, event: Any) -> Outcome:
        """What a stored ``Completed`` event says, unchecked: its fields are what was decided
        then, and replaying never consults today's table (docs/design.md §2.2)."""
        outcome = object.__new__(cls)
        for name in _STORED:
            object.__setattr__(outcome, name, getattr(event, name))
        object.__setattr__(outcome, "output", None)
        object.__setattr__(outcome, "tails", None)
        return outcome

    def with_output(self, output: OutputSummary | None, tails: Mapping[str, str] | None) -> Outcome:
        """This outcome with the run's output facts, known only once its capture closed."""
        return replace(self, output=output, tails=tails)

    @property
    def output_facts(self) -> tuple[OutputSummary, dict[str, str]] | None:
        """The output facts as the aggregate writes them (tails only with a summary)."""
        return None if self.output is None else (self.output, dict(self.tails or {}))

    def fingerprint(self) -> str:
        """What an identical terminal repeat must match (docs/design.md §3.2, §11.4)."""
        return completed_fingerprint(
            str(self.state),
            str(self.reason),
            self.exit_code,
            self.diagnostic,
            self.value,
            signal=self.signal,
            survivors=self.survivors,
        )


def completed_fingerprint(
    state: str,
    reason: str,
    exit_code: int | None,
    diagnostic: str | None,
    value: Any,
    *,
    signal: int | None = None,
    survivors: Sequence[int] = (),
) -> str:
    """What an identical terminal repeat must match. ``signal`` and ``survivors`` join only
    when set, so a v1 event (upcast to ``None`` and ``[]``) keeps the fingerprint 0.1.0 gave
    it and a retry from 0.1.0-era code still matches it (docs/design.md §11.4)."""
    if signal is None and not survivors:
        return fingerprint("completed", state, reason, exit_code, diagnostic, value)
    return fingerprint(
        "completed", state, reason, exit_code, diagnostic, value, signal, list(survivors)
    )


def fingerprint(*parts: Any) -> str:
    """The canonical JSON of a write's content: what a retry with the same event id matches."""
    return canonical_json(list(parts)).decode()


def as_state(value: ProcessState | str) -> ProcessState:
    """The member named ``value``; an unknown word is refused as the table refuses it."""
    try:
        return STATES[value]
    except (KeyError, TypeError):
        raise ProcessLifecycleValidationError("state_reason", f"unknown state {value!r}") from None


def as_reason(value: TerminalReason | str | None) -> TerminalReason | None:
    """The member named ``value`` (``None`` stays ``None``: the table's check refuses it)."""
    if value is None:
        return None
    try:
        return REASONS[value]
    except (KeyError, TypeError):
        raise ProcessLifecycleValidationError("state_reason", f"unknown reason {value!r}") from None


def check_diagnostic(diagnostic: str | None) -> None:
    """A diagnostic fits ``MAX_DIAGNOSTIC_BYTES`` (docs/design.md §3.2)."""
    if diagnostic is not None and len(diagnostic.encode()) > MAX_DIAGNOSTIC_BYTES:
        raise ProcessLifecycleValidationError(
            "diagnostic", f"must be at most {MAX_DIAGNOSTIC_BYTES} UTF-8 bytes"
        )


def check_completion_fields(
    state: ProcessState,
    exit_code: int | None,
    diagnostic: str | None,
    value: Any,
    signal: int | None = None,
) -> None:
    """Field rules of a completion: which state may carry which detail (docs/design.md §3.2)."""
    if (exit_code is None) == (state is ProcessState.exited):
        raise ProcessLifecycleValidationError(
            "exit_code", "is required for 'exited' and only allowed there"
        )
    if diagnostic is not None and state is not ProcessState.failed:
        raise ProcessLifecycleValidationError(
            "diagnostic", "is only allowed on failed completions, lost and abandoned"
        )
    if value is not None and state is not ProcessState.exited:
        raise ProcessLifecycleValidationError("value", "is only allowed for 'exited'")
    check_diagnostic(diagnostic)
    check_signal(state, signal)


def check_signal(state: ProcessState, signal: int | None) -> None:
    """``signaled`` needs the signal's number; a stop's states may carry it; others never."""
    if signal is None:
        if state is ProcessState.signaled:
            raise ProcessLifecycleValidationError("signal", "is required for 'signaled'")
        return
    if state not in SIGNAL_STATES:
        raise ProcessLifecycleValidationError(
            "signal", "is only allowed for signaled, interrupted, terminated and killed"
        )
    if type(signal) is not int or not 1 <= signal <= MAX_SIGNAL:
        raise ProcessLifecycleValidationError(
            "signal", f"must be a signal number from 1 to {MAX_SIGNAL}, not {signal!r}"
        )


def checked_survivors(survivors: Any) -> list[int]:
    """OS pids still alive after a tree stop, as stored: positive ints, sorted, each once (so a
    retry that lists them in another order is the same write)."""
    if isinstance(survivors, str | bytes) or not isinstance(survivors, list | tuple | set):
        raise ProcessLifecycleValidationError(
            "survivors", f"must be a sequence of OS pids, not {type(survivors).__name__}"
        )
    bad = [pid for pid in survivors if type(pid) is not int or pid < 1]
    if bad:
        raise ProcessLifecycleValidationError(
            "survivors", f"must be positive OS pids, not {bad[0]!r}"
        )
    return sorted(set(survivors))
