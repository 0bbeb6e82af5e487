"""48 concurrent writers and one reader paging the change feed with ``limit=2``.

Each writer registers a process, appends a producer event and completes it; meanwhile the
reader follows the feed. Every non-empty page must advance the cursor strictly, and at the
end every process must have been seen terminal exactly once — a change committed behind the
reader's cursor would be missed. Writers are threads on ``memory://`` and OS processes on a
SQLite file and on PostgreSQL (each recorded by its ``Popen`` and killed by PID if it outlives
the test).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import procledger
from _shared import child_env, end_process
from procledger import ProcessRegistry, open_registry
from procledger.projections import ChangeCursor

WRITERS = 48
WRITER_SCRIPT = Path(__file__).with_name("_feed_writer.py")
DEADLINE_S = 240  # a fail-fast net, not a synchronisation


class FeedFollower:
    """Pages with limit 2, checking each page as it comes."""

    def __init__(self, registry: ProcessRegistry) -> None:
        self.registry = registry
        self.cursor = ChangeCursor.initial()
        self.terminal_sightings: Counter[str] = Counter()
        self.pages = 0

    def step(self) -> bool:
        page, following = self.registry.changes_since(self.cursor, 2)
        if not page:
            assert following == self.cursor
            return False
        assert following > self.cursor, (self.cursor, following)
        assert following.value == page[-1].change_seq
        keys = [(record.change_seq, record.id) for record in page]
        assert keys == sorted(keys)
        assert len({record.id for record in page}) == len(page)
        assert all(record.change_seq > self.cursor.value for record in page)
        for record in page:
            if record.is_terminal:
                self.terminal_sightings[record.id] += 1
        self.cursor = following
        self.pages += 1
        return True

    def follow_until(self, writers_done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            finished = writers_done()  # read before paging: then an empty page is final
            if not self.step() and finished:
                return
            assert time.monotonic() < deadline, "writers did not finish in time"


def check(follower: FeedFollower, names: list[str]) -> None:
    assert follower.terminal_sightings == Counter(dict.fromkeys(names, 1))
    assert follower.pages >= WRITERS // 2
    final = follower.registry.list_processes({"status": "completed"})
    assert [record.id for record in final] == sorted(names)


def names() -> list[str]:
    return [f"writer-{index:02d}" for index in range(WRITERS)]


def test_threads_on_memory() -> None:
    url = "memory://"
    registry = open_registry(url)
    try:
        go = threading.Barrier(WRITERS + 1)
        errors: list[BaseException] = []

        def writer(process_id: str) -> None:
            try:
                go.wait()
                registry.register(_registration(process_id))
                registry.append_event(process_id, "signal.ready", {}, replay_key="r")
                registry.record_started(process_id, 1)
                registry.record_completed(
                    process_id, "exited", "exited", exit_code=0, authority=_AUTHORITY
                )
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=writer, args=(name,)) for name in names()]
        for thread in threads:
            thread.start()
        follower = FeedFollower(registry)
        go.wait()
        follower.follow_until(lambda: not any(thread.is_alive() for thread in threads))
        for thread in threads:
            thread.join()
        assert errors == []
        check(follower, names())
    finally:
        registry.close()


class Writers:
    """Writer OS processes started together; every one is killed by PID on the way out."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, url: str, process_ids: list[str]) -> None:
        env = child_env()
        for process_id in process_ids:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(WRITER_SCRIPT), url, process_id],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
        for proc in self.procs:  # synchronise on state: every registry is open
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line == "ready\n", (line, proc.stderr.read() if proc.stderr else "")

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def all_exited(self) -> bool:
        return all(proc.poll() is not None for proc in self.procs)

    def check_outcomes(self) -> None:
        for proc in self.procs:
            out, err = proc.communicate(timeout=DEADLINE_S)
            assert (proc.returncode, out.splitlines()[-1:]) == (0, ["done"]), err

    def kill_all(self) -> None:
        for proc in self.procs:
            end_process(proc)


@pytest.fixture
def writers() -> Iterator[Writers]:
    started = Writers()
    try:
        yield started
    finally:
        started.kill_all()


def _follow_os_writers(url: str, writers: Writers) -> None:
    registry = open_registry(url)  # creates the tables before the writers race to
    try:
        writers.start(url, names())
        follower = FeedFollower(registry)
        writers.go()
        follower.follow_until(writers.all_exited)
        writers.check_outcomes()
        check(follower, names())
    finally:
        registry.close()


@pytest.mark.slow
def test_os_processes_on_sqlite(tmp_path: Path, writers: Writers) -> None:
    _follow_os_writers(f"sqlite:///{tmp_path / 'ledger.db'}", writers)


@pytest.mark.slow
@pytest.mark.postgres
def test_os_processes_on_postgres(postgres_schema_url: str, writers: Writers) -> None:
    _follow_os_writers(postgres_schema_url, writers)


def _registration(process_id: str) -> procledger.ProcessRegistration:
    return procledger.ProcessRegistration(
        id=process_id,
        input=procledger.ProcessInput.external({"label": "writer"}),
        disposition=procledger.RecoveryDisposition.externally_owned,
        originator=procledger.Originator.host(),
        event_types=[procledger.EventType(name="signal.ready")],
    )


_AUTHORITY = procledger.CompletionAuthority.external_owner("feed-test")
