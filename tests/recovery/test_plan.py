"""Properties of ``plan``, the pure disposition table of docs/design.md §3.6, over every combination
of state, disposition, first start, abandon request, stored lease, time and holder liveness."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from procledger import (
    Lease,
    LeaseOwner,
    ProcessRecord,
    ProcessState,
    RecoveryDisposition,
    open_registry,
)
from procledger import TerminalReason as R
from procledger.domain.records import AbandonRequest, OwnerStamp
from procledger.recovery import Action, plan

from ._support import T0, register

OWNER = LeaseOwner(owner_id="holder", incarnation_id="i1")
STARTER = LeaseOwner(owner_id="starter", incarnation_id="i0")


def _base_records() -> dict[str, ProcessRecord]:
    registry = open_registry("memory://")
    try:
        return {
            "engine": register(registry, "engine", "rerunnable"),
            "command": register(registry, "command", "rerunnable", argv=["true"]),
            "external": register(registry, "external", "rerunnable", external=True),
        }
    finally:
        registry.close()


BASE = _base_records()


@st.composite
def situations(draw: st.DrawFn) -> dict[str, Any]:
    input_type = draw(st.sampled_from(sorted(BASE)))
    state = draw(st.sampled_from(list(ProcessState)))
    disposition = draw(st.sampled_from(list(RecoveryDisposition)))
    started = draw(st.booleans())
    requested = draw(st.booleans())
    now = T0 + draw(st.integers(0, 10**9))
    lease = None
    if draw(st.booleans()):
        expires = now + draw(st.integers(-(10**6), 10**6))
        lease = Lease(
            process_id=input_type,
            owner=OWNER,
            lease_token="t",
            fencing_token=draw(st.integers(1, 9)),
            claimed_at_ms=expires - 1000,
            expires_at_ms=expires,
        )
    record = BASE[input_type].model_copy(
        update={
            "state": state,
            "disposition": disposition,
            "first_started": OwnerStamp(owner=STARTER, at_ms=T0) if started else None,
            "abandon_request": AbandonRequest(requested_by="op", requested_at_ms=T0)
            if requested
            else None,
        }
    )
    return {
        "record": record,
        "lease": lease,
        "now_ms": now,
        "holder_dead": draw(st.booleans()),
    }


def _plan(s: dict[str, Any]) -> Any:
    return plan(s["record"], s["lease"], now_ms=s["now_ms"], holder_dead=s["holder_dead"])


@given(situations())
def test_what_each_disposition_allows(s: dict[str, Any]) -> None:
    record: ProcessRecord = s["record"]
    lease: Lease | None = s["lease"]
    decision = _plan(s)
    live = lease is not None and lease.is_live(s["now_ms"])
    dead = lease is not None and s["holder_dead"]

    if record.state.is_terminal:
        assert decision.action is Action.skip
        return
    if decision.action is Action.run:
        assert record.disposition is not RecoveryDisposition.externally_owned
        assert record.input.type != "external"
        assert not (record.disposition is RecoveryDisposition.owner_bound and record.first_started)
        assert not live or dead  # never two live holders
        assert decision.reclaim == dead
    if decision.action is Action.abandon:
        assert record.abandon_request is not None or dead  # never on elapsed time alone
        if decision.reason is R.owner_dead:
            assert record.disposition is RecoveryDisposition.owner_bound
            assert lease is not None
            assert decision.evidence == lease.owner
            assert decision.reclaim
        elif decision.authority:
            assert record.disposition is RecoveryDisposition.externally_owned
            assert decision.evidence is None
        else:
            assert decision.reason is R.abandon_requested
            assert not live
            assert record.first_started is not None
            assert decision.evidence == record.first_started.owner


@given(situations(), st.integers(0, 10**12))
def test_time_alone_never_turns_a_skip_into_an_abandon(s: dict[str, Any], later: int) -> None:
    if s["record"].abandon_request is not None or s["holder_dead"]:
        return
    assert _plan(s).action is not Action.abandon
    assert _plan({**s, "now_ms": s["now_ms"] + later}).action is not Action.abandon


@given(situations())
def test_a_started_owner_bound_process_is_never_run(s: dict[str, Any]) -> None:
    record: ProcessRecord = s["record"]
    if record.disposition is RecoveryDisposition.owner_bound and record.first_started:
        assert _plan(s).action is not Action.run


@given(situations())
def test_externally_owned_work_is_never_claimed_by_a_lease(s: dict[str, Any]) -> None:
    record: ProcessRecord = s["record"]
    if record.disposition is RecoveryDisposition.externally_owned:
        decision = _plan(s)
        assert decision.action is not Action.run
        assert not decision.reclaim
        if decision.action is Action.abandon:
            assert decision.authority
