"""What a killed writer's files tell (issue 15, docs/design.md §14): ``OutputReader.totals``
reads back, from disk alone, the totals and tail the writer would have reported had it lived,
so ``restore`` can put a dead supervisor's output facts in the ledger."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from procledger.adapters.output_files import TAIL_BYTES, OutputReader, OutputWriter

WRITES = st.lists(
    st.tuples(st.integers(0, 1), st.integers(1, 20_000), st.integers(0, 255)), max_size=30
)


@settings(max_examples=60, deadline=None)
@given(writes=WRITES, limit=st.sampled_from([16 * 1024, 64 * 1024, 1024 * 1024]))
def test_the_files_alone_give_the_writers_totals_and_tail(
    writes: list[tuple[int, int, int]], limit: int
) -> None:
    with tempfile.TemporaryDirectory() as base:
        folder = Path(base) / "out"
        writer = OutputWriter(folder, limit)
        for stream, size, byte in writes:
            writer.write(stream, bytes([byte]) * size)
        reader = OutputReader(folder)  # read before close: as after a kill -9 of the writer
        for stream in (0, 1):
            alive, found = writer.streams[stream], reader.totals(stream)
            if alive.kept == 0 and alive.written > 0:
                # every byte dropped: the order file bounds it from below, never above
                assert found.kept == 0
                assert found.written <= alive.written
                continue
            assert (found.written, found.kept, found.dropped) == (
                alive.written,
                alive.kept,
                alive.dropped,
            )
            kept_tail = min(TAIL_BYTES, alive.kept)  # the disk has only what was kept
            assert bytes(found.tail) == (bytes(alive.tail)[-kept_tail:] if kept_tail else b"")
        writer.close()


def test_a_folder_that_is_not_there_has_no_totals(tmp_path: Path) -> None:
    reader = OutputReader(tmp_path / "never")
    assert not reader.exists()
    totals = reader.totals(0)
    assert (totals.written, totals.kept, totals.dropped, bytes(totals.tail)) == (0, 0, 0, b"")
