"""The projections contract (docs/design.md §5) as one abstract suite, subclassed per store in
``test_stores.py``. Every test drives the public registry API with a ``FakeClock``."""

from __future__ import annotations

import threading
import uuid

import pytest

from _stores import StoreCase
from procledger import (
    ExternalRef,
    HandleDescriptor,
    LeaseOwner,
    NotFound,
    Originator,
    ProcessInput,
    ProcessRegistry,
    ProcessState,
    RecoveryDisposition,
    SessionScope,
    StoreCorrupt,
    WaitState,
)
from procledger.domain.errors import FilterError
from procledger.domain.process import process_uuid
from procledger.projections import ChangeCursor, ProcessListFilter, PruneReport
from procledger.projections import rebuild as rebuild_module
from procledger.testing import FakeClock

from ._support import (
    KEY,
    drain_feed,
    finish,
    registration,
    snapshot,
)


def tip(registry: ProcessRegistry) -> ChangeCursor:
    return drain_feed(registry)[1]


def ids(records: list) -> list[str]:
    return [record.id for record in records]


def _rewritten_by(registry: ProcessRegistry, action: object) -> set[str]:
    """The processes whose ``records`` row ``action()`` updated: by the rows' versions on
    PostgreSQL (``xmin``), by an ``AFTER UPDATE`` trigger on SQLite."""
    assert callable(action)
    store = registry._store
    table = store.table("records")
    if store.dialect.name == "postgresql":

        def versions() -> dict[str, str]:
            with store.read() as tx:
                rows = tx.execute(f"SELECT process_id, xmin::text AS v FROM {table}").all()
            return {row["process_id"]: row["v"] for row in rows}

        before = versions()
        action()
        return {pid for pid, version in versions().items() if before.get(pid) != version}
    with store.write() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS test_rewritten (process_id TEXT)")
        tx.execute("DELETE FROM test_rewritten")
        tx.execute(
            f"CREATE TRIGGER IF NOT EXISTS test_note_rewrite AFTER UPDATE ON {table} "
            "BEGIN INSERT INTO test_rewritten VALUES (new.process_id); END"
        )
    action()
    with store.read() as tx:
        rows = tx.execute("SELECT process_id FROM test_rewritten").all()
    return {row["process_id"] for row in rows}


