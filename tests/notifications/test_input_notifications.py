"""Waiting-for-input notifications (docs/design.md §4.4): the second kind of process notification.

Its checks run in a fixed order with a typed error naming the field; on every store it is
journalled before dispatch and deduplicated by command id exactly as a completion is; both
kinds share one journal, one inbox and one order; and a journal row written before this kind
existed (no ``notification_type``) still reads as a completion.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import orjson
import pydantic
import pytest

from procledger import (
    ProcessCompletionNotification,
    ProcessInputNotification,
    ProcessRegistry,
    WaitKind,
    open_registry,
)
from procledger.adapters.sql import journal_rows
from procledger.aio import notifications
from procledger.domain.errors import (
    IdempotencyCollision,
    LoopNotFound,
    OwnerMismatch,
    ProcessLifecycleValidationError,
    StoreCorrupt,
    UnsupportedLoop,
)
from procledger.domain.notification import Notification
from procledger.notifications import Delivery, LoopInbox, NotificationDisposition, Notifier

from ._support import ZERO_UUID, notification
from .conftest import Opener

D = NotificationDisposition
INPUT_FIELDS = ("command_id", "session_id", "loop_id", "process_handle", "kind")
GOLDEN = Path(__file__).parents[1] / "golden" / "ledger-0.1.0.db"
GOLDEN_SESSION = uuid.UUID("5e55107a-0000-4000-8000-000000000001")
GOLDEN_LOOP = uuid.UUID("100b0000-0000-4000-8000-000000000001")


def input_fields(
    session_id: uuid.UUID | str | None = None,
    loop_id: uuid.UUID | str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """A valid waiting-for-input notification as a JSON-native dict (fresh command id)."""
    data: dict[str, Any] = {
        "command_id": str(uuid.uuid4()),
        "session_id": str(session_id or uuid.uuid4()),
        "loop_id": str(loop_id or uuid.uuid4()),
        "process_handle": "BBBBBBBBBBBBBBBBBBBBBB",
        "kind": "password",
    }
    data.update(overrides)
    return data


def waiting(
    session_id: uuid.UUID | None = None, loop_id: uuid.UUID | None = None, **overrides: Any
) -> ProcessInputNotification:
    return ProcessInputNotification.model_validate(input_fields(session_id, loop_id, **overrides))


def send(notifier: Notifier, n: Notification) -> Delivery:
    """Each kind through its own method."""
    if isinstance(n, ProcessInputNotification):
        return notifier.notify_input_wait(n)
    return notifier.notify_process_completion(n)


def rejected(data: Any) -> ProcessLifecycleValidationError:
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        ProcessInputNotification.model_validate(data)
    return caught.value


def stored_rows(registry: ProcessRegistry) -> list[Any]:
    with registry._store.read() as tx:
        return tx.execute(f"SELECT * FROM {registry._store.table('journal')} ORDER BY seq").all()


def insert_row(registry: ProcessRegistry, payload: dict[str, Any]) -> None:
    """A journal row written as an older procledger (or a damaged store) left it."""
    registry._store.attempt(
        lambda tx: journal_rows.insert(
            tx,
            payload["command_id"],
            session_id=payload["session_id"],
            loop_id=payload["loop_id"],
            process_handle=payload["process_handle"],
            payload=orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode(),
        ),
        write=True,
    )


@pytest.fixture
def session() -> uuid.UUID:
    return uuid.uuid4()


@pytest.fixture
def loop() -> uuid.UUID:
    return uuid.uuid4()


# -- the command: ordered checks, typed errors, metadata only ---------------------------------


@pytest.mark.parametrize("kind", ["password", "question", "prompt", "input"])
def test_each_kind_round_trips_through_json(kind: str) -> None:
    n = waiting(kind=kind)
    assert n.kind is WaitKind(kind)
    assert list(orjson.loads(n.model_dump_json())) == list(INPUT_FIELDS)
    assert ProcessInputNotification.model_validate_json(n.model_dump_json()) == n
    assert ProcessInputNotification(**input_fields(kind=WaitKind(kind))).kind is WaitKind(kind)


def test_it_carries_metadata_only() -> None:
    assert tuple(ProcessInputNotification.model_fields) == INPUT_FIELDS
    for leak in ("last_line", "output", "pid", "command", "how", "state"):
        assert rejected(input_fields(**{leak: "x"})).field == leak


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("command_id", "not-a-uuid"),
        ("command_id", ZERO_UUID),
        ("command_id", 42),
        ("command_id", None),
        ("session_id", "nope"),
        ("session_id", ZERO_UUID),
        ("loop_id", ["x"]),
        ("loop_id", ZERO_UUID),
        ("process_handle", ""),
        ("process_handle", "has space"),
        ("process_handle", "trailing-newline\n"),
        ("process_handle", "x" * 129),
        ("process_handle", 7),
        ("kind", "PASSWORD"),
        ("kind", "secret"),
        ("kind", ""),
        ("kind", None),
        ("kind", 1),
        ("kind", ["password"]),
    ],
)
def test_each_wrong_field_is_a_typed_error_naming_it(field: str, bad: Any) -> None:
    error = rejected(input_fields(**{field: bad}))
    assert (error.field, type(error)) == (field, ProcessLifecycleValidationError)
    assert not isinstance(error, ValueError | pydantic.ValidationError)
    with pytest.raises(ProcessLifecycleValidationError) as from_json:
        ProcessInputNotification.model_validate_json(orjson.dumps(input_fields(**{field: bad})))
    assert from_json.value.field == field


def test_a_missing_field_is_named_too() -> None:
    for field in INPUT_FIELDS:
        data = input_fields()
        del data[field]
        assert rejected(data).field == field


def test_the_first_failing_check_is_reported() -> None:
    everything_wrong = input_fields(
        command_id="x", session_id="x", loop_id="x", process_handle="!", kind="?", extra=1
    )
    assert rejected(everything_wrong).field == "extra"
    del everything_wrong["extra"]
    assert rejected(everything_wrong).field == "command_id"
    assert rejected(input_fields(loop_id="x", process_handle="!", kind="?")).field == "loop_id"
    assert rejected(input_fields(process_handle="!", kind="?")).field == "process_handle"


def test_malformed_json_and_non_objects_are_typed_errors() -> None:
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        ProcessInputNotification.model_validate_json(b"{not json")
    assert caught.value.field == "command_id"
    assert rejected(["password"]).field == "command_id"
    assert rejected("password").field == "command_id"


def test_a_constructed_instance_is_checked_again() -> None:
    sloppy = ProcessInputNotification.model_construct(**{**input_fields(), "kind": "nope"})
    assert rejected(sloppy).field == "kind"
    with pytest.raises(ProcessLifecycleValidationError):
        sloppy.revalidated()


def test_the_two_kinds_do_not_pass_for_each_other() -> None:
    wait, done = waiting(), notification()
    assert rejected(done).field == "state"
    with pytest.raises(ProcessLifecycleValidationError) as caught:
        ProcessCompletionNotification.model_validate(wait)
    assert caught.value.field == "kind"


# -- delivery on every store -----------------------------------------------------------------


class InputDeliveryContract:
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

    def test_journalled_before_dispatch_and_read_back_as_its_own_class(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        n = waiting(session, loop, kind="question")
        assert notifier.notify_input_wait(n) == Delivery(D.ACCEPTED, None)
        assert inbox.pending() == [n]
        [entry] = registry.journal_entries()
        assert (entry.notification, entry.consumed) == (n, False)
        assert type(registry.journal_get(n.command_id)) is ProcessInputNotification
        assert registry.journal_get(str(n.command_id)) == n
        [row] = stored_rows(registry)
        assert orjson.loads(row["payload"]) == {
            **n.model_dump(mode="json"),
            "notification_type": "process_input",
        }

    def test_a_completion_is_still_stored_as_its_six_keys(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        notifier.add_loop(loop)
        done = notification(session, loop)
        notifier.notify_process_completion(done)
        [row] = stored_rows(registry)
        # the bytes procledger wrote before there was a second kind
        assert (
            row["payload"]
            == orjson.dumps(done.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS).decode()
        )
        assert type(registry.journal_get(done.command_id)) is ProcessCompletionNotification

    def test_an_identical_retry_is_one_row_and_duplicate_once_consumed(
        self,
        open: Opener,
        registry: ProcessRegistry,
        notifier: Notifier,
        session: uuid.UUID,
        loop: uuid.UUID,
    ) -> None:
        inbox = notifier.add_loop(loop)
        n = waiting(session, loop)
        again = ProcessInputNotification.model_validate_json(n.model_dump_json())
        assert notifier.notify_input_wait(n).disposition == D.ACCEPTED
        assert notifier.notify_input_wait(again) == Delivery(D.DUPLICATE, None)  # pending
        assert len(stored_rows(registry)) == 1
        assert inbox.pending() == [n]
        inbox.consume(n.command_id)
        assert notifier.notify_input_wait(again) == Delivery(D.DUPLICATE, None)
        restarted = Notifier(open(), session)
        fresh = restarted.add_loop(loop)
        assert restarted.notify_input_wait(again) == Delivery(D.DUPLICATE, None)
        assert fresh.pending() == []
        assert len(stored_rows(registry)) == 1
        assert [e.consumed for e in registry.journal_entries()] == [True]

    def test_another_payload_under_the_same_command_id_collides(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        first = waiting(session, loop, kind="password")
        notifier.notify_input_wait(first)
        other = waiting(session, loop, command_id=str(first.command_id), kind="prompt")
        delivery = notifier.notify_input_wait(other)
        assert delivery.disposition == D.COLLISION
        assert isinstance(delivery.error, IdempotencyCollision)
        assert str(first.command_id) in str(delivery.error)
        with pytest.raises(IdempotencyCollision):
            registry.journal_append(other)
        assert inbox.pending() == [first]
        assert [e.notification for e in registry.journal_entries()] == [first]

    def test_a_command_id_cannot_serve_both_kinds(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop)
        done = notification(session, loop)
        wait = waiting(session, loop, command_id=str(done.command_id))
        assert notifier.notify_process_completion(done).disposition == D.ACCEPTED
        assert notifier.notify_input_wait(wait).disposition == D.COLLISION
        wait_first = waiting(session, loop)
        done_after = notification(session, loop, command_id=str(wait_first.command_id))
        assert notifier.notify_input_wait(wait_first).disposition == D.ACCEPTED
        assert notifier.notify_process_completion(done_after).disposition == D.COLLISION
        assert inbox.pending() == [done, wait_first]
        assert [e.notification for e in registry.journal_entries()] == [done, wait_first]

    def test_restore_yields_both_kinds_in_journal_order(
        self, open: Opener, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        inbox = notifier.add_loop(loop, LoopInbox(2))
        sent: list[Notification] = [
            waiting(session, loop, kind="prompt"),
            notification(session, loop),
            waiting(session, loop, kind="input"),  # the inbox is full: stopped, journalled
            notification(session, loop, state="failed", reason="failed"),
        ]
        answers = [send(notifier, n).disposition for n in sent]
        assert answers == [D.ACCEPTED] * 2 + [D.STOPPED] * 2
        inbox.consume(sent[1].command_id)

        restarted = Notifier(open(), session)
        assert restarted.undelivered(loop) == [sent[0], sent[2], sent[3]]
        assert [type(n) for n in restarted.undelivered(loop)] == [
            ProcessInputNotification,
            ProcessInputNotification,
            ProcessCompletionNotification,
        ]
        fresh = restarted.add_loop(loop)
        assert [d.disposition for d in restarted.restore_loop(loop)] == [D.ACCEPTED] * 3
        assert fresh.pending() == [sent[0], sent[2], sent[3]]
        assert [d.disposition for d in restarted.restore_loop(loop)] == [D.DUPLICATE] * 3

    def test_refusals_write_nothing(
        self, registry: ProcessRegistry, notifier: Notifier, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        foreign = uuid.uuid4()
        notifier.add_loop(loop)
        notifier.add_loop(foreign, accepts_process_notifications=False)
        unsupported = notifier.notify_input_wait(waiting(session, foreign))
        assert unsupported.disposition == D.STOPPED
        assert isinstance(unsupported.error, UnsupportedLoop)
        assert str(foreign) in str(unsupported.error)
        missing = notifier.notify_input_wait(waiting(session, uuid.uuid4()))
        assert isinstance(missing.error, LoopNotFound)
        with pytest.raises(OwnerMismatch):
            notifier.notify_input_wait(waiting(uuid.uuid4(), loop))
        bad_handle = {**input_fields(session, loop), "process_handle": "no way"}
        sloppy = ProcessInputNotification.model_construct(**bad_handle)
        with pytest.raises(ProcessLifecycleValidationError) as caught:
            notifier.notify_input_wait(sloppy)
        assert caught.value.field == "process_handle"
        with pytest.raises(ProcessLifecycleValidationError) as wrong_kind:
            notifier.notify_input_wait(notification(session, loop))  # type: ignore[arg-type]
        assert wrong_kind.value.field == "state"
        with pytest.raises(ProcessLifecycleValidationError):
            notifier.notify_process_completion(waiting(session, loop))  # type: ignore[arg-type]
        assert stored_rows(registry) == []

    def test_an_old_completion_row_without_a_discriminator_still_reads(
        self, open: Opener, registry: ProcessRegistry, session: uuid.UUID, loop: uuid.UUID
    ) -> None:
        old = notification(session, loop)
        insert_row(registry, old.model_dump(mode="json"))
        wait = waiting(session, loop)
        notifier = Notifier(registry, session)
        inbox = notifier.add_loop(loop)
        assert notifier.notify_input_wait(wait).disposition == D.ACCEPTED
        assert registry.journal_get(old.command_id) == old
        assert notifier.undelivered(loop) == [old, wait]
        # the runner publishing the old completion again (restore) is a retry, not a collision
        assert notifier.notify_process_completion(old).disposition == D.ACCEPTED
        assert inbox.pending() == [wait, old]
        assert len(stored_rows(registry)) == 2

    @pytest.mark.parametrize(
        "payload",
        [
            {"notification_type": "process_output"},
            {"notification_type": 3},
            {"notification_type": "process_input", "state": "exited", "reason": "exited"},
        ],
    )
    def test_an_unreadable_discriminator_is_store_corrupt(
        self,
        registry: ProcessRegistry,
        session: uuid.UUID,
        loop: uuid.UUID,
        payload: dict[str, Any],
    ) -> None:
        fields = notification(session, loop).model_dump(mode="json")
        insert_row(registry, {**fields, **payload})
        with pytest.raises(StoreCorrupt) as caught:
            registry.journal_get(fields["command_id"])
        assert fields["command_id"] in str(caught.value)


class TestMemory(InputDeliveryContract):
    @pytest.fixture
    def open(self, memory_store: Opener) -> Opener:
        return memory_store


class TestSQLite(InputDeliveryContract):
    @pytest.fixture
    def open(self, sqlite_store: Opener) -> Opener:
        return sqlite_store


@pytest.mark.postgres
class TestPostgres(InputDeliveryContract):
    @pytest.fixture
    def open(self, postgres_store: Opener) -> Opener:
        return postgres_store


# -- headless: the inbox alone deduplicates ------------------------------------------------------


def test_headless_dedup_and_collision_rest_on_the_inbox(
    session: uuid.UUID, loop: uuid.UUID
) -> None:
    notifier = Notifier(None, session)
    inbox = notifier.add_loop(loop, LoopInbox(4, remember=4))
    n = waiting(session, loop)
    assert notifier.notify_input_wait(n).disposition == D.ACCEPTED
    again = ProcessInputNotification.model_validate(n.model_dump())
    assert notifier.notify_input_wait(again).disposition == D.DUPLICATE
    changed = ProcessInputNotification.model_validate({**n.model_dump(), "kind": "question"})
    assert notifier.notify_input_wait(changed).disposition == D.COLLISION
    inbox.consume(n.command_id)
    assert notifier.notify_input_wait(n).disposition == D.DUPLICATE
    assert inbox.pending() == []


# -- a ledger 0.1.0 wrote: its completions read, and the new kind joins their order ------------


@pytest.fixture
def golden(tmp_path: Path) -> Iterator[ProcessRegistry]:
    copy = tmp_path / GOLDEN.name
    shutil.copyfile(GOLDEN, copy)
    registry = open_registry(f"sqlite:///{copy}", create=False)
    try:
        yield registry
    finally:
        registry.close()


def test_a_0_1_0_ledger_reads_its_completions_and_takes_input_waits(
    golden: ProcessRegistry,
) -> None:
    before = golden.journal_entries()
    assert before
    assert all(type(e.notification) is ProcessCompletionNotification for e in before)
    notifier = Notifier(golden, GOLDEN_SESSION)
    old = notifier.undelivered(GOLDEN_LOOP)
    wait = waiting(GOLDEN_SESSION, GOLDEN_LOOP, kind="prompt")
    inbox = notifier.add_loop(GOLDEN_LOOP)
    assert notifier.notify_input_wait(wait).disposition == D.ACCEPTED
    assert notifier.undelivered(GOLDEN_LOOP) == [*old, wait]
    # every completion 0.1.0 journalled, published again under its id, is no collision
    for entry in before:
        if entry.notification.loop_id == GOLDEN_LOOP:
            again = send(notifier, entry.notification)
            assert again.disposition in (D.ACCEPTED, D.DUPLICATE)
    assert inbox.pending()[0] == wait
    assert len(golden.journal_entries()) == len(before) + 1


# -- the async iterator hands over both kinds ---------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_async_iterator_yields_both_kinds_in_order(
    backend: str, sqlite_store: Opener, session: uuid.UUID, loop: uuid.UUID
) -> None:
    registry = sqlite_store()
    notifier = Notifier(registry, session)
    inbox = notifier.add_loop(loop)
    sent: list[Notification] = [
        waiting(session, loop),
        notification(session, loop),
        waiting(session, loop),
    ]
    assert [send(notifier, n).disposition for n in sent] == [D.ACCEPTED] * 3

    async def take_three() -> list[Any]:
        got = []
        with anyio.fail_after(30):
            async with aclosing(notifications(inbox)) as notes:
                async for note in notes:
                    got.append(note)
                    if len(got) == len(sent):
                        break
        return got

    assert anyio.run(take_three, backend=backend) == sent
    assert notifier.undelivered(loop) == []
