"""The record's JSON form is built from stored event values, not by pydantic: it must be
exactly what ``ProcessRecord`` would serialise, or rows and returned records would drift."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from procledger.domain.leases import LeaseOwner
from procledger.domain.process import Process
from procledger.domain.records import ExternalRef, WaitState
from procledger.testing import LifecycleHistory, apply_to_process, lifecycle_histories


@given(lifecycle_histories(), st.booleans(), st.integers(min_value=0, max_value=2**40))
def test_document_equals_the_validated_record_dump(
    history: LifecycleHistory, extra_facts: bool, change_seq: int
) -> None:
    process = Process.register(history.registration, at_ms=1)
    if extra_facts:
        process.record_first_started(LeaseOwner.local_process("owner"), 2, at_ms=2)
        process.request_abandon("someone", "why", at_ms=3)
        process.set_external_ref(ExternalRef(backend="b", id="i", metadata={"k": [1]}), at_ms=4)
        process.set_wait(WaitState(name="n", event_type="signal.x", since_ms=5), at_ms=5)
    for step, command in enumerate(history.commands, start=10):
        apply_to_process(process, command, at_ms=step)
    document = process.record_document(change_seq)
    assert process.to_record(change_seq).model_dump(mode="json") == document
