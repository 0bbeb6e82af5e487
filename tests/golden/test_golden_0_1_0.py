"""The ledger procledger 0.1.0 wrote must stay readable, rebuildable and writable.

``ledger-0.1.0.db`` was written once by the 0.1.0 release (``make_ledger_0_1_0.py``) and
``ledger-0.1.0.expected.json`` is what 0.1.0 read back from it. The current code must read every
field 0.1.0 read, with the same value; it may add fields (``assert_superset``), never drop or
change one. Each test works on a copy: the fixture itself is never opened.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procledger import (
    Acquired,
    CompletionAuthority,
    EventType,
    LeaseOwner,
    NotFound,
    Notifier,
    Originator,
    ProcessInput,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
    open_registry,
)

HERE = Path(__file__).resolve().parent
LEDGER = HERE / "ledger-0.1.0.db"
EXPECTED_JSON = HERE / "ledger-0.1.0.expected.json"
# The bytes 0.1.0 wrote. A mismatch means the fixture was regenerated or damaged: restore it
# from git; never update these hashes (add a new ledger beside it instead).
LEDGER_SHA256 = "c36e2a1e644f5dd7801b89c32c07c778682f6f26cb0dcdfbea2cd04db940212b"
EXPECTED_SHA256 = "60b6a19cdb74dbfb79b1df6961ee8e76569e336c94921f33f5e345ea134715eb"

KEY = CompletionAuthority.workflow_key("after-upgrade")


def rebuild(registry: ProcessRegistry) -> int:
    """Rebuild every read model from the log (the one call a refactor may move); the events
    read. The golden ledger has no damage, so nothing may be reported damaged."""
    report = registry.rebuild()
    assert report.damaged == []
    return report.applied


# -- helpers ------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:300] + "…"


def assert_superset(expected: Any, actual: Any, path: str = "$") -> None:
    """``actual`` has everything ``expected`` has, with equal values; objects may have more
    keys (additive changes), lists must have the same length, scalars must be equal."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            pytest.fail(f"{path}: expected an object, read {_short(actual)}")
        missing = sorted(set(expected) - set(actual))
        if missing:
            pytest.fail(
                f"{path}: field(s) {missing} written by 0.1.0 are no longer read "
                f"(read keys: {sorted(actual)})"
            )
        for key, value in expected.items():
            assert_superset(value, actual[key], f"{path}.{key}")
    elif isinstance(expected, list):
        if not isinstance(actual, list):
            pytest.fail(f"{path}: expected a list, read {_short(actual)}")
        if len(actual) != len(expected):
            pytest.fail(
                f"{path}: expected {len(expected)} items, read {len(actual)}\n"
                f"  expected: {_short(expected)}\n  read:     {_short(actual)}"
            )
        for index, (item, read) in enumerate(zip(expected, actual, strict=True)):
            assert_superset(item, read, f"{path}[{index}]")
    elif expected != actual or isinstance(expected, bool) != isinstance(actual, bool):
        pytest.fail(f"{path}: 0.1.0 read {_short(expected)}, now read {_short(actual)}")


def producer_events_as_read_now(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """0.1.0 read a producer event's payload wrapped as ``{"payload": P, "replay_key": K}``;
    issue #14 fixed that: the payload reads back as the producer gave it (``P``) and the key
    is a field of its own (``replay_key: K``). The one field whose shape legitimately changed,
    so 0.1.0's expectation is rewritten to today's shape here — the fixture files stay as
    0.1.0 wrote them — and every other field is still compared as a superset."""
    rewritten = []
    for event in events:
        payload = event["payload"]
        if event["kind"].startswith("signal.") and set(payload) == {"payload", "replay_key"}:
            rewritten.append(
                {**event, "payload": payload["payload"], "replay_key": payload["replay_key"]}
            )
        else:
            rewritten.append(event)
    return rewritten


def dumped(models: Any) -> Any:
    """Pydantic models (or lists of them) as the JSON 0.1.0's dump holds."""
    if isinstance(models, list):
        return [model.model_dump(mode="json") for model in models]
    return None if models is None else models.model_dump(mode="json")


def feed_pages(registry: ProcessRegistry, limit: int, cursor: int = 0) -> list[dict[str, Any]]:
    pages: list[dict[str, Any]] = []
    while True:
        records, next_cursor = registry.changes_since(cursor, limit)
        if not records:
            return pages
        cursor = int(next_cursor)
        pages.append({"records": dumped(records), "cursor": cursor})


def snapshot(registry: ProcessRegistry, expected: dict[str, Any]) -> dict[str, Any]:
    """Every record and the whole feed, as the current code reads them."""
    return {
        "records": {pid: dumped(registry.get(pid)) for pid in expected["processes"]},
        "feed": feed_pages(registry, expected["feed"]["page_limit"]),
        "handles": {
            session: dumped(registry.handles(session, {"status": "any"}))
            for session in expected["handles"]
        },
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EXPECTED_JSON.read_text())
    return data


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ProcessRegistry]:
    copy = tmp_path / "ledger-0.1.0.db"
    shutil.copyfile(LEDGER, copy)
    # An absolute path, in SQLAlchemy's form: sqlite:/// + /abs/path.db (sqlite:////abs/...).
    opened = open_registry(f"sqlite:///{copy}", create=False)
    try:
        yield opened
    finally:
        opened.close()


