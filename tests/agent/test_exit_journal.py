"""The exit journal: records round-trip with stable offsets, a torn last line waits until it is
complete, garbage never raises, a writer after a crash never glues a record to a fragment, and
compaction drops only sealed segments, so a live writer loses nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procledger.agent.exit_journal import (
    ExitRecord,
    JournalBusy,
    JournalWriter,
    compact,
    read_exits,
)


def record(pid: int, **fields: object) -> ExitRecord:
    values: dict[str, object] = {
        "start_time": 1000 + pid, "exit_code": pid % 256, "signal": None, "core_dumped": False,
        "time_ms": 1_700_000_000_000, "boot_id": "boot", "pid_ns": 4026531836,
    }  # fmt: skip
    values.update(fields)
    return ExitRecord(pid=pid, **values)  # type: ignore[arg-type]


def write(path: Path, *pids: int, segment_bytes: int = 1 << 20) -> None:
    writer = JournalWriter(path, segment_bytes)
    writer.open()
    try:
        for pid in pids:
            writer.append(record(pid))
    finally:
        writer.close()


def unplaced(records: list[ExitRecord]) -> list[ExitRecord]:
    """``records`` without their offsets, to compare with records made here."""
    return [r._replace(offset=-1) for r in records]


def only_segment(path: Path) -> Path:
    (segment,) = path.glob("exits-*.jsonl")
    return segment


def test_records_round_trip_with_their_offsets(tmp_path: Path) -> None:
    write(tmp_path, 1, 2, 3)
    records, end = read_exits(tmp_path)
    assert unplaced(records) == [record(1), record(2), record(3)]
    assert end == only_segment(tmp_path).stat().st_size
    line = len(record(1).to_line())
    assert [r.offset for r in records] == [0, line, 2 * line]
    assert read_exits(tmp_path, records[1].offset)[0] == records[1:]
    assert read_exits(tmp_path, end) == ([], end)


def test_a_missing_journal_reads_as_empty(tmp_path: Path) -> None:
    assert read_exits(tmp_path / "nowhere", 42) == ([], 42)


def test_a_torn_last_line_is_read_once_it_is_complete(tmp_path: Path) -> None:
    write(tmp_path, 1, 2)
    segment = only_segment(tmp_path)
    complete = segment.stat().st_size
    line = record(3).to_line()
    with open(segment, "ab") as file:
        file.write(line[:10])
    records, end = read_exits(tmp_path)
    assert (unplaced(records), end) == ([record(1), record(2)], complete)
    assert read_exits(tmp_path, complete) == ([], complete)
    with open(segment, "ab") as file:
        file.write(line[10:])
    records, end = read_exits(tmp_path, complete)
    assert (unplaced(records), end) == ([record(3)], complete + len(line))
    assert records[0].offset == complete


def test_a_writer_after_a_crash_mid_write_never_glues_a_record_to_the_fragment(
    tmp_path: Path,
) -> None:
    write(tmp_path, 1)
    with open(only_segment(tmp_path), "ab") as file:
        file.write(record(2).to_line()[:25])  # the predecessor died here
    write(tmp_path, 3)
    assert unplaced(read_exits(tmp_path)[0]) == [record(1), record(3)]


def test_complete_lines_that_are_not_records_are_skipped(tmp_path: Path) -> None:
    write(tmp_path, 1)
    with open(only_segment(tmp_path), "ab") as file:
        file.write(b'not json\n{"v":99,"pid":2}\n[1,2]\n{"v":1,"pid":"x"}\n\x00\x00\n')
    write(tmp_path, 3)
    assert unplaced(read_exits(tmp_path)[0]) == [record(1), record(3)]


@given(data=st.binary(max_size=400))
def test_reading_any_bytes_never_raises(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    directory = tmp_path_factory.mktemp("journal")
    (directory / f"exits-{0:020d}.jsonl").write_bytes(data)
    records, end = read_exits(directory)
    assert end == data.rfind(b"\n") + 1
    assert all(0 <= r.offset < end for r in records)


def test_segments_roll_and_offsets_stay_stable_across_them(tmp_path: Path) -> None:
    write(tmp_path, 1, 2, 3, 4, 5, segment_bytes=1)  # every record seals its segment
    assert len(list(tmp_path.glob("exits-*.jsonl"))) == 6  # the newest is empty
    records, end = read_exits(tmp_path)
    assert [r.pid for r in records] == [1, 2, 3, 4, 5]
    assert end == sum(len(record(pid).to_line()) for pid in range(1, 6))
    assert [r.pid for r in read_exits(tmp_path, records[3].offset)[0]] == [4, 5]


def test_compaction_drops_only_sealed_segments_before_the_offset(tmp_path: Path) -> None:
    write(tmp_path, 1, 2, 3, 4, 5, segment_bytes=1)
    records, end = read_exits(tmp_path)
    assert compact(tmp_path, records[3].offset) == 3
    assert read_exits(tmp_path) == (records[3:], end)
    assert compact(tmp_path, end + 10**9) == 2  # never the newest
    assert len(list(tmp_path.glob("exits-*.jsonl"))) == 1
    write(tmp_path, 6)
    assert [r.pid for r in read_exits(tmp_path, end)[0]] == [6]


def test_compacting_while_the_writer_appends_loses_nothing(tmp_path: Path) -> None:
    """The agent delivers and compacts while the anchor appends: every record is read once."""
    count = 600
    writer = JournalWriter(tmp_path, segment_bytes=1024)
    writer.open()

    def append_all() -> None:
        for pid in range(count):
            writer.append(record(pid))

    appender = threading.Thread(target=append_all)
    seen: list[int] = []

    def deliver(offset: int) -> int:
        records, offset = read_exits(tmp_path, offset)
        seen.extend(r.pid for r in records)
        compact(tmp_path, offset)
        return offset

    appender.start()
    offset = 0
    try:
        while appender.is_alive():
            offset = deliver(offset)
    finally:
        appender.join(60)
        writer.close()
    deliver(offset)
    assert seen == list(range(count))
    assert len(list(tmp_path.glob("exits-*.jsonl"))) <= 2


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    first = JournalWriter(tmp_path)
    first.open()
    try:
        with pytest.raises(JournalBusy, match="another anchor"):
            JournalWriter(tmp_path).open()
    finally:
        first.close()
    write(tmp_path, 1)  # free again once the first closed


def test_returncode_follows_subprocess() -> None:
    assert record(1, exit_code=7).returncode == 7
    assert record(1, exit_code=None, signal=9).returncode == -9
