"""ProcessRecord and the small DTOs beside it (docs/design.md §3.3, §3.5's models, §10's JSON
forms)."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from hypothesis import given

from procledger.domain.leases import (
    Acquired,
    Busy,
    CompletionAuthority,
    Lease,
    LeaseOwner,
    LeaseTimings,
    Liveness,
)
from procledger.domain.process import Process
from procledger.domain.records import (
    MAX_DIAGNOSTIC_BYTES,
    MAX_PROCESS_HANDLE_BYTES,
    ExternalRef,
    OsFacts,
    ProcessEvent,
    ProcessRecord,
    WaitState,
)
from procledger.domain.registration import ProcessRegistration
from procledger.domain.rendering import render_record
from procledger.domain.vocabulary import ProcessState, ProcessStatus
from procledger.testing import LifecycleHistory, apply_to_process, lifecycle_histories

RECORD_KEYS = {
    "id", "registration_hash", "input", "disposition", "identity", "originator", "wake_target",
    "env_ref", "event_types", "descriptor", "state", "reason", "exit_code", "signal",
    "survivors", "diagnostic",
    "value", "status", "stop_requested", "backgrounded", "created_at_ms", "updated_at_ms",
    "started_at_ms", "finished_at_ms", "os_pid", "os", "first_started", "abandon_request",
    "abandon_evidence", "wait", "external_ref", "output", "ready_at_ms", "attempt", "attempt_of",
    "gave_up", "service_stop_requested", "readiness", "restart", "name", "digest", "port",
    "starts_at_ms", "pty", "waiting_for_input", "resources", "change_seq",
}  # fmt: skip

OWNER = LeaseOwner(owner_id="worker-1", incarnation_id="inc-1")
LOCAL = Liveness(kind="local_process", host_id="h", boot_id="b", pid=42, process_start="9")
FACTS = {"pid": 4242, "pgid": 4200, "start_time": 987654, "host_id": "host-a"}


def full_record_registration() -> ProcessRegistration:
    return ProcessRegistration.model_validate(
        {
            "id": "deploy-7",
            "input": {"type": "external", "metadata": {"title": "deploy"}},
            "disposition": "externally_owned",
            "originator": {"type": "session", "scope": {"session_id": "s", "agent_frame_id": "f"}},
            "wake_target": {"session_id": "s"},
            "event_types": [{"name": "signal.ready", "payload_schema": {"type": "object"}}],
            "descriptor": {"kind": "deploy", "label": "prod"},
            "definition": {"workflow": "release", "step": [1, 2]},
        }
    )


def full_record() -> ProcessRecord:
    """A record with every optional part filled in."""
    process = Process.register(full_record_registration(), at_ms=1_000)
    process.record_first_started(OWNER, 1_001, at_ms=1_002)
    process.record_backgrounded(
        1_003, at_ms=1_004, event_id="e-1", os=OsFacts.model_validate(FACTS)
    )
    process.request_stop("terminated", at_ms=1_005, event_id=None)
    process.request_abandon("operator", "stuck", at_ms=1_006)
    process.set_external_ref(ExternalRef(backend="k8s", id="job/7", metadata={"ns": "x"}), at_ms=7)
    process.abandon(
        "abandon_requested",
        owner=LeaseOwner(owner_id="w", incarnation_id="i", liveness=LOCAL),
        evidence_at_ms=1_008,
        diagnostic="gone ☃",
        event_id=None,
        authority=CompletionAuthority.reconciled_abandon(),
        at_ms=1_009,
    )
    return render_record(process, change_seq=99)


def test_a_record_has_exactly_the_designed_fields() -> None:
    assert set(ProcessRecord.model_fields) == RECORD_KEYS
    assert set(json.loads(full_record().model_dump_json())) == RECORD_KEYS


def test_a_full_record_round_trips_through_json() -> None:
    record = full_record()
    assert record.first_started is not None
    assert record.abandon_request is not None
    assert record.abandon_evidence is not None
    assert record.external_ref is not None
    again = ProcessRecord.model_validate_json(record.model_dump_json())
    assert again == record
    assert again.model_dump_json() == record.model_dump_json()
    assert again.status is ProcessStatus.abandoned
    assert again.is_terminal


def test_record_json_uses_the_json_forms_of_the_parts() -> None:
    data = json.loads(full_record().model_dump_json())
    assert data["input"] == {"type": "external", "metadata": {"title": "deploy"}}
    assert data["originator"] == {
        "type": "session",
        "scope": {"session_id": "s", "agent_frame_id": "f"},
    }
    assert data["identity"] == {
        "kind": "external",
        "label": "deploy",
        "definition": {"workflow": "release", "step": [1, 2]},
    }
    assert data["stop_requested"] == ["terminated"]
    assert data["state"] == "abandoned"
    assert data["reason"] == "abandon_requested"
    assert data["status"] == "abandoned"
    assert data["first_started"] == {
        "owner": {
            "owner_id": "worker-1",
            "incarnation_id": "inc-1",
            "liveness": {"kind": "opaque"},
        },
        "at_ms": 1_001,
    }
    assert data["abandon_evidence"]["owner"]["liveness"] == {
        "kind": "local_process",
        "host_id": "h",
        "boot_id": "b",
        "pid": 42,
        "process_start": "9",
    }
    assert data["abandon_request"] == {
        "requested_by": "operator",
        "requested_at_ms": 1_006,
        "reason": "stuck",
    }
    assert data["external_ref"] == {"backend": "k8s", "id": "job/7", "metadata": {"ns": "x"}}
    assert data["change_seq"] == 99


def test_a_record_without_disposition_fails_to_load() -> None:
    data = json.loads(full_record().model_dump_json())
    del data["disposition"]
    with pytest.raises(pydantic.ValidationError) as caught:
        ProcessRecord.model_validate_json(json.dumps(data))
    assert [e["loc"] for e in caught.value.errors()] == [("disposition",)]
    with pytest.raises(pydantic.ValidationError):
        ProcessRecord.model_validate(data)


@pytest.mark.parametrize("key", ["argv_env", "pid", "stdout", "lease"])
def test_a_record_with_an_unknown_key_fails_to_load(key: str) -> None:
    data = json.loads(full_record().model_dump_json())
    data[key] = 1
    with pytest.raises(pydantic.ValidationError) as caught:
        ProcessRecord.model_validate(data)
    assert caught.value.errors()[0]["loc"] == (key,)


def test_a_record_is_frozen() -> None:
    record = full_record()
    with pytest.raises(pydantic.ValidationError):
        record.state = ProcessState.running  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        record.change_seq = 1  # type: ignore[misc]


@given(lifecycle_histories())
def test_records_of_any_history_round_trip(history: LifecycleHistory) -> None:
    process = Process.register(history.registration, at_ms=5)
    for at_ms, command in enumerate(history.commands, start=6):
        assert apply_to_process(process, command, at_ms=at_ms)
    record = render_record(process, change_seq=len(history.commands) + 1)
    assert record.state is history.final_state
    assert record.status is history.final_status
    assert ProcessRecord.model_validate_json(record.model_dump_json()) == record


# -- ProcessEvent, WaitState, ExternalRef ----------------------------------------------------------


def test_process_event_shape() -> None:
    event = ProcessEvent(
        process_id="p",
        sequence=2,
        kind="signal.ready",
        payload={"port": 1},
        event_id=None,
        occurred_at_ms=5,
        replay_key="k",
    )
    assert json.loads(event.model_dump_json()) == {
        "process_id": "p",
        "sequence": 2,
        "kind": "signal.ready",
        "payload": {"port": 1},
        "event_id": None,
        "occurred_at_ms": 5,
        "replay_key": "k",
    }
    assert ProcessEvent.model_validate_json(event.model_dump_json()) == event
    lifecycle = ProcessEvent(
        process_id="p", sequence=1, kind="started", payload={}, event_id=None, occurred_at_ms=1
    )
    assert lifecycle.replay_key is None


def test_wait_state_defaults_and_json() -> None:
    wait = WaitState(name="ready", event_type="signal.ready", since_ms=3)
    assert wait.model_dump(mode="json") == {
        "kind": "signal",
        "name": "ready",
        "event_type": "signal.ready",
        "key": None,
        "ordinal": 0,
        "since_ms": 3,
    }
    assert WaitState.model_validate_json(wait.model_dump_json()) == wait


def test_external_ref_needs_a_backend_and_an_id() -> None:
    assert ExternalRef(backend="b", id="i").model_dump() == {
        "backend": "b",
        "id": "i",
        "metadata": None,
    }
    for bad in ({"backend": "", "id": "i"}, {"backend": "b", "id": ""}, {"backend": "b"}):
        with pytest.raises(pydantic.ValidationError):
            ExternalRef.model_validate(bad)


def test_the_byte_limits() -> None:
    assert MAX_DIAGNOSTIC_BYTES == 512
    assert MAX_PROCESS_HANDLE_BYTES == 128


# -- LeaseTimings ----------------------------------------------------------------------------------


def test_lease_timings_defaults() -> None:
    timings = LeaseTimings()
    assert (timings.ttl_ms, timings.renew_ms) == (30_000, 10_000)


@pytest.mark.parametrize(("ttl_ms", "renew_ms"), [(3, 1), (30_000, 10_000), (90, 30), (10, 1)])
def test_lease_timings_accept_ttl_of_three_renewals_or_more(ttl_ms: int, renew_ms: int) -> None:
    timings = LeaseTimings(ttl_ms=ttl_ms, renew_ms=renew_ms)
    assert (timings.ttl_ms, timings.renew_ms) == (ttl_ms, renew_ms)


@pytest.mark.parametrize(
    ("ttl_ms", "renew_ms"),
    [(2, 1), (29_999, 10_000), (0, 0), (3, 0), (0, 1), (-3, -1), (30_000, -1), (1, 1)],
)
def test_lease_timings_refuse_anything_else_with_value_error(ttl_ms: int, renew_ms: int) -> None:
    with pytest.raises(ValueError, match=r"ttl_ms|renew_ms"):
        LeaseTimings(ttl_ms=ttl_ms, renew_ms=renew_ms)


def test_lease_timings_take_keywords() -> None:
    with pytest.raises(TypeError):
        LeaseTimings(30_000, 10_000)  # type: ignore[misc]


# -- CompletionAuthority: a tagged union on ``authority`` ------------------------------------------


@pytest.mark.parametrize(
    ("authority", "dumped"),
    [
        (
            CompletionAuthority.external_owner("ops"),
            {"authority": "external_owner", "granted_to": "ops"},
        ),
        (CompletionAuthority.workflow_key("wf-1"), {"authority": "workflow_key", "key": "wf-1"}),
        (CompletionAuthority.reconciled_abandon(), {"authority": "reconciled_abandon"}),
    ],
)
def test_completion_authority_json_forms(
    authority: CompletionAuthority, dumped: dict[str, Any]
) -> None:
    assert authority.model_dump(mode="json") == dumped
    assert json.loads(authority.model_dump_json()) == dumped
    assert CompletionAuthority.model_validate(dumped) == authority
    assert CompletionAuthority.model_validate_json(json.dumps(dumped)) == authority


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"granted_to": "ops"},
        {"authority": "admin"},
        {"authority": "external_owner"},
        {"authority": "workflow_key"},
        {"authority": "external_owner", "granted_to": "ops", "key": "k"},
        {"authority": "workflow_key", "key": "k", "granted_to": "ops"},
        {"authority": "reconciled_abandon", "key": "k"},
        {"authority": "reconciled_abandon", "lease": "x"},
    ],
)
def test_bad_completion_authorities_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        CompletionAuthority.model_validate(bad)


# -- Liveness and LeaseOwner: tagged on ``kind``, opaque by default --------------------------------


def test_liveness_defaults_to_opaque() -> None:
    assert Liveness().model_dump(mode="json") == {"kind": "opaque"}
    assert Liveness.model_validate({}) == Liveness(kind="opaque")
    owner = LeaseOwner(owner_id="o", incarnation_id="i")
    assert owner.liveness.kind == "opaque"
    assert not owner.liveness.is_local_process
    assert json.loads(owner.model_dump_json()) == {
        "owner_id": "o",
        "incarnation_id": "i",
        "liveness": {"kind": "opaque"},
    }
    assert LeaseOwner.model_validate({"owner_id": "o", "incarnation_id": "i"}) == owner


def test_local_process_liveness_json() -> None:
    dumped = {"kind": "local_process", "host_id": "h", "boot_id": "b", "pid": 42,
              "process_start": "9"}  # fmt: skip
    assert LOCAL.model_dump(mode="json") == dumped
    assert Liveness.model_validate_json(json.dumps(dumped)) == LOCAL
    assert LOCAL.is_local_process


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "remote"},
        {"kind": "opaque", "pid": 1},
        {"pid": 1},
        {"kind": "local_process", "host_id": "h", "boot_id": "b", "pid": 1},
        {"kind": "local_process", "host_id": "h", "boot_id": "b", "process_start": "1"},
    ],
)
def test_bad_liveness_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        Liveness.model_validate(bad)


def test_lease_owner_needs_ids() -> None:
    for bad in ({"owner_id": "", "incarnation_id": "i"}, {"owner_id": "o"}):
        with pytest.raises(pydantic.ValidationError):
            LeaseOwner.model_validate(bad)


def test_same_incarnation_compares_owner_and_incarnation_only() -> None:
    a = LeaseOwner(owner_id="o", incarnation_id="i")
    assert a.same_incarnation(LeaseOwner(owner_id="o", incarnation_id="i", liveness=LOCAL))
    assert not a.same_incarnation(LeaseOwner(owner_id="o", incarnation_id="j"))
    assert not a.same_incarnation(LeaseOwner(owner_id="p", incarnation_id="i"))


def test_lease_acquired_and_busy_round_trip() -> None:
    lease = Lease(
        process_id="p",
        owner=OWNER,
        lease_token="t",
        fencing_token=3,
        claimed_at_ms=10,
        expires_at_ms=20,
    )
    assert lease.is_live(19)
    assert not lease.is_live(20)
    for value in (lease, Acquired(lease=lease), Busy(holder=lease)):
        assert type(value).model_validate_json(value.model_dump_json()) == value
    with pytest.raises(pydantic.ValidationError):
        lease.fencing_token = 4  # type: ignore[misc]


# -- OsFacts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("start_time", [0, 987654, 12.5])
def test_os_facts_json_round_trips_exactly(start_time: float) -> None:
    facts = OsFacts.model_validate({**FACTS, "start_time": start_time})
    assert facts.model_dump(mode="json") == {**FACTS, "start_time": start_time}
    assert type(facts.start_time) is type(start_time)
    assert OsFacts.model_validate_json(facts.model_dump_json()) == facts


@pytest.mark.parametrize(
    "change",
    [
        {"pid": 0},
        {"pid": True},
        {"pid": "42"},
        {"pgid": -1},
        {"start_time": -1},
        {"start_time": float("nan")},
        {"start_time": float("inf")},
        {"start_time": "9"},
        {"host_id": ""},
        {"extra": 1},
    ],
)
def test_os_facts_refuse_what_would_not_round_trip(change: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        OsFacts.model_validate({**FACTS, **change})


def test_a_record_carries_the_os_facts_of_the_event_that_made_it_running() -> None:
    process = Process.register(full_record_registration(), at_ms=1)
    process.record_started(2, at_ms=3, event_id=None, os=OsFacts.model_validate(FACTS))
    record = render_record(process, change_seq=1)
    assert record.os == OsFacts.model_validate(FACTS)
    assert record.os_pid == FACTS["pid"]
    assert ProcessRecord.model_validate_json(record.model_dump_json()) == record


def test_a_record_stored_before_os_facts_still_reads_back() -> None:
    document = full_record().model_dump(mode="json")
    del document["os"], document["os_pid"]
    legacy = ProcessRecord.model_validate(document)
    assert (legacy.os, legacy.os_pid) == (None, None)
    assert legacy == full_record().model_copy(update={"os": None, "os_pid": None})


def test_a_record_carries_the_signal_and_the_survivors_of_its_completion() -> None:
    process = Process.register(full_record_registration(), at_ms=1)
    process.record_started(2, at_ms=3, event_id=None, os=OsFacts.model_validate(FACTS))
    authority = CompletionAuthority.external_owner("ops")
    process.complete(
        "signaled",
        "signaled",
        exit_code=None,
        diagnostic=None,
        value=None,
        event_id=None,
        authority=authority,
        at_ms=4,
        signal=9,
        survivors=[77, 12],
    )
    record = render_record(process, change_seq=2)
    assert (record.state, record.signal, record.survivors) == (ProcessState.signaled, 9, [12, 77])
    assert record.status is ProcessStatus.failed
    data = json.loads(record.model_dump_json())
    assert (data["signal"], data["survivors"]) == (9, [12, 77])
    assert ProcessRecord.model_validate_json(record.model_dump_json()) == record


def test_a_record_stored_before_signals_still_reads_back() -> None:
    document = full_record().model_dump(mode="json")
    del document["signal"], document["survivors"]
    legacy = ProcessRecord.model_validate(document)
    assert (legacy.signal, legacy.survivors) == (None, [])
    assert legacy == full_record()
