"""The Process aggregate under random command sequences, checked against a tiny model.

Built on ``procledger.testing``: its strategies make the commands (valid ones walked through
the lifecycle table, and arbitrary, often invalid ones) and its ``LifecycleModel`` predicts
each outcome. On top of the model's verdict this machine checks, at the aggregate level:

- every accepted transition is a row of the table, and every rejected one is not;
- terminal states absorb: nothing changes the aggregate after its terminal;
- replaying the stored events (orjson encode → decode → mutate) gives the same state and
  version;
- idempotent retries append nothing.

The kit's own ``ProcessMachine`` then runs against a registry on ``memory://``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from procledger.adapters.codec import OrjsonMapper
from procledger.domain.errors import (
    AlreadyTerminal,
    InvalidTransition,
    ProcessLifecycleValidationError,
    ProcledgerError,
)
from procledger.domain.lifecycle_table import TRANSITIONS, lifecycle_table
from procledger.domain.notification import ProcessCompletionNotification
from procledger.domain.process import Process
from procledger.domain.records import ProcessRecord
from procledger.domain.registration import ProcessRegistration
from procledger.domain.rendering import render_record
from procledger.domain.vocabulary import LifecycleKind, ProcessState
from procledger.testing import (
    LifecycleCommand,
    LifecycleHistory,
    LifecycleModel,
    Outcome,
    ProcessMachine,
    apply_to_process,
    lifecycle_commands,
    lifecycle_histories,
    next_commands,
    notification_error_field,
    notification_payloads,
    notifications,
    registrations,
)

ROWS = frozenset(lifecycle_table())
STOP = LifecycleKind.stop_requested
MAPPER = OrjsonMapper()


def replay(events: list[Any]) -> Process:
    """Store each event as the registry does (orjson), read it back, and rebuild."""
    aggregate: Any = None
    for event in events:
        aggregate = MAPPER.to_domain_event(MAPPER.to_stored_event(event)).mutate(aggregate)
    assert isinstance(aggregate, Process)
    return aggregate


class ProcessAggregateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.process: Process | None = None
        self.model: LifecycleModel | None = None
        self.log: list[Any] = []
        self.retryable: list[LifecycleCommand] = []
        self.terminal_record: ProcessRecord | None = None

    @initialize(registration=registrations())
    def register(self, registration: ProcessRegistration) -> None:
        self.process = Process.register(registration, at_ms=self.now)
        self.model = LifecycleModel(registration, created_at_ms=self.now)
        self.log.extend(self.process.collect_events())
        assert len(self.log) == 1
        assert self.process.state is ProcessState.starting

    # -- rules ------------------------------------------------------------------------------------

    @rule(command=lifecycle_commands())
    def arbitrary_command(self, command: LifecycleCommand) -> None:
        self.send(command)

    @precondition(lambda self: self.model is not None and not self.model.is_terminal)
    @rule(data=st.data())
    def valid_command(self, data: st.DataObject) -> None:
        assert self.model is not None
        outcome = self.send(data.draw(next_commands(self.model), label="command"))
        assert outcome.appends

    @precondition(lambda self: bool(self.retryable))
    @rule(data=st.data())
    def retry_an_appended_command(self, data: st.DataObject) -> None:
        assert self.process is not None
        command = data.draw(st.sampled_from(self.retryable), label="retry")
        version = self.process.version
        outcome = self.send(command)
        assert outcome.accepted
        assert not outcome.appends
        assert self.process.version == version

    @rule(ms=st.integers(min_value=1, max_value=60_000))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    def send(self, command: LifecycleCommand) -> Outcome:
        process, model = self.process, self.model
        assert process is not None
        assert model is not None
        from_state, version = process.state, process.version
        outcome = model.step(command, now_ms=self.now)
        try:
            appended = apply_to_process(process, command, at_ms=self.now)
        except ProcledgerError as error:
            self.check_rejected(command, outcome, error, from_state)
            assert process.version == version
            assert not process.pending_events
        else:
            assert outcome.accepted, f"{command} accepted; model expected {outcome.error}"
            events = process.collect_events()
            assert appended is outcome.appends
            assert len(events) == int(appended)
            if appended:
                self.check_accepted(command, events[0], from_state)
                self.log.extend(events)
                if command.event_id is not None or command.is_terminal_kind:
                    self.retryable.append(command)
        model.check(render_record(process, change_seq=len(self.log)))
        return outcome

    # -- checks -----------------------------------------------------------------------------------

    def check_accepted(
        self, command: LifecycleCommand, event: Any, from_state: ProcessState
    ) -> None:
        to_state = ProcessState(event.state)
        reason = getattr(event, "reason", None)
        row_state = from_state if command.kind is STOP else to_state
        assert (command.kind, row_state, reason) in ROWS
        assert (from_state, command.kind, to_state) in TRANSITIONS
        assert event.at_ms == self.now
        assert getattr(event, "event_id", None) == command.event_id

    def check_rejected(
        self,
        command: LifecycleCommand,
        outcome: Outcome,
        error: ProcledgerError,
        from_state: ProcessState,
    ) -> None:
        assert outcome.error is not None, f"{command} refused ({error!r}); model accepts it"
        assert isinstance(error, outcome.error), f"{command}: {error!r}, not {outcome.error}"
        assert self.model is not None
        to_state, reason = self.model.target(command)
        if isinstance(error, ProcessLifecycleValidationError):
            assert error.field in outcome.fields
            if error.field == "state_reason":
                row_state = ProcessState.running if command.kind is STOP else to_state
                assert (command.kind, row_state, reason) not in ROWS
        elif isinstance(error, AlreadyTerminal):
            assert from_state.is_terminal
        elif isinstance(error, InvalidTransition):
            assert to_state is not None
            twice_backgrounded = command.kind is LifecycleKind.backgrounded and (
                self.model.backgrounded
            )
            assert (from_state, command.kind, to_state) not in TRANSITIONS or twice_backgrounded
            assert (error.from_state, error.kind) == (from_state.value, command.kind.value)

    # -- invariants -------------------------------------------------------------------------------

    @precondition(lambda self: self.process is not None)
    @invariant()
    def replaying_the_log_reproduces_the_aggregate(self) -> None:
        assert self.process is not None
        rebuilt = replay(self.log)
        assert rebuilt.version == self.process.version == len(self.log)
        assert render_record(rebuilt, change_seq=0) == render_record(self.process, change_seq=0)
        assert rebuilt.event_ids == self.process.event_ids
        assert rebuilt.terminal_fingerprint == self.process.terminal_fingerprint

    @precondition(lambda self: self.process is not None)
    @invariant()
    def terminal_states_absorb(self) -> None:
        assert self.process is not None
        if not self.process.state.is_terminal:
            return
        record = render_record(self.process, change_seq=0)
        if self.terminal_record is None:
            self.terminal_record = record
        assert record == self.terminal_record


ProcessAggregateMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProcessAggregate = ProcessAggregateMachine.TestCase


class RegistryOnMemory(ProcessMachine):
    """The kit's machine as a user would run it, against the registry itself."""


