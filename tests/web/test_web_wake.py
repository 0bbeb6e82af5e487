"""What wakes the web view's feed hub (docs/design.md §16.2): another process's commit, told
by the store itself -- inotify on SQLite, LISTEN on PostgreSQL -- not the hub's clock. The
check intervals are pushed out of reach, so only the news can wake a wait in time."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from _shared import CLI, Processes, child_env
from procledger import open_registry
from procledger.web import wake
from procledger.web.wake import LedgerWake


def woken_by_a_commit_elsewhere(url: str, procs: Processes) -> str:
    """How the hub's wake listens, once a wait ended because another process committed."""

    async def main() -> str:
        registry = open_registry(url)
        waker = await LedgerWake.open(registry)
        try:
            before = registry.latest_change_seq()
            writer = subprocess.Popen([*CLI, "--url", url, "run", "--", "true"], env=child_env())
            procs.add(writer.pid)
            while registry.latest_change_seq() == before:  # a spurious wake waits again
                await asyncio.wait_for(waker.wait(), 30)
            await asyncio.to_thread(writer.wait, 30)
            return waker.how
        finally:
            waker.close()
            registry.close()

    return asyncio.run(main())


@pytest.fixture(autouse=True)
def no_timely_check(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INOTIFY_CHECK_S", "LISTEN_CHECK_S"):
        monkeypatch.setattr(wake, name, 600.0)


def test_sqlite_wakes_on_inotify(tmp_path: Path, procs: Processes) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    assert woken_by_a_commit_elsewhere(url, procs) == "inotify"


@pytest.mark.postgres
def test_postgresql_wakes_on_listen(
    postgres_schemas: Callable[[], AbstractContextManager[str]], procs: Processes
) -> None:
    with postgres_schemas() as url:
        open_registry(url).close()  # the schema, before anyone listens to it
        assert woken_by_a_commit_elsewhere(url, procs) == "listen"
