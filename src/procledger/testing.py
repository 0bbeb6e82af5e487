"""Property-test kit: hypothesis strategies and a stateful machine for code that drives processes.

Applications that record process lifecycles through procledger can property-test their own
code with it. Everything here is derived from the live lifecycle table
(``procledger.domain.lifecycle_table``, the plain-data form of the one machine), never copied
from it, so the kit follows the table.

Strategies:

- ``registrations()`` — valid ``ProcessRegistration`` values.
- ``lifecycle_histories()`` — a registration and a valid sequence of lifecycle commands, from
  ``starting`` to an optional terminal; every command in it appends exactly one event.
- ``lifecycle_commands()`` — arbitrary, often invalid, lifecycle command descriptions.
- ``next_commands(model)`` — the valid next commands of one process, given its model.
- ``notifications()`` / ``notification_payloads()`` — valid completion notifications, and
  dicts (often invalid) to feed ``ProcessCompletionNotification.model_validate``;
  ``notification_error_field(payload)`` says which field should be reported first.

The reference model, ``LifecycleModel``, predicts the outcome of each command (``Outcome``:
which error, or whether it appends) and the record that results. ``apply_command`` sends a
command to a ``ProcessRegistry``.

``ProcessMachine`` is a ``hypothesis.stateful.RuleBasedStateMachine``: it opens a registry
(``memory://`` with a ``FakeClock``), registers processes, sends random valid and invalid
commands, and checks after every step that the records agree with the model, that terminal
states absorb and that ``change_seq`` only grows. Subclass it and override ``drive`` (and
``register``, ``open_registry``…) to route the commands through your own code::

    class RunnerMachine(ProcessMachine):
        def drive(self, process_id, command):
            return my_runner.apply(process_id, command)  # returns the ProcessRecord

    TestRunner = RunnerMachine.TestCase

This module needs ``hypothesis`` (the ``dev`` extra) but not pytest.
"""

from __future__ import annotations

import hashlib
import re
import string
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeVar

try:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "procledger.testing needs hypothesis: pip install 'procledger[dev]' (or hypothesis)"
    ) from error

# The kit uses the package's public names, as the applications it serves do; beyond them only
# what a public name does not give: the table's sets and the aggregate (for apply_to_process).
from procledger import (
    MAX_DIAGNOSTIC_BYTES,
    MAX_PROCESS_HANDLE_BYTES,
    Acquired,
    AlreadyTerminal,
    CompletionAuthority,
    EventType,
    HandleDescriptor,
    InvalidTransition,
    Lease,
    LeaseOwner,
    LeaseTimings,
    LifecycleKind,
    LifecycleRow,
    Originator,
    ProcessCompletionNotification,
    ProcessInput,
    ProcessLifecycleValidationError,
    ProcessRecord,
    ProcessRegistration,
    ProcessRegistry,
    ProcessState,
    ProcessStatus,
    ProcledgerError,
    RecoveryDisposition,
    RegistrationConflict,
    ReplayConflict,
    SessionScope,
    TerminalReason,
    lifecycle_table,
    open_registry,
)
from procledger.domain.lifecycle_table import NOTIFICATION_ROWS, TRANSITIONS
from procledger.domain.process import MAX_SIGNAL, SIGNAL_STATES, Process

__all__ = [
    "FakeClock",
    "LifecycleCommand",
    "LifecycleHistory",
    "LifecycleModel",
    "Outcome",
    "ProcessMachine",
    "apply_command",
    "apply_to_process",
    "authority_for",
    "expected_status",
    "lifecycle_commands",
    "lifecycle_histories",
    "next_commands",
    "notification_error_field",
    "notification_payloads",
    "notifications",
    "registrations",
]

_K = LifecycleKind
_S = ProcessState

# -- what the table says, read once ------------------------------------------------------------

_ROWS = tuple(lifecycle_table())
_ROW_SET = frozenset(_ROWS)
_ROWS_OF: dict[LifecycleKind, tuple[LifecycleRow, ...]] = {
    kind: tuple(row for row in _ROWS if row.kind is kind) for kind in LifecycleKind
}
#: Kinds whose table rows all end a process (completed, lost, abandoned).
TERMINAL_KINDS: Final = frozenset(
    kind for kind, rows in _ROWS_OF.items() if all(row.state.is_terminal for row in rows)
)
#: Kinds whose rows share one resulting state (the write names none): all but completed and
#: stop_requested (whose "state" is the current one).
_IMPLIED_STATE: dict[LifecycleKind, ProcessState] = {
    kind: rows[0].state
    for kind, rows in _ROWS_OF.items()
    if len({row.state for row in rows}) == 1 and kind is not _K.stop_requested
}
#: Kinds with a single row: the reason is implied too (started, backgrounded, lost).
_IMPLIED_REASON: dict[LifecycleKind, TerminalReason | None] = {
    kind: rows[0].reason for kind, rows in _ROWS_OF.items() if len(rows) == 1
}
_STOP_REASONS = frozenset(row.reason for row in _ROWS_OF[_K.stop_requested])

#: The arguments each kind's registry write takes (besides the process id and ``event_id``).
_PAYLOAD: Final[Mapping[LifecycleKind, tuple[str, ...]]] = {
    _K.started: ("at_ms",),
    _K.backgrounded: ("at_ms",),
    _K.stop_requested: ("reason",),
    _K.completed: ("state", "reason", "exit_code", "diagnostic", "value", "signal", "survivors"),
    _K.lost: ("diagnostic",),
    _K.abandoned: ("reason", "diagnostic"),
}