# -- the fixture --------------------------------------------------------------------------------


def test_the_golden_files_are_the_ones_0_1_0_wrote() -> None:
    assert sha256(LEDGER) == LEDGER_SHA256, "ledger-0.1.0.db changed: restore it from git"
    assert sha256(EXPECTED_JSON) == EXPECTED_SHA256, "the expected JSON changed: restore it"
    assert not [p for p in HERE.iterdir() if p.name.startswith(LEDGER.name + "-")]


def test_assert_superset_allows_additions_only() -> None:
    assert_superset({"a": [1, {"b": None}]}, {"a": [1, {"b": None, "new": 2}], "c": 3})
    for actual in ({"a": [1]}, {"a": [1, {}]}, {"a": [1, {"b": 0}]}, {"a": [1, {"b": None}, 3]}):
        with pytest.raises(pytest.fail.Exception, match=r"\$\.a"):
            assert_superset({"a": [1, {"b": None}]}, actual)
    with pytest.raises(pytest.fail.Exception, match="now read true"):
        assert_superset({"x": 1}, {"x": True})


# -- (a) everything 0.1.0 read is still read ----------------------------------------------------


def test_every_record_event_lease_and_grant_reads_as_0_1_0_read_it(
    registry: ProcessRegistry, expected: dict[str, Any]
) -> None:
    for pid, process in expected["processes"].items():
        assert_superset(process["record"], dumped(registry.get(pid)), f"get({pid!r})")
        events = producer_events_as_read_now(process["events"])
        assert_superset(events, dumped(registry.events(pid)), f"events({pid!r})")
        assert_superset(process["lease"], dumped(registry.get_lease(pid)), f"get_lease({pid!r})")
        assert_superset(
            process["handle_sessions"], registry.handle_sessions(pid), f"handle_sessions({pid!r})"
        )
    for pid in expected["pruned"]:
        with pytest.raises(NotFound):
            registry.get(pid)


def test_lists_feed_handles_journal_and_envs_read_as_0_1_0_read_them(
    registry: ProcessRegistry, expected: dict[str, Any]
) -> None:
    filters: dict[str, dict[str, Any] | None] = {
        "default": None,
        "any": {"status": "any"},
        "waiting": {"status": "any", "waiting": True},
        **{status: {"status": status} for status in ("completed", "cancelled", "failed")},
        "abandoned": {"status": "abandoned"},
    }
    assert set(filters) == set(expected["list_processes"])
    for name, selection in filters.items():
        ids = [record.id for record in registry.list_processes(selection)]
        assert ids == expected["list_processes"][name], f"list_processes({selection})"

    feed = expected["feed"]
    assert_superset(feed["pages"], feed_pages(registry, feed["page_limit"]), "changes_since")
    assert registry.changes_since(feed["final_cursor"], 100)[0] == []

    for session, by_status in expected["handles"].items():
        assert_superset(by_status["running"], dumped(registry.handles(session)), session)
        any_status = dumped(registry.handles(session, {"status": "any"}))
        assert_superset(by_status["any"], any_status, session)

    journal = expected["journal"]
    notifier = Notifier(registry, journal["session_id"])
    for loop, undelivered in journal["undelivered"].items():
        assert_superset(undelivered, dumped(notifier.undelivered(loop)), f"undelivered({loop})")
    entries = [
        {"seq": e.seq, "notification": dumped(e.notification), "consumed": e.consumed}
        for e in registry.journal_entries()
    ]
    assert_superset(journal["entries"], entries, "journal_entries()")
    for entry in journal["entries"]:
        found = registry.journal_get(entry["notification"]["command_id"])
        assert_superset(entry["notification"], dumped(found), "journal_get")

    for env_ref, env in expected["envs"].items():
        assert registry.load_env(env_ref) == env


# -- (b) a rebuild from the 0.1.0 log reproduces the same read models ---------------------------


def test_rebuild_reproduces_every_record_the_feed_and_the_handles(
    registry: ProcessRegistry, expected: dict[str, Any]
) -> None:
    before = snapshot(registry, expected)
    assert rebuild(registry) > 0
    after = snapshot(registry, expected)
    assert after == before
    for pid, process in expected["processes"].items():
        assert_superset(process["record"], after["records"][pid], f"rebuilt {pid!r}")
    assert_superset(expected["feed"]["pages"], after["feed"], "rebuilt feed")


