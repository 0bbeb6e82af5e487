"""A burst of starts from many tasks (docs/design.md §17): their writes go together in worker
threads (``Supervisor.start_all``, ``Settle.together``), and each start still ends as it would
alone -- a missing program fails only its own start -- under asyncio and trio."""

from __future__ import annotations

import anyio
import pytest

from procledger import LeaseOwner, ProcessRecord, ProcessRegistry, SpawnError
from procledger.aio import AsyncSupervisor

pytestmark = pytest.mark.anyio

STARTS = 40
MISSING = 7


async def test_a_burst_of_starts_shares_writes_and_each_ends_as_alone(
    registry: ProcessRegistry, owner: LeaseOwner
) -> None:
    groups = registry._store.backend.connections.groups  # type: ignore[attr-defined]
    outcomes: dict[int, ProcessRecord | SpawnError] = {}

    async def one(index: int) -> None:
        argv = ["/nonexistent/program"] if index == MISSING else ["sh", "-c", f"exit {index % 3}"]
        try:
            handle = await sup.start(argv, capture=False)
        except SpawnError as error:
            outcomes[index] = error
            return
        outcomes[index] = await handle.wait()

    writes_before = groups.writes
    async with AsyncSupervisor(registry, owner=owner) as sup:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for index in range(STARTS):
                    group.start_soon(one, index)
    writes = groups.writes - writes_before
    assert isinstance(outcomes.pop(MISSING), SpawnError)
    assert {i: (r.state, r.exit_code) for i, r in outcomes.items()} == {  # type: ignore[union-attr]
        i: ("exited", i % 3) for i in range(STARTS) if i != MISSING
    }
    failed = [r for r in registry.list_processes({"status": "any"}) if r.state == "failed"]
    assert len(failed) == 1
    # alone: three writes a start (two for the missing program) -- 119
    assert writes <= 3 * STARTS // 2, writes
    assert registry.verify().ok
