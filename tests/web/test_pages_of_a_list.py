"""Pages of a list (docs/design.md §5.2) as the web view reads them (§16) -- the newest ids
first, past a given id, filtered, a page costing only its rows -- on every store; and forward
pages, as a library caller walks a long list."""

from __future__ import annotations

import pytest

from procledger import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    ProcessRegistry,
    ProcessScan,
    RecoveryDisposition,
    open_registry,
)
from procledger.domain.registration import env_ref_for
from procledger.web.hub import feed_head
from procledger.web.views import list_query


def register(registry: ProcessRegistry, process_id: str, label: str) -> None:
    registry.register(
        ProcessRegistration(
            id=process_id,
            input=ProcessInput.command([label, "x"], cwd="/tmp"),
            disposition=RecoveryDisposition.owner_bound,
            originator=Originator.host(),
            env_ref=env_ref_for({}),
        )
    )


@pytest.fixture
def registry(registry: ProcessRegistry) -> ProcessRegistry:
    """The shared ``registry`` (on each store), with seven processes labelled in turn."""
    for index in range(7):
        register(registry, f"p{index}", "even" if index % 2 == 0 else "odd")
    return registry


def test_pages_go_backwards_along_the_ids(registry: ProcessRegistry) -> None:
    def newest(filter: object, **page: object) -> ProcessScan:
        return registry.scan_processes(filter, newest_first=True, **page)  # type: ignore[arg-type]

    try:
        first = newest({"status": "any"}, limit=3)
        assert [r.id for r in first.records] == ["p6", "p5", "p4"]
        second = newest({"status": "any"}, after="p4", limit=3)
        assert [r.id for r in second.records] == ["p3", "p2", "p1"]
        last = newest({"status": "any"}, after="p1", limit=3)
        assert [r.id for r in last.records] == ["p0"]
        labelled = newest({"status": "any", "identity_label": "odd"}, limit=9)
        assert [r.id for r in labelled.records] == ["p5", "p3", "p1"]
        assert newest(None, limit=9).records[0].id == "p6"  # starting is running
        with pytest.raises(ValueError, match="limit"):
            newest(None, limit=-1)
    finally:
        registry.close()


def test_pages_go_forwards_along_the_ids(registry: ProcessRegistry) -> None:
    try:
        pages, after = [], None
        while True:
            page = registry.list_processes({"status": "any"}, limit=3, after=after)
            if not page:
                break
            pages.append([r.id for r in page])
            after = page[-1].id
        assert pages == [["p0", "p1", "p2"], ["p3", "p4", "p5"], ["p6"]]
    finally:
        registry.close()


def test_a_state_filter_fills_the_page_from_further_back(registry: ProcessRegistry) -> None:
    try:
        query = list_query({"state": "starting", "label": "even", "limit": "2"})
        assert [r.id for r in query.page(registry).records] == ["p6", "p4"]
        query = list_query({"state": "starting", "label": "even", "limit": "2", "before": "p4"})
        assert [r.id for r in query.page(registry).records] == ["p2", "p0"]
        assert list_query({"state": "exited"}).page(registry).records == []
    finally:
        registry.close()


def test_the_feed_head_is_the_last_change(shared_url: str) -> None:
    registry = open_registry(shared_url)
    try:
        assert feed_head(registry) == 0
        for count in range(1, 12):
            register(registry, f"h{count:02d}", "x")
            last = max(r.change_seq for r in registry.scan_processes({"status": "any"}).records)
            assert feed_head(registry) == last
    finally:
        registry.close()