# -- commands ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LifecycleCommand:
    """One lifecycle write, described as the arguments of its registry method.

    Only the fields the kind's write takes are meaningful (``state``, ``signal`` and
    ``survivors`` only for ``completed``; ``reason`` for ``stop_requested``, ``completed`` and
    ``abandoned``; ``at_ms`` — the caller's timestamp — for ``started`` and ``backgrounded``);
    generated commands leave the others ``None`` (or empty). Values may be invalid on purpose:
    unknown strings, broken field rules.
    """

    kind: LifecycleKind
    state: ProcessState | str | None = None
    reason: TerminalReason | str | None = None
    exit_code: int | None = None
    diagnostic: str | None = None
    value: Any = None
    event_id: str | None = None
    at_ms: int | None = None
    signal: int | None = None
    survivors: tuple[int, ...] = ()

    @property
    def is_terminal_kind(self) -> bool:
        return self.kind in TERMINAL_KINDS

    def payload(self) -> tuple[Any, ...]:
        """What an idempotent retry must repeat exactly (the event id aside)."""
        values = [getattr(self, name) for name in _PAYLOAD[self.kind]]
        return (self.kind.value, *(_plain(value) for value in values))


def _plain(value: Any) -> Any:
    """A comparable form: enums as their values, JSON containers as canonical text, survivors
    as the sorted set the registry stores."""
    if isinstance(value, ProcessState | TerminalReason):
        return value.value
    if isinstance(value, tuple):
        return tuple(sorted(set(value)))
    if isinstance(value, dict | list):
        return repr(_canonical(value))
    return value


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((str(k), _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    return (type(value).__name__, value)


_Word = TypeVar("_Word", ProcessState, TerminalReason)


def _parse(vocabulary: type[_Word], value: _Word | str | None) -> _Word | None:
    """``value`` as a word of ``vocabulary``; ``None`` for none or an unknown string, which the
    model then predicts is refused."""
    if value is None:
        return None
    try:
        return vocabulary(value)
    except ValueError:
        return None


def _signal_broken(state: ProcessState, signal: int | None) -> bool:
    """docs/design.md §3.2's signal rule, written out independently of the aggregate."""
    if signal is None:
        return state is _S.signaled
    return state not in SIGNAL_STATES or not 1 <= signal <= MAX_SIGNAL


# -- the reference model -----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What the model predicts for one command.

    ``error`` is the class the write must raise (an instance of it, so ``InvalidTransition``
    also admits ``AlreadyTerminal``), or ``None`` when it succeeds; ``fields`` are the
    acceptable ``.field`` values of a ``ProcessLifecycleValidationError``; ``appends`` says
    whether a success appends an event (``False``: an idempotent no-op).
    """

    error: type[ProcledgerError] | None
    appends: bool = False
    fields: frozenset[str] = frozenset()
    from_state: ProcessState = ProcessState.starting
    to_state: ProcessState | None = None

    @property
    def accepted(self) -> bool:
        return self.error is None


def expected_status(
    state: ProcessState, reason: TerminalReason | None, exit_code: int | None
) -> ProcessStatus:
    """docs/design.md §3.4, written out independently of ``procledger.domain.vocabulary``."""
    if state in (_S.starting, _S.running):
        return ProcessStatus.running
    if state is _S.exited:
        return ProcessStatus.completed if exit_code == 0 else ProcessStatus.failed
    if state in (_S.failed, _S.timed_out, _S.signaled):
        return ProcessStatus.failed
    if state in (_S.interrupted, _S.terminated, _S.killed):
        if reason is TerminalReason.output_limit:
            return ProcessStatus.failed
        return ProcessStatus.cancelled
    return ProcessStatus.abandoned


@dataclass
class LifecycleModel:
    """A tiny model of one process: what the registry must answer and record.

    ``step(command)`` predicts the outcome in the contract's error order (validation, identical
    replay, state) and, when the command appends, applies it. ``lifecycle_events`` counts the
    lifecycle events in the process log (registration not included).
    """

    registration: ProcessRegistration
    created_at_ms: int = 0
    state: ProcessState = ProcessState.starting
    reason: TerminalReason | None = None
    exit_code: int | None = None
    diagnostic: str | None = None
    value: Any = None
    signal: int | None = None
    survivors: list[int] = field(default_factory=list)
    stop_requested: list[TerminalReason] = field(default_factory=list)
    backgrounded: bool = False
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    updated_at_ms: int = 0
    lifecycle_events: int = 0
    event_ids: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    terminal: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        self.updated_at_ms = self.created_at_ms

    @property
    def process_id(self) -> str:
        return self.registration.id

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal

    @property
    def status(self) -> ProcessStatus:
        return expected_status(self.state, self.reason, self.exit_code)

    # -- deciding ------------------------------------------------------------------------------

    def target(
        self, command: LifecycleCommand
    ) -> tuple[ProcessState | None, TerminalReason | None]:
        """The (state, reason) row the command asks for; ``None`` state when unparseable."""
        kind = command.kind
        implied = kind in _IMPLIED_REASON
        reason = _IMPLIED_REASON[kind] if implied else _parse(TerminalReason, command.reason)
        if kind is _K.stop_requested:
            return self.state, reason
        return _IMPLIED_STATE.get(kind) or _parse(ProcessState, command.state), reason

    def invalid_fields(self, command: LifecycleCommand) -> frozenset[str]:
        """Every validation rule the command breaks (empty when it is well-formed)."""
        broken: set[str] = set()
        state, reason = self.target(command)
        unknown_reason = command.reason is not None and reason is None
        if command.kind is _K.stop_requested:
            if unknown_reason or reason not in _STOP_REASONS:
                broken.add("state_reason")
        elif state is None or unknown_reason or (command.kind, state, reason) not in _ROW_SET:
            broken.add("state_reason")
        if command.kind is _K.completed and state is not None:
            if (command.exit_code is None) == (state is _S.exited):
                broken.add("exit_code")
            if command.value is not None and state is not _S.exited:
                broken.add("value")
            if command.diagnostic is not None and state is not _S.failed:
                broken.add("diagnostic")
            if _signal_broken(state, command.signal):
                broken.add("signal")
        if command.kind is _K.completed and any(pid < 1 for pid in command.survivors):
            broken.add("survivors")
        if (
            command.diagnostic is not None
            and len(command.diagnostic.encode()) > MAX_DIAGNOSTIC_BYTES
        ):
            broken.add("diagnostic")
        return frozenset(broken)

    def decide(self, command: LifecycleCommand) -> Outcome:
        """The predicted outcome, without changing the model."""
        here = self.state
        broken = self.invalid_fields(command)
        if broken:
            return Outcome(ProcessLifecycleValidationError, fields=broken, from_state=here)
        payload = command.payload()
        if command.event_id is not None and command.event_id in self.event_ids:
            if self.event_ids[command.event_id] == payload:
                return Outcome(None, from_state=here, to_state=here)
            return Outcome(ReplayConflict, from_state=here)
        to_state, reason = self.target(command)
        assert to_state is not None
        if command.is_terminal_kind and here.is_terminal:
            if payload == self.terminal:
                return Outcome(None, from_state=here, to_state=here)
            return Outcome(AlreadyTerminal, from_state=here)
        allowed = (here, command.kind, to_state) in TRANSITIONS
        if not allowed or (command.kind is _K.backgrounded and self.backgrounded):
            return Outcome(InvalidTransition, from_state=here)
        if command.kind is _K.stop_requested and reason in self.stop_requested:
            return Outcome(None, from_state=here, to_state=here)
        return Outcome(None, appends=True, from_state=here, to_state=to_state)

    def step(self, command: LifecycleCommand, *, now_ms: int = 0) -> Outcome:
        """Decide, and apply the command when it appends; ``now_ms`` is the registry's clock."""
        outcome = self.decide(command)
        if outcome.appends:
            self._apply(command, now_ms)
        return outcome

    def _apply(self, command: LifecycleCommand, now_ms: int) -> None:
        state, reason = self.target(command)
        assert state is not None
        kind = command.kind
        if kind is _K.started:
            self.started_at_ms = command.at_ms
        if kind is _K.backgrounded:
            self.backgrounded = True
            if self.started_at_ms is None:
                self.started_at_ms = command.at_ms
        if kind is _K.stop_requested:
            assert reason is not None
            self.stop_requested.append(reason)
        if kind in TERMINAL_KINDS:
            self.reason = reason
            self.exit_code = command.exit_code
            self.diagnostic = command.diagnostic
            self.value = command.value
            self.signal = command.signal
            self.survivors = sorted(set(command.survivors))
            self.finished_at_ms = now_ms
            self.terminal = command.payload()
        self.state = state
        self.updated_at_ms = now_ms
        self.lifecycle_events += 1
        if command.event_id is not None:
            self.event_ids[command.event_id] = command.payload()

    # -- checking ------------------------------------------------------------------------------

    def expected_view(self) -> dict[str, Any]:
        return {
            "id": self.process_id,
            "registration_hash": self.registration.registration_hash(),
            "disposition": self.registration.disposition,
            "state": self.state,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "survivors": self.survivors,
            "diagnostic": self.diagnostic,
            "value": self.value,
            "status": self.status,
            "stop_requested": self.stop_requested,
            "backgrounded": self.backgrounded,
            "started_at_ms": self.started_at_ms,
            "finished_at_ms": self.finished_at_ms,
        }

    def mismatches(self, record: ProcessRecord) -> list[str]:
        """Where ``record`` disagrees with the model (empty when it agrees)."""
        return [
            f"{name}: record has {getattr(record, name)!r}, model expects {expected!r}"
            for name, expected in self.expected_view().items()
            if getattr(record, name) != expected
        ]

    def check(self, record: ProcessRecord) -> None:
        problems = self.mismatches(record)
        if problems:
            raise AssertionError(f"process {self.process_id!r}: " + "; ".join(problems))


# -- strategies --------------------------------------------------------------------------------

_SAFE_TEXT = st.text(
    alphabet=st.characters(exclude_categories=("Cs", "Cc")),
    max_size=12,
)
_WORD = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
_ID_TEXT = st.text(alphabet=string.ascii_letters + string.digits + "-_.:", min_size=1, max_size=32)

_json_scalars = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | _SAFE_TEXT
_JSON: st.SearchStrategy[Any] = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_WORD, inner, max_size=3),
    max_leaves=6,
)


