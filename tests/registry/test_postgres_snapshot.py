"""On PostgreSQL a read sees one snapshot for all its statements (docs/design.md §7.3): a
process's log and its head row are read by two statements, and a write committed between them
must not make a healthy log look damaged (a CI run met this: `show` through the agent said
"event v4 (up to v5) is missing" while the 50 MB test's process was being written)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _shared import command_registration
from procledger import ProcessRegistry, open_registry
from procledger.adapters.sql import record_rows

pytestmark = pytest.mark.postgres


@pytest.fixture
def two(postgres_schema_url: str) -> Iterator[tuple[ProcessRegistry, ProcessRegistry]]:
    reader, writer = open_registry(postgres_schema_url), open_registry(postgres_schema_url)
    try:
        yield reader, writer
    finally:
        reader.close()
        writer.close()


def test_a_write_committed_during_a_read_is_not_seen_by_it(
    two: tuple[ProcessRegistry, ProcessRegistry],
) -> None:
    reader, writer = two
    writer.register(command_registration("a"))

    def read(tx: object) -> tuple[bool, bool]:
        before = record_rows.record_payload(tx, "b") is not None  # type: ignore[arg-type]
        writer.register(command_registration("b"))  # another connection commits meanwhile
        after = record_rows.record_payload(tx, "b") is not None  # type: ignore[arg-type]
        return before, after

    assert reader.run_read(read) == (False, False)
    assert reader.get("b").id == "b"  # the next read sees it
