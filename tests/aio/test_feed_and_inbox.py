"""``follow`` over the change feed and ``notifications`` over a loop's inbox
(docs/design.md §17), under asyncio and trio."""

from __future__ import annotations

import sqlite3
import sys
import threading
import uuid
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from _shared import child_env
from procledger import (
    ChangeCursor,
    Notifier,
    Originator,
    ProcessCompletionNotification,
    ProcessInput,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
    open_registry,
)
from procledger.aio import FeedChange, follow, notifications

pytestmark = pytest.mark.anyio

WRITER = Path(__file__).with_name("_writer.py")


def register(registry: ProcessRegistry, process_id: str) -> None:
    registry.register(
        ProcessRegistration(
            id=process_id,
            input=ProcessInput.external({"n": process_id}),
            disposition=RecoveryDisposition.externally_owned,
            originator=Originator.host(),
        )
    )


async def take(
    registry: ProcessRegistry, cursor: ChangeCursor | int, count: int
) -> list[FeedChange]:
    got: list[FeedChange] = []
    with anyio.fail_after(30):
        async with aclosing(follow(registry, cursor, limit=7)) as changes:
            async for change in changes:
                got.append(change)
                if len(got) == count:
                    break
    return got


async def test_follow_sees_every_change_of_a_concurrent_writer(registry: ProcessRegistry) -> None:
    ids = [f"p-{i:03d}" for i in range(60)]
    register(registry, ids[0])
    writer = threading.Thread(target=lambda: [register(registry, i) for i in ids[1:]])
    writer.start()
    try:
        got = await take(registry, 0, len(ids))
    finally:
        writer.join(30)
    assert sorted(c.record.id for c in got) == ids
    seqs = [c.record.change_seq for c in got]
    assert seqs == sorted(seqs)
    assert [c.cursor.value for c in got] == seqs  # one event per change here: every cursor
    resumed = await take(registry, got[29].cursor, 30)
    assert [c.record.id for c in resumed] == [c.record.id for c in got[30:]]


async def test_follow_passes_a_page_of_damaged_rows_only(
    registry: ProcessRegistry, tmp_path: Path
) -> None:
    """A page holding only damaged rows (here ``limit=1`` and one damaged record) still moves
    the follower on: the change after it is yielded, not waited for for ever."""
    for process_id in ("a-good", "b-bad", "c-good"):
        register(registry, process_id)
    with sqlite3.connect(tmp_path / "ledger.db") as raw:
        raw.execute("UPDATE procledger_records SET record='{broken' WHERE process_id='b-bad'")
    raw.close()
    got: list[str] = []
    with anyio.fail_after(30):
        async with aclosing(follow(registry, 0, limit=1)) as changes:
            async for change in changes:
                got.append(change.record.id)
                if change.record.id == "c-good":
                    break
    assert got == ["a-good", "c-good"]


async def test_follow_is_woken_by_another_process(shared_url: str) -> None:
    registry = open_registry(shared_url)
    try:
        start = registry.changes_since(0, 1000)[1]
        async with anyio.create_task_group() as group:
            argv = [sys.executable, str(WRITER), shared_url, "other", "20", "0.01"]
            group.start_soon(lambda: anyio.run_process(argv, env=child_env(), check=True))
            got = await take(registry, start, 20)
    finally:
        registry.close()
    assert [c.record.id for c in got] == [f"other-{i:04d}" for i in range(20)]


def completion(session: uuid.UUID, loop: uuid.UUID, n: int) -> ProcessCompletionNotification:
    return ProcessCompletionNotification(
        command_id=uuid.uuid4(),
        session_id=session,
        loop_id=loop,
        process_handle=f"handle-{n}",
        state="exited",
        reason="exited",
    )


async def test_two_consumers_get_each_notification_once(registry: ProcessRegistry) -> None:
    session, loop = uuid.uuid4(), uuid.uuid4()
    notifier = Notifier(registry, session)
    inbox = notifier.add_loop(loop)
    sent = [completion(session, loop, n) for n in range(40)]
    seen: dict[str, list[uuid.UUID]] = {"a": [], "b": []}
    done = anyio.Event()

    async def consume(name: str) -> None:
        async with aclosing(notifications(inbox)) as notes:
            async for note in notes:
                seen[name].append(note.command_id)
                if len(seen["a"]) + len(seen["b"]) == len(sent):
                    done.set()
                await anyio.sleep(0)

    def deliver() -> None:
        for note in sent:
            assert notifier.notify_process_completion(note).disposition == "accepted"

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(consume, "a")
            group.start_soon(consume, "b")
            await anyio.to_thread.run_sync(deliver)
            await done.wait()
            group.cancel_scope.cancel()
    everything = seen["a"] + seen["b"]
    assert sorted(everything) == sorted(n.command_id for n in sent)
    assert len(set(everything)) == len(everything)
    assert inbox.pending() == []
    assert notifier.undelivered(loop) == []  # consumed in the journal too
    again = notifier.notify_process_completion(sent[0])
    assert again.disposition == "duplicate"
