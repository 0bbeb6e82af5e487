"""ProcessCompletionNotification: ordered validation, unwrapped errors, the six-key JSON form."""

from __future__ import annotations

import itertools
import re
import uuid
from typing import Any

import orjson
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from procledger.domain.errors import ProcessLifecycleValidationError
from procledger.domain.lifecycle import lifecycle_table
from procledger.domain.notification import ProcessCompletionNotification as N
from procledger.domain.vocabulary import ProcessState, TerminalReason

from ._support import FIELDS, NOTIFICATION_PAIRS, ZERO_UUID, fields

# -- the accepted rows ------------------------------------------------------------------------


@pytest.mark.parametrize(("state", "reason"), sorted(NOTIFICATION_PAIRS))
def test_every_completed_and_lost_row_is_accepted(state: str, reason: str) -> None:
    n = N(**fields(state=state, reason=reason))
    assert (n.state, n.reason) == (ProcessState(state), TerminalReason(reason))


_OTHER_PAIRS = sorted(
    (s.value, r.value)
    for s, r in itertools.product(ProcessState, TerminalReason)
    if (s.value, r.value) not in NOTIFICATION_PAIRS
)


@pytest.mark.parametrize(("state", "reason"), _OTHER_PAIRS)
def test_every_other_pair_is_refused_as_state_reason(state: str, reason: str) -> None:
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        N(**fields(state=state, reason=reason))
    assert caught.value.field == "state_reason"


def test_abandoned_and_non_terminal_rows_of_the_table_are_refused() -> None:
    refused = [
        row
        for row in lifecycle_table()
        if row.kind.value in {"abandoned", "started", "backgrounded", "stop_requested"}
    ]
    assert {row.state.value for row in refused} >= {"abandoned", "running", "starting"}
    for row in refused:
        reason = None if row.reason is None else row.reason.value
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            N.model_validate(fields(state=row.state.value, reason=reason))
        assert caught.value.field == "state_reason", row


@pytest.mark.parametrize(
    ("state", "reason"),
    [("EXITED", "exited"), ("exited", None), (None, None), ("exited", 0), ([], {}), ("", "")],
)
def test_junk_states_and_reasons_are_state_reason(state: Any, reason: Any) -> None:
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        N.model_validate(fields(state=state, reason=reason))
    assert caught.value.field == "state_reason"


# -- ids and handles ----------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["command_id", "session_id", "loop_id"])
@pytest.mark.parametrize(
    "bad", [ZERO_UUID, uuid.UUID(int=0), "not-a-uuid", "", None, 17, b"\x00" * 16]
)
def test_ids_must_be_non_zero_uuids(field: str, bad: Any) -> None:
    data = fields()
    data[field] = bad
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        N.model_validate(data)
    assert caught.value.field == field


@pytest.mark.parametrize("field", ["command_id", "session_id", "loop_id"])
def test_missing_id_names_it(field: str) -> None:
    data = fields()
    del data[field]
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        N.model_validate(data)
    assert caught.value.field == field


def test_ids_accept_uuid_objects_and_strings() -> None:
    cid = uuid.uuid4()
    assert N(**fields(command_id=cid)).command_id == cid
    assert N(**fields(command_id=str(cid))).command_id == cid


@pytest.mark.parametrize(
    "handle",
    [
        "",
        "a" * 129,
        "a/b",
        "a+b",
        "a=",
        "a b",
        "a.b",
        "abc\n",
        "\nabc",
        "é",
        "a\udc80",  # a lone surrogate must not escape as UnicodeEncodeError
        "ａ",  # a full-width letter: not URL-safe ASCII
        None,
        42,
        ["abc"],
    ],
)
def test_bad_handles(handle: Any) -> None:
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        N.model_validate(fields(process_handle=handle))
    assert caught.value.field == "process_handle"


@pytest.mark.parametrize("handle", ["a", "A-z_09", "a" * 128, "-_-"])
def test_good_handles(handle: str) -> None:
    assert N(**fields(process_handle=handle)).process_handle == handle


# -- order and entry points ---------------------------------------------------------------------


def test_checks_run_in_the_contract_order() -> None:
    bad = {
        "command_id": ZERO_UUID,
        "session_id": ZERO_UUID,
        "loop_id": ZERO_UUID,
        "process_handle": "",
        "state": "running",
        "reason": None,
    }
    order = ["command_id", "session_id", "loop_id", "process_handle", "state_reason"]
    good = fields()
    for position, field in enumerate(order):
        data = dict(bad)
        for fixed in order[:position]:
            if fixed == "state_reason":
                continue
            data[fixed] = good[fixed]
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            N.model_validate(data)
        assert caught.value.field == field