# -- (c) the current code keeps writing to a 0.1.0 ledger ---------------------------------------


def test_new_writes_on_the_0_1_0_ledger(
    registry: ProcessRegistry, expected: dict[str, Any]
) -> None:
    old_cursor = expected["feed"]["final_cursor"]
    env_ref = next(iter(expected["envs"]))
    worker = LeaseOwner(owner_id="upgraded-worker", incarnation_id="upgraded-1")

    # A new process, start to completion.
    registration = ProcessRegistration(
        id="after-upgrade",
        input=ProcessInput.command(["/bin/echo", "upgraded"]),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.host(),
        env_ref=env_ref,
        event_types=[EventType(name="signal.ready")],
    )
    assert registry.register(registration).state.value == "starting"
    now = registry.now_ms()
    registry.record_first_started("after-upgrade", worker, now)
    registry.record_started("after-upgrade", now)
    registry.append_event("after-upgrade", "signal.ready", {"ok": True}, replay_key="r1")
    done = registry.record_completed(
        "after-upgrade", "exited", "exited", exit_code=0, value={"n": 1}, authority=KEY
    )
    assert (done.state.value, done.exit_code, done.status.value) == ("exited", 0, "completed")
    kinds = [event.kind for event in registry.events("after-upgrade")]
    assert kinds == ["registered", "first_started", "started", "signal.ready", "completed"]
    assert done.change_seq > old_cursor

    # A producer event on a running 0.1.0 process; a 0.1.0 replay key still deduplicates.
    engine_events = expected["processes"]["run-engine"]["events"]
    event = registry.append_event(
        "run-engine", "signal.progress", {"percent": 1}, replay_key="after-upgrade"
    )
    assert (event.sequence, event.kind) == (len(engine_events) + 1, "signal.progress")
    main_events = expected["processes"]["run-main"]["events"]
    ready = next(e for e in main_events if e["kind"] == "signal.ready")
    assert ready["payload"]["replay_key"] == "ready"
    replayed = registry.append_event(
        "run-main", "signal.ready", ready["payload"]["payload"], replay_key="ready"
    )
    [ready_now] = producer_events_as_read_now([ready])
    assert_superset(ready_now, dumped(replayed), "replayed append_event")

    # Commands 0.1.0 recorded, sent again with their event ids, are identical replays.
    started = next(e for e in main_events if e["kind"] == "started")
    registry.record_started(
        "run-main", started["payload"]["started_at_ms"], event_id=started["event_id"]
    )
    main_now = producer_events_as_read_now(main_events)
    assert_superset(main_now, dumped(registry.events("run-main")), "run-main after replays")
    exited = expected["processes"]["done-exited-3"]
    event_id = exited["events"][-1]["event_id"]
    registry.record_completed(
        "done-exited-3", "exited", "exited", exit_code=3, event_id=event_id, authority=KEY
    )
    assert len(registry.events("done-exited-3")) == len(exited["events"])
    assert_superset(exited["record"], dumped(registry.get("done-exited-3")), "replayed terminal")

    # Grants on old and new processes, next to the 0.1.0 grants.
    registry.grant_handle("session-beta", "run-engine")
    registry.grant_handle("session-beta", "after-upgrade")
    handles = {h.process_id: h for h in registry.handles("session-beta", {"status": "any"})}
    old = {h["process_id"] for h in expected["handles"]["session-beta"]["any"]}
    assert set(handles) == old | {"run-engine", "after-upgrade"}
    assert handles["after-upgrade"].status.value == "completed"

    # A running 0.1.0 process completed with a lease taken over from its expired 0.1.0 lease.
    old_lease = expected["processes"]["run-main"]["lease"]
    claimed = registry.claim_lease("run-main", worker, 60_000)
    assert isinstance(claimed, Acquired)
    assert claimed.lease.fencing_token == old_lease["fencing_token"] + 1
    stopped = registry.record_completed("run-main", "terminated", "terminated", lease=claimed.lease)
    assert (stopped.state.value, stopped.reason, stopped.wait) == ("terminated", "terminated", None)
    assert registry.get_lease("run-main") is None
    assert registry.events("run-main")[-1].kind == "completed"

    # Everything written shows in the feed after 0.1.0's last cursor, and survives a rebuild.
    changed = [record.id for record in registry.changes_since(old_cursor, 100)[0]]
    assert changed == ["after-upgrade", "run-engine", "run-main"]
    before = snapshot(registry, expected)
    rebuild(registry)
    assert snapshot(registry, expected) == before
    assert dumped(registry.get("after-upgrade")) == dumped(done)
