"""The notifier contract (docs/design.md §4) on every store, and headless.

One abstract suite, ``NotifierContract``, subclassed per store. The cases mirror the reference
harness's delivery tests: duplicate, collision, inbox full, foreign loop, restore.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from procledger import ProcessRegistry
from procledger.domain.errors import (
    DeliveryStopped,
    IdempotencyCollision,
    LoopNotFound,
    NotFound,
    OwnerMismatch,
    ProcessLifecycleValidationError,
    StoreError,
    UnsupportedLoop,
)
from procledger.domain.notification import ProcessCompletionNotification as N
from procledger.notifications import Delivery, LoopInbox, NotificationDisposition, Notifier

from ._support import fields, notification
from .conftest import Opener

D = NotificationDisposition


def _journal_rows(registry: ProcessRegistry) -> list[Any]:
    with registry._store.read() as tx:
        return tx.execute(f"SELECT * FROM {registry._store.table('journal')} ORDER BY seq").all()


@pytest.fixture
def session() -> uuid.UUID:
    return uuid.uuid4()


@pytest.fixture
def loop() -> uuid.UUID:
    return uuid.uuid4()


class NotifierContract:
    """Subclasses provide the ``open`` fixture (see conftest)."""

    @pytest.fixture
    def open(self) -> Opener:
        raise NotImplementedError

    @pytest.fixture
    def registry(self, open: Opener) -> ProcessRegistry:
        return open()

    @pytest.fixture
    def notifier(self, registry: ProcessRegistry, session: uuid.UUID) -> Notifier:
        return Notifier(registry, session)

    # -- accepted, duplicate, collision ----------------------------------------------------

    def test_first_delivery_is_journalled_then_accepted(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        n = notification(session, loop)
        assert notifier.notify_process_completion(n) == Delivery(D.ACCEPTED, None)
        assert inbox.pending() == [n]
        [entry] = registry.journal_entries()
        assert (entry.notification, entry.consumed) == (n, False)
        assert registry.journal_get(n.command_id) == n
        assert registry.journal_get(str(n.command_id)) == n
        assert registry.journal_get(uuid.uuid4()) is None

    def test_identical_retry_is_a_duplicate_with_one_record(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        data = fields(session, loop)
        assert notifier.notify_process_completion(N(**data)).disposition == D.ACCEPTED
        retry = notifier.notify_process_completion(N.model_validate_json(orjson.dumps(data)))
        assert retry == Delivery(D.DUPLICATE, None)
        assert len(inbox.pending()) == 1
        assert len(_journal_rows(registry)) == 1

    def test_stored_command_is_the_canonical_six_keys_without_timestamp(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        notifier.add_loop(loop)
        n = notification(session, loop, state="lost_on_restore", reason="lost_on_restore")
        notifier.notify_process_completion(n)
        notifier.notify_process_completion(n)
        [row] = _journal_rows(registry)
        expected = orjson.dumps(n.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS).decode()
        assert row["payload"] == expected
        assert sorted(orjson.loads(row["payload"])) == sorted(n.model_dump())
        assert row["command_id"] == str(n.command_id)
        assert (row["session_id"], row["loop_id"]) == (str(session), str(loop))
        assert row["process_handle"] == n.process_handle

    def test_collision_is_rejected_and_never_dispatched(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        first = notification(session, loop)
        notifier.notify_process_completion(first)
        inbox.consume(first.command_id)  # the inbox no longer holds it: only the journal knows
        other = first.model_copy(update={"process_handle": "different"})
        delivery = notifier.notify_process_completion(other)
        assert delivery.disposition == D.COLLISION
        assert isinstance(delivery.error, IdempotencyCollision)
        assert str(first.command_id) in str(delivery.error)
        assert inbox.pending() == []
        assert [e.notification for e in registry.journal_entries()] == [first]

    def test_collision_while_pending_keeps_the_first(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        first = notification(session, loop)
        notifier.notify_process_completion(first)
        other = first.model_copy(update={"state": "killed", "reason": "killed"})
        delivery = notifier.notify_process_completion(other)
        assert delivery.disposition == D.COLLISION
        assert isinstance(delivery.error, IdempotencyCollision)
        assert inbox.pending() == [first]
        with pytest.raises(IdempotencyCollision):
            registry.journal_append(other)
        assert len(_journal_rows(registry)) == 1

    # -- stopped ----------------------------------------------------------------------------

    def test_inbox_full_is_stopped_and_a_retry_still_stopped(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        capacity = 3
        inbox = notifier.add_loop(loop, LoopInbox(capacity))
        accepted = [notification(session, loop) for _ in range(capacity)]
        for n in accepted:
            assert notifier.notify_process_completion(n).disposition == D.ACCEPTED
        overflow = notification(session, loop)
        for _ in range(2):  # the first attempt, then a retry
            delivery = notifier.notify_process_completion(overflow)
            assert delivery.disposition == D.STOPPED
            assert isinstance(delivery.error, DeliveryStopped)
            assert str(loop) in str(delivery.error)
        assert len(_journal_rows(registry)) == capacity + 1
        assert inbox.pending() == accepted
        # a known id is a duplicate even when full (checked before capacity)
        assert notifier.notify_process_completion(accepted[0]).disposition == D.DUPLICATE
        # once the loop catches up, the same retry gets through, still without a new record
        inbox.consume(accepted[0].command_id)
        assert notifier.notify_process_completion(overflow).disposition == D.ACCEPTED
        assert inbox.pending() == [*accepted[1:], overflow]
        assert len(_journal_rows(registry)) == capacity + 1

    def test_foreign_loop_is_stopped_naming_the_loop_and_writes_nothing(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop, accepts_process_notifications=False)
        delivery = notifier.notify_process_completion(notification(session, loop))
        assert delivery.disposition == D.STOPPED
        assert isinstance(delivery.error, UnsupportedLoop)
        assert str(loop) in str(delivery.error)
        assert inbox.pending() == []
        assert _journal_rows(registry) == []

    def test_unknown_loop_is_stopped_with_loop_not_found_and_writes_nothing(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        notifier.add_loop(uuid.uuid4())
        delivery = notifier.notify_process_completion(notification(session, loop))
        assert delivery.disposition == D.STOPPED
        assert isinstance(delivery.error, LoopNotFound)
        assert str(loop) in str(delivery.error)
        assert _journal_rows(registry) == []

    def test_a_removed_loop_is_not_found(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        notifier.add_loop(loop)
        notifier.remove_loop(loop)
        delivery = notifier.notify_process_completion(notification(session, loop))
        assert isinstance(delivery.error, LoopNotFound)
        assert _journal_rows(registry) == []

    # -- refused before anything is written --------------------------------------------------

    def test_owner_mismatch_appends_nothing(
        self, registry: ProcessRegistry, notifier: Notifier, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        foreign = notification(uuid.uuid4(), loop)
        with pytest.raises(OwnerMismatch) as caught:
            notifier.notify_process_completion(foreign)
        assert str(foreign.session_id) in str(caught.value)
        assert _journal_rows(registry) == []
        assert inbox.pending() == []

    @pytest.mark.parametrize(
        ("overrides", "field"),
        [
            ({"command_id": "00000000-0000-0000-0000-000000000000"}, "command_id"),
            ({"process_handle": "a/b"}, "process_handle"),
            ({"process_handle": "a" * 129}, "process_handle"),
            ({"state": "abandoned", "reason": "owner_drain"}, "state_reason"),
            ({"state": "running", "reason": None}, "state_reason"),
        ],
    )
    def test_constructed_invalid_notifications_are_revalidated_and_write_nothing(
        self,
        *,
        registry: ProcessRegistry,
        notifier: Notifier,
        session: uuid.UUID,
        loop: uuid.UUID,
        overrides: dict[str, Any],
        field: str,
    ) -> None:
        inbox = notifier.add_loop(loop)
        sloppy = N.model_construct(**fields(session, loop, **overrides))
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            notifier.notify_process_completion(sloppy)
        assert caught.value.field == field
        with pytest.raises(ProcessLifecycleValidationError):
            registry.journal_append(sloppy)
        assert _journal_rows(registry) == []
        assert inbox.pending() == []

    def test_a_failed_append_is_raised_and_nothing_dispatched(
        self,
        *,
        registry: ProcessRegistry,
        notifier: Notifier,
        session: uuid.UUID,
        loop: uuid.UUID,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        inbox = notifier.add_loop(loop)

        def broken(_: N) -> Any:
            raise StoreError("journal unavailable")

        monkeypatch.setattr(registry, "journal_append_checked", broken)
        with pytest.raises(StoreError):
            notifier.notify_process_completion(notification(session, loop))
        assert inbox.pending() == []

    # -- consume and restore ----------------------------------------------------------------

    def test_append_before_dispatch_restores_an_undelivered_notification(
        self, open: Opener, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop, LoopInbox(1))
        other_loop = uuid.uuid4()
        notifier.add_loop(other_loop)
        consumed, stopped, later = (notification(session, loop) for _ in range(3))
        unconsumed = notification(session, other_loop)
        assert notifier.notify_process_completion(consumed).disposition == D.ACCEPTED
        assert notifier.notify_process_completion(stopped).disposition == D.STOPPED
        assert notifier.notify_process_completion(unconsumed).disposition == D.ACCEPTED
        inbox.consume(consumed.command_id)
        assert notifier.notify_process_completion(later).disposition == D.ACCEPTED

        restarted = Notifier(open(), session)
        assert restarted.undelivered(loop) == [stopped, later]  # journal order, minus consumed
        assert restarted.undelivered(str(other_loop)) == [unconsumed]
        assert restarted.undelivered(uuid.uuid4()) == []
        assert Notifier(open(), uuid.uuid4()).undelivered(loop) == []  # another session's view

    def test_a_consumed_notification_is_not_redelivered(
        self, open: Opener, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        n = notification(session, loop)
        notifier.notify_process_completion(n)
        inbox.consume(n.command_id)
        inbox.consume(n.command_id)  # twice is harmless
        assert inbox.pending() == []
        assert notifier.undelivered(loop) == []

        restarted = Notifier(open(), session)
        fresh = restarted.add_loop(loop)
        assert restarted.undelivered(loop) == []
        assert restarted.restore_loop(loop) == []
        assert restarted.notify_process_completion(n) == Delivery(D.DUPLICATE, None)
        assert fresh.pending() == []

    def test_restore_seeds_the_loop_and_consumption_is_durable(
        self, open: Opener, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        notifier.add_loop(loop, LoopInbox(1))
        a, b = notification(session, loop), notification(session, loop)
        notifier.notify_process_completion(a)
        assert notifier.notify_process_completion(b).disposition == D.STOPPED

        registry = open()
        restarted = Notifier(registry, session)
        inbox = restarted.add_loop(loop)
        assert [d.disposition for d in restarted.restore_loop(loop)] == [D.ACCEPTED] * 2
        assert inbox.pending() == [a, b]
        assert [d.disposition for d in restarted.restore_loop(loop)] == [D.DUPLICATE] * 2
        # a retry from the runner is now a duplicate and writes nothing
        assert restarted.notify_process_completion(b).disposition == D.DUPLICATE
        inbox.consume(b.command_id)
        assert inbox.pending() == [a]
        assert Notifier(open(), session).undelivered(loop) == [a]
        assert len(registry.journal_entries()) == 2
        assert [e.consumed for e in registry.journal_entries(session)] == [False, True]

    def test_a_stopped_notification_is_accepted_after_restart_without_a_new_record(
        self, open: Opener, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        notifier.add_loop(loop, accepts_process_notifications=True, inbox=LoopInbox(1))
        notifier.notify_process_completion(notification(session, loop))
        n = notification(session, loop)
        assert notifier.notify_process_completion(n).disposition == D.STOPPED
        registry = open()
        restarted = Notifier(registry, session)
        inbox = restarted.add_loop(loop)
        assert restarted.notify_process_completion(n).disposition == D.ACCEPTED
        assert inbox.pending() == [n]
        assert len(_journal_rows(registry)) == 2

    def test_consuming_an_unknown_command_is_not_found(
        self, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        with pytest.raises(NotFound):
            inbox.consume(uuid.uuid4())
        elsewhere = notification(session, uuid.uuid4())
        notifier.add_loop(elsewhere.loop_id)
        notifier.notify_process_completion(elsewhere)
        with pytest.raises(NotFound):  # journalled, but for another loop
            inbox.consume(elsewhere.command_id)


class TestMemory(NotifierContract):
    @pytest.fixture
    def open(self, memory_store: Opener) -> Opener:
        return memory_store


class TestSQLite(NotifierContract):
    @pytest.fixture
    def open(self, sqlite_store: Opener) -> Opener:
        return sqlite_store

    def test_an_identical_retry_writes_nothing_at_all(
        self, sqlite_url: str, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        """A retry commits no change, so it costs no fsync: the write-ahead log stays as is."""
        notifier.add_loop(loop)
        n = notification(session, loop)
        notifier.notify_process_completion(n)
        wal = Path(sqlite_url.removeprefix("sqlite://") + "-wal")
        before = wal.read_bytes()
        for _ in range(20):
            assert notifier.notify_process_completion(n).disposition == D.DUPLICATE
        assert wal.read_bytes() == before


@pytest.mark.postgres
class TestPostgres(NotifierContract):
    @pytest.fixture
    def open(self, postgres_store: Opener) -> Opener:
        return postgres_store


# -- headless: no journal, de-duplication rests on the inbox ----------------------------------


class TestHeadless:
    @pytest.fixture
    def notifier(self, session: uuid.UUID) -> Notifier:
        return Notifier(None, session)

    def test_live_duplicate(self, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID) -> None:
        assert notifier.headless
        inbox = notifier.add_loop(loop)
        n = notification(session, loop)
        assert notifier.notify_process_completion(n).disposition == D.ACCEPTED
        again = N.model_validate_json(n.model_dump_json())
        assert notifier.notify_process_completion(again) == Delivery(D.DUPLICATE, None)
        assert inbox.pending() == [n]

    def test_a_recently_consumed_retry_is_still_a_duplicate(
        self, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop, LoopInbox(1, remember=2))
        sent = [notification(session, loop) for _ in range(3)]
        for n in sent:
            assert notifier.notify_process_completion(n).disposition == D.ACCEPTED
            inbox.consume(n.command_id)
        assert notifier.notify_process_completion(sent[2]).disposition == D.DUPLICATE
        assert notifier.notify_process_completion(sent[1]).disposition == D.DUPLICATE
        # the guard is bounded: the oldest consumed id is forgotten
        assert notifier.notify_process_completion(sent[0]).disposition == D.ACCEPTED

    def test_collision_is_detected_by_the_inbox(
        self, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        n = notification(session, loop)
        notifier.notify_process_completion(n)
        delivery = notifier.notify_process_completion(
            n.model_copy(update={"state": "failed", "reason": "failed"})
        )
        assert delivery.disposition == D.COLLISION
        assert isinstance(delivery.error, IdempotencyCollision)
        assert inbox.pending() == [n]

    def test_full_foreign_unknown_and_owner(
        self, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        notifier.add_loop(loop, LoopInbox(capacity=1))
        foreign = uuid.uuid4()
        notifier.add_loop(foreign, accepts_process_notifications=False)
        assert notifier.notify_process_completion(notification(session, loop)).error is None
        full = notifier.notify_process_completion(notification(session, loop))
        assert isinstance(full.error, DeliveryStopped)
        unsupported = notifier.notify_process_completion(notification(session, foreign))
        assert isinstance(unsupported.error, UnsupportedLoop)
        assert str(foreign) in str(unsupported.error)
        missing = notifier.notify_process_completion(notification(session, uuid.uuid4()))
        assert isinstance(missing.error, LoopNotFound)
        with pytest.raises(OwnerMismatch):
            notifier.notify_process_completion(notification(uuid.uuid4(), loop))

    def test_undelivered_is_what_the_inbox_still_holds(
        self, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        a, b = notification(session, loop), notification(session, loop)
        notifier.notify_process_completion(a)
        notifier.notify_process_completion(b)
        inbox.consume(a.command_id)
        assert notifier.undelivered(loop) == [b]
        assert notifier.undelivered(uuid.uuid4()) == []
        with pytest.raises(NotFound):
            inbox.consume(uuid.uuid4())


# -- the pieces ---------------------------------------------------------------------------------


def test_inbox_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="capacity"):
        LoopInbox(0)
    with pytest.raises(ValueError, match="remember"):
        LoopInbox(remember=-1)
    assert LoopInbox().capacity == 64


def test_an_inbox_serves_one_loop() -> None:
    notifier = Notifier(None, uuid.uuid4())
    inbox = notifier.add_loop(uuid.uuid4())
    with pytest.raises(ValueError, match="already attached"):
        notifier.add_loop(uuid.uuid4(), inbox)
    with pytest.raises(ValueError, match="already attached"):
        Notifier(None, uuid.uuid4()).add_loop(uuid.uuid4(), inbox)


def test_adding_the_same_loop_twice_is_idempotent_only_when_identical() -> None:
    notifier = Notifier(None, uuid.uuid4())
    loop = uuid.uuid4()
    inbox = notifier.add_loop(loop)
    assert notifier.add_loop(loop, inbox) is inbox
    with pytest.raises(ValueError, match="already attached"):
        notifier.add_loop(loop)


def test_notifier_session_must_be_a_non_zero_uuid() -> None:
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        Notifier(None, "00000000-0000-0000-0000-000000000000")
    assert caught.value.field == "session_id"
    with pytest.raises(ProcessLifecycleValidationError):
        Notifier(None, "nope")
    sid = uuid.uuid4()
    assert Notifier(None, str(sid)).session_id == sid


def test_inbox_wait_returns_once_something_is_pending() -> None:
    session, loop = uuid.uuid4(), uuid.uuid4()
    notifier = Notifier(None, session)
    inbox = notifier.add_loop(loop)
    assert inbox.wait(timeout=0) is False
    notifier.notify_process_completion(notification(session, loop))
    assert inbox.wait(timeout=0) is True
    assert inbox.wait() is True


def test_dispositions_are_snake_case_strings() -> None:
    assert [d.value for d in NotificationDisposition] == [
        "accepted",
        "duplicate",
        "collision",
        "stopped",
    ]
