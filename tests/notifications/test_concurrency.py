"""Concurrent identical retries write exactly one journal record: threads and OS processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections import Counter

import orjson
import pytest

from _shared import child_env, end_process
from procledger import ProcessRegistry
from procledger.notifications import NotificationDisposition, Notifier

from ._support import fields, notification
from .conftest import Opener

D = NotificationDisposition
THREADS = 8
CHILDREN = 3

# A child opens the store, says "ready", waits for "go" on stdin, appends, prints the outcome.
_CHILD = """
import sys, orjson
from procledger import open_registry
from procledger.domain.notification import ProcessCompletionNotification
registry = open_registry(sys.argv[1])
n = ProcessCompletionNotification.model_validate_json(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
appended = registry.journal_append(n)
print(orjson.dumps({"new": appended.new}).decode(), flush=True)
registry.close()
"""


def _run_children(url: str, payload: str) -> list[dict[str, bool]]:
    env = child_env()
    children: list[subprocess.Popen[str]] = []
    try:
        for _ in range(CHILDREN):
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, url, payload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            children.append(child)
            # Synchronise on state: this child has opened the store. Opening one at a time
            # keeps the race to what is under test, the append.
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        results = []
        for child in children:
            out, _ = child.communicate(timeout=120)
            assert child.returncode == 0, out
            results.append(orjson.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for child in children:  # cleaned up by exact PID, whatever happened
            end_process(child)


class ConcurrencyContract:
    @pytest.fixture
    def open(self) -> Opener:
        raise NotImplementedError

    def test_threads_retrying_through_one_notifier(self, open: Opener) -> None:
        registry = open()
        session, loop = uuid.uuid4(), uuid.uuid4()
        notifier = Notifier(registry, session)
        inbox = notifier.add_loop(loop)
        n = notification(session, loop)
        barrier = threading.Barrier(THREADS)
        results: list[D] = []
        errors: list[BaseException] = []

        def retry() -> None:
            try:
                barrier.wait(timeout=60)
                results.append(notifier.notify_process_completion(n).disposition)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=retry) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        assert Counter(results) == {D.ACCEPTED: 1, D.DUPLICATE: THREADS - 1}
        assert inbox.pending() == [n]
        assert [e.notification for e in registry.journal_entries()] == [n]


class TestMemory(ConcurrencyContract):
    @pytest.fixture
    def open(self, memory_store: Opener) -> Opener:
        return memory_store


class SharedStoreContract(ConcurrencyContract):
    """Stores several registries (threads) and OS processes can share."""

    def test_threads_with_their_own_registries(self, open: Opener) -> None:
        registries: list[ProcessRegistry] = [open() for _ in range(4)]
        n = notification()
        barrier = threading.Barrier(len(registries))
        news: list[bool] = []
        errors: list[BaseException] = []

        def append(registry: ProcessRegistry) -> None:
            try:
                barrier.wait(timeout=60)
                news.append(registry.journal_append(n).new)
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=append, args=(r,)) for r in registries]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert errors == []
        assert sorted(news) == [False, False, False, True]
        assert len(registries[0].journal_entries()) == 1

    @pytest.mark.slow
    def test_os_processes_retrying_write_one_record(self, open: Opener, url: str) -> None:
        registry = open()  # creates the tables before the children race
        payload = orjson.dumps(fields()).decode()
        results = _run_children(url, payload)
        assert sorted(r["new"] for r in results) == [False] * (CHILDREN - 1) + [True]
        [entry] = registry.journal_entries()
        assert entry.notification.model_dump_json() == payload


class TestSQLite(SharedStoreContract):
    @pytest.fixture
    def url(self, sqlite_url: str) -> str:
        return sqlite_url

    @pytest.fixture
    def open(self, sqlite_store: Opener) -> Opener:
        return sqlite_store


@pytest.mark.postgres
class TestPostgres(SharedStoreContract):
    @pytest.fixture
    def url(self, postgres_schema_url: str) -> str:
        return postgres_schema_url

    @pytest.fixture
    def open(self, postgres_store: Opener) -> Opener:
        return postgres_store