def _env_refs() -> st.SearchStrategy[str]:
    return st.binary(min_size=1, max_size=8).map(
        lambda raw: "process-env:sha256:" + hashlib.sha256(raw).hexdigest()
    )


def _inputs(types: Sequence[str]) -> st.SearchStrategy[ProcessInput]:
    options: dict[str, st.SearchStrategy[ProcessInput]] = {
        "command": st.builds(
            ProcessInput.command,
            argv=st.lists(_WORD, min_size=1, max_size=3).flatmap(
                lambda argv: st.sampled_from(["", "/usr/bin/", "./"]).map(
                    lambda prefix: [prefix + argv[0], *argv[1:]]
                )
            ),
            cwd=st.none() | st.just("/tmp"),
        ),
        "engine": st.builds(ProcessInput.engine, kind=_WORD, payload=_JSON),
        "external": st.builds(
            ProcessInput.external,
            metadata=st.none()
            | st.dictionaries(
                st.sampled_from(["label", "name", "title", "x"]), _SAFE_TEXT, max_size=3
            ),
        ),
    }
    return st.one_of([options[name] for name in types])


_SCOPES = st.builds(SessionScope, session_id=_WORD, agent_frame_id=st.none() | _WORD)
_ORIGINATORS = st.builds(Originator.host, scope=st.none() | _WORD) | st.builds(
    Originator.session, scope=_SCOPES
)