class ProjectionContract(StoreCase):
    # -- change feed ---------------------------------------------------------------------------

    def test_pages_follow_change_order_and_carry_the_last_change_seq(
        self, registry: ProcessRegistry
    ) -> None:
        for name in ["e", "c", "a", "d", "b"]:
            registry.register(registration(name))
        first, cursor = registry.changes_since(ChangeCursor.initial(), 2)
        assert ids(first) == ["e", "c"]
        assert cursor == ChangeCursor(first[-1].change_seq)
        second, cursor2 = registry.changes_since(cursor, 2)
        third, cursor3 = registry.changes_since(cursor2, 2)
        assert ids(second) == ["a", "d"]
        assert ids(third) == ["b"]
        assert cursor < cursor2 < cursor3 == ChangeCursor(third[-1].change_seq)
        seqs = [r.change_seq for r in first + second + third]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == len(seqs)
        assert registry.changes_since(cursor3, 2) == ([], cursor3)

    def test_limit_zero_and_an_empty_page_keep_the_cursor(self, registry: ProcessRegistry) -> None:
        registry.register(registration("p"))
        start = ChangeCursor.initial()
        assert registry.changes_since(start, 0) == ([], start)
        end = tip(registry)
        assert registry.changes_since(end, 10) == ([], end)
        assert registry.changes_since(ChangeCursor(end.value + 1000), 5)[0] == []

    def test_rereading_a_cursor_is_idempotent(self, registry: ProcessRegistry) -> None:
        for name in "abc":
            registry.register(registration(name))
        cursor = ChangeCursor.initial()
        assert registry.changes_since(cursor, 2) == registry.changes_since(cursor, 2)
        page, following = registry.changes_since(cursor, 2)
        assert registry.changes_since(following, 2) == registry.changes_since(following, 2)
        assert ids(page) == ["a", "b"]

    def test_several_mutations_coalesce_into_one_entry_at_the_latest_state(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        registry.register(registration("quiet"))
        registry.register(registration("busy"))
        cursor = tip(registry)
        registry.record_started("busy", 5)
        clock.advance(10)
        registry.append_event("busy", "signal.ready", {"n": 1}, replay_key="r1")
        wait = WaitState(name="ready", event_type="signal.ready", since_ms=clock.now_ms)
        registry.set_wait("busy", wait)
        registry.clear_wait("busy")
        latest = registry.request_abandon("busy", "operator")
        page, following = registry.changes_since(cursor, 10)
        assert page == [latest]
        assert page[0] == registry.get("busy")
        assert following == ChangeCursor(latest.change_seq)
        assert latest.abandon_request is not None
        assert latest.updated_at_ms == clock.now_ms

    def test_a_terminal_is_a_change(self, registry: ProcessRegistry) -> None:
        registry.register(registration("p"))
        registry.record_started("p", 1)
        cursor = tip(registry)
        done = registry.record_completed("p", "exited", "exited", exit_code=3, authority=KEY)
        page, _ = registry.changes_since(cursor, 5)
        assert page == [done]
        assert page[0].state is ProcessState.exited
        assert page[0].status == "failed"

    def test_every_fact_moves_the_record_forward_in_the_feed(
        self, registry: ProcessRegistry
    ) -> None:
        registry.register(registration("p"))
        owner = LeaseOwner(owner_id="w", incarnation_id="1")
        wait = WaitState(name="ready", event_type="signal.ready", since_ms=1)
        facts = [
            lambda: registry.record_first_started("p", owner, 3),
            lambda: registry.record_started("p", 4),
            lambda: registry.request_stop("p", "interrupted"),
            lambda: registry.record_backgrounded("p", 5),
            lambda: registry.append_event("p", "signal.ready", None, replay_key="k"),
            lambda: registry.set_wait("p", wait),
            lambda: registry.clear_wait("p"),
            lambda: registry.set_external_ref("p", ExternalRef(backend="ci", id="42")),
            lambda: registry.request_abandon("p", "me"),
        ]
        for fact in facts:
            cursor = tip(registry)
            fact()
            page, following = registry.changes_since(cursor, 5)
            assert ids(page) == ["p"]
            assert following > cursor

    def test_leases_grants_and_idempotent_repeats_are_not_changes(
        self, registry: ProcessRegistry
    ) -> None:
        reg = registration("p")
        event_id = "00000000-0000-4000-8000-000000000001"
        owner = LeaseOwner(owner_id="w", incarnation_id="1")
        ref = ExternalRef(backend="ci", id="42")
        registry.register(reg)
        registry.record_first_started("p", owner, 1)
        registry.record_started("p", 7, event_id=event_id)
        registry.append_event("p", "signal.ready", {"x": 1}, replay_key="once")
        registry.request_stop("p", "killed")
        registry.set_external_ref("p", ref)
        registry.request_abandon("p", "me")
        cursor = tip(registry)

        acquired = registry.claim_lease("p", owner, 1_000)
        lease = registry.renew_lease(acquired.lease, 2_000)  # type: ignore[union-attr]
        registry.release_lease(lease)
        registry.grant_handle("s1", "p")
        registry.grant_handle("s1", "p")
        registry.transfer_handles("s1", "s2", ["p"])
        registry.revoke_handle("s2", "p")
        registry.register(reg)
        registry.record_first_started("p", owner, 2)
        registry.record_started("p", 7, event_id=event_id)
        registry.append_event("p", "signal.ready", {"x": 1}, replay_key="once")
        registry.request_stop("p", "killed")
        registry.set_external_ref("p", ref)
        registry.request_abandon("p", "someone else")
        registry.clear_wait("p")

        assert registry.changes_since(cursor, 10) == ([], cursor)
        assert registry.get("p").change_seq == cursor.value

    def test_cursor_accepts_a_plain_int(self, registry: ProcessRegistry) -> None:
        registry.register(registration("p"))
        page, cursor = registry.changes_since(0, 1)
        assert ids(page) == ["p"]
        assert isinstance(cursor, ChangeCursor)
        with pytest.raises(ValueError, match="limit"):
            registry.changes_since(cursor, -1)

    # -- listing --------------------------------------------------------------------------------

    def test_list_defaults_to_running_sorted_by_id(self, registry: ProcessRegistry) -> None:
        for name in ["b", "B", "a", "Z", "é", "a-2"]:
            registry.register(registration(name))
        finish(registry, "Z")
        assert ids(registry.list_processes()) == ["B", "a", "a-2", "b", "é"]
        assert registry.list_processes() == registry.list_processes(ProcessListFilter())
        assert ids(registry.list_processes({"status": "any"})) == sorted(
            ["b", "B", "a", "Z", "é", "a-2"]
        )

    def test_status_filters_use_the_coarse_status(self, registry: ProcessRegistry) -> None:
        for name in ["ok", "bad", "stopped", "gone", "live"]:
            registry.register(registration(name))
        finish(registry, "ok", 0)
        finish(registry, "bad", 2)
        registry.record_started("stopped", 1)
        registry.record_completed("stopped", "interrupted", "interrupted", authority=KEY)
        registry.record_abandoned("gone", "abandon_requested", authority=KEY)
        expected = {
            "running": ["live"],
            "completed": ["ok"],
            "failed": ["bad"],
            "cancelled": ["stopped"],
            "abandoned": ["gone"],
            "any": ["bad", "gone", "live", "ok", "stopped"],
        }
        for status, names in expected.items():
            assert ids(registry.list_processes({"status": status})) == names, status

    def test_fields_filter_and_are_anded(self, registry: ProcessRegistry, clock: FakeClock) -> None:
        scope = SessionScope(session_id="s1", agent_frame_id="f1")
        registry.register(registration("make-1", definition={"wf": "build", "step": 1}))
        clock.advance(10)
        registry.register(
            registration(
                "make-2",
                originator=Originator.session(scope),
                definition={"step": 2, "wf": "build"},
            )
        )
        clock.advance(10)
        registry.register(registration("cc-1", argv0="/usr/bin/cc"))
        registry.register(
            registration(
                "ext",
                input=ProcessInput.external({"name": "ticket"}),
                env_ref=None,
                disposition=RecoveryDisposition.externally_owned,
            )
        )
        wait = WaitState(name="ready", event_type="signal.ready", since_ms=clock.now_ms)
        registry.set_wait("make-2", wait)
        t0 = clock.now_ms - 20

        def listed(**fields: object) -> list[str]:
            return ids(registry.list_processes(fields))

        assert listed(waiting=True) == ["make-2"]
        assert listed(waiting=False) == ["cc-1", "ext", "make-1"]
        assert listed(originator_scope_id="session:s1/frame:f1") == ["make-2"]
        assert listed(originator_scope_id="host") == ["cc-1", "ext", "make-1"]
        assert listed(identity_kind="command") == ["cc-1", "make-1", "make-2"]
        assert listed(identity_kind="external", identity_label="ticket") == ["ext"]
        assert listed(identity_label="make") == ["make-1", "make-2"]
        assert listed(identity_label="cc", identity_kind="external") == []
        assert listed(definition={"wf": "build", "step": 2}) == ["make-2"]  # key order is moot
        assert listed(definition=None) == ["cc-1", "ext"]
        assert listed(definition={"wf": "build"}) == []
        assert listed(created_at_start_ms=t0 + 10) == ["cc-1", "ext", "make-2"]
        assert listed(created_at_end_ms=t0 + 10) == ["make-1"]
        assert listed(created_at_start_ms=t0, created_at_end_ms=t0 + 20) == ["make-1", "make-2"]
        assert listed(created_at_start_ms=t0 + 10, identity_label="make", waiting=True) == [
            "make-2"
        ]

    def test_a_bad_filter_raises_filter_error_naming_the_key(
        self, registry: ProcessRegistry
    ) -> None:
        with pytest.raises(FilterError) as caught:
            registry.list_processes({"state": "running"})
        assert caught.value.key == "state"
        with pytest.raises(FilterError, match="created_at_end_ms"):
            registry.handles("s", {"created_at_end_ms": "soon"})

    # -- handles ----------------------------------------------------------------------------------

    def test_handle_summary_json_is_exact(self, registry: ProcessRegistry) -> None:
        registry.register(registration("plain"))
        registry.register(registration("defined", definition={"step": "lint"}))
        registry.register(
            registration("labelled", descriptor=HandleDescriptor(kind="job", label="nightly"))
        )
        for pid in ["plain", "defined", "labelled"]:
            registry.grant_handle("s1", pid)
        registry.grant_handle("s2", "plain", HandleDescriptor(kind="tool", label=None))
        assert registry.handle("s1", "plain").model_dump() == {
            "__handle__": "process",
            "id": "plain",
            "process_id": "plain",
            "descriptor": {"kind": "command", "label": "make"},
            "status": "running",
        }
        assert registry.handle("s1", "defined").model_dump() == {
            "__handle__": "process",
            "id": "defined",
            "process_id": "defined",
            "descriptor": {"kind": "command", "label": "make"},
            "status": "running",
            "definition": {"step": "lint"},
        }
        assert registry.handle("s1", "labelled").model_dump_json() == (
            '{"__handle__":"process","id":"labelled","process_id":"labelled",'
            '"descriptor":{"kind":"job","label":"nightly"},"status":"running"}'
        )
        assert registry.handle("s2", "plain").descriptor == HandleDescriptor(kind="tool")

    def test_handles_filter_like_list_processes(self, registry: ProcessRegistry) -> None:
        for pid in ["c", "a", "b", "other"]:
            registry.register(registration(pid))
            if pid != "other":
                registry.grant_handle("s1", pid)
        finish(registry, "b", 1)
        assert [h.id for h in registry.handles("s1")] == ["a", "c"]
        assert [h.id for h in registry.handles("s1", {"status": "any"})] == ["a", "b", "c"]
        [failed] = registry.handles("s1", ProcessListFilter(status="failed"))
        assert (failed.id, failed.status) == ("b", "failed")
        assert registry.handles("nobody", {"status": "any"}) == []

    def test_a_session_cannot_tell_ungranted_from_unknown(self, registry: ProcessRegistry) -> None:
        registry.register(registration("secret"))
        registry.grant_handle("owner", "secret")

        def message(action: object) -> str:
            with pytest.raises(NotFound) as caught:
                action()  # type: ignore[operator]
            return str(caught.value)

        for act in (
            lambda pid: registry.handle("snoop", pid),
            lambda pid: registry.revoke_handle("snoop", pid),
            lambda pid: registry.transfer_handles("snoop", "elsewhere", [pid]),
        ):
            ungranted = message(lambda act=act: act("secret"))
            unknown = message(lambda act=act: act("nothing"))
            assert ungranted.replace("secret", "ID") == unknown.replace("nothing", "ID")
        assert registry.handles("snoop", {"status": "any"}) == []
        assert registry.handle_sessions("secret") == ["owner"]
        with pytest.raises(NotFound):
            registry.grant_handle("owner", "nothing")

    def test_transfer_is_all_or_nothing(self, registry: ProcessRegistry) -> None:
        for pid in ["a", "b", "c"]:
            registry.register(registration(pid))
        registry.grant_handle("from", "a")
        registry.grant_handle("from", "b")
        with pytest.raises(NotFound, match="'c'"):
            registry.transfer_handles("from", "to", ["a", "b", "c"])
        assert [h.id for h in registry.handles("from")] == ["a", "b"]
        assert registry.handles("to") == []
        registry.transfer_handles("from", "to", ["b", "a"])
        assert registry.handles("from") == []
        assert [h.id for h in registry.handles("to")] == ["a", "b"]
        registry.grant_handle("third", "a")
        assert registry.handle_sessions("a") == ["third", "to"]
        registry.transfer_handles("to", "to", ["a"])
        registry.transfer_handles("empty", "to", [])
        assert registry.handle_sessions("a") == ["third", "to"]
        with pytest.raises(NotFound):
            registry.handle_sessions("missing")

    # -- session deletion -------------------------------------------------------------------------

    def test_delete_session_reports_and_clears(self, registry: ProcessRegistry) -> None:
        wake_frame = SessionScope(session_id="s1", agent_frame_id="f1")
        registry.register(registration("only-mine"))
        registry.register(registration("shared"))
        registry.register(registration("done"))
        registry.register(registration("woken", wake=wake_frame))
        registry.register(registration("woken-too", wake=SessionScope(session_id="s1")))
        registry.register(registration("not-mine", wake=SessionScope(session_id="s10")))
        finish(registry, "done")
        for pid in ["only-mine", "shared", "done"]:
            registry.grant_handle("s1", pid)
        registry.grant_handle("s2", "shared")
        cursor = tip(registry)

        report = registry.delete_session("s1")

        assert report.model_dump() == {
            "session_id": "s1",
            "revoked_handle_count": 3,
            "deleted_wake_count": 2,
            "orphaned_process_ids": ["only-mine"],
            "preserved_process_ids": ["shared"],
        }
        assert registry.handles("s1", {"status": "any"}) == []
        assert registry.handle_sessions("shared") == ["s2"]
        assert registry.get("woken").wake_target is None
        assert registry.get("woken-too").wake_target is None
        assert registry.get("not-mine").wake_target == SessionScope(session_id="s10")
        assert [e.kind for e in registry.events("woken")][-1] == "wake_target_cleared"
        changed, _ = registry.changes_since(cursor, 10)
        assert ids(changed) == ["woken", "woken-too"]
        again = registry.delete_session("s1")
        assert (again.revoked_handle_count, again.deleted_wake_count) == (0, 0)
        assert registry.delete_session("never-existed").orphaned_process_ids == []

    # -- pruning ----------------------------------------------------------------------------------

    def test_prune_deletes_old_terminal_processes_only(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        for pid in ["old-done", "old-live", "old-failed"]:
            registry.register(registration(pid))
        finish(registry, "old-done")
        finish(registry, "old-failed", 1)
        clock.advance(1_000)
        cutoff = clock.now_ms
        registry.register(registration("new-done"))
        finish(registry, "new-done")
        events = len(registry.events("old-done")) + len(registry.events("old-failed"))

        report = registry.prune_terminal(cutoff)

        assert report == PruneReport(processes=["old-done", "old-failed"], events=events)
        assert ids(registry.list_processes({"status": "any"})) == ["new-done", "old-live"]
        for pid in report.processes:
            with pytest.raises(NotFound):
                registry.get(pid)
            with pytest.raises(NotFound):
                registry.events(pid)
        assert registry.prune_terminal(cutoff) == PruneReport(processes=[], events=0)
        assert registry.prune_terminal(clock.now_ms + 1).processes == ["new-done"]

    def test_prune_respects_filter_and_watermark(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        for pid in ["a", "b", "c", "d"]:
            registry.register(registration(pid, argv0="/bin/cc" if pid == "d" else "make"))
        finish(registry, "a", 1)
        finish(registry, "b")
        watermark = tip(registry)
        finish(registry, "c", 1)
        finish(registry, "d", 1)
        clock.advance(1)
        assert registry.prune_terminal(
            clock.now_ms, {"status": "failed"}, up_to=watermark
        ).processes == ["a"]
        assert registry.prune_terminal(clock.now_ms, {"identity_label": "cc"}).processes == ["d"]
        assert registry.prune_terminal(clock.now_ms, {"status": "running"}).processes == []
        assert registry.prune_terminal(clock.now_ms, up_to=watermark.value).processes == ["b"]
        assert ids(registry.list_processes({"status": "any"})) == ["c"]

    def test_a_pruned_id_is_gone_everywhere_and_can_be_registered_afresh(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        registry.register(registration("p"))
        registry.register(registration("keep"))
        owner = LeaseOwner(owner_id="w", incarnation_id="1")
        lease = registry.claim_lease("p", owner, 60_000).lease  # type: ignore[union-attr]
        registry.record_started("p", 1)
        registry.record_completed("p", "exited", "exited", exit_code=0, lease=lease)
        registry.grant_handle("s1", "p")
        registry.grant_handle("s2", "p")
        registry.grant_handle("s1", "keep")
        self._add_journal(registry, "p", "handle-p", "cmd-p")
        self._add_journal(registry, "keep", "handle-keep", "cmd-keep")
        before = tip(registry)
        clock.advance(1)

        assert registry.prune_terminal(clock.now_ms).processes == ["p"]

        assert self._journal(registry) == [("cmd-keep", "handle-keep")]
        assert registry.get_lease("keep") is None
        with pytest.raises(NotFound):
            registry.handle("s1", "p")
        with pytest.raises(NotFound):
            registry.handle_sessions("p")
        assert [h.id for h in registry.handles("s1")] == ["keep"]
        with pytest.raises(NotFound):
            registry.claim_lease("p", owner, 1_000)
        again = registry.register(registration("p"))
        assert again.change_seq > before.value  # no notification id is ever handed out twice
        assert [e.sequence for e in registry.events("p")] == [1]
        assert registry.handle_sessions("p") == []
        acquired = registry.claim_lease("p", owner, 1_000)
        assert acquired.lease.fencing_token == 1  # type: ignore[union-attr]
        assert snapshot(registry)["grants"] == [("s1", "keep", '{"kind":"command","label":"make"}')]
        live = snapshot(registry)
        registry.rebuild()
        assert snapshot(registry) == live  # revoked grants stay revoked

    def test_pruning_the_newest_events_never_lets_a_change_seq_be_reused(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        registry.register(registration("only"))
        finish(registry, "only")
        before = tip(registry)
        clock.advance(1)
        assert registry.prune_terminal(clock.now_ms).processes == ["only"]
        fresh = registry.register(registration("next"))
        assert fresh.change_seq > before.value
        assert registry.changes_since(before, 5)[0] == [fresh]

    def test_a_write_from_a_stale_load_of_a_pruned_process_is_not_found(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        registry.register(registration("p"))
        finish(registry, "p")
        stale = registry._ledger.load_process("p")  # a writer loaded it ...
        clock.advance(1)
        registry.prune_terminal(clock.now_ms)  # ... then it was pruned ...
        stale.set_external_ref(ExternalRef(backend="b", id="1"), at_ms=clock.now_ms)
        with pytest.raises(NotFound):  # ... so its write must not resurrect a partial log
            registry._ledger.save([stale], now_ms=clock.now_ms)
        with pytest.raises(NotFound):
            registry.events("p")
        registry.rebuild()
        assert registry.list_processes({"status": "any"}) == []

    @staticmethod
    def _add_journal(registry: ProcessRegistry, pid: str, handle: str, command: str) -> None:
        store = registry._store
        with store.write() as tx:
            tx.execute(
                f"INSERT INTO {store.table('handles')} "
                "(handle, process_id, owner_id, session_id, loop_id, command_id) "
                "VALUES (?,?,?,?,?,?)",
                (handle, pid, "w", "s", "l", command),
            )
            tx.execute(
                f"INSERT INTO {store.table('journal')} "
                "(command_id, session_id, loop_id, process_handle, payload) VALUES (?,?,?,?,?)",
                (command, "s", "l", handle, "{}"),
            )

    @staticmethod
    def _journal(registry: ProcessRegistry) -> list[tuple[str, str]]:
        store = registry._store
        with store.read() as tx:
            rows = tx.execute(
                f"SELECT j.command_id AS c, h.handle AS h FROM {store.table('journal')} j "
                f"JOIN {store.table('handles')} h ON h.handle = j.process_handle"
            ).all()
        return sorted((row["c"], row["h"]) for row in rows)

    # -- rebuild ----------------------------------------------------------------------------------

    def test_rebuild_reproduces_every_read_model(
        self, registry: ProcessRegistry, clock: FakeClock
    ) -> None:
        scope = SessionScope(session_id="s1")
        for index in range(7):
            clock.advance(3)
            registry.register(registration(f"p{index}", wake=scope, definition={"i": index}))
            registry.grant_handle(f"s{index % 3}", f"p{index}")
        finish(registry, "p1")
        finish(registry, "p2", 9)
        registry.append_event("p3", "signal.ready", [1, 2.5, "x"], replay_key="k")
        registry.transfer_handles("s0", "s2", ["p0"])
        registry.delete_session("s1")
        clock.advance(5)
        registry.prune_terminal(clock.now_ms, {"status": "failed"})
        live = snapshot(registry)
        calls: list[tuple[int, int]] = []

        report = registry.rebuild(lambda done, total: calls.append((done, total)))
        applied = report.applied
        assert report.damaged == []

        with registry._store.read() as tx:
            stored = tx.execute(f"SELECT COUNT(*) AS n FROM {registry._store.events_table}").one()
        assert applied == int(stored["n"])
        assert calls[-1] == (applied, applied)
        assert [done for done, _ in calls] == sorted(done for done, _ in calls)
        assert snapshot(registry) == live
        assert registry.rebuild().applied == applied
        assert snapshot(registry) == live

    def test_writes_during_rebuilds_are_neither_lost_nor_doubled(
        self, registry: ProcessRegistry
    ) -> None:
        for index in range(20):
            registry.register(registration(f"seed-{index:02d}"))
        errors: list[BaseException] = []

        def write() -> None:
            try:
                for index in range(30):
                    registry.register(registration(f"w-{index:02d}"))
                    registry.record_started(f"w-{index:02d}", index)
            except BaseException as error:
                errors.append(error)

        writer = threading.Thread(target=write)
        writer.start()
        for _ in range(3):
            registry.rebuild()
        writer.join()
        assert errors == []
        live = snapshot(registry)
        assert len(live["records"]) == 50
        assert all(r["state"] == "running" for r in live["records"] if r["id"].startswith("w-"))
        registry.rebuild()
        assert snapshot(registry) == live

    def test_a_damaged_stream_is_reported_and_everything_else_is_rebuilt(
        self, registry: ProcessRegistry
    ) -> None:
        registry.register(registration("good"))
        registry.grant_handle("s", "good")
        live = snapshot(registry)
        store = registry._store
        broken = uuid.uuid4()
        with store.write() as tx:
            tx.execute(
                f"INSERT INTO {store.events_table} "
                "(originator_id, originator_version, topic, state) VALUES (?,?,?,?)",
                (
                    store.dialect.originator_key(broken),
                    1,
                    "procledger:Process.Registered",
                    b"{not json",
                ),
            )
            tx.execute(f"DELETE FROM {store.table('records')}")  # the rest must come back
        report = registry.rebuild()
        assert report.damaged == [f"stream {broken}"]
        assert snapshot(registry)["records"] == live["records"]
        assert snapshot(registry)["grants"] == live["grants"]

    def test_rebuild_repairs_a_row_that_differs_in_one_column_only(
        self, registry: ProcessRegistry
    ) -> None:
        """Rebuild leaves alone only rows equal to their rebuild in every column: a filter
        column changed under an intact record, an extra or altered grant, are all put back."""
        for index in range(3):
            registry.register(registration(f"p{index}"))
            registry.grant_handle("s", f"p{index}")
        live = snapshot(registry)
        store = registry._store
        with store.write() as tx:
            tx.execute(f"UPDATE {store.table('records')} SET status='failed' WHERE process_id='p0'")
            tx.execute(f"UPDATE {store.table('records')} SET change_seq=1 WHERE process_id='p1'")
            tx.execute(
                f"UPDATE {store.table('grants')} SET descriptor='{{}}' WHERE process_id='p2'"
            )
            tx.execute(
                f"INSERT INTO {store.table('grants')} (session_id, process_id, descriptor) "
                "VALUES ('s', 'ghost', NULL)"
            )
        assert snapshot(registry) != live
        registry.rebuild()
        assert snapshot(registry) == live

    def test_rebuild_rewrites_only_the_record_rows_that_differ(
        self, registry: ProcessRegistry
    ) -> None:
        """The store compares each rebuilt row with the stored one: a sound row is not
        written again (no new row version, no update), a damaged one is."""
        for index in range(4):
            registry.register(registration(f"p{index}"))
        finish(registry, "p3")
        live = snapshot(registry)
        store = registry._store
        with store.write() as tx:
            tx.execute(f"UPDATE {store.table('records')} SET record='{{}}' WHERE process_id='p1'")
        assert _rewritten_by(registry, registry.rebuild) == {"p1"}
        assert snapshot(registry) == live
        assert _rewritten_by(registry, registry.rebuild) == set()

    def test_rebuild_deletes_records_the_log_no_longer_backs(
        self, registry: ProcessRegistry, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The sweep pages through the record ids (more than one page here) and deletes the
        rows whose process has no events, keeping every other."""
        for index in range(5):
            registry.register(registration(f"p{index}"))
        live = snapshot(registry)
        store = registry._store
        table = store.table("records")
        with store.write() as tx:
            for index in range(3):
                tx.execute(
                    f"INSERT INTO {table} (process_id, change_seq, status, terminal, waiting, "
                    "originator_scope_id, identity_kind, identity_label, definition, "
                    "created_at_ms, updated_at_ms, record) SELECT ?, change_seq, status, "
                    "terminal, waiting, originator_scope_id, identity_kind, identity_label, "
                    f"definition, created_at_ms, updated_at_ms, record FROM {table} "
                    "WHERE process_id='p0'",
                    (f"ghost-{index}",),
                )
        assert len(snapshot(registry)["records"]) == 8
        monkeypatch.setattr(rebuild_module, "SWEEP", 2)
        registry.rebuild()
        assert snapshot(registry) == live

    def test_a_stream_with_a_missing_version_is_damaged(self, registry: ProcessRegistry) -> None:
        """A gap in a stream's versions is damage (the fold checks each version follows on)."""
        registry.register(registration("gap"))
        finish(registry, "gap")
        registry.register(registration("whole"))
        live = snapshot(registry)
        store = registry._store
        with store.write() as tx:
            tx.execute(
                f"DELETE FROM {store.events_table} WHERE originator_id=? AND originator_version=2",
                (store.dialect.originator_key(process_uuid("gap")),),
            )
        report = registry.rebuild()
        assert report.damaged == report.marked == ["gap"]  # its chain does not verify
        healthy = [record for record in live["records"] if record["id"] != "gap"]
        assert snapshot(registry)["records"] == healthy  # "gap" is listed among the damaged
        assert registry.scan_processes({"status": "any"}).damaged == ["gap"]
        with pytest.raises(StoreCorrupt, match=r"'gap'.*does not verify: event v2 is missing"):
            registry.get("gap")

    def test_rebuild_from_empty_tables_restores_them(self, registry: ProcessRegistry) -> None:
        registry.register(registration("p"))
        registry.grant_handle("s", "p")
        live = snapshot(registry)
        store = registry._store
        with store.write() as tx:
            tx.execute(f"DELETE FROM {store.table('records')}")
            tx.execute(f"DELETE FROM {store.table('grants')}")
            tx.execute(f"UPDATE {store.table('tracking')} SET position=0")
        assert registry.list_processes() == []
        registry.rebuild()
        assert snapshot(registry) == live
