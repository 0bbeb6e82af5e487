"""The registry's contract (docs/design.md §3, §3.5, §7, §9) as one abstract conformance suite.

``RegistryConformance`` is subclassed once per store (``test_memory.py``, ``test_sqlite.py``,
``test_postgres.py``), mixed with the store's case from ``tests/_stores.py``, which says how to
open a registry with a given clock. Every
test drives the public ``ProcessRegistry`` API with an injected ``FakeClock``, so lease expiry
is a clock step, never a sleep.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

from _stores import StoreCase
from procledger import (
    Acquired,
    AlreadyTerminal,
    AuthorityRejected,
    Busy,
    CompletionAuthority,
    EventType,
    ExternalRef,
    InvalidTransition,
    Lease,
    LeaseLost,
    LeaseOwner,
    NotFound,
    Originator,
    ProcessInput,
    ProcessLifecycleValidationError,
    ProcessRecord,
    ProcessRegistration,
    ProcessRegistry,
    ProcessState,
    ProcessStatus,
    RecoveryDisposition,
    RegistrationConflict,
    ReplayConflict,
    SessionScope,
    StoreCorrupt,
    StoreError,
    TerminalReason,
    UndeclaredEventType,
    WaitState,
    lifecycle_table,
)
from procledger.adapters.liveness import ProcProbe
from procledger.domain.input import InputWait, SentInput, WaitKind
from procledger.domain.leases import Liveness
from procledger.domain.process import Process, process_uuid
from procledger.domain.records import (
    OsFacts,
    OutputSummary,
    ResourceUse,
    StoppedOrphan,
    StreamOutput,
)
from procledger.domain.registration import env_ref_for
from procledger.domain.rendering import render_record
from procledger.domain.service import RestartPolicy
from procledger.domain.session import Session
from procledger.domain.vocabulary import LifecycleKind
from procledger.testing import FakeClock

TTL = 1_000
ENV_REF = env_ref_for({"PATH": "/usr/bin"})
D = RecoveryDisposition


def registration(
    process_id: str,
    *,
    disposition: RecoveryDisposition = D.owner_bound,
    event_types: tuple[str, ...] = ("signal.ready",),
    **overrides: Any,
) -> ProcessRegistration:
    fields: dict[str, Any] = {
        "id": process_id,
        "input": ProcessInput.command(["/bin/sleep", "1"]),
        "disposition": disposition,
        "originator": Originator.host(),
        "env_ref": ENV_REF,
        "event_types": [EventType(name=name) for name in event_types],
        **overrides,
    }
    return ProcessRegistration(**fields)


def external_registration(process_id: str, **overrides: Any) -> ProcessRegistration:
    fields: dict[str, Any] = {
        "input": ProcessInput.external({"label": "ticket"}),
        "env_ref": None,
        "disposition": D.externally_owned,
        **overrides,
    }
    return registration(process_id, **fields)


def owner(name: str = "worker", incarnation: str = "one") -> LeaseOwner:
    return LeaseOwner(owner_id=name, incarnation_id=incarnation)


def local_owner(name: str, *, pid: int, start: str = "100", host: str = "host-a") -> LeaseOwner:
    """A ``local_process`` owner on a made-up host, for probes faked by the test."""
    return LeaseOwner(
        owner_id=name,
        incarnation_id=f"{name}-incarnation",
        liveness=Liveness(
            kind="local_process", host_id=host, boot_id="boot-1", pid=pid, process_start=start
        ),
    )


KEY = CompletionAuthority.workflow_key("step-1")


def names_field(error: ValidationError, field: str) -> bool:
    """True when pydantic's error points at ``field`` (by location or in its message)."""
    return any(field in err["loc"] or field in err["msg"] for err in error.errors())


def valid_registration_dict(**overrides: Any) -> dict[str, Any]:
    data = registration("p").model_dump(mode="json")
    data.update(overrides)
    return data


