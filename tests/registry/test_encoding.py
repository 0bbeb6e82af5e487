"""Property: any JSON value a caller hands the registry comes back exactly (orjson encoding).

The conformance suite round-trips every event type through each store; this adds breadth on
memory:// — nested objects and arrays, None, unicode keys and values, 64-bit integers, floats —
for the places where callers supply JSON: producer payloads, completion values, external refs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procledger import ExternalRef, ProcessRegistry, open_registry
from procledger.domain.process import process_uuid
from procledger.domain.rendering import render_record

from .conformance import KEY, registration

_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_SCALARS = (
    st.none()
    | st.booleans()
    | _INT64
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

_ids = itertools.count()


@pytest.fixture(scope="module")
def registry() -> Iterator[ProcessRegistry]:
    opened = open_registry("memory://")
    try:
        yield opened
    finally:
        opened.close()


def _started(registry: ProcessRegistry) -> str:
    pid = f"enc-{next(_ids)}"
    registry.register(registration(pid))
    registry.record_started(pid, 1)
    return pid


@settings(max_examples=60)
@given(payload=JSON, value=JSON, metadata=JSON)
def test_caller_json_round_trips(
    registry: ProcessRegistry, payload: Any, value: Any, metadata: Any
) -> None:
    pid = _started(registry)
    event = registry.append_event(pid, "signal.ready", payload, replay_key="k")
    assert (event.payload, event.replay_key) == (payload, "k")
    assert registry.events(pid)[-1] == event
    registry.set_external_ref(pid, ExternalRef(backend="b", id="i", metadata=metadata))
    record = registry.record_completed(
        pid, "exited", "exited", exit_code=0, value=value, authority=KEY
    )
    assert record.value == value
    assert record.external_ref is not None
    assert record.external_ref.metadata == metadata
    assert registry.get(pid) == record
    replayed = render_record(registry._ledger.load_process(pid), record.change_seq)
    assert replayed == record
    stored = registry._ledger.recorder.select_events(process_uuid(pid))
    for item in stored:
        decoded = registry._ledger.mapper.to_domain_event(item)
        assert registry._ledger.mapper.to_stored_event(decoded).state == item.state
