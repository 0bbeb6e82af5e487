"""The one list selection (docs/design.md §5.2): states kept after reading, a service as one
row (its newest attempt), newest first, pages that stop at ``limit`` rows -- also when a
service's attempts straddle a page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from procledger import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    ProcessRegistry,
    ProcessState,
    RecoveryDisposition,
    open_registry,
)
from procledger.application.listing import select_processes
from procledger.domain.registration import env_ref_for


@pytest.fixture
def registry() -> Iterator[ProcessRegistry]:
    opened = open_registry("memory://")
    try:
        yield opened
    finally:
        opened.close()


def _register(registry: ProcessRegistry, process_id: str, **fields: object) -> None:
    registry.register(
        ProcessRegistration(
            id=process_id,
            input=ProcessInput.command(["true"], cwd="/"),
            disposition=RecoveryDisposition.owner_bound,
            originator=Originator.host(),
            env_ref=env_ref_for({}),
            **fields,  # type: ignore[arg-type]
        )
    )


def test_newest_first_with_states_kept_after_reading(registry: ProcessRegistry) -> None:
    for index in range(5):
        _register(registry, f"p-{index}")
    everything = select_processes(registry, None)
    assert [r.id for r in everything.records] == ["p-4", "p-3", "p-2", "p-1", "p-0"]
    page = select_processes(registry, None, limit=2, before="p-3")
    assert [r.id for r in page.records] == ["p-2", "p-1"]
    none = select_processes(registry, None, states={ProcessState.exited}, limit=2)
    assert none.records == []
    assert select_processes(registry, None, limit=0).records == []


def test_a_service_is_one_row_even_across_pages(registry: ProcessRegistry) -> None:
    _register(registry, "a")
    _register(registry, "s", attempt=1)
    _register(registry, "s.2", attempt_of="s", attempt=2)
    _register(registry, "s.3", attempt_of="s", attempt=3)
    _register(registry, "z")
    rows = select_processes(registry, None, limit=2)  # pages of 2: z s.3 | s.2 s | a
    assert [r.id for r in rows.records] == ["z", "s.3"]
    assert [r.id for r in select_processes(registry, None, limit=3).records] == ["z", "s.3", "a"]
    every = select_processes(registry, None, attempts=True)
    assert [r.id for r in every.records] == ["z", "s.3", "s.2", "s", "a"]