class RegistryConformance(StoreCase):
    """Everything a store must honour; run per store by mixing in a ``_stores`` case.

    Fixtures: ``clock`` and ``registry`` (``StoreCase``), ``running``.
    """

    @pytest.fixture
    def running(self, registry: ProcessRegistry) -> str:
        """A registered, started, owner_bound command process."""
        registry.register(registration("run-1"))
        registry.record_started("run-1", 10)
        return "run-1"

    @staticmethod
    def kinds(registry: ProcessRegistry, process_id: str) -> list[str]:
        return [event.kind for event in registry.events(process_id)]

    # -- registration ----------------------------------------------------------------------------

    def test_register_creates_starting_process_with_registered_event(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        reg = registration("p-1", definition={"workflow": "build", "step": 3})
        record = registry.register(reg)
        assert record.id == "p-1"
        assert record.state is ProcessState.starting
        assert record.status is ProcessStatus.running
        assert record.registration_hash == reg.registration_hash()
        assert record.disposition is D.owner_bound
        assert (record.identity.kind, record.identity.label) == ("command", "sleep")
        assert record.identity.definition == {"workflow": "build", "step": 3}
        assert record.created_at_ms == record.updated_at_ms == clock.now_ms
        assert record.stop_requested == []
        assert record.backgrounded is False
        assert record.change_seq > 0
        assert registry.get("p-1") == record
        [event] = registry.events("p-1")
        assert (event.sequence, event.kind, event.process_id) == (1, "registered", "p-1")
        assert event.occurred_at_ms == clock.now_ms

    def test_register_same_registration_returns_existing_record_unchanged(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        first = registry.register(registration("p-1"))
        clock.advance(5_000)
        again = registry.register(registration("p-1"))
        assert again == first
        assert len(registry.events("p-1")) == 1

    def test_register_same_id_other_content_conflicts_naming_both_hashes(
        self, registry: ProcessRegistry
    ) -> None:
        first = registry.register(registration("p-1"))
        other = registration("p-1", disposition=D.rerunnable)
        with pytest.raises(RegistrationConflict) as caught:
            registry.register(other)
        assert caught.value.existing_hash == first.registration_hash
        assert caught.value.new_hash == other.registration_hash()
        assert first.registration_hash in str(caught.value)
        assert other.registration_hash() in str(caught.value)
        assert "p-1" in str(caught.value)
        assert registry.get("p-1") == first
        assert len(registry.events("p-1")) == 1

    def test_registration_hash_is_independent_of_construction_order(self) -> None:
        a = ProcessRegistration.model_validate(valid_registration_dict())
        data = valid_registration_dict()
        b = ProcessRegistration.model_validate(dict(reversed(list(data.items()))))
        assert a.registration_hash() == b.registration_hash()

    @pytest.mark.parametrize(
        ("bad_id", "why"),
        [("", "empty"), ("   ", "blank"), ("a#b", "hash sign"), ("x" * 257, "too long")],
    )
    def test_invalid_process_id_is_a_validation_error_naming_id(
        self, bad_id: str, why: str
    ) -> None:
        with pytest.raises(ValidationError) as caught:
            registration(bad_id)
        assert names_field(caught.value, "id"), why

    def test_longest_allowed_id_registers(self, registry: ProcessRegistry) -> None:
        long_id = "x" * 256
        assert registry.register(registration(long_id)).id == long_id

    def test_missing_disposition_is_a_validation_error(self) -> None:
        data = valid_registration_dict()
        del data["disposition"]
        with pytest.raises(ValidationError) as caught:
            ProcessRegistration.model_validate(data)
        assert names_field(caught.value, "disposition")

    def test_extra_key_is_a_validation_error_naming_it(self) -> None:
        with pytest.raises(ValidationError) as caught:
            ProcessRegistration.model_validate(valid_registration_dict(surprise=1))
        assert names_field(caught.value, "surprise")

    @pytest.mark.parametrize(
        "input_",
        [ProcessInput.command(["/bin/true"]), ProcessInput.engine("batch", {"n": 1})],
        ids=["command", "engine"],
    )
    def test_command_and_engine_inputs_require_env_ref(self, input_: ProcessInput) -> None:
        with pytest.raises(ValidationError) as caught:
            registration("p", input=input_, env_ref=None)
        assert names_field(caught.value, "env_ref")

    def test_external_input_must_not_have_env_ref(self) -> None:
        with pytest.raises(ValidationError) as caught:
            external_registration("p", env_ref=ENV_REF)
        assert names_field(caught.value, "env_ref")

    def test_env_ref_must_be_a_content_hash(self) -> None:
        with pytest.raises(ValidationError) as caught:
            registration("p", env_ref="process-env:sha256:nothex")
        assert names_field(caught.value, "env_ref")

    def test_frozen_registration_refuses_assignment(self) -> None:
        reg = registration("p")
        with pytest.raises(ValidationError):
            reg.id = "q"  # type: ignore[misc]

    def test_record_without_disposition_fails_to_load(self, registry: ProcessRegistry) -> None:
        record = registry.register(registration("p-1"))
        assert ProcessRecord.model_validate_json(record.model_dump_json()) == record
        data = record.model_dump(mode="json")
        del data["disposition"]
        with pytest.raises(ValidationError) as caught:
            ProcessRecord.model_validate(data)
        assert names_field(caught.value, "disposition")

    # -- environments ------------------------------------------------------------------------------

    def test_store_env_ref_is_order_independent_and_loads_back(
        self, registry: ProcessRegistry
    ) -> None:
        ref = registry.store_env({"A": "1", "B": "ü ✓"})
        assert ref == registry.store_env({"B": "ü ✓", "A": "1"})
        assert ref.startswith("process-env:sha256:")
        assert ref == env_ref_for({"A": "1", "B": "ü ✓"})
        assert registry.load_env(ref) == {"A": "1", "B": "ü ✓"}
        assert registry.store_env({"A": "2"}) != ref

    def test_load_env_never_stored_is_not_found(self, registry: ProcessRegistry) -> None:
        with pytest.raises(NotFound):
            registry.load_env(env_ref_for({"NEVER": "stored"}))

    def test_environment_values_never_reach_events_or_records(
        self, registry: ProcessRegistry
    ) -> None:
        secret = "s3cr3t-" + uuid.uuid4().hex
        ref = registry.store_env({"TOKEN": secret})
        registry.register(registration("p-env", env_ref=ref))
        registry.record_started("p-env", 1)
        store = registry._store
        with store.read() as tx:
            events = tx.execute(f"SELECT state FROM {store.events_table}").all()
            records = tx.execute(f"SELECT record FROM {store.table('records')}").all()
        assert events
        assert records
        assert not any(secret.encode() in bytes(row["state"]) for row in events)
        assert not any(secret in row["record"] for row in records)

    # -- event sequencing -------------------------------------------------------------------------

    def test_sequences_are_one_based_and_contiguous(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        registry.append_event(running, "signal.ready", {"n": 1}, replay_key="k1")
        registry.request_stop(running, "interrupted")
        registry.record_completed(running, "interrupted", "interrupted", authority=KEY)
        events = registry.events(running)
        assert [e.sequence for e in events] == list(range(1, len(events) + 1))
        assert [e.kind for e in events] == [
            "registered",
            "started",
            "signal.ready",
            "stop_requested",
            "completed",
        ]
        assert all(e.process_id == running for e in events)
        assert [e.sequence for e in registry.events(running, after=2)] == [3, 4, 5]
        assert registry.events(running, after=5) == []

    def test_sequences_are_per_process(self, registry: ProcessRegistry) -> None:
        registry.register(registration("a"))
        registry.register(registration("b"))
        registry.record_started("b", 1)
        assert [e.sequence for e in registry.events("a")] == [1]
        assert [e.sequence for e in registry.events("b")] == [1, 2]

    def test_change_seq_follows_the_latest_event(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        before = registry.get(running).change_seq
        after = registry.append_event(running, "signal.ready", None, replay_key="k")
        assert after.sequence == 3
        assert registry.get(running).change_seq > before

    # -- lifecycle rows and fields -----------------------------------------------------------------

    @pytest.mark.parametrize(
        "row",
        [r for r in lifecycle_table() if r.kind is LifecycleKind.completed],
        ids=lambda r: f"{r.state.value}-{r.reason.value if r.reason else None}",
    )
    def test_every_completed_row_is_recorded_from_running(
        self, registry: ProcessRegistry, running: str, clock: FakeClock, row: Any
    ) -> None:
        exit_code = 3 if row.state is ProcessState.exited else None
        diagnostic = "boom ✗" if row.state is ProcessState.failed else None
        value = {"out": [1, None, "ü"]} if row.state is ProcessState.exited else None
        signal = 11 if row.state is ProcessState.signaled else None
        clock.advance(250)
        record = registry.record_completed(
            running,
            row.state,
            row.reason,
            exit_code=exit_code,
            diagnostic=diagnostic,
            value=value,
            authority=KEY,
            signal=signal,
        )
        assert (record.state, record.reason, record.signal) == (row.state, row.reason, signal)
        assert (record.exit_code, record.diagnostic, record.value) == (exit_code, diagnostic, value)
        assert record.finished_at_ms == record.updated_at_ms == clock.now_ms
        assert record.is_terminal
        assert registry.get(running) == record
        last = registry.events(running)[-1]
        assert last.kind == "completed"
        assert last.payload["state"] == row.state.value
        assert last.payload["reason"] == row.reason.value

    @pytest.mark.parametrize(
        ("state", "reason", "status"),
        [
            ("failed", "failed", ProcessStatus.failed),
            ("terminated", "terminated", ProcessStatus.cancelled),
            ("killed", "output_limit", ProcessStatus.failed),
        ],
    )
    def test_completions_allowed_from_starting(
        self, registry: ProcessRegistry, state: str, reason: str, status: ProcessStatus
    ) -> None:
        registry.register(registration("p"))
        record = registry.record_completed("p", state, reason, authority=KEY)
        assert record.state == state
        assert record.status is status
        assert record.started_at_ms is None

    @pytest.mark.parametrize(
        ("state", "reason", "exit_code"),
        [
            ("exited", "exited", 0),
            ("timed_out", "timed_out", None),
            ("interrupted", "interrupted", None),
        ],
    )
    def test_completions_invalid_from_starting(
        self, registry: ProcessRegistry, state: str, reason: str, exit_code: int | None
    ) -> None:
        registry.register(registration("p"))
        with pytest.raises(InvalidTransition) as caught:
            registry.record_completed("p", state, reason, exit_code=exit_code, authority=KEY)
        assert not isinstance(caught.value, AlreadyTerminal)
        assert (caught.value.from_state, caught.value.kind, caught.value.to_state) == (
            "starting",
            "completed",
            state,
        )
        assert "'p'" in str(caught.value)
        assert registry.get("p").state is ProcessState.starting
        assert self.kinds(registry, "p") == ["registered"]

    @pytest.mark.parametrize("from_running", [False, True])
    def test_lost_and_abandoned_from_starting_and_running(
        self, registry: ProcessRegistry, from_running: bool
    ) -> None:
        for pid in ("lost", "aband"):
            registry.register(registration(pid))
            if from_running:
                registry.record_started(pid, 1)
        lost = registry.record_lost("lost", diagnostic="worker vanished", authority=KEY)
        assert (lost.state, lost.reason) == (
            ProcessState.lost_on_restore,
            TerminalReason.lost_on_restore,
        )
        assert lost.diagnostic == "worker vanished"
        assert lost.status is ProcessStatus.abandoned
        evidence = owner("dead-owner")
        abandoned = registry.record_abandoned(
            "aband", "owner_dead", owner=evidence, at_ms=77, authority=KEY
        )
        assert (abandoned.state, abandoned.reason) == (
            ProcessState.abandoned,
            TerminalReason.owner_dead,
        )
        assert abandoned.abandon_evidence is not None
        assert abandoned.abandon_evidence.owner == evidence
        assert abandoned.abandon_evidence.at_ms == 77
        assert self.kinds(registry, "lost")[-1] == "lost"
        assert self.kinds(registry, "aband")[-1] == "abandoned"

    @pytest.mark.parametrize(
        ("call", "field"),
        [
            (lambda r, p: r.record_completed(p, "exited", "failed", exit_code=1), "state_reason"),
            (lambda r, p: r.record_completed(p, "abandoned", "abandon_requested"), "state_reason"),
            (lambda r, p: r.record_completed(p, "running", "exited"), "state_reason"),
            (lambda r, p: r.record_completed(p, "bogus", "exited"), "state_reason"),
            (lambda r, p: r.record_completed(p, "failed", "bogus"), "state_reason"),
            (lambda r, p: r.record_completed(p, "killed", "owner_dead"), "state_reason"),
            (lambda r, p: r.request_stop(p, "exited"), "state_reason"),
            (lambda r, p: r.request_stop(p, "runner_shutdown"), "state_reason"),
            (lambda r, p: r.record_abandoned(p, "exited"), "state_reason"),
            (lambda r, p: r.record_completed(p, "exited", "exited"), "exit_code"),
            (lambda r, p: r.record_completed(p, "failed", "failed", exit_code=1), "exit_code"),
            (
                lambda r, p: r.record_completed(p, "exited", "exited", exit_code=0, diagnostic="x"),
                "diagnostic",
            ),
            (
                lambda r, p: r.record_completed(p, "timed_out", "timed_out", diagnostic="x"),
                "diagnostic",
            ),
            (
                lambda r, p: r.record_completed(p, "failed", "failed", diagnostic="é" * 257),
                "diagnostic",
            ),
            (lambda r, p: r.record_lost(p, diagnostic="x" * 513), "diagnostic"),
            (lambda r, p: r.record_abandoned(p, "owner_dead", diagnostic="x" * 513), "diagnostic"),
            (lambda r, p: r.record_completed(p, "failed", "failed", value={"v": 1}), "value"),
        ],
    )
    def test_invalid_rows_and_fields_name_the_field_and_append_nothing(
        self,
        registry: ProcessRegistry,
        running: str,
        call: Callable[[ProcessRegistry, str], Any],
        field: str,
    ) -> None:
        before = registry.get(running)
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            call(registry, running)
        assert caught.value.field == field
        assert registry.get(running) == before
        assert len(registry.events(running)) == 2

    def test_diagnostic_limit_is_512_utf8_bytes(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        diagnostic = "é" * 256  # 512 bytes exactly
        record = registry.record_completed(
            running, "failed", "failed", diagnostic=diagnostic, authority=KEY
        )
        assert record.diagnostic == diagnostic

    # -- transitions -------------------------------------------------------------------------------

    def test_started_then_backgrounded_once(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        registry.register(registration("p"))
        started = registry.record_started("p", 1234)
        assert started.state is ProcessState.running
        assert started.started_at_ms == 1234
        with pytest.raises(InvalidTransition):
            registry.record_started("p", 1235)
        backgrounded = registry.record_backgrounded("p", 2000)
        assert backgrounded.backgrounded is True
        assert backgrounded.state is ProcessState.running
        assert backgrounded.started_at_ms == 1234
        with pytest.raises(InvalidTransition):
            registry.record_backgrounded("p", 2001)
        assert self.kinds(registry, "p") == ["registered", "started", "backgrounded"]

    def test_backgrounded_from_starting_starts_the_process(self, registry: ProcessRegistry) -> None:
        registry.register(registration("p"))
        record = registry.record_backgrounded("p", 500)
        assert (record.state, record.backgrounded, record.started_at_ms) == (
            ProcessState.running,
            True,
            500,
        )
        with pytest.raises(InvalidTransition):
            registry.record_started("p", 501)
        with pytest.raises(InvalidTransition):
            registry.record_backgrounded("p", 502)

    @pytest.mark.parametrize("start", [False, True])
    def test_stop_requested_once_per_signal_and_state_unchanged(
        self, registry: ProcessRegistry, start: bool
    ) -> None:
        registry.register(registration("p"))
        if start:
            registry.record_started("p", 1)
        state = registry.get("p").state
        registry.request_stop("p", "interrupted")
        repeat = registry.request_stop("p", TerminalReason.interrupted)
        registry.request_stop("p", "killed")
        record = registry.request_stop("p", "interrupted")
        assert record.state is state
        assert record.stop_requested == [TerminalReason.interrupted, TerminalReason.killed]
        assert repeat.stop_requested == [TerminalReason.interrupted]
        assert self.kinds(registry, "p").count("stop_requested") == 2
        cancelled = registry.record_completed("p", "killed", "killed", authority=KEY)
        assert cancelled.status is ProcessStatus.cancelled

    @pytest.mark.parametrize(
        "write",
        [
            lambda r, p: r.record_started(p, 9),
            lambda r, p: r.record_backgrounded(p, 9),
            lambda r, p: r.request_stop(p, "terminated"),
        ],
        ids=["started", "backgrounded", "stop_requested"],
    )
    def test_terminal_process_accepts_no_lifecycle_write(
        self, registry: ProcessRegistry, running: str, write: Callable[[ProcessRegistry, str], Any]
    ) -> None:
        registry.record_completed(running, "exited", "exited", exit_code=0, authority=KEY)
        before = registry.get(running)
        with pytest.raises(InvalidTransition):
            write(registry, running)
        assert registry.get(running) == before
        assert len(registry.events(running)) == 3

    def test_different_terminal_on_terminal_is_already_terminal(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        registry.record_completed(running, "exited", "exited", exit_code=0, authority=KEY)
        before = registry.get(running)
        attempts: list[Callable[[], Any]] = [
            lambda: registry.record_completed(
                running, "exited", "exited", exit_code=1, authority=KEY
            ),
            lambda: registry.record_completed(running, "failed", "failed", authority=KEY),
            lambda: registry.record_lost(running, authority=KEY),
            lambda: registry.record_abandoned(running, "owner_drain", authority=KEY),
        ]
        for attempt in attempts:
            with pytest.raises(AlreadyTerminal) as caught:
                attempt()
            assert isinstance(caught.value, InvalidTransition)
            assert running in str(caught.value)
        assert registry.get(running) == before
        assert len(registry.events(running)) == 3

    def test_identical_terminal_replay_returns_record_and_appends_nothing(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        first = registry.record_completed(
            running, "exited", "exited", exit_code=0, value={"a": [1]}, authority=KEY
        )
        clock.advance(1_000)
        again = registry.record_completed(
            running, "exited", "exited", exit_code=0, value={"a": [1]}, authority=KEY
        )
        assert again == first
        assert len(registry.events(running)) == 3

    def test_identical_lost_and_abandoned_replays(self, registry: ProcessRegistry) -> None:
        for pid in ("l", "a"):
            registry.register(registration(pid))
        lost = registry.record_lost("l", diagnostic="gone", authority=KEY)
        assert registry.record_lost("l", diagnostic="gone", authority=KEY) == lost
        evidence = owner("o")
        abandoned = registry.record_abandoned("a", "owner_dead", owner=evidence, authority=KEY)
        assert registry.record_abandoned("a", "owner_dead", owner=evidence) == abandoned
        assert len(registry.events("l")) == len(registry.events("a")) == 2

    # -- event_id idempotency ----------------------------------------------------------------------

    def test_event_id_repeat_with_same_payload_is_a_noop(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        registry.register(registration("p"))
        ids = [str(uuid.uuid4()) for _ in range(4)]
        started = registry.record_started("p", 5, event_id=ids[0])
        clock.advance(10)
        assert registry.record_started("p", 5, event_id=ids[0]) == started
        stopped = registry.request_stop("p", "terminated", event_id=ids[1])
        assert registry.request_stop("p", "terminated", event_id=ids[1]) == stopped
        bg = registry.record_backgrounded("p", 6, event_id=ids[2])
        assert registry.record_backgrounded("p", 6, event_id=ids[2]) == bg
        done = registry.record_completed(
            "p", "terminated", "terminated", event_id=ids[3], authority=KEY
        )
        assert (
            registry.record_completed(
                "p", "terminated", "terminated", event_id=ids[3], authority=KEY
            )
            == done
        )
        # Earlier ids still replay after the terminal (replay is checked before state).
        assert registry.record_started("p", 5, event_id=ids[0]) == done
        events = registry.events("p")
        assert len(events) == 5
        assert [e.event_id for e in events[1:]] == ids

    def test_event_id_reused_with_other_payload_is_a_replay_conflict(
        self, registry: ProcessRegistry
    ) -> None:
        registry.register(registration("p"))
        event_id = str(uuid.uuid4())
        registry.record_started("p", 5, event_id=event_id)
        before = registry.get("p")
        with pytest.raises(ReplayConflict):
            registry.record_started("p", 6, event_id=event_id)
        with pytest.raises(ReplayConflict):
            registry.request_stop("p", "killed", event_id=event_id)
        with pytest.raises(ReplayConflict):
            registry.record_completed("p", "killed", "killed", event_id=event_id, authority=KEY)
        assert registry.get("p") == before
        assert len(registry.events("p")) == 2

    def test_terminal_event_id_reused_with_other_payload_conflicts(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        event_id = str(uuid.uuid4())
        registry.record_completed(
            running, "exited", "exited", exit_code=0, event_id=event_id, authority=KEY
        )
        with pytest.raises(ReplayConflict):
            registry.record_completed(
                running, "exited", "exited", exit_code=2, event_id=event_id, authority=KEY
            )

    # -- error order -------------------------------------------------------------------------------

    def test_validation_comes_before_identical_replay(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        event_id = str(uuid.uuid4())
        registry.record_completed(
            running, "exited", "exited", exit_code=0, event_id=event_id, authority=KEY
        )
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            registry.record_completed(running, "exited", "exited", event_id=event_id, authority=KEY)
        assert caught.value.field == "exit_code"

    def test_validation_comes_before_state(self, registry: ProcessRegistry, running: str) -> None:
        registry.record_completed(running, "exited", "exited", exit_code=0, authority=KEY)
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            registry.record_completed(running, "exited", "failed", exit_code=0)
        assert caught.value.field == "state_reason"
        with pytest.raises(ProcessLifecycleValidationError):
            registry.request_stop(running, "exited")

    def test_identical_replay_comes_before_lease_and_authority(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        lease = self.acquire(registry, running, owner("a"))
        done = registry.record_completed(running, "exited", "exited", exit_code=0, lease=lease)
        assert registry.get_lease(running) is None  # released with the terminal: now stale
        clock.advance(10 * TTL)
        # stale lease, expired lease, no lease and a refused authority: all replay fine
        assert (
            registry.record_completed(running, "exited", "exited", exit_code=0, lease=lease) == done
        )
        assert registry.record_completed(running, "exited", "exited", exit_code=0) == done
        assert (
            registry.record_completed(
                running,
                "exited",
                "exited",
                exit_code=0,
                authority=CompletionAuthority.external_owner("x"),
            )
            == done
        )
        assert len(registry.events(running)) == 3

    def test_state_comes_before_lease(self, registry: ProcessRegistry, clock: FakeClock) -> None:
        registry.register(registration("p"))
        lease = self.acquire(registry, "p", owner("a"))
        clock.advance(2 * TTL)  # the lease has expired
        with pytest.raises(InvalidTransition):
            registry.record_completed("p", "exited", "exited", exit_code=0, lease=lease)
        registry.record_completed("p", "failed", "failed", authority=KEY)
        with pytest.raises(AlreadyTerminal):
            registry.record_completed("p", "killed", "killed", lease=lease)

    def test_state_comes_before_authority(self, registry: ProcessRegistry) -> None:
        registry.register(registration("p"))
        with pytest.raises(InvalidTransition):
            registry.record_completed("p", "exited", "exited", exit_code=0)
        with pytest.raises(InvalidTransition):
            registry.record_completed(
                "p",
                "exited",
                "exited",
                exit_code=0,
                authority=CompletionAuthority.reconciled_abandon(),
            )
        registry.record_completed("p", "failed", "failed", authority=KEY)
        with pytest.raises(AlreadyTerminal):
            registry.record_lost("p")
        with pytest.raises(AlreadyTerminal):
            registry.record_lost("p", authority=CompletionAuthority.external_owner("x"))

    def test_terminal_without_lease_or_authority_is_rejected(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        attempts: list[Callable[[], Any]] = [
            lambda: registry.record_completed(running, "exited", "exited", exit_code=0),
            lambda: registry.record_lost(running),
            lambda: registry.record_abandoned(running, "owner_drain"),
        ]
        for attempt in attempts:
            with pytest.raises(AuthorityRejected) as caught:
                attempt()
            assert running in str(caught.value)
        assert len(registry.events(running)) == 2
        assert registry.get(running).state is ProcessState.running

    # -- producer events ---------------------------------------------------------------------------

    def test_append_declared_event(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        clock.advance(42)
        event = registry.append_event(running, "signal.ready", {"port": 8080}, replay_key="r1")
        assert (event.process_id, event.sequence, event.kind) == (running, 3, "signal.ready")
        assert (event.payload, event.replay_key) == ({"port": 8080}, "r1")
        assert event.occurred_at_ms == clock.now_ms
        assert registry.events(running)[-1] == event
        assert registry.get(running).updated_at_ms == clock.now_ms

    def test_undeclared_event_type_is_refused(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        for event_type in ("signal.other", "completed", "registered", "ready"):
            with pytest.raises(UndeclaredEventType) as caught:
                registry.append_event(running, event_type, {}, replay_key=event_type)
            assert running in str(caught.value)
        assert len(registry.events(running)) == 2

    def test_replay_key_semantics(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        first = registry.append_event(running, "signal.ready", {"n": 1}, replay_key="k")
        clock.advance(100)
        assert registry.append_event(running, "signal.ready", {"n": 1}, replay_key="k") == first
        with pytest.raises(ReplayConflict):
            registry.append_event(running, "signal.ready", {"n": 2}, replay_key="k")
        second = registry.append_event(running, "signal.ready", {"n": 1}, replay_key="k2")
        assert second.sequence == first.sequence + 1
        assert len(registry.events(running)) == 4

    @pytest.mark.parametrize("payload", [{"n": 2}, [1, {"n": 2}], 7, "ping", None])
    def test_a_producer_event_reads_back_as_its_producer_wrote_it(
        self, registry: ProcessRegistry, payload: Any
    ) -> None:
        """Issue #14: the payload is the producer's own, the replay key a field of its own."""
        registry.register(registration("pinger", event_types=("signal.ping",)))
        registry.record_started("pinger", 1)
        appended = registry.append_event("pinger", "signal.ping", payload, replay_key="p2")
        assert (appended.payload, appended.replay_key) == (payload, "p2")
        read = registry.events("pinger")[-1]
        assert read == appended
        assert (read.kind, read.payload, read.replay_key, read.event_id) == (
            "signal.ping",
            payload,
            "p2",
            None,
        )
        assert registry.await_event("pinger", "signal.ping", timeout=5) == appended
        assert registry.append_event("pinger", "signal.ping", payload, replay_key="p2") == read
        assert [e.replay_key for e in registry.events("pinger")] == [None, None, "p2"]

    # -- leases ------------------------------------------------------------------------------------

    @staticmethod
    def acquire(
        registry: ProcessRegistry, process_id: str, who: LeaseOwner, ttl_ms: int = TTL
    ) -> Lease:
        result = registry.claim_lease(process_id, who, ttl_ms)
        assert isinstance(result, Acquired), result
        return result.lease

    def test_first_claim_acquires_fence_one(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        assert registry.get_lease(running) is None
        lease = self.acquire(registry, running, owner("a"))
        assert lease.process_id == running
        assert lease.owner == owner("a")
        assert lease.fencing_token == 1
        assert lease.claimed_at_ms == clock.now_ms
        assert lease.expires_at_ms == clock.now_ms + TTL
        assert lease.lease_token
        assert registry.get_lease(running) == lease

    def test_live_lease_is_busy_for_another_owner(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        lease = self.acquire(registry, running, owner("a"))
        for other in (owner("b"), owner("a", "another-incarnation")):
            result = registry.claim_lease(running, other, TTL)
            assert result == Busy(holder=lease)
        assert registry.get_lease(running) == lease

    def test_same_incarnation_reenters_keeping_token_and_fence(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        lease = self.acquire(registry, running, owner("a"))
        clock.advance(TTL // 2)
        again = self.acquire(registry, running, owner("a"), ttl_ms=5 * TTL)
        assert (again.lease_token, again.fencing_token) == (lease.lease_token, lease.fencing_token)
        assert again.expires_at_ms == clock.now_ms + 5 * TTL
        assert registry.get_lease(running) == again

    def test_renew_extends_a_live_lease(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        lease = self.acquire(registry, running, owner("a"))
        clock.advance(TTL - 1)
        renewed = registry.renew_lease(lease, 2 * TTL)
        assert renewed.expires_at_ms == clock.now_ms + 2 * TTL
        assert (renewed.lease_token, renewed.fencing_token) == (
            lease.lease_token,
            lease.fencing_token,
        )
        assert registry.get_lease(running) == renewed
        clock.advance(TTL + 1)  # past the original expiry, within the renewed one
        registry.renew_lease(renewed, TTL)

    def test_renew_refuses_expired_released_or_superseded_leases(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        lease = self.acquire(registry, running, owner("a"))
        clock.advance(TTL)  # expires_at_ms == now: no longer live
        with pytest.raises(LeaseLost) as caught:
            registry.renew_lease(lease, TTL)
        assert running in str(caught.value)
        newer = self.acquire(registry, running, owner("b"))
        with pytest.raises(LeaseLost):
            registry.renew_lease(lease, TTL)
        forged = newer.model_copy(update={"lease_token": "forged"})
        with pytest.raises(LeaseLost):
            registry.renew_lease(forged, TTL)
        registry.release_lease(newer)
        with pytest.raises(LeaseLost):
            registry.renew_lease(newer, TTL)

    def test_release_keeps_the_fence(self, registry: ProcessRegistry, running: str) -> None:
        first = self.acquire(registry, running, owner("a"))
        registry.release_lease(first)
        assert registry.get_lease(running) is None
        second = self.acquire(registry, running, owner("a"))
        assert second.fencing_token == 2
        assert second.lease_token != first.lease_token
        registry.release_lease(second)
        assert self.acquire(registry, running, owner("b")).fencing_token == 3

    def test_stale_release_is_a_silent_noop(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        stale = self.acquire(registry, running, owner("a"))
        clock.advance(TTL)
        holder = self.acquire(registry, running, owner("b"))
        assert holder.fencing_token == 2
        registry.release_lease(stale)
        assert registry.get_lease(running) == holder
        assert registry.claim_lease(running, owner("c"), TTL) == Busy(holder=holder)

    def test_expired_lease_is_acquired_with_next_fence(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        first = self.acquire(registry, running, owner("a"))
        clock.advance(TTL - 1)
        assert isinstance(registry.claim_lease(running, owner("b"), TTL), Busy)
        clock.advance(1)
        assert registry.get_lease(running) == first  # as stored, though expired
        second = self.acquire(registry, running, owner("b"))
        assert second.fencing_token == 2
        assert second.owner == owner("b")

    def test_expired_lease_of_same_incarnation_is_claimed_afresh(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        first = self.acquire(registry, running, owner("a"))
        clock.advance(TTL)
        second = self.acquire(registry, running, owner("a"))
        assert second.fencing_token == first.fencing_token + 1

    def test_lease_operations_do_not_touch_the_log_or_the_record(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        record = registry.get(running)
        events = registry.events(running)
        lease = self.acquire(registry, running, owner("a"))
        clock.advance(10)
        lease = registry.renew_lease(lease, TTL)
        registry.claim_lease(running, owner("b"), TTL)
        registry.release_lease(lease)
        assert registry.get(running) == record
        assert registry.events(running) == events

    def test_a_thousand_renewals_add_no_events(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        record = registry.get(running)
        lease = self.acquire(registry, running, owner("a"))
        for _ in range(1_000):
            clock.advance(1)
            lease = registry.renew_lease(lease, TTL)
        assert lease.expires_at_ms == clock.now_ms + TTL
        assert len(registry.events(running)) == 2
        assert registry.get(running) == record
        assert registry._ledger.load_process(running).version == 2

    def test_terminal_with_lease_releases_it_atomically(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        lease = self.acquire(registry, running, owner("a"))
        record = registry.record_completed(running, "exited", "exited", exit_code=0, lease=lease)
        assert record.state is ProcessState.exited
        assert registry.get_lease(running) is None
        with pytest.raises(AlreadyTerminal):  # and nobody can take a lease on it again
            registry.claim_lease(running, owner("b"), TTL)

    @pytest.mark.parametrize("terminal", ["completed", "lost", "abandoned"])
    def test_stale_and_expired_writers_append_nothing_and_leave_holder(
        self, registry: ProcessRegistry, running: str, clock: FakeClock, terminal: str
    ) -> None:
        def write(lease: Lease) -> Any:
            if terminal == "completed":
                return registry.record_completed(
                    running, "exited", "exited", exit_code=0, lease=lease
                )
            if terminal == "lost":
                return registry.record_lost(running, lease=lease)
            return registry.record_abandoned(running, "owner_drain", lease=lease)

        stale = self.acquire(registry, running, owner("a"))
        clock.advance(TTL)
        # expired, nobody else holds it yet: refused, and the stored lease stays as it was
        with pytest.raises(LeaseLost):
            write(stale)
        assert registry.get_lease(running) == stale
        holder = self.acquire(registry, running, owner("b"))
        with pytest.raises(LeaseLost):
            write(stale)
        assert registry.get_lease(running) == holder
        assert len(registry.events(running)) == 2
        assert registry.get(running).state is ProcessState.running
        assert write(holder).is_terminal
        assert registry.get_lease(running) is None

    def test_lease_of_another_process_is_lost(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        registry.register(registration("other"))
        other_lease = self.acquire(registry, "other", owner("a"))
        with pytest.raises(LeaseLost):
            registry.record_completed(running, "exited", "exited", exit_code=0, lease=other_lease)
        assert registry.get_lease("other") == other_lease
        assert len(registry.events(running)) == 2

    def test_ttl_must_be_positive(self, registry: ProcessRegistry, running: str) -> None:
        with pytest.raises(ValueError, match="ttl"):
            registry.claim_lease(running, owner("a"), 0)
        lease = self.acquire(registry, running, owner("a"))
        with pytest.raises(ValueError, match="ttl"):
            registry.renew_lease(lease, -5)

    # -- reclaim -----------------------------------------------------------------------------------

    def dead_holder(self, registry: ProcessRegistry, process_id: str) -> Lease:
        return self.acquire(registry, process_id, local_owner("dead", pid=4242), ttl_ms=60_000)

    def test_reclaim_of_provably_dead_holder(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        observed = self.dead_holder(registry, running)
        asked: list[int] = []

        def gone(pid: int) -> str | None:
            asked.append(pid)
            return None

        registry.probe = ProcProbe(read_start=gone)
        claimant = local_owner("claimant", pid=7)
        result = registry.reclaim_lease(running, claimant, observed, TTL)
        assert isinstance(result, Acquired)
        assert asked == [4242]
        assert result.lease.fencing_token == 2
        assert result.lease.owner == claimant
        assert result.lease.expires_at_ms == clock.now_ms + TTL
        assert registry.get_lease(running) == result.lease
        # the old holder is now stale
        with pytest.raises(LeaseLost):
            registry.renew_lease(observed, TTL)

    def test_reclaim_when_pid_was_reused_by_another_process(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        observed = self.dead_holder(registry, running)
        registry.probe = ProcProbe(read_start=lambda pid: "999")  # started at another time
        result = registry.reclaim_lease(running, local_owner("c", pid=7), observed, TTL)
        assert isinstance(result, Acquired)

    @pytest.mark.parametrize("case", ["alive", "unreadable", "other-host", "opaque-claimant"])
    def test_reclaim_refused_unless_provably_dead(
        self, registry: ProcessRegistry, running: str, case: str
    ) -> None:
        observed = self.dead_holder(registry, running)

        def unreadable(pid: int) -> str | None:
            raise PermissionError(f"/proc/{pid}/stat")

        readers: dict[str, Callable[[int], str | None]] = {
            "alive": lambda pid: "100",
            "unreadable": unreadable,
            "other-host": lambda pid: None,
            "opaque-claimant": lambda pid: None,
        }
        registry.probe = ProcProbe(read_start=readers[case])
        claimant = {
            "other-host": local_owner("c", pid=7, host="host-b"),
            "opaque-claimant": owner("c"),
        }.get(case, local_owner("c", pid=7))
        result = registry.reclaim_lease(running, claimant, observed, TTL)
        assert result == Busy(holder=observed)
        assert registry.get_lease(running) == observed

    def test_reclaim_with_outdated_observation_is_busy(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        observed = self.dead_holder(registry, running)
        clock.advance(10)
        current = registry.renew_lease(observed, 60_000)  # the holder renewed since
        registry.probe = ProcProbe(read_start=lambda pid: None)
        result = registry.reclaim_lease(running, local_owner("c", pid=7), observed, TTL)
        assert result == Busy(holder=current)

    def test_reclaim_of_released_or_expired_lease_simply_acquires(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        observed = self.acquire(registry, running, owner("a"))

        def never(pid: int) -> str | None:
            raise AssertionError("no probe needed")

        registry.probe = ProcProbe(read_start=never)
        registry.release_lease(observed)
        first = registry.reclaim_lease(running, owner("b"), observed, TTL)
        assert isinstance(first, Acquired)
        assert first.lease.fencing_token == 2
        clock.advance(TTL)
        second = registry.reclaim_lease(running, owner("c"), first.lease, TTL)
        assert isinstance(second, Acquired)
        assert second.lease.fencing_token == 3

    def test_racing_reclaims_have_exactly_one_winner(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        observed = self.dead_holder(registry, running)
        registry.probe = ProcProbe(read_start=lambda pid: None)
        claimants = [local_owner(f"c{i}", pid=100 + i) for i in range(4)]
        results: list[Any] = [None] * len(claimants)
        barrier = threading.Barrier(len(claimants))

        def race(index: int) -> None:
            barrier.wait()
            try:
                results[index] = registry.reclaim_lease(running, claimants[index], observed, TTL)
            except BaseException as error:  # recorded, asserted below
                results[index] = error

        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(claimants))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert all(isinstance(r, Acquired | Busy) for r in results), results
        winners = [r for r in results if isinstance(r, Acquired)]
        assert len(winners) == 1
        winner = winners[0].lease
        assert winner.fencing_token == 2
        assert all(r.holder == winner for r in results if isinstance(r, Busy))
        assert registry.get_lease(running) == winner

    # -- authority matrix --------------------------------------------------------------------------

    @pytest.mark.parametrize("disposition", list(D))
    @pytest.mark.parametrize("authority", ["external_owner", "workflow_key", "reconciled_abandon"])
    def test_authority_matrix(
        self, registry: ProcessRegistry, disposition: RecoveryDisposition, authority: str
    ) -> None:
        allowed = {
            "external_owner": {D.externally_owned},
            "workflow_key": {D.rerunnable, D.owner_bound},
            "reconciled_abandon": {D.externally_owned},
        }[authority]
        granted = {
            "external_owner": CompletionAuthority.external_owner("billing"),
            "workflow_key": CompletionAuthority.workflow_key("wf-7"),
            "reconciled_abandon": CompletionAuthority.reconciled_abandon(),
        }[authority]
        registry.register(registration("p", disposition=disposition))
        registry.record_started("p", 1)

        def terminal() -> ProcessRecord:
            if authority == "reconciled_abandon":
                registry.request_abandon("p", "operator")
                return registry.record_abandoned("p", "abandon_requested", authority=granted)
            return registry.record_completed(
                "p", "exited", "exited", exit_code=0, authority=granted
            )

        if disposition in allowed:
            record = terminal()
            assert record.is_terminal
            assert registry.events("p")[-1].payload["authority"] == granted.model_dump(mode="json")
        else:
            count = len(registry.events("p")) + (authority == "reconciled_abandon")
            with pytest.raises(AuthorityRejected) as caught:
                terminal()
            assert "'p'" in str(caught.value)
            assert len(registry.events("p")) == count
            assert registry.get("p").state is ProcessState.running

    def test_reconciled_abandon_needs_a_request_and_that_reason(
        self, registry: ProcessRegistry
    ) -> None:
        reconciled = CompletionAuthority.reconciled_abandon()
        registry.register(external_registration("x"))
        registry.record_started("x", 1)
        with pytest.raises(AuthorityRejected):  # no abandon request yet
            registry.record_abandoned("x", "abandon_requested", authority=reconciled)
        registry.request_abandon("x", "operator", reason="ticket closed")
        with pytest.raises(AuthorityRejected):  # another abandon reason
            registry.record_abandoned("x", "owner_dead", authority=reconciled)
        with pytest.raises(AuthorityRejected):  # another terminal kind
            registry.record_completed("x", "failed", "failed", authority=reconciled)
        with pytest.raises(AuthorityRejected):
            registry.record_lost("x", authority=reconciled)
        record = registry.record_abandoned("x", "abandon_requested", authority=reconciled)
        assert (record.state, record.reason, record.abandon_evidence) == (
            ProcessState.abandoned,
            TerminalReason.abandon_requested,
            None,
        )

    # -- other facts -------------------------------------------------------------------------------

    def test_first_started_first_writer_wins(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        first = registry.record_first_started(running, owner("a"), 111)
        assert first.first_started is not None
        assert (first.first_started.owner, first.first_started.at_ms) == (owner("a"), 111)
        clock.advance(5)
        again = registry.record_first_started(running, owner("b"), 222)
        assert again == first
        assert self.kinds(registry, running).count("first_started") == 1

    def test_request_abandon_first_writer_wins(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        clock.advance(7)
        first = registry.request_abandon(running, "alice", reason="stuck")
        assert first.abandon_request is not None
        assert first.abandon_request.requested_by == "alice"
        assert first.abandon_request.reason == "stuck"
        assert first.abandon_request.requested_at_ms == clock.now_ms
        clock.advance(7)
        assert registry.request_abandon(running, "bob") == first
        assert self.kinds(registry, running).count("abandon_requested") == 1

    def test_request_abandon_and_set_wait_refused_on_terminal(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        registry.record_completed(running, "exited", "exited", exit_code=0, authority=KEY)
        wait = WaitState(name="ready", event_type="signal.ready", since_ms=clock.now_ms)
        with pytest.raises(AlreadyTerminal):
            registry.request_abandon(running, "alice")
        with pytest.raises(AlreadyTerminal):
            registry.set_wait(running, wait)
        assert len(registry.events(running)) == 3

    def test_waits_are_set_cleared_and_cleared_by_a_terminal(
        self, registry: ProcessRegistry, running: str, clock: FakeClock
    ) -> None:
        wait = WaitState(name="ready", event_type="signal.ready", key="k", ordinal=2, since_ms=5)
        record = registry.set_wait(running, wait)
        assert record.wait == wait
        assert registry.set_wait(running, wait) == record  # identical: no new event
        cleared = registry.clear_wait(running)
        assert cleared.wait is None
        assert registry.clear_wait(running) == cleared
        registry.set_wait(running, wait)
        done = registry.record_completed(running, "exited", "exited", exit_code=0, authority=KEY)
        assert done.wait is None
        assert self.kinds(registry, running) == [
            "registered",
            "started",
            "wait_set",
            "wait_cleared",
            "wait_set",
            "completed",
        ]

    def test_external_ref_first_wins(self, registry: ProcessRegistry, running: str) -> None:
        ref = ExternalRef(backend="k8s", id="job/42", metadata={"ns": "default", "n": [1, None]})
        record = registry.set_external_ref(running, ref)
        assert record.external_ref == ref
        assert registry.set_external_ref(running, ref) == record
        with pytest.raises(ReplayConflict):
            registry.set_external_ref(running, ExternalRef(backend="k8s", id="job/43"))
        assert self.kinds(registry, running).count("external_ref_set") == 1
        assert registry.get(running).external_ref == ref

    # -- waiting -----------------------------------------------------------------------------------

    def test_await_event_returns_first_match_strictly_after(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        first = registry.append_event(running, "signal.ready", 1, replay_key="a")
        second = registry.append_event(running, "signal.ready", 2, replay_key="b")
        assert registry.await_event(running, "signal.ready", timeout=1) == first
        assert registry.await_event(running, "signal.ready", after=first.sequence - 1) == first
        assert registry.await_event(running, "signal.ready", after=first.sequence) == second
        started = registry.await_event(running, "started", timeout=1)
        assert started.sequence == 2
        with pytest.raises(TimeoutError):
            registry.await_event(running, "signal.ready", after=second.sequence, timeout=0.05)

    def test_await_event_wakes_on_a_later_write(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        found: list[Any] = []
        waiter = threading.Thread(
            target=lambda: found.append(
                registry.await_event(running, "signal.ready", after=2, timeout=20)
            )
        )
        waiter.start()
        appended = registry.append_event(running, "signal.ready", {"x": 1}, replay_key="k")
        waiter.join(timeout=30)
        assert found == [appended]

    def test_await_terminal(self, registry: ProcessRegistry, running: str) -> None:
        with pytest.raises(TimeoutError):
            registry.await_terminal(running, timeout=0.05)
        found: list[Any] = []
        waiter = threading.Thread(
            target=lambda: found.append(registry.await_terminal(running, timeout=20))
        )
        waiter.start()
        done = registry.record_completed(running, "exited", "exited", exit_code=0, authority=KEY)
        waiter.join(timeout=30)
        assert found == [done]
        assert registry.await_terminal(running, timeout=0) == done

    # -- clock -------------------------------------------------------------------------------------

    def test_every_timestamp_comes_from_the_injected_clock(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        t0 = clock.now_ms
        registry.register(registration("p"))
        t1 = clock.advance(100)
        registry.record_started("p", started_at_ms=55)
        t2 = clock.advance(100)
        lease = self.acquire(registry, "p", owner("a"))
        t3 = clock.advance(100)
        lease = registry.renew_lease(lease, TTL)
        t4 = clock.advance(100)
        registry.request_abandon("p", "me")
        t5 = clock.advance(100)
        record = registry.record_completed("p", "exited", "exited", exit_code=0, lease=lease)
        assert record.created_at_ms == t0
        assert record.started_at_ms == 55
        assert record.updated_at_ms == record.finished_at_ms == t5
        assert record.abandon_request is not None
        assert record.abandon_request.requested_at_ms == t4
        assert [e.occurred_at_ms for e in registry.events("p")] == [t0, t1, t4, t5]
        assert (lease.claimed_at_ms, lease.expires_at_ms) == (t2, t3 + TTL)

    # -- unknown ids -------------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "call",
        [
            lambda r: r.get("nope"),
            lambda r: r.events("nope"),
            lambda r: r.events("nope", after=3),
            lambda r: r.record_started("nope", 1),
            lambda r: r.record_backgrounded("nope", 1),
            lambda r: r.request_stop("nope", "killed"),
            lambda r: r.record_completed("nope", "failed", "failed", authority=KEY),
            lambda r: r.record_lost("nope", authority=KEY),
            lambda r: r.record_abandoned("nope", "owner_drain", authority=KEY),
            lambda r: r.append_event("nope", "signal.ready", {}, replay_key="k"),
            lambda r: r.record_first_started("nope", owner(), 1),
            lambda r: r.request_abandon("nope", "me"),
            lambda r: r.set_wait("nope", WaitState(name="n", event_type="signal.n", since_ms=1)),
            lambda r: r.clear_wait("nope"),
            lambda r: r.set_external_ref("nope", ExternalRef(backend="b", id="i")),
            lambda r: r.claim_lease("nope", owner(), TTL),
            lambda r: r.get_lease("nope"),
            lambda r: r.reclaim_lease(
                "nope",
                owner(),
                Lease(
                    process_id="nope",
                    owner=owner("x"),
                    lease_token="t",
                    fencing_token=1,
                    claimed_at_ms=0,
                    expires_at_ms=1,
                ),
                TTL,
            ),
            lambda r: r.await_event("nope", "signal.ready", timeout=0.01),
            lambda r: r.await_terminal("nope", timeout=0.01),
        ],
    )
    def test_unknown_process_is_not_found(
        self, registry: ProcessRegistry, call: Callable[[ProcessRegistry], Any]
    ) -> None:
        registry.register(registration("known"))
        with pytest.raises(NotFound) as caught:
            call(registry)
        assert "nope" in str(caught.value)
        assert isinstance(caught.value, LookupError)

    # -- encoding ----------------------------------------------------------------------------------

    def test_every_event_type_round_trips_through_the_store(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        """Stored → decoded equals the original, for every Process and Session event type."""
        nested: dict[str, Any] = {
            "ü": ["ß", None, {"深": [1.5, True, -2]}],
            "empty": {},
            "none": None,
        }
        saved: dict[str, list[Any]] = {}

        def save(process: Process) -> None:
            saved.setdefault(process.process_id, []).extend(process.pending_events)
            registry._ledger.save([process], now_ms=clock.now_ms)

        def fresh(pid: str, **overrides: Any) -> Process:
            return Process.register(
                registration(pid, event_types=("signal.ready", "signal.done-1"), **overrides),
                at_ms=clock.now_ms,
            )

        main = fresh(
            "enc-main ✓",
            definition=nested,
            wake_target=SessionScope(session_id="s-1", agent_frame_id="f"),
            originator=Originator.session(SessionScope(session_id="s-1")),
        )
        now = clock.advance(3)
        main.record_started(11, at_ms=now, event_id=str(uuid.uuid4()))
        main.record_backgrounded(12, at_ms=now, event_id=None)
        main.record_ready(12, ["port:80", "output:ü"], at_ms=now)
        main.request_stop("interrupted", at_ms=now, event_id=str(uuid.uuid4()))
        main.record_first_started(local_owner("w", pid=3), 13, at_ms=now)
        main.request_abandon("ops ✓", "why: ü", at_ms=now)
        main.set_wait(
            WaitState(name="ready", event_type="signal.ready", key="κ", since_ms=now), at_ms=now
        )
        main.clear_wait(at_ms=now)
        main.set_external_ref(ExternalRef(backend="k8s", id="j/1", metadata=nested), at_ms=now)
        main.append_producer_event("signal.ready", nested, replay_key="rk-ü", at_ms=now)
        main.append_producer_event("signal.done-1", None, replay_key="rk-none", at_ms=now)
        main.clear_wake_target("s-1", at_ms=now)
        wait = InputWait(WaitKind.password, "Pässword: ", 77, "read(fd 0)")
        main.record_waiting(wait, at_ms=now)
        main.record_input(SentInput("cmd-ü", b"secret\n", redacted=True), at_ms=now)
        main.record_waiting(wait, at_ms=now)
        main.record_wait_ended(at_ms=now)
        main.record_input(SentInput("cmd-2", b"\xff\x00 ok", eof=True), at_ms=now)
        main.complete(
            "exited",
            "exited",
            exit_code=0,
            diagnostic=None,
            value=nested,
            event_id=str(uuid.uuid4()),
            authority=KEY,
            at_ms=now,
            output=OutputSummary(
                capture=True,
                host_id="h ✓",
                folder="/tmp/ü",
                limit=10,
                stdout=StreamOutput(written=30, kept=10, dropped=20),
                stopped="ENOSPC: no space",
            ),
            tails={"stdout": "aGk=", "stderr": ""},
        )
        main.record_crash_loop(5, 60.0, at_ms=now)
        main.record_resources(
            ResourceUse(
                cpu_s=1.5, peak_rss_bytes=2**31, open_files=4, threads=2, sampled_at_ms=now
            ),
            at_ms=now,
        )
        save(main)
        lost = fresh("enc-lost")
        lost.lose(diagnostic="ü lost", event_id=None, authority=KEY, at_ms=now)
        save(lost)
        service = fresh("enc-service", restart=RestartPolicy(mode="always"), attempt=1)
        service.request_service_stop("killed", at_ms=now)
        save(service)
        kept = fresh("enc-kept")
        facts = OsFacts(pid=77, pgid=77, start_time=5, host_id="h ✓")
        kept.record_started(11, at_ms=now, event_id=None, os=facts)
        kept.lose(diagnostic="kept", event_id=None, authority=KEY, at_ms=now)
        stop = StoppedOrphan(
            pid=77, reason=TerminalReason.terminated, sent=[15, 9], signal=15, survivors=[],
            by="me ✓",
        )  # fmt: skip
        kept.record_orphan_stopped(stop, at_ms=now)
        save(kept)
        abandoned = fresh("enc-abandoned")
        abandoned.abandon(
            "owner_dead",
            owner=local_owner("w", pid=3),
            evidence_at_ms=99,
            diagnostic=None,
            event_id=None,
            authority=None,
            at_ms=now,
        )
        save(abandoned)
        session = Session.open("sess ✓", at_ms=now)
        session.grant("enc-main ✓", {"kind": "command", "label": "ü"}, at_ms=now)
        session.grant("enc-lost", None, at_ms=now)
        session.revoke("enc-lost", at_ms=now)
        session_events = list(session.pending_events)
        registry._ledger.save(sessions=[session], now_ms=now)

        def stored_of(aggregate_id: uuid.UUID) -> list[Any]:
            return [
                registry._ledger.mapper.to_domain_event(s)
                for s in registry._ledger.recorder.select_events(aggregate_id)
            ]

        covered: set[type] = set()
        for pid, originals in saved.items():
            decoded = stored_of(process_uuid(pid))
            assert [type(e) for e in decoded] == [type(e) for e in originals]
            for original, back in zip(originals, decoded, strict=True):
                chained = {k: v for k, v in vars(back).items() if k != "prev_digest"}
                assert chained == vars(original), type(original).__name__
                covered.add(type(original))
            replayed = registry._ledger.load_process(pid)
            record = registry.get(pid)
            assert render_record(replayed, record.change_seq) == record
        decoded_session = stored_of(session.id)
        for original, back in zip(session_events, decoded_session, strict=True):
            assert vars(back) == vars(original)
            covered.add(type(original))
        expected = {
            value
            for owner_class in (Process, Session)
            for value in vars(owner_class).values()
            if isinstance(value, type)
            and issubclass(value, owner_class.Event)
            and "TOPIC" in vars(value)  # pinned: the ones that are stored
            and value not in (owner_class.Event, Process.Terminal, Process.Running)
        }
        assert expected - covered == set()
        assert registry.get("enc-main ✓").value == nested

    # -- resources (docs/design.md §18.10) ---------------------------------------------------------

    def test_what_a_run_used_is_recorded_once_and_kept_on_its_record(
        self, registry: ProcessRegistry
    ) -> None:
        registry.register(registration("used"))
        assert registry.get("used").resources is None
        used = ResourceUse(
            cpu_s=2.25, peak_rss_bytes=210 * 2**20, open_files=5, threads=3, sampled_at_ms=7
        )
        assert registry.record_resources("used", used).resources == used
        other = used.model_copy(update={"peak_rss_bytes": 1})
        assert registry.record_resources("used", other).resources == used  # once
        kinds = [event.kind for event in registry.events("used")]
        assert kinds == ["registered", "resources_used"]
        payload = registry.events("used")[-1].payload
        assert payload["peak_rss_bytes"] == 210 * 2**20

    # -- signals and survivors (issue #14) ---------------------------------------------------------

    def test_a_signal_nobody_sent_is_recorded_signaled_with_its_number(
        self, registry: ProcessRegistry, running: str
    ) -> None:
        record = registry.record_completed(
            running, "signaled", "signaled", signal=11, survivors=[4242, 17], authority=KEY
        )
        assert (record.state, record.reason, record.status) == (
            ProcessState.signaled,
            TerminalReason.signaled,
            ProcessStatus.failed,
        )
        assert (record.exit_code, record.signal, record.survivors) == (None, 11, [17, 4242])
        assert registry.get(running) == record
        completed = registry.events(running)[-1]
        assert (completed.payload["signal"], completed.payload["survivors"]) == (11, [17, 4242])
        assert [r.id for r in registry.list_processes({"status": "failed"})] == [running]
        # An identical retry (survivors in another order) appends nothing.
        again = registry.record_completed(
            running, "signaled", "signaled", signal=11, survivors=[17, 4242], authority=KEY
        )
        assert again == record
        assert len(registry.events(running)) == 3
        registry.rebuild()
        assert registry.get(running) == record

    @pytest.mark.parametrize(("state", "signal"), [("terminated", 15), ("killed", 9)])
    def test_a_requested_stop_keeps_the_signal_that_ended_it(
        self, registry: ProcessRegistry, running: str, state: str, signal: int
    ) -> None:
        registry.request_stop(running, state)
        record = registry.record_completed(running, state, state, signal=signal, authority=KEY)
        assert (record.state.value, record.signal, record.status) == (
            state,
            signal,
            ProcessStatus.cancelled,
        )

    @pytest.mark.parametrize(
        ("state", "fields", "field"),
        [
            ("signaled", {}, "signal"),
            ("signaled", {"signal": 65}, "signal"),
            ("signaled", {"signal": 9, "exit_code": 137}, "exit_code"),
            ("exited", {"exit_code": 0, "signal": 15}, "signal"),
            ("killed", {"survivors": [0]}, "survivors"),
        ],
    )
    def test_signal_and_survivor_rules_name_the_field_and_append_nothing(
        self, registry: ProcessRegistry, running: str, state: str, fields: Any, field: str
    ) -> None:
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            registry.record_completed(running, state, state, authority=KEY, **fields)
        assert caught.value.field == field
        assert len(registry.events(running)) == 2
        assert registry.get(running).state is ProcessState.running

    def test_signaled_is_not_reachable_from_starting(self, registry: ProcessRegistry) -> None:
        registry.register(registration("never-ran"))
        with pytest.raises(InvalidTransition):
            registry.record_completed("never-ran", "signaled", "signaled", signal=9, authority=KEY)
        assert self.kinds(registry, "never-ran") == ["registered"]

    # -- tamper evidence (issue #13) --------------------------------------------------------------

    @staticmethod
    def stored_versions(registry: ProcessRegistry, process_id: str) -> list[int]:
        """The versions of the process's stored events, read raw (``events`` refuses a log
        that does not verify)."""
        store = registry._store
        key: Any = store.dialect.originator_key(process_uuid(process_id))
        with store.read() as tx:
            rows = tx.execute(
                f"SELECT originator_version FROM {store.events_table} WHERE originator_id=? "
                "ORDER BY originator_version",
                (key,),
            ).all()
        return [int(row["originator_version"]) for row in rows]

    def edit_registration(self, registry: ProcessRegistry, process_id: str) -> None:
        """Rewrite the stored Registered event's argv, leaving its hash (raw SQL)."""
        store = registry._store
        key: Any = store.dialect.originator_key(process_uuid(process_id))
        where = "WHERE originator_id=? AND originator_version=1"
        with store.write() as tx:
            row = tx.execute(f"SELECT state FROM {store.events_table} {where}", (key,)).one()
            state = bytes(row["state"])
            assert b'"/bin/sleep"' in state
            edited = state.replace(b'"/bin/sleep"', b'"/bin/evil"')
            tx.execute(f"UPDATE {store.events_table} SET state=? {where}", (edited, key))
            assert tx.rowcount == 1

    def test_an_edited_registration_is_store_corrupt_when_loaded(
        self, registry: ProcessRegistry
    ) -> None:
        for pid in ("healthy", "tampered"):
            registry.register(registration(pid))
            registry.record_started(pid, 1)
        self.edit_registration(registry, "tampered")
        for write in (
            lambda: registry.request_stop("tampered", "killed"),
            lambda: registry.record_completed(
                "tampered", "exited", "exited", exit_code=0, authority=KEY
            ),
        ):
            with pytest.raises(StoreCorrupt) as caught:
                write()
            assert caught.value.process_id == "tampered"
            assert "registration does not match its hash" in str(caught.value)
        assert self.stored_versions(registry, "tampered") == [1, 2]  # nothing appended
        with pytest.raises(StoreCorrupt, match=r"'tampered'.*does not verify"):
            registry.events("tampered")  # its log is not served either (§13.1)
        # Every other process stays writable.
        assert registry.request_stop("healthy", "killed").stop_requested == ["killed"]

    def corrupt_event(self, registry: ProcessRegistry, process_id: str, version: int) -> None:
        """Overwrite one stored event's state with bytes that are not JSON (raw SQL)."""
        store = registry._store
        aggregate_id = process_uuid(process_id)
        key: Any = store.dialect.originator_key(aggregate_id)
        with store.write() as tx:
            tx.execute(
                f"UPDATE {store.events_table} SET state=? "
                "WHERE originator_id=? AND originator_version=?",
                (b"\x00garbage{", key, version),
            )
            assert tx.rowcount == 1

    def test_corrupt_stored_event_is_a_store_error_naming_the_process(
        self, registry: ProcessRegistry
    ) -> None:
        for pid in ("healthy", "broken"):
            registry.register(registration(pid))
            registry.record_started(pid, 1)
        self.corrupt_event(registry, "broken", 2)
        with pytest.raises(StoreError) as caught:
            registry.events("broken")
        assert "broken" in str(caught.value)
        with pytest.raises(StoreError) as caught:
            registry.request_stop("broken", "killed")
        assert "broken" in str(caught.value)
        # every other process stays readable and writable
        assert [e.kind for e in registry.events("healthy")] == ["registered", "started"]
        assert registry.request_stop("healthy", "killed").stop_requested == ["killed"]
        registry.register(registration("later"))
        assert registry.get("later").state is ProcessState.starting

    def test_corrupt_stored_record_is_a_store_error_naming_the_process(
        self, registry: ProcessRegistry
    ) -> None:
        for pid in ("healthy", "broken"):
            registry.register(registration(pid))
        store = registry._store
        with store.write() as tx:
            tx.execute(
                f"UPDATE {store.table('records')} SET record=? WHERE process_id=?",
                ('{"id": "broken"', "broken"),
            )
        with pytest.raises(StoreError) as caught:
            registry.get("broken")
        assert "broken" in str(caught.value)
        assert registry.get("healthy").id == "healthy"