class RegistryOnMemoryWithLeases(ProcessMachine):
    """The same, finishing processes with a claimed lease instead of an authority."""

    use_leases = True


REGISTRY_SETTINGS = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
RegistryOnMemory.TestCase.settings = REGISTRY_SETTINGS
RegistryOnMemoryWithLeases.TestCase.settings = settings(REGISTRY_SETTINGS, max_examples=10)
TestRegistryOnMemory = RegistryOnMemory.TestCase
TestRegistryOnMemoryWithLeases = RegistryOnMemoryWithLeases.TestCase


# -- the kit's strategies keep their promises ------------------------------------------------------


@given(lifecycle_histories())
def test_every_command_of_a_history_appends_one_event(history: LifecycleHistory) -> None:
    process = Process.register(history.registration, at_ms=1)
    model = LifecycleModel(history.registration, created_at_ms=1)
    states = [process.state]
    for at_ms, command in enumerate(history.commands, start=2):
        assert model.step(command, now_ms=at_ms).appends
        assert apply_to_process(process, command, at_ms=at_ms), command
        states.append(process.state)
    assert process.version == 1 + len(history.commands)
    assert states == history.states
    assert history.final_status is model.status
    model.check(render_record(process, change_seq=0))


@given(lifecycle_histories(terminal=True))
def test_terminal_histories_end_in_a_terminal(history: LifecycleHistory) -> None:
    assert history.final_state.is_terminal
    assert history.commands[-1].is_terminal_kind
    assert not any(c.is_terminal_kind for c in history.commands[:-1])


@given(lifecycle_histories(terminal=False))
def test_open_histories_never_end(history: LifecycleHistory) -> None:
    assert not history.final_state.is_terminal


@given(notifications())
def test_generated_notifications_are_valid(notification: ProcessCompletionNotification) -> None:
    assert notification_error_field(notification.model_dump(mode="json")) is None
    again = ProcessCompletionNotification.model_validate_json(notification.model_dump_json())
    assert again == notification


@given(notification_payloads())
def test_payloads_fail_on_the_field_the_kit_predicts(payload: dict[str, Any]) -> None:
    expected = notification_error_field(payload)
    if expected is None:
        ProcessCompletionNotification.model_validate(payload)
        return
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        ProcessCompletionNotification.model_validate(payload)
    assert caught.value.field == expected
