"""Stored events outlive the code that wrote them: the codec reads every version it knows,
upcasting old state to today's shape, and refuses state from a newer procledger rather than
misreading it. Encoding stays deterministic (the registry compares the bytes it wrote)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from eventsourcing.domain import CanMutateAggregate
from eventsourcing.persistence import StoredEvent
from hypothesis import given
from hypothesis import strategies as st

from _shared import drive, os_facts
from procledger.adapters.codec import OrjsonMapper, decode_event
from procledger.domain.errors import StoreError
from procledger.domain.input import InputWait, SentInput, WaitKind
from procledger.domain.leases import CompletionAuthority, LeaseOwner
from procledger.domain.process import Process
from procledger.domain.records import (
    ExternalRef,
    OsFacts,
    OutputSummary,
    ResourceUse,
    StoppedOrphan,
    StreamOutput,
    WaitState,
)
from procledger.domain.registration import ProcessRegistration, env_ref_for
from procledger.domain.rendering import render_record
from procledger.domain.session import Session
from procledger.domain.vocabulary import TerminalReason
from procledger.testing import LifecycleHistory, lifecycle_histories

MAPPER = OrjsonMapper()
JOB_1 = uuid.UUID("9897ed87-a79e-5f15-a2e6-be0666086fb3")
JOB_2 = uuid.UUID("64986c71-d2af-555b-a33a-49f407265d0b")
E1 = "2b1c1e1e-0000-4000-8000-000000000001"

# Bytes as procledger 0.1.0 wrote them (its OrjsonMapper, its event classes), copied verbatim.
V1_STARTED = (
    b'{"timestamp":"2023-11-14T22:13:20.200000+00:00","at_ms":1700000000200,"state":"running",'
    b'"started_at_ms":1700000000100,"event_id":"2b1c1e1e-0000-4000-8000-000000000001"}'
)
V1_BACKGROUNDED = (
    b'{"timestamp":"2023-11-14T22:13:20.400000+00:00","at_ms":1700000000400,"state":"running",'
    b'"backgrounded_at_ms":1700000000300,"event_id":null}'
)
V1_STOP_REQUESTED = (
    b'{"timestamp":"2023-11-14T22:13:20.500000+00:00","at_ms":1700000000500,"state":"running",'
    b'"reason":"terminated","event_id":null}'
)
# Two of the golden ledger's Completed events (tests/golden/ledger-0.1.0.db), byte for byte.
V1_COMPLETED_EXITED = (
    b'{"timestamp":"2023-11-14T22:13:27.020000+00:00","at_ms":1700000007020,"state":"exited",'
    b'"reason":"exited","exit_code":3,"diagnostic":null,"value":null,'
    b'"event_id":"done-exited-3:done","authority":{"authority":"workflow_key",'
    b'"key":"golden-workflow"}}'
)
V1_COMPLETED_KILLED = (
    b'{"timestamp":"2023-11-14T22:13:53.090000+00:00","at_ms":1700000033090,"state":"killed",'
    b'"reason":"killed","exit_code":null,"diagnostic":null,"value":null,'
    b'"event_id":"done-killed-killed:done","authority":{"authority":"workflow_key",'
    b'"key":"golden-workflow"}}'
)
FACTS = OsFacts(pid=4242, pgid=4242, start_time=987654, host_id="host-a")
WORKFLOW = CompletionAuthority.workflow_key("golden-workflow")


def registration(process_id: str = "job-1") -> ProcessRegistration:
    return ProcessRegistration.model_validate(
        {
            "id": process_id,
            "input": {"type": "command", "argv": ["/bin/true"]},
            "disposition": "owner_bound",
            "originator": {"type": "host", "scope": "ci"},
            "env_ref": env_ref_for({}),
            "event_types": [{"name": "signal.x"}],
            "wake_target": {"session_id": "s"},
        }
    )


def stored(originator_id: uuid.UUID, version: int, topic: str, state: bytes) -> StoredEvent:
    return StoredEvent(
        originator_id=originator_id, originator_version=version, topic=topic, state=state
    )


def registered(process_id: str) -> Process:
    process = Process.register(registration(process_id), at_ms=1_700_000_000_000)
    process.collect_events()
    return process


# -- version 1, as 0.1.0 stored it ----------------------------------------------------------------


def test_a_v1_started_event_reads_back_with_no_os_facts() -> None:
    event = MAPPER.to_domain_event(stored(JOB_1, 2, "procledger:Process.Started", V1_STARTED))
    assert isinstance(event, Process.Started)
    assert event.os is None
    assert (event.state, event.started_at_ms, event.event_id) == ("running", 1700000000100, E1)
    assert "class_version" not in vars(event)

    process = registered("job-1")
    event.mutate(process)
    record = render_record(process, change_seq=2)
    assert (record.os, record.os_pid, record.started_at_ms) == (None, None, 1700000000100)
    # The same retry 0.1.0 would have sent is still an identical replay (no event appended).
    assert not process.record_started(1700000000100, at_ms=1, event_id=E1)


def test_a_v1_backgrounded_event_reads_back_with_no_os_facts() -> None:
    topic = "procledger:Process.Backgrounded"
    event = decode_event(JOB_2, 2, topic, V1_BACKGROUNDED)
    assert isinstance(event, Process.Backgrounded)
    assert event.os is None
    process = registered("job-2")
    event.mutate(process)
    record = render_record(process, change_seq=2)
    assert record.backgrounded
    assert (record.os, record.os_pid) == (None, None)


def test_version_1_events_still_encode_to_the_bytes_0_1_0_wrote() -> None:
    process = registered("job-1")
    process.record_started(1700000000100, at_ms=1700000000200, event_id=E1)
    process.request_stop("terminated", at_ms=1700000000500, event_id=None)
    started, stop = process.collect_events()
    assert MAPPER.to_stored_event(stop).state == V1_STOP_REQUESTED
    # Started is v2 now: the v1 fields, in their old order, then the new field and the version.
    assert orjson.loads(MAPPER.to_stored_event(started).state) == {
        **orjson.loads(V1_STARTED),
        "os": None,
        "class_version": 2,
    }


@pytest.mark.parametrize(
    ("state", "exit_code", "bytes_"),
    [("exited", 3, V1_COMPLETED_EXITED), ("killed", None, V1_COMPLETED_KILLED)],
)
def test_a_v1_completed_event_reads_back_with_no_signal_and_no_survivors(
    state: str, exit_code: int | None, bytes_: bytes
) -> None:
    event = decode_event(JOB_1, 3, "procledger:Process.Completed", bytes_)
    assert isinstance(event, Process.Completed)
    assert (event.state, event.exit_code) == (state, exit_code)
    assert (event.signal, event.survivors) == (None, [])
    assert "class_version" not in vars(event)

    process = registered("job-1")
    process.record_started(1, at_ms=2, event_id=None)
    process.collect_events()
    event.mutate(process)
    record = render_record(process, change_seq=3)
    assert (record.state.value, record.exit_code) == (state, exit_code)
    assert (record.signal, record.survivors) == (None, [])
    # The retry 0.1.0 would have sent is still an identical replay, by event id and as a
    # terminal: the fingerprint of a completion without signal or survivors is 0.1.0's.
    again = {"exit_code": exit_code, "diagnostic": None, "value": None, "authority": WORKFLOW}
    assert not process.complete(state, state, event_id=event.event_id, at_ms=5, **again)
    assert not process.complete(state, state, event_id=None, at_ms=5, **again)
    assert process.collect_events() == []
    # Encoding the upcast event writes today's shape: 0.1.0's fields, then the new ones.
    assert orjson.loads(MAPPER.to_stored_event(event).state) == {
        **orjson.loads(bytes_),
        "signal": None,
        "survivors": [],
        "class_version": 2,
    }


# -- version 2 --------------------------------------------------------------------------------


def test_a_v2_completed_event_round_trips_with_its_signal_and_survivors() -> None:
    process = registered("job-1")
    process.record_started(1, at_ms=2, event_id=None)
    process.complete(
        "signaled", "signaled", exit_code=None, diagnostic=None, value=None, event_id=E1,
        authority=None, at_ms=3, signal=11, survivors=[900, 12],
    )  # fmt: skip
    _, event = process.collect_events()
    first = MAPPER.to_stored_event(event)
    state = orjson.loads(first.state)
    assert list(state)[-3:] == ["signal", "survivors", "class_version"]
    assert (state["signal"], state["survivors"], state["class_version"]) == (11, [12, 900], 2)
    decoded = MAPPER.to_domain_event(first)
    assert vars(decoded) == vars(event)
    assert MAPPER.to_stored_event(decoded).state == first.state
    replayed = registered("job-1")
    replayed.record_started(1, at_ms=2, event_id=None)
    decoded.mutate(replayed)
    record = render_record(replayed, change_seq=3)
    assert (record.state.value, record.signal, record.survivors) == ("signaled", 11, [12, 900])


@pytest.mark.parametrize("facts", [FACTS, None])
def test_a_v2_started_event_round_trips(facts: OsFacts | None) -> None:
    process = registered("job-1")
    process.record_started(1700000000100, at_ms=1700000000200, event_id=E1, os=facts)
    (event,) = process.collect_events()
    first = MAPPER.to_stored_event(event)
    state = orjson.loads(first.state)
    assert list(state)[-2:] == ["os", "class_version"]
    assert state["class_version"] == 2
    decoded = MAPPER.to_domain_event(first)
    assert vars(decoded) == vars(event)
    assert MAPPER.to_stored_event(decoded).state == first.state

    replayed = registered("job-1")
    decoded.mutate(replayed)
    assert render_record(replayed, change_seq=1).os == facts


def test_a_v2_backgrounded_event_round_trips() -> None:
    process = registered("job-2")
    process.record_backgrounded(5, at_ms=6, event_id=None, os=FACTS)
    (event,) = process.collect_events()
    decoded = MAPPER.to_domain_event(MAPPER.to_stored_event(event))
    assert vars(decoded) == vars(event)
    assert decoded.os == FACTS.model_dump(mode="json")


# -- refused ------------------------------------------------------------------------------------


def with_version(state: bytes, version: Any) -> bytes:
    return orjson.dumps({**orjson.loads(state), "class_version": version})


@pytest.mark.parametrize(
    ("topic", "state"),
    [
        ("procledger:Process.Started", V1_STARTED),
        ("procledger:Process.StopRequested", V1_STOP_REQUESTED),
        ("procledger:Process.Completed", V1_COMPLETED_EXITED),
    ],
)
def test_an_event_from_a_newer_procledger_is_a_store_error(topic: str, state: bytes) -> None:
    with pytest.raises(StoreError, match="written by a newer procledger") as caught:
        MAPPER.to_domain_event(stored(JOB_1, 2, topic, with_version(state, 99)))
    assert str(JOB_1) in str(caught.value)
    assert topic in str(caught.value)
    assert "class_version 99" in str(caught.value)
    with pytest.raises(StoreError, match="newer procledger"):
        decode_event(JOB_1, 2, topic, with_version(state, 99))


@pytest.mark.parametrize("version", [0, -1, "2", True, 2.0, None])
def test_a_malformed_class_version_is_a_store_error(version: Any) -> None:
    state = with_version(V1_STARTED, version)
    with pytest.raises(StoreError, match="invalid class_version"):
        MAPPER.to_domain_event(stored(JOB_1, 2, "procledger:Process.Started", state))


# -- every event class ---------------------------------------------------------------------------


def stored_event_classes() -> set[type[Any]]:
    """Every event class with a pinned topic, bar the bases: what the store can hold
    (eventsourcing's own ``Created``, which has no topic of ours, is never triggered)."""
    found: set[type[Any]] = set()
    for aggregate in (Process, Session):
        for value in vars(aggregate).values():
            if isinstance(value, type) and issubclass(value, CanMutateAggregate):
                found.update([value] if "TOPIC" in vars(value) else [])
    bases = {Process.Event, Process.Terminal, Process.Running, Session.Event}
    return found - bases


def test_every_stored_event_class_declares_its_version() -> None:
    classes = stored_event_classes()
    assert len(classes) == 28
    undeclared = [cls.__qualname__ for cls in classes if "class_version" not in vars(cls)]
    assert undeclared == []
    versions = {cls.__qualname__: vars(cls)["class_version"] for cls in classes}
    assert {name for name, version in versions.items() if version != 1} == {
        "Process.Started",
        "Process.Backgrounded",
        "Process.Completed",
    }
    # The codec can bring every older version up: each step's upcast exists.
    for cls in classes:
        for version in range(1, cls.class_version):
            assert callable(getattr(cls, f"upcast_v{version}_v{version + 1}"))


def every_fact(process: Process, payload: Any) -> None:
    """One of each non-lifecycle event (the first one, while the process is not terminal)."""
    process.record_first_started(LeaseOwner.local_process("owner"), 2, at_ms=2)
    process.request_abandon("someone", None, at_ms=3)
    process.set_external_ref(ExternalRef(backend="b", id="i", metadata=payload), at_ms=4)
    process.set_wait(WaitState(name="n", event_type="signal.x", since_ms=5), at_ms=5)
    process.clear_wait(at_ms=6)
    process.append_producer_event("signal.x", payload, replay_key="k", at_ms=7)
    process.clear_wake_target("s", at_ms=8)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


def round_trip(events: list[Any]) -> set[type[Any]]:
    for event in events:
        first = MAPPER.to_stored_event(event)
        decoded = MAPPER.to_domain_event(first)
        assert type(decoded) is type(event)
        assert vars(decoded) == vars(event)
        assert MAPPER.to_stored_event(decoded).state == first.state
    return {type(event) for event in events}


@given(lifecycle_histories(), st.one_of(st.none(), os_facts), json_values, st.booleans())
def test_every_event_round_trips_through_the_codec(
    history: LifecycleHistory, facts: OsFacts | None, payload: Any, facts_first: bool
) -> None:
    document = history.registration.model_dump(mode="json")
    document["event_types"] = [{"name": "signal.x"}]
    document["wake_target"] = {"session_id": "s"}
    process = Process.register(ProcessRegistration.model_validate(document), at_ms=1)
    if facts_first:
        every_fact(process, payload)
    drive(process, history, facts)
    session = Session.open("s", at_ms=1)
    session.grant(history.registration.id, {"kind": "k", "label": None}, at_ms=2)
    session.revoke(history.registration.id, at_ms=3)
    round_trip([*process.collect_events(), *session.collect_events()])


OUTPUT = OutputSummary(
    capture=True,
    host_id="host-a",
    folder="/tmp/x",
    limit=1024,
    stdout=StreamOutput(written=3000, kept=1000, dropped=2000),
    stopped="ENOSPC: No space left on device",
)


def service_and_orphan_facts() -> list[Any]:
    """A stop of a whole service (on its first attempt) and a kept orphan stopped."""
    document = registration("cover-service").model_dump(mode="json")
    document |= {"restart": {"mode": "always"}, "attempt": 1}
    service = Process.register(ProcessRegistration.model_validate(document), at_ms=1)
    service.request_service_stop("terminated", at_ms=2)
    kept = registered("cover-kept")
    kept.record_started(1, at_ms=2, event_id=None, os=FACTS)
    kept.lose(diagnostic="kept", event_id=None, authority=None, at_ms=3)
    stop = StoppedOrphan(
        pid=FACTS.pid, reason=TerminalReason.killed, sent=[9], signal=9, survivors=[7], by="me"
    )
    kept.record_orphan_stopped(stop, at_ms=4)
    return [*service.collect_events(), *kept.collect_events()]


def test_every_event_class_round_trips() -> None:
    """A fixed script that reaches every class, so a new class cannot slip past the property
    above because its strategies never produce it."""
    process = Process.register(registration("cover"), at_ms=1)
    every_fact(process, {"k": [1]})
    process.record_started(1, at_ms=2, event_id=None, os=FACTS)
    process.record_backgrounded(3, at_ms=4, event_id=None, os=FACTS)
    process.record_ready(4, ["port:80"], at_ms=4)
    process.request_stop("terminated", at_ms=5, event_id=None)
    process.record_waiting(InputWait(WaitKind.prompt, ">>> ", 1, "pselect6"), at_ms=6)
    process.record_wait_ended(at_ms=6)
    process.record_input(SentInput("c-1", b"print(1)\n", eof=True), at_ms=7)
    events = process.collect_events()
    terminals = {
        "completed": lambda p: p.complete(
            "exited", "exited", exit_code=0, diagnostic=None, value=None,
            event_id=None, authority=None, at_ms=9, output=OUTPUT, tails={"stdout": "aGk="},
        ),
        "lost": lambda p: p.lose(diagnostic="x", event_id=None, authority=None, at_ms=9),
        "abandoned": lambda p: p.abandon(
            "abandon_requested", owner=LeaseOwner.local_process("o"), evidence_at_ms=None,
            diagnostic=None, event_id=None, authority=None, at_ms=9,
        ),
    }  # fmt: skip
    for name, terminal in terminals.items():
        other = registered(f"cover-{name}")
        other.record_started(1, at_ms=2, event_id=None)
        terminal(other)
        other.record_crash_loop(5, 60.0, at_ms=10)
        used = ResourceUse(
            cpu_s=0.5, peak_rss_bytes=2**28, open_files=3, threads=1, sampled_at_ms=10
        )
        other.record_resources(used, at_ms=10)
        events += other.collect_events()
    events += service_and_orphan_facts()
    session = Session.open("s", at_ms=1)
    session.grant("cover", None, at_ms=2)
    session.revoke("cover", at_ms=3)
    covered = round_trip([*events, *session.collect_events()])
    missing = {cls.__qualname__ for cls in stored_event_classes() - covered}
    assert missing == set()