@st.composite
def registrations(
    draw: st.DrawFn,
    *,
    ids: st.SearchStrategy[str] | None = None,
    input_types: Sequence[str] = ("command", "engine", "external"),
    dispositions: Sequence[RecoveryDisposition] = tuple(RecoveryDisposition),
) -> ProcessRegistration:
    """Valid registrations: every input type, originator form and optional part."""
    process_input = draw(_inputs(input_types))
    names = draw(st.lists(_WORD, max_size=3, unique=True))
    return ProcessRegistration(
        id=draw(ids if ids is not None else _ID_TEXT),
        input=process_input,
        disposition=draw(st.sampled_from(list(dispositions))),
        originator=draw(_ORIGINATORS),
        wake_target=draw(st.none() | _SCOPES),
        env_ref=None if process_input.type == "external" else draw(_env_refs()),
        event_types=[EventType(name=f"signal.{name}") for name in names],
        descriptor=draw(
            st.none() | st.builds(HandleDescriptor, kind=_WORD, label=st.none() | _WORD)
        ),
        definition=draw(st.none() | _JSON),
    )


#: A few fixed event ids, so arbitrary commands reuse them: replays and conflicts happen.
EVENT_ID_POOL: Final = tuple(str(uuid.UUID(int=n, version=4)) for n in range(1, 4))

