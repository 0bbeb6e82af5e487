"""Group commit: the write transactions of one SQLite file that are ready at once, from any
threads of this process, commit together (docs/design.md §7.3).

Why. A write on a SQLite file ends in a commit that fsyncs the WAL, and only one connection
may write at a time. Threads that each opened their own ``BEGIN IMMEDIATE`` waited in SQLite's
busy handler, which sleeps (1, 2, 5, ... up to 100 ms between tries) instead of waking when the
lock is free: with five writer threads most of a write's wall time was that sleep. Here the
writers of one process queue on a Python lock (the *baton*), and those queued at the same
moment share one transaction and one fsync.

How. The holder of the baton runs its body in the open group transaction (opening it with
``BEGIN IMMEDIATE`` if there is none), inside a savepoint of its own (but the first): a body
that raises rolls back to its savepoint -- its writes are undone, the others' stay -- and its
caller gets its own error. The holder then hands the baton on: if another writer is queued
(and the group is not full) the transaction stays open for it; otherwise the holder commits,
for every member. Each member's call returns only once that commit has succeeded, so a
returned write is durable exactly as if it had committed alone (``synchronous=FULL``: the WAL
is fsynced by the commit).
If the commit fails, or a body's error ended the whole transaction (SQLite rolls back by itself
on a full disk or an I/O error), every member gets that failure -- including a member whose
own body failed, since its decision may have rested on writes that were then rolled back.

Members see each other's uncommitted writes, as a later transaction would see an earlier
one's: a group is a serial order that commits at once. Other connections (other processes,
readers) see the group's writes only when it commits.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from procledger.domain.errors import StoreError

MAX_MEMBERS = 64
"""Writers one transaction takes at most: a continuous stream of writers still commits."""

SAVEPOINT = "procledger_member"


class Group:
    """One open transaction and the writers in it; ``done`` is set once it has ended."""

    __slots__ = ("connection", "done", "failure", "members")

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection
        self.members = 0
        self.done = threading.Event()
        self.failure: BaseException | None = None
        """Why the group's transaction did not commit (``None``: it committed, or is open)."""


class WriteGroups:
    """The baton and the open group of one SQLite file store in this process."""

    def __init__(
        self,
        acquire: Callable[[], sqlite3.Connection],
        release: Callable[[sqlite3.Connection], None],
        max_members: int = MAX_MEMBERS,
        timeout: float | None = None,
    ) -> None:
        self._acquire = acquire
        self._release = release
        self.max_members = max_members
        self.timeout = timeout
        """How long a writer waits for the baton (``None``: as long as it takes); past it,
        the writer fails as it would waiting for SQLite's own lock."""
        self.commits = 0
        """Transactions committed so far (each ended a group: one fsync)."""
        self.writes = 0
        """Writers that have held the baton so far (``writes / commits``: writes per fsync)."""
        self.held_s = 0.0
        """Seconds the baton has been held so far: this process's writes, one after another,
        bodies and commits. Near the wall time, the write path is what bounds a workload
        (``benchmarks/async_supervise.py`` reports it)."""
        self._taken_at = 0.0
        self.forget_after_fork()

    @property
    def queued(self) -> int:
        """Writers waiting for the baton now."""
        return self._queued

    def forget_after_fork(self) -> None:
        """A fresh baton and no open group (in a forked child, another thread of the parent
        may have held them)."""
        self._baton = threading.Lock()
        self._counts = threading.Lock()
        self._queued = 0
        self._holder: int | None = None
        self._group: Group | None = None

    def join(self) -> tuple[Group, sqlite3.Cursor]:
        """Wait for the baton, then a cursor in the open group inside this writer's savepoint.
        The caller must then call ``leave`` exactly once.

        Raises:
            StoreError: this thread is already inside a write (it would wait for itself).
            sqlite3.Error: the transaction or the savepoint could not be begun, or the baton
                was not free within ``timeout`` ("database is locked").
        """
        if self._holder == threading.get_ident():
            raise StoreError("a write transaction was begun inside another on the same thread")
        with self._counts:
            self._queued += 1
        try:
            taken = self._baton.acquire(timeout=-1 if self.timeout is None else self.timeout)
        finally:
            with self._counts:
                self._queued -= 1
        if not taken:
            raise sqlite3.OperationalError("database is locked (by this process's writers)")
        self._holder, self._taken_at = threading.get_ident(), time.perf_counter()
        self.writes += 1
        group = self._group
        try:
            if group is None:
                group = self._group = self._open()
            cursor = group.connection.cursor()
            if group.members:  # the first member needs none: see ``_end_part``
                cursor.execute(f"SAVEPOINT {SAVEPOINT}")
        except BaseException:
            self._hand_on(group)
            raise
        group.members += 1
        return group, cursor

    def leave(
        self, group: Group, cursor: sqlite3.Cursor, error: BaseException | None
    ) -> BaseException | None:
        """End this writer's part (kept, or rolled back to its savepoint on ``error``), hand
        the baton on, and wait until the group's transaction has ended.

        Returns why the group did not commit (``None``: it committed; also ``None`` when
        ``error`` itself ended it, which the caller raises anyway). The failure is shared by
        every member: the caller raises an error of its own made from it.
        """
        try:
            try:
                self._end_part(group, cursor, error)
            finally:
                cursor.close()
        except BaseException as failure:  # the savepoint could not be ended: nothing commits
            if group.failure is None:
                group.failure = failure
        finally:
            self._hand_on(group)
        group.done.wait()
        return None if group.failure is error else group.failure

    def _end_part(self, group: Group, cursor: sqlite3.Cursor, error: BaseException | None) -> None:
        """Keep the member's writes, or undo them. The first member of a group has no
        savepoint (a lone writer, the usual case, runs exactly the statements it would run
        alone): if it fails, the transaction holds nothing else, and is rolled back whole."""
        first = group.members == 1
        if error is None:
            if not first:
                cursor.execute(f"RELEASE {SAVEPOINT}")
        elif first or not group.connection.in_transaction:  # or SQLite rolled it all back
            group.failure = error
        else:
            cursor.execute(f"ROLLBACK TO {SAVEPOINT}")
            cursor.execute(f"RELEASE {SAVEPOINT}")

    def _open(self) -> Group:
        connection = self._acquire()
        try:
            connection.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._release(connection)
            raise
        return Group(connection)

    def _hand_on(self, group: Group | None) -> None:
        """With the baton held: leave the group open for a queued writer, or end it (commit,
        or roll back a failed one) for every member; then release the baton. Ending it
        under the baton means the next group's ``BEGIN IMMEDIATE`` never waits for it."""
        try:
            if group is None:
                return
            with self._counts:
                waiting = self._queued
            if waiting and group.failure is None and group.members < self.max_members:
                return  # the next holder continues the group (and ends it, or hands it on)
            self._group = None
            if _end(group, self._release):
                self.commits += 1
        finally:
            self._holder = None
            self.held_s += time.perf_counter() - self._taken_at
            self._baton.release()


def _end(group: Group, release: Callable[[sqlite3.Connection], None]) -> bool:
    """Commit the group (roll it back if it failed) and wake every member; whether it
    committed."""
    connection = group.connection
    try:
        if group.failure is None:
            connection.commit()
        else:
            connection.rollback()
    except BaseException as failure:
        if group.failure is None:
            group.failure = failure
        _rollback_quietly(connection)
    finally:
        release(connection)
        group.done.set()
    return group.failure is None


def _rollback_quietly(connection: Any) -> None:
    """Roll back after a failed commit; its own failure adds nothing to the one reported."""
    try:
        connection.rollback()
    except sqlite3.Error:
        return
