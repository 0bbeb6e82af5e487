"""The record has two forms, the JSON document the read model stores and the ``ProcessRecord``
a write returns; both are rendered from one field table and must agree exactly, or rows and
returned records would drift."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from _shared import drive, os_facts
from procledger.domain.leases import LeaseOwner
from procledger.domain.process import Process
from procledger.domain.records import ExternalRef, OsFacts, ProcessRecord, WaitState
from procledger.domain.rendering import (
    RECORD_FIELDS,
    record_document,
    record_forms,
    render_record,
)
from procledger.testing import LifecycleHistory, lifecycle_histories


@given(
    lifecycle_histories(),
    st.booleans(),
    st.one_of(st.none(), os_facts),
    st.integers(min_value=0, max_value=2**40),
)
def test_the_document_and_the_record_agree(
    history: LifecycleHistory, extra_facts: bool, facts: OsFacts | None, change_seq: int
) -> None:
    process = Process.register(history.registration, at_ms=1)
    if extra_facts:
        process.record_first_started(LeaseOwner.local_process("owner"), 2, at_ms=2)
        process.request_abandon("someone", "why", at_ms=3)
        process.set_external_ref(ExternalRef(backend="b", id="i", metadata={"k": [1]}), at_ms=4)
        process.set_wait(WaitState(name="n", event_type="signal.x", since_ms=5), at_ms=5)
    record_forms(process, 0)  # the registration's fields are now taken from this rendering
    drive(process, history, facts)
    document = record_document(process, change_seq)
    record = render_record(process, change_seq)
    forms = record_forms(process, change_seq)
    assert forms == (document, record)
    assert list(forms[0]) == list(document)
    assert ProcessRecord.model_validate(document) == record
    assert record.model_dump(mode="json") == document
    assert list(document) == list(ProcessRecord.model_fields)
    if process.started_at_ms is not None:
        assert record.os == facts
        assert record.os_pid == (None if facts is None else facts.pid)


def test_one_table_lists_every_record_field_in_the_models_order() -> None:
    names = [field.name for field in RECORD_FIELDS]
    assert [*names, "change_seq"] == list(ProcessRecord.model_fields)