def test_an_extra_key_is_reported_before_any_field_check() -> None:
    data = {"command_id": ZERO_UUID, "pid": 1234, "session_id": None}
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        N.model_validate(data)
    assert caught.value.field == "pid"
    assert "pid" in str(caught.value)


@pytest.mark.parametrize("key", ["argv", "env", "stdout", "pid", "cwd", "command"])
def test_it_never_carries_process_details(key: str) -> None:
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        N(**fields(**{key: "x"}))
    assert caught.value.field == key


def _entry_points(data: dict[str, Any]) -> list[Any]:
    return [
        lambda: N(**data),
        lambda: N.model_validate(data),
        lambda: N.model_validate_json(orjson.dumps(data)),
        lambda: N.model_validate_json(orjson.dumps(data).decode()),
        lambda: N.model_construct(**data).revalidated(),
        lambda: N.model_validate(N.model_construct(**data)),
    ]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"command_id": ZERO_UUID}, "command_id"),
        ({"session_id": "x"}, "session_id"),
        ({"loop_id": ZERO_UUID}, "loop_id"),
        ({"process_handle": "a" * 129}, "process_handle"),
        ({"state": "abandoned", "reason": "owner_dead"}, "state_reason"),
    ],
)
def test_every_entry_point_raises_the_error_unwrapped(
    overrides: dict[str, Any], field: str
) -> None:
    data = fields(**overrides)
    for call in _entry_points(data):
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            call()
        assert caught.value.field == field
        assert not isinstance(caught.value, (ValueError, pydantic.ValidationError))


def test_extra_keys_through_json_and_constructor() -> None:
    data = fields(extra="x")
    for call in _entry_points(data)[:4]:
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            call()
        assert caught.value.field == "extra"


@pytest.mark.parametrize("raw", [b"[]", b"null", b"42", b'"x"', b"{", b"", b"\xff"])
def test_json_that_is_not_an_object_is_refused(raw: bytes) -> None:
    with pytest.raises(ProcessLifecycleValidationError):
        N.model_validate_json(raw)


def test_model_construct_skips_checks_until_revalidated() -> None:
    sloppy = N.model_construct(**fields(process_handle="../etc/passwd"))
    assert sloppy.process_handle == "../etc/passwd"  # construct trusts its input ...
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        sloppy.revalidated()  # ... revalidation does not
    assert caught.value.field == "process_handle"
    missing = N.model_construct(command_id=uuid.uuid4())
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        missing.revalidated()
    assert caught.value.field == "session_id"


def test_revalidated_copy_of_a_good_construct_equals_the_validated_one() -> None:
    data = fields()
    assert N.model_construct(**N.model_validate(data).__dict__).revalidated() == N(**data)
    assert N.model_validate(N(**data)) == N(**data)


# -- the JSON form ------------------------------------------------------------------------------


def test_json_has_exactly_the_six_keys_and_round_trips() -> None:
    n = N(**fields(state="killed", reason="output_limit"))
    dumped = orjson.loads(n.model_dump_json())
    assert list(dumped) == list(FIELDS)
    assert dumped["state"] == "killed"
    assert dumped["reason"] == "output_limit"
    assert dumped["command_id"] == str(n.command_id)
    assert N.model_validate_json(n.model_dump_json()) == n
    assert set(n.model_dump()) == set(FIELDS)


def test_it_is_frozen() -> None:
    n = N(**fields())
    with pytest.raises(pydantic.ValidationError):
        n.process_handle = "other"  # type: ignore[misc]


def test_the_error_is_not_a_value_error() -> None:
    assert not issubclass(ProcessLifecycleValidationError, ValueError)


# -- properties -----------------------------------------------------------------------------------

_handle_chars = st.sampled_from("abcXYZ019_-")


@given(handle=st.text(alphabet=_handle_chars, min_size=1, max_size=128))
def test_any_url_safe_handle_up_to_128_bytes_is_accepted(handle: str) -> None:
    assert N(**fields(process_handle=handle)).process_handle == handle


@given(handle=st.text(max_size=200))
def test_handle_rule_matches_its_definition(handle: str) -> None:
    ok = re.fullmatch(r"[A-Za-z0-9_-]{1,128}", handle) is not None
    if ok:
        assert N(**fields(process_handle=handle)).process_handle == handle
    else:
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            N(**fields(process_handle=handle))
        assert caught.value.field == "process_handle"
