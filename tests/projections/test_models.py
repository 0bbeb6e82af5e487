"""The projection value types on their own: cursor, filter decoding, handle summary JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from procledger import HandleDescriptor, ProcessStatus
from procledger.domain.errors import FilterError, ProcledgerError
from procledger.projections import (
    ChangeCursor,
    HandleSummary,
    ProcessListFilter,
    PruneReport,
    SessionDeleteReport,
)

# -- ChangeCursor -------------------------------------------------------------------------------


def test_cursor_serialises_as_the_integer() -> None:
    cursor = ChangeCursor(5)
    assert cursor.model_dump_json() == "5"
    assert cursor.model_dump() == 5
    assert json.loads(cursor.model_dump_json()) == 5
    assert ChangeCursor.model_validate_json("5") == cursor
    assert ChangeCursor.model_validate(5) == cursor
    assert ChangeCursor(value=5) == cursor
    assert int(cursor) == 5
    assert str(cursor) == "5"
    assert repr(cursor) == "ChangeCursor(5)"


def test_initial_cursor_is_zero_and_cursors_order() -> None:
    assert ChangeCursor.initial() == ChangeCursor(0)
    assert ChangeCursor.initial().value == 0
    assert ChangeCursor(1) < ChangeCursor(2) <= ChangeCursor(2)
    assert ChangeCursor(3) > ChangeCursor(2)
    assert hash(ChangeCursor(4)) == hash(ChangeCursor(4))


@pytest.mark.parametrize("bad", [-1, True, "5", 1.5, None])
def test_cursor_rejects_what_is_not_a_position(bad: Any) -> None:
    with pytest.raises(ValidationError):
        ChangeCursor.model_validate(bad)


def test_cursor_is_frozen() -> None:
    cursor = ChangeCursor(1)
    with pytest.raises(ValidationError):
        cursor.value = 2  # type: ignore[misc]


# -- ProcessListFilter.decode -------------------------------------------------------------------


def test_decode_defaults_to_running() -> None:
    assert ProcessListFilter.decode({}) == ProcessListFilter()
    assert ProcessListFilter.decode({}).status == "running"
    assert ProcessListFilter.decode(None).status == "running"


def test_decode_accepts_every_key() -> None:
    decoded = ProcessListFilter.decode(
        {
            "status": "any",
            "waiting": False,
            "originator_scope_id": "host",
            "identity_kind": "command",
            "identity_label": "make",
            "definition": {"step": [1, 2]},
            "created_at_start_ms": 10,
            "created_at_end_ms": 20,
        }
    )
    assert decoded.status == "any"
    assert decoded.waiting is False
    assert decoded.definition == {"step": [1, 2]}
    assert decoded.filters_definition
    assert (decoded.created_at_start_ms, decoded.created_at_end_ms) == (10, 20)


@pytest.mark.parametrize("status", [*(s.value for s in ProcessStatus), "any"])
def test_decode_accepts_each_status(status: str) -> None:
    assert ProcessListFilter.decode({"status": status}).status == status


def test_definition_null_is_a_filter_but_absence_is_not() -> None:
    assert ProcessListFilter.decode({"definition": None}).filters_definition
    assert not ProcessListFilter.decode({}).filters_definition


@pytest.mark.parametrize(
    ("mapping", "key"),
    [
        ({"bogus": 1}, "bogus"),
        ({"status": "running", "limit": 5}, "limit"),
        ({"status": "done"}, "status"),
        ({"status": None}, "status"),
        ({"status": 1}, "status"),
        ({"waiting": "yes"}, "waiting"),
        ({"waiting": 1}, "waiting"),
        ({"waiting": None}, "waiting"),
        ({"originator_scope_id": 5}, "originator_scope_id"),
        ({"identity_kind": None}, "identity_kind"),
        ({"identity_label": ["make"]}, "identity_label"),
        ({"created_at_start_ms": True}, "created_at_start_ms"),
        ({"created_at_start_ms": "10"}, "created_at_start_ms"),
        ({"created_at_end_ms": 1.5}, "created_at_end_ms"),
        ({"definition": {1, 2}}, "definition"),
    ],
)
def test_decode_errors_name_the_key(mapping: dict[str, Any], key: str) -> None:
    with pytest.raises(FilterError) as caught:
        ProcessListFilter.decode(mapping)
    assert caught.value.key == key
    assert repr(key) in str(caught.value)
    assert isinstance(caught.value, ProcledgerError)
    assert isinstance(caught.value, ValueError)


def test_decode_rejects_a_non_mapping() -> None:
    with pytest.raises(FilterError):
        ProcessListFilter.decode(["status"])  # type: ignore[arg-type]


def test_filter_model_is_frozen_and_closed() -> None:
    with pytest.raises(ValidationError):
        ProcessListFilter(colour="red")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        ProcessListFilter().status = "any"  # type: ignore[misc]


# -- HandleSummary and reports -------------------------------------------------------------------


def test_handle_summary_json_has_exactly_the_contract_keys() -> None:
    summary = HandleSummary(
        process_id="p-1",
        descriptor=HandleDescriptor(kind="command", label=None),
        status=ProcessStatus.cancelled,
    )
    assert json.loads(summary.model_dump_json()) == {
        "__handle__": "process",
        "id": "p-1",
        "process_id": "p-1",
        "descriptor": {"kind": "command", "label": None},
        "status": "cancelled",
    }
    assert summary.id == "p-1"
    with_definition = summary.model_copy(update={"definition": {"step": 1}})
    assert json.loads(with_definition.model_dump_json())["definition"] == {"step": 1}


def test_handle_summary_round_trips_through_its_json() -> None:
    summary = HandleSummary(
        process_id="p",
        descriptor=HandleDescriptor(kind="job", label="nightly"),
        status=ProcessStatus.running,
        definition=[1, "two"],
    )
    assert HandleSummary.model_validate_json(summary.model_dump_json()) == summary
    with pytest.raises(ValidationError):
        HandleSummary.model_validate({**summary.model_dump(), "__handle__": "file"})


def test_reports_have_the_contract_fields() -> None:
    assert set(SessionDeleteReport.model_fields) == {
        "session_id",
        "revoked_handle_count",
        "deleted_wake_count",
        "orphaned_process_ids",
        "preserved_process_ids",
    }
    assert set(PruneReport.model_fields) == {"processes", "events"}