_AT_MS = st.sampled_from([0, 1_000, 2_500])
_DIAGNOSTICS = st.one_of(
    st.none(),
    st.sampled_from(["boom", "x" * MAX_DIAGNOSTIC_BYTES, "é" * (MAX_DIAGNOSTIC_BYTES // 2 + 1)]),
    _SAFE_TEXT,
)
_EXIT_CODES = st.none() | st.sampled_from([0, 1, 2, 127, 255, -9])
_VALUES = st.none() | _JSON
_SIGNALS = st.none() | st.sampled_from([-1, 0, 1, 2, 9, 11, 13, 15, MAX_SIGNAL, MAX_SIGNAL + 1])
_SURVIVORS = st.lists(st.sampled_from([-3, 0, 1, 4242, 4_194_304]), max_size=3).map(tuple)
_GOOD_SURVIVORS = st.lists(st.integers(1, 4_194_304), max_size=3).map(tuple)


@st.composite
def lifecycle_commands(
    draw: st.DrawFn,
    *,
    kinds: Sequence[LifecycleKind] = tuple(LifecycleKind),
    event_ids: st.SearchStrategy[str | None] | None = None,
) -> LifecycleCommand:
    """Arbitrary lifecycle commands, often invalid: any state/reason pair (and unknown
    strings), field rules kept or broken, event ids from a small pool so retries and conflicts
    happen. About half the completions pick a real row of the table."""
    kind = draw(st.sampled_from(list(kinds)))
    ids = event_ids if event_ids is not None else st.none() | st.sampled_from(EVENT_ID_POOL)
    fields: dict[str, Any] = {"event_id": draw(ids)}
    if "at_ms" in _PAYLOAD[kind]:
        fields["at_ms"] = draw(_AT_MS)
    if "reason" in _PAYLOAD[kind]:
        fields["reason"] = draw(
            st.none() | st.sampled_from(list(TerminalReason)) | st.just("no_such_reason")
        )
    if "state" in _PAYLOAD[kind]:
        if draw(st.booleans()):
            row = draw(st.sampled_from(_ROWS_OF[kind]))
            fields["state"], fields["reason"] = row.state, row.reason
        else:
            fields["state"] = draw(
                st.none() | st.sampled_from(list(ProcessState)) | st.just("no_such_state")
            )
        fields["exit_code"] = draw(_EXIT_CODES)
        fields["value"] = draw(_VALUES)
        fields["signal"] = draw(_SIGNALS)
        fields["survivors"] = draw(_SURVIVORS)
    if "diagnostic" in _PAYLOAD[kind]:
        fields["diagnostic"] = draw(_DIAGNOSTICS)
    return LifecycleCommand(kind=kind, **fields)


def _valid_rows(model: LifecycleModel) -> list[LifecycleRow]:
    """Rows the table allows from the model's state that would append an event."""
    return [
        row
        for row in _ROWS
        if (model.state, row.kind, row.state) in TRANSITIONS
        and not (row.kind is _K.backgrounded and model.backgrounded)
        and not (row.kind is _K.stop_requested and row.reason in model.stop_requested)
    ]


@st.composite
def _command_for_row(
    draw: st.DrawFn, row: LifecycleRow, event_id: st.SearchStrategy[str | None]
) -> LifecycleCommand:
    kind = row.kind
    fields: dict[str, Any] = {"event_id": draw(event_id)}
    if "at_ms" in _PAYLOAD[kind]:
        fields["at_ms"] = draw(st.integers(0, 10**12))
    if "reason" in _PAYLOAD[kind]:
        fields["reason"] = row.reason
    if "state" in _PAYLOAD[kind]:
        fields["state"] = row.state
        if row.state is _S.exited:
            fields["exit_code"] = draw(st.integers(-255, 255))
            fields["value"] = draw(_VALUES)
        if row.state is _S.signaled:
            fields["signal"] = draw(st.integers(1, MAX_SIGNAL))
        elif row.state in SIGNAL_STATES:
            fields["signal"] = draw(st.none() | st.integers(1, MAX_SIGNAL))
        fields["survivors"] = draw(_GOOD_SURVIVORS)
    if "diagnostic" in _PAYLOAD[kind] and (kind is not _K.completed or row.state is _S.failed):
        fields["diagnostic"] = draw(st.none() | _SAFE_TEXT)
    return LifecycleCommand(kind=kind, **fields)


def next_commands(
    model: LifecycleModel,
    *,
    terminal: bool | None = None,
    event_ids: st.SearchStrategy[str | None] | None = None,
) -> st.SearchStrategy[LifecycleCommand]:
    """Valid commands that append an event from the model's current state (``nothing()`` when
    there are none). ``terminal``: only terminal kinds (True), none (False), or either."""
    rows = [
        row
        for row in _valid_rows(model)
        if terminal is None or (row.kind in TERMINAL_KINDS) is terminal
    ]
    if not rows:
        return st.nothing()
    ids = event_ids if event_ids is not None else st.none() | st.uuids().map(str)
    return st.sampled_from(rows).flatmap(lambda row: _command_for_row(row, ids))


@dataclass(frozen=True)
class LifecycleHistory:
    """A registration and a valid command sequence; each command appends one event."""

    registration: ProcessRegistration
    commands: tuple[LifecycleCommand, ...]

    def model(self) -> LifecycleModel:
        """The model after every command (timestamps from a clock stuck at 0)."""
        model = LifecycleModel(self.registration)
        for command in self.commands:
            model.step(command)
        return model

    @property
    def states(self) -> list[ProcessState]:
        """The state after registration and after each command."""
        model = LifecycleModel(self.registration)
        states = [model.state]
        for command in self.commands:
            model.step(command)
            states.append(model.state)
        return states

    @property
    def final_state(self) -> ProcessState:
        return self.states[-1]

    @property
    def final_status(self) -> ProcessStatus:
        return self.model().status


_MAX_LEAD_IN = 4  # non-terminal commands before a forced terminal (terminal=True)


@st.composite
def lifecycle_histories(
    draw: st.DrawFn,
    *,
    registration: st.SearchStrategy[ProcessRegistration] | None = None,
    terminal: bool | None = None,
) -> LifecycleHistory:
    """Valid histories, walked through the table from ``starting``.

    ``terminal=True`` always ends in a terminal, ``False`` never does, ``None`` either. Event
    ids, when present, are unique within the history (derived from the process id).
    """
    chosen = draw(registration if registration is not None else registrations())
    model = LifecycleModel(chosen)
    commands: list[LifecycleCommand] = []
    while not model.is_terminal:
        rows = _valid_rows(model)
        if terminal is False:
            rows = [row for row in rows if row.kind not in TERMINAL_KINDS]
        if terminal is True and len(commands) >= _MAX_LEAD_IN:
            rows = [row for row in rows if row.kind in TERMINAL_KINDS]
        if not rows or (terminal is not True and not draw(st.booleans())):
            break
        row = draw(st.sampled_from(rows))
        event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{chosen.id}#{len(commands)}"))
        ids: st.SearchStrategy[str | None] = st.none() | st.just(event_id)
        command = draw(_command_for_row(row, ids))
        model.step(command)
        commands.append(command)
    return LifecycleHistory(chosen, tuple(commands))


# -- notifications -----------------------------------------------------------------------------

_NOTIFICATION_FIELDS = ("command_id", "session_id", "loop_id", "process_handle", "state", "reason")
_UUIDS = st.uuids().filter(lambda value: value.int != 0)
_HANDLE_ALPHABET = string.ascii_letters + string.digits + "_-"
_HANDLES = st.text(alphabet=_HANDLE_ALPHABET, min_size=1, max_size=MAX_PROCESS_HANDLE_BYTES)
_HANDLE = re.compile(r"[A-Za-z0-9_-]+")


def notifications() -> st.SearchStrategy[ProcessCompletionNotification]:
    """Valid completion notifications: non-zero ids, a good handle, a completed or lost row."""
    return st.builds(
        lambda command_id, session_id, loop_id, handle, row: ProcessCompletionNotification(
            command_id=command_id,
            session_id=session_id,
            loop_id=loop_id,
            process_handle=handle,
            state=row[0],
            reason=row[1],
        ),
        _UUIDS,
        _UUIDS,
        _UUIDS,
        _HANDLES,
        st.sampled_from(sorted(NOTIFICATION_ROWS)),
    )


_BAD_UUIDS = st.sampled_from(
    [None, 42, "", "not-a-uuid", str(uuid.UUID(int=0)), "00000000000000000000000000000000"]
)
_BAD_HANDLES = st.sampled_from(
    [None, 7, "", "a" * (MAX_PROCESS_HANDLE_BYTES + 1), "has space", "dot.ted", "é", "abc\n"]
)
_BAD_ROWS = st.sampled_from(
    [
        ("running", None),
        ("starting", "exited"),
        ("exited", "killed"),
        ("abandoned", "owner_dead"),
        ("killed", "interrupted"),
        ("no_such_state", "exited"),
        ("exited", "no_such_reason"),
        (None, None),
    ]
)
_EXTRA_KEYS = st.sampled_from(["pid", "argv", "stdout", "env", "cwd", "stdin", "command"])


@st.composite
def notification_payloads(draw: st.DrawFn) -> dict[str, Any]:
    """JSON-shaped dicts for ``ProcessCompletionNotification.model_validate``, often invalid:
    fields dropped or corrupted, unknown keys added; sometimes untouched (valid)."""
    payload: dict[str, Any] = draw(notifications()).model_dump(mode="json")
    corruptions = draw(
        st.lists(st.sampled_from(["drop", "extra", "uuid", "handle", "row"]), max_size=3)
    )
    for corruption in corruptions:
        if corruption == "drop":
            payload.pop(draw(st.sampled_from(_NOTIFICATION_FIELDS)), None)
        elif corruption == "extra":
            payload[draw(_EXTRA_KEYS)] = draw(_json_scalars)
        elif corruption == "uuid":
            name = draw(st.sampled_from(_NOTIFICATION_FIELDS[:3]))
            payload[name] = draw(_BAD_UUIDS)
        elif corruption == "handle":
            payload["process_handle"] = draw(_BAD_HANDLES)
        else:
            payload["state"], payload["reason"] = draw(_BAD_ROWS)
    return payload


def _is_live_uuid(value: Any) -> bool:
    if isinstance(value, uuid.UUID):
        return value.int != 0
    if not isinstance(value, str):
        return False
    try:
        return uuid.UUID(value).int != 0
    except ValueError:
        return False


def _is_handle(value: Any) -> bool:
    return (
        isinstance(value, str)
        and 1 <= len(value.encode()) <= MAX_PROCESS_HANDLE_BYTES
        and _HANDLE.fullmatch(value) is not None
    )


def notification_error_field(payload: Mapping[str, Any]) -> str | None:
    """The ``.field`` docs/design.md §4 says validation reports first, or ``None`` when valid."""
    for key in payload:
        if key not in _NOTIFICATION_FIELDS:
            return str(key)
    for name in _NOTIFICATION_FIELDS[:3]:
        if not _is_live_uuid(payload.get(name)):
            return name
    if not _is_handle(payload.get("process_handle")):
        return "process_handle"
    state, reason = payload.get("state"), payload.get("reason")
    rows = {(s.value, r.value) for s, r in NOTIFICATION_ROWS}
    if not (isinstance(state, str) and isinstance(reason, str) and (state, reason) in rows):
        return "state_reason"
    return None


# -- driving a registry ------------------------------------------------------------------------


def authority_for(disposition: RecoveryDisposition) -> CompletionAuthority:
    """An authority the contract grants for any terminal of a process with ``disposition``."""
    if disposition is RecoveryDisposition.externally_owned:
        return CompletionAuthority.external_owner("procledger.testing")
    return CompletionAuthority.workflow_key("procledger.testing")


#: The write a command of each kind goes through: on a ``ProcessRegistry``, on a ``Process``.
_WRITES: Final[Mapping[LifecycleKind, tuple[str, str]]] = {
    _K.started: ("record_started", "record_started"),
    _K.backgrounded: ("record_backgrounded", "record_backgrounded"),
    _K.stop_requested: ("request_stop", "request_stop"),
    _K.completed: ("record_completed", "complete"),
    _K.lost: ("record_lost", "lose"),
    _K.abandoned: ("record_abandoned", "abandon"),
}
#: The ``_PAYLOAD`` fields the writes take by position (in ``_PAYLOAD``'s order); the others
#: are keywords.
_POSITIONAL: Final = frozenset({"at_ms", "state", "reason"})


def apply_command(
    registry: ProcessRegistry,
    process_id: str,
    command: LifecycleCommand,
    *,
    lease: Lease | None = None,
    authority: CompletionAuthority | None = None,
) -> ProcessRecord:
    """Send ``command`` through the registry's write for its kind; return the new record.

    A terminal write without ``lease`` or ``authority`` uses ``authority_for`` the process's
    disposition (read from the registry).
    """
    positional, keywords = _write_arguments(command)
    if command.is_terminal_kind:
        if lease is None and authority is None:
            authority = authority_for(registry.get(process_id).disposition)
        keywords.update(lease=lease, authority=authority)
    write: Callable[..., ProcessRecord] = getattr(registry, _WRITES[command.kind][0])
    return write(process_id, *positional, **keywords)


def apply_to_process(
    process: Process,
    command: LifecycleCommand,
    *,
    at_ms: int,
    authority: CompletionAuthority | None = None,
) -> bool:
    """Send ``command`` to a ``Process`` aggregate directly (no store); True when it decided to
    append an event. Terminal commands carry ``authority`` (default: ``authority_for`` the
    process's disposition); ``at_ms`` is the time the aggregate records."""
    positional, keywords = _write_arguments(command)
    if command.is_terminal_kind:
        granted = authority if authority is not None else authority_for(process.disposition)
        keywords["authority"] = granted
    if command.kind is _K.abandoned:
        keywords.update(owner=None, evidence_at_ms=None)  # no evidence: the registry's default
    write: Callable[..., bool] = getattr(process, _WRITES[command.kind][1])
    return write(*positional, at_ms=at_ms, **keywords)


def _write_arguments(command: LifecycleCommand) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of the command's write, by position and by keyword, as ``_PAYLOAD`` names
    them: the registry's and the aggregate's writes take the same ones, and add their own (the
    process id and lease; the time, an abandon's owner), so both are driven from here."""
    names = _PAYLOAD[command.kind]
    values = {name: _unchecked(getattr(command, name)) for name in names}
    if "at_ms" in values:
        values["at_ms"] = _at(command)
    positional = [values.pop(name) for name in names if name in _POSITIONAL]
    return positional, {"event_id": command.event_id, **values}


def _at(command: LifecycleCommand) -> int:
    return 0 if command.at_ms is None else command.at_ms


def _unchecked(value: Any) -> Any:
    """Invalid values (``None``, unknown strings) go through as they are: the registry under
    test must refuse them itself."""
    return value


# -- the stateful machine ----------------------------------------------------------------------


class FakeClock:
    """A controllable clock in epoch milliseconds; pass it as ``open_registry(clock=...)``."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError("a clock never goes back")
        self.now_ms += ms
        return self.now_ms


class ProcessMachine(RuleBasedStateMachine):
    """Drives processes through a registry with random commands and checks them against
    ``LifecycleModel`` after every step.

    Hooks to override: ``open_registry`` / ``close_registry``, ``registration_strategy``,
    ``register``, ``drive`` (route a command through your code; return the ``ProcessRecord``
    or raise the registry's error), ``credentials`` (lease or authority for terminal writes;
    ``use_leases = True`` claims a lease for ``owner``) and ``read``. Set
    ``only_lifecycle_writes = False`` when ``drive`` also writes other facts (first-started,
    waits…): no-ops are then allowed to move ``change_seq``.
    """

    store_url: ClassVar[str] = "memory://"
    start_ms: ClassVar[int] = 1_700_000_000_000
    process_ids: ClassVar[tuple[str, ...]] = ("proc-a", "proc-b", "proc-c")
    only_lifecycle_writes: ClassVar[bool] = True
    use_leases: ClassVar[bool] = False
    owner: ClassVar[LeaseOwner] = LeaseOwner(owner_id="procledger.testing", incarnation_id="1")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(self.start_ms)
        self.registry = self.open_registry()
        self.models: dict[str, LifecycleModel] = {}
        self.records: dict[str, ProcessRecord] = {}
        self.terminal_records: dict[str, ProcessRecord] = {}
        self.sent: list[tuple[str, LifecycleCommand]] = []
        self.high_water = 0

    # -- hooks -----------------------------------------------------------------------------------

    def open_registry(self) -> ProcessRegistry:
        return open_registry(self.store_url, clock=self.clock)

    def close_registry(self) -> None:
        self.registry.close()

    def registration_strategy(self) -> st.SearchStrategy[ProcessRegistration]:
        return registrations(ids=st.sampled_from(self.process_ids))

    def register(self, registration: ProcessRegistration) -> ProcessRecord:
        return self.registry.register(registration)

    def credentials(self, process_id: str, command: LifecycleCommand) -> dict[str, Any]:
        """Keyword arguments (``lease=`` or ``authority=``) for a terminal write: a fresh lease
        claimed for ``owner`` when ``use_leases``, else ``authority_for`` the disposition.

        An ended process grants no lease (``AlreadyTerminal``): the write then goes without
        one, which is what a retry after the end does — an identical terminal succeeds without
        credentials, anything else is refused before they would be checked."""
        if self.use_leases:
            try:
                claim = self.registry.claim_lease(process_id, self.owner, LeaseTimings().ttl_ms)
            except AlreadyTerminal:
                return {}
            if not isinstance(claim, Acquired):
                raise AssertionError(f"process {process_id!r}: lease busy: {claim}")
            return {"lease": claim.lease}
        return {"authority": authority_for(self.models[process_id].registration.disposition)}

    def drive(self, process_id: str, command: LifecycleCommand) -> ProcessRecord:
        extra = self.credentials(process_id, command) if command.is_terminal_kind else {}
        return apply_command(self.registry, process_id, command, **extra)

    def read(self, process_id: str) -> ProcessRecord:
        return self.registry.get(process_id)

    def lifecycle_event_count(self, process_id: str) -> int:
        kinds = {kind.value for kind in LifecycleKind}
        return sum(event.kind in kinds for event in self.registry.events(process_id))

    # -- rules -----------------------------------------------------------------------------------

    @rule(data=st.data())
    def register_process(self, data: st.DataObject) -> None:
        registration = data.draw(self.registration_strategy(), label="registration")
        model = self.models.get(registration.id)
        if model is None:
            self._register_new(registration)
        elif model.registration.registration_hash() == registration.registration_hash():
            record = self.register(registration)
            _expect(record == self.records[registration.id], "re-registering changed the record")
        else:
            self._register_conflicting(registration, model)

    def _register_new(self, registration: ProcessRegistration) -> None:
        record = self.register(registration)
        model = LifecycleModel(registration, created_at_ms=self.clock.now_ms)
        model.check(record)
        _expect(record.created_at_ms == self.clock.now_ms, "created_at_ms is not the clock's")
        _expect(record.change_seq > self.high_water, "registration did not advance change_seq")
        self.high_water = record.change_seq
        self.models[registration.id] = model
        self.records[registration.id] = record

    def _register_conflicting(
        self, registration: ProcessRegistration, model: LifecycleModel
    ) -> None:
        try:
            self.register(registration)
        except RegistrationConflict as error:
            _expect(
                error.existing_hash == model.registration.registration_hash()
                and error.new_hash == registration.registration_hash(),
                f"RegistrationConflict names the wrong hashes: {error}",
            )
        else:
            raise AssertionError(f"registering {registration.id!r} differently was accepted")

    @precondition(lambda self: any(not m.is_terminal for m in self.models.values()))
    @rule(data=st.data())
    def send_valid_command(self, data: st.DataObject) -> None:
        live = sorted(pid for pid, model in self.models.items() if not model.is_terminal)
        process_id = data.draw(st.sampled_from(live), label="process_id")
        command = data.draw(next_commands(self.models[process_id]), label="command")
        self.send(process_id, command)

    @precondition(lambda self: bool(self.models))
    @rule(data=st.data())
    def send_arbitrary_command(self, data: st.DataObject) -> None:
        process_id = data.draw(st.sampled_from(sorted(self.models)), label="process_id")
        self.send(process_id, data.draw(lifecycle_commands(), label="command"))

    @precondition(lambda self: bool(self.sent))
    @rule(data=st.data())
    def resend_command(self, data: st.DataObject) -> None:
        process_id, command = data.draw(st.sampled_from(self.sent), label="resent")
        self.send(process_id, command)

    @rule(ms=st.integers(min_value=0, max_value=120_000))
    def advance_clock(self, ms: int) -> None:
        self.clock.advance(ms)

    def send(self, process_id: str, command: LifecycleCommand) -> Outcome:
        """Drive one command and check the answer against the model."""
        model = self.models[process_id]
        before = self.records[process_id]
        outcome = model.step(command, now_ms=self.clock.now_ms)
        try:
            record = self.drive(process_id, command)
        except ProcledgerError as error:
            _check_rejection(outcome, command, error)
            record = self.read(process_id)
            self._check_unchanged(before, record, f"a refused {command}")
        else:
            _expect(outcome.accepted, f"{command} was accepted; expected {outcome.error}")
            self.sent.append((process_id, command))
            if outcome.appends:
                self._check_appended(record, command)
            else:
                self._check_unchanged(before, record, f"the no-op {command}")
        model.check(record)
        self.records[process_id] = record
        if model.is_terminal and process_id not in self.terminal_records:
            self.terminal_records[process_id] = record
        return outcome

    def _check_appended(self, record: ProcessRecord, command: LifecycleCommand) -> None:
        _expect(
            record.change_seq > self.high_water,
            f"{command} appended but change_seq {record.change_seq} <= {self.high_water}",
        )
        _expect(record.updated_at_ms == self.clock.now_ms, "updated_at_ms is not the clock's")
        self.high_water = record.change_seq

    def _check_unchanged(self, before: ProcessRecord, record: ProcessRecord, what: str) -> None:
        if self.only_lifecycle_writes:
            _expect(record == before, f"{what} changed the record")
        else:
            _expect(record.change_seq >= before.change_seq, f"{what}: change_seq went back")

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def records_agree_with_the_model(self) -> None:
        for process_id, model in self.models.items():
            record = self.read(process_id)
            model.check(record)
            count = self.lifecycle_event_count(process_id)
            _expect(
                count == model.lifecycle_events,
                f"process {process_id!r}: {count} lifecycle events, model has "
                f"{model.lifecycle_events}",
            )

    @invariant()
    def terminal_states_absorb(self) -> None:
        for process_id, first in self.terminal_records.items():
            record = self.read(process_id)
            _expect(record.state == first.state, f"process {process_id!r} left its terminal")
            if self.only_lifecycle_writes:
                _expect(record == first, f"process {process_id!r} changed after its terminal")

    @invariant()
    def change_seq_is_monotonic(self) -> None:
        for process_id, last in self.records.items():
            record = self.read(process_id)
            _expect(
                record.change_seq >= last.change_seq,
                f"process {process_id!r}: change_seq went back to {record.change_seq}",
            )
            if self.only_lifecycle_writes:
                _expect(
                    record.change_seq <= self.high_water,
                    f"process {process_id!r}: change_seq {record.change_seq} moved unseen",
                )

    def teardown(self) -> None:
        self.close_registry()


def _check_rejection(outcome: Outcome, command: LifecycleCommand, error: ProcledgerError) -> None:
    if outcome.error is None:
        raise AssertionError(f"{command} was refused with {error!r}; the model accepts it")
    if not isinstance(error, outcome.error):
        raise AssertionError(f"{command} raised {error!r}; expected {outcome.error.__name__}")
    if isinstance(error, ProcessLifecycleValidationError) and error.field not in outcome.fields:
        raise AssertionError(
            f"{command} was refused for {error.field!r}; expected one of {sorted(outcome.fields)}"
        )


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
