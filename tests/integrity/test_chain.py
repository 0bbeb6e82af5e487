"""The hash chain (docs/design.md §13.1): every process event after the first stores the digest
of its predecessor as stored, and ``heads`` holds the digest of the last one, written in the
same transaction as each append. The link is the store's: callers never see it."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from procledger import ExternalRef, ProcessRegistry, WaitState, open_registry
from procledger.application.unit_of_work import event_digest
from procledger.testing import FakeClock
from registry.conformance import KEY, owner, registration

from ._raw import Raw


def _links(raw: Raw, process_id: str) -> list[tuple[int, str, bytes]]:
    rows = raw.run(
        f"SELECT originator_version, topic, state FROM {raw.events} WHERE originator_id=? "
        "ORDER BY originator_version",
        (raw.key(process_id),),
    )
    return [(int(v), str(t), bytes(s)) for v, t, s in rows]


def assert_chained(raw: Raw, process_id: str) -> None:
    """Each event links to the one before it and the head names the last one."""
    events = _links(raw, process_id)
    assert "prev_digest" not in orjson.loads(events[0][2])
    for (version, topic, state), (_, _, following) in itertools.pairwise(events):
        assert orjson.loads(following)["prev_digest"] == event_digest(topic, version, state)
    version, topic, state = events[-1]
    head = raw.run(
        f"SELECT version, digest FROM {raw.table('heads')} WHERE process_id=?", (process_id,)
    )
    assert head == [(version, event_digest(topic, version, state))]


def test_every_write_path_extends_the_chain_and_moves_the_head(
    registry: ProcessRegistry, url: str
) -> None:
    registry.register(registration("p", wake_target={"session_id": "s"}))
    registry.record_started("p", 1)
    registry.append_event("p", "signal.ready", {"n": 1}, replay_key="k")
    registry.grant_handle("s", "p")
    registry.delete_session("s")  # clears the wake target through the saving path
    registry.record_completed("p", "exited", "exited", exit_code=0, authority=KEY)
    raw = Raw(url)
    try:
        assert [e.kind for e in registry.events("p")][-2:] == ["wake_target_cleared", "completed"]
        assert_chained(raw, "p")
    finally:
        raw.close()
    for event in registry.events("p"):
        assert "prev_digest" not in event.payload
    assert registry.verify().ok


def test_a_no_op_write_moves_nothing(registry: ProcessRegistry, url: str) -> None:
    registry.register(registration("p"))
    registry.record_started("p", 1, event_id="s")
    raw = Raw(url)
    try:
        before = raw.run(f"SELECT version, digest FROM {raw.table('heads')}")
        registry.record_started("p", 1, event_id="s")  # an identical retry
        assert raw.run(f"SELECT version, digest FROM {raw.table('heads')}") == before
    finally:
        raw.close()


_WRITES = st.lists(st.sampled_from(["event", "wait", "clear", "stop", "ref", "first"]), max_size=8)


@settings(max_examples=25)
@given(writes=_WRITES, end=st.booleans())
def test_property_any_history_verifies_and_stays_chained(writes: list[str], end: bool) -> None:
    registry = open_registry("memory://", clock=FakeClock())
    try:
        registry.register(registration("p"))
        registry.record_started("p", 1)
        for index, write in enumerate(writes):
            if write == "event":
                registry.append_event("p", "signal.ready", {"i": index}, replay_key=str(index))
            elif write == "wait":
                registry.set_wait(
                    "p",
                    WaitState(name="ready", event_type="signal.ready", key=str(index), since_ms=1),
                )
            elif write == "clear":
                registry.clear_wait("p")
            elif write == "stop":
                registry.request_stop("p", "terminated")
            elif write == "ref":
                registry.set_external_ref("p", ExternalRef(backend="b", id="i"))
            else:
                registry.record_first_started("p", owner("o"), 5)
        if end:
            registry.record_completed("p", "exited", "exited", exit_code=1, authority=KEY)
        report = registry.verify()
        assert report.ok, report.problems
        assert report.unchained == []
    finally:
        registry.close()
