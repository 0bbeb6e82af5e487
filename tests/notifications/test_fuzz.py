"""Fuzzed JSON never reaches the journal, and the error names the first failing check.

The expected field comes from an independent oracle written from docs/design.md §4 (not from the
code under test): an extra key first, then command_id, session_id, loop_id, process_handle, and
the (state, reason) pair.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from procledger import ProcessRegistry
from procledger.domain.errors import ProcessLifecycleValidationError
from procledger.domain.notification import ProcessCompletionNotification as N
from procledger.domain.vocabulary import ProcessState, TerminalReason
from procledger.notifications import Notifier

from ._support import FIELDS, NOTIFICATION_PAIRS, ZERO_UUID
from .conftest import Opener

SESSION = uuid.UUID("5e551011-0000-4000-8000-000000000001")
LOOP = uuid.UUID("1007b000-0000-4000-8000-000000000002")
_HANDLE = re.compile(r"[A-Za-z0-9_-]{1,128}")


def _good_uuid(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return uuid.UUID(value).int != 0
    except ValueError:
        return False


def expected_field(data: dict[str, Any]) -> str | None:
    for key in data:
        if key not in FIELDS:
            return key
    for field in ("command_id", "session_id", "loop_id"):
        if not _good_uuid(data.get(field)):
            return field
    handle = data.get("process_handle")
    if not (isinstance(handle, str) and _HANDLE.fullmatch(handle)):
        return "process_handle"
    if (data.get("state"), data.get("reason")) not in NOTIFICATION_PAIRS:
        return "state_reason"
    return None


_json_junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
_bad_ids = st.one_of(st.just(ZERO_UUID), st.just(ZERO_UUID.replace("-", "")), _json_junk)
_bad_handles = st.one_of(
    st.text(alphabet="ab_-9", min_size=129, max_size=200),
    st.text(max_size=20).filter(lambda h: _HANDLE.fullmatch(h) is None),
    st.from_regex(_HANDLE, fullmatch=True).map(lambda h: h + "\n"),
    st.from_regex(_HANDLE, fullmatch=True).map(lambda h: h + "/"),
    _json_junk,
)
_good_pairs = st.sampled_from(sorted(NOTIFICATION_PAIRS))
_any_pairs = st.tuples(
    st.one_of(st.sampled_from([s.value for s in ProcessState]), _json_junk),
    st.one_of(st.sampled_from([r.value for r in TerminalReason]), _json_junk),
)
_CHECKS = (*FIELDS[:4], "state_reason")
_extra_keys = st.text(min_size=1, max_size=10).filter(lambda k: k not in FIELDS)


def _either(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    """Each field goes wrong about one time in six, so every check gets its turn first."""
    return draw(bad) if draw(st.integers(0, 5)) == 0 else draw(good)


@st.composite
def fuzzed(draw: st.DrawFn) -> dict[str, Any]:
    extras = (
        draw(st.lists(_extra_keys, min_size=1, max_size=2, unique=True))
        if draw(st.integers(0, 5)) == 0
        else []
    )
    state, reason = _either(draw, _good_pairs, _any_pairs)
    values = {
        "command_id": _either(draw, st.uuids().map(str), _bad_ids),
        "session_id": _either(draw, st.just(str(SESSION)), _bad_ids),
        "loop_id": _either(draw, st.just(str(LOOP)), _bad_ids),
        "process_handle": _either(draw, st.from_regex(_HANDLE, fullmatch=True), _bad_handles),
        "state": state,
        "reason": reason,
    }
    data: dict[str, Any] = {}
    for key in draw(st.permutations([*FIELDS, *extras])):
        if key not in values:
            data[key] = draw(_json_junk)
        elif draw(st.integers(0, 31)) != 0:  # sometimes a field is missing
            data[key] = values[key]
    field = expected_field(data)
    event(f"first failing check: {'extra key' if field and field not in _CHECKS else field}")
    return data


@settings(suppress_health_check=[HealthCheck.too_slow])  # from_regex is slow to generate
@given(data=fuzzed())
def test_fuzzed_json_names_the_first_failing_check(data: dict[str, Any]) -> None:
    raw = orjson.dumps(data)
    expected = expected_field(data)
    if expected is None:
        assert N.model_validate_json(raw).model_dump(mode="json") == {
            k: data[k] for k in FIELDS
        } | {k: str(uuid.UUID(data[k])) for k in ("command_id", "session_id", "loop_id")}
        return
    for parse in (N.model_validate_json, lambda r: N.model_validate(orjson.loads(r))):
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            parse(raw)
        assert caught.value.field == expected


class FuzzContract:
    @pytest.fixture
    def open(self) -> Opener:
        raise NotImplementedError

    @pytest.fixture
    def registry(self, open: Opener) -> ProcessRegistry:
        return open()  # once per test: hypothesis runs every example against it

    # One registry per test serves every example (examples never write to it), and the
    # inherited method runs once per store subclass: both health checks are expected here.
    @settings(
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
            HealthCheck.too_slow,
        ],
        max_examples=150,
    )
    @given(data=fuzzed())
    def test_invalid_notifications_never_reach_the_journal(
        self, registry: ProcessRegistry, data: dict[str, Any]
    ) -> None:
        notifier = Notifier(registry, SESSION)
        inbox = notifier.add_loop(LOOP)
        expected = expected_field(data)
        if expected is None:
            return  # valid: delivery is covered elsewhere; this test is about refusals
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            notifier.notify_process_completion(N.model_validate_json(orjson.dumps(data)))
        assert caught.value.field == expected
        if all(key in FIELDS for key in data):  # a constructed object carries no extra keys
            sloppy = N.model_construct(**data)
            with pytest.raises(ProcessLifecycleValidationError) as caught:
                notifier.notify_process_completion(sloppy)
            assert caught.value.field == expected
            with pytest.raises(ProcessLifecycleValidationError):
                registry.journal_append(sloppy)
        assert registry.journal_entries() == []
        assert inbox.pending() == []


class TestMemory(FuzzContract):
    @pytest.fixture
    def open(self, memory_store: Opener) -> Opener:
        return memory_store


class TestSQLite(FuzzContract):
    @pytest.fixture
    def open(self, sqlite_store: Opener) -> Opener:
        return sqlite_store


@pytest.mark.postgres
class TestPostgres(FuzzContract):
    @pytest.fixture
    def open(self, postgres_store: Opener) -> Opener:
        return postgres_store
