"""Reading output a child wrote to files itself (issue 28, docs/design.md §14.1): every reader
of captured output -- ``OutputReader``, ``read_output``/``follow_output``, ``aio``'s
``output_chunks`` and ``procledger logs`` -- reads the direct layout as it reads the segment
layout, with the same chunks, offsets and text.

Real files, written as a child writes them (``open_output_files``, ``O_APPEND`` writes), and real
holes (``punch_hole``): a read from inside the dropped prefix begins where the kept bytes do, as
a read from a deleted segment does, and never returns the zeros the kernel reads from a hole.
Merged, the direct layout has no arrival order to give: stdout comes whole, then stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

import anyio
import pytest

from _shared import CLI, child_env, command_registration, end_process, run_cli
from procledger import LeaseOwner, ProcessRegistry
from procledger.adapters.direct_output import (
    OutputFiles,
    check_hole_punching,
    kept_from,
    open_output_files,
    punch_hole,
    stream_paths,
)
from procledger.adapters.output_files import (
    Chunk,
    DirectReader,
    OutputReader,
    OutputWriter,
    SegmentReader,
    folder_for,
    output_root,
    segment_size_for,
)
from procledger.aio.output import output_chunks
from procledger.application.outbox import store_key, this_host_id
from procledger.application.output import follow_output, read_output
from procledger.domain.records import OsFacts, OutputSummary, StreamOutput


@pytest.fixture
def shared_url(tmp_path: Path) -> str:
    """A SQLite ledger only: what is read here is files on this host, whatever the store, and
    the store's own behaviour is tested with both elsewhere."""
    return f"sqlite:///{tmp_path}/shared.db"


OUT = b"".join(b"out %d\n" % n for n in range(5))
ERR = b"err 0\nerr 1\n"


def write_direct(folder: Path, out: bytes = b"", err: bytes = b"") -> tuple[int, int]:
    """``folder`` in the direct layout, ``out`` and ``err`` written as a child writes them;
    the two append-only descriptors, still open, for more (the caller closes them)."""
    fds = open_output_files(folder)
    for fd, data in zip(fds, (out, err), strict=True):
        if data:
            os.write(fd, data)
    return fds


def direct_folder(folder: Path, out: bytes = b"", err: bytes = b"") -> Path:
    for fd in write_direct(folder, out, err):
        os.close(fd)
    return folder


def segmented_folder(
    folder: Path, out: bytes = b"", err: bytes = b"", limit: int = 1 << 20
) -> OutputWriter:
    """``folder`` as the Supervisor's capture leaves it: stdout's bytes, then stderr's."""
    writer = OutputWriter(folder, limit)
    writer.write(0, out)
    writer.write(1, err)
    writer.close()
    return writer


def block_of(folder: Path) -> int:
    """The unit a punch frees on ``folder``'s file system; skips where holes are not exact."""
    reason = check_hole_punching(folder)
    if reason is not None:
        pytest.skip(reason)
    return max(os.statvfs(folder).f_bsize, 512)


def punch(path: Path, length: int) -> None:
    """Drop ``[0, length)`` of ``path`` as the agent's bound does."""
    fd = os.open(path, os.O_WRONLY)
    try:
        punch_hole(fd, length)
    finally:
        os.close(fd)


def lines(count: int, start: int = 0) -> bytes:
    return b"".join(b"line %06d\n" % n for n in range(start, start + count))


def triple(chunk: Chunk) -> tuple[str, int, bytes]:
    return (chunk.stream, chunk.offset, chunk.data)


def triples(chunks: Iterable[Chunk]) -> list[tuple[str, int, bytes]]:
    return [triple(chunk) for chunk in chunks]


# --- OutputReader on the direct layout --------------------------------------------------------


def test_the_layout_is_told_by_its_file_names(tmp_path: Path) -> None:
    direct = OutputReader(direct_folder(tmp_path / "direct", OUT, ERR))
    segments = OutputReader(tmp_path / "seg")
    segmented_folder(tmp_path / "seg", OUT, ERR)
    assert isinstance(direct.layout(), DirectReader)
    assert isinstance(segments.layout(), SegmentReader)
    empty = tmp_path / "empty"
    empty.mkdir()  # made before its files: read as nothing, and as direct once they come
    reader = OutputReader(empty)
    assert list(reader.merged()) == []
    direct_folder(empty, b"late\n")
    assert isinstance(reader.layout(), DirectReader)
    assert triples(reader.merged()) == [("stdout", 0, b"late\n")]


def test_a_direct_folder_reads_as_the_same_segments_would(tmp_path: Path) -> None:
    direct = OutputReader(direct_folder(tmp_path / "direct", OUT, ERR))
    segments = OutputReader(tmp_path / "seg")
    segmented_folder(tmp_path / "seg", OUT, ERR)  # stdout first: the order direct gives
    assert direct.exists()
    for since in ((0, 0), (4, 0), (0, 7), (len(OUT), 3), (100, 100)):
        assert triples(direct.merged(since)) == triples(segments.merged(since))
    for stream, data in ((0, OUT), (1, ERR)):
        assert direct.end(stream) == segments.end(stream) == len(data)
        for start, end in ((0, None), (3, None), (3, 9), (5, 5), (len(data), None)):
            assert triples(direct.read(stream, start, end)) == triples(
                segments.read(stream, start, end)
            )
        got, want = direct.totals(stream), segments.totals(stream)
        assert (got.written, got.kept, got.dropped, got.tail) == (
            want.written,
            want.kept,
            want.dropped,
            want.tail,
        )


def test_merged_gives_stdout_whole_then_stderr_never_a_made_up_interleaving(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "run"
    out, err = write_direct(folder)
    try:
        for n in range(3):  # the child alternated; the files cannot say so
            os.write(out, b"out %d\n" % n)
            os.write(err, b"err %d\n" % n)
        reader = OutputReader(folder)
        assert triples(reader.merged()) == [
            ("stdout", 0, b"out 0\nout 1\nout 2\n"),
            ("stderr", 0, b"err 0\nerr 1\nerr 2\n"),
        ]
        # read again as bytes come, the streams interleave as finely as the reader looks
        os.write(err, b"err 3\n")
        os.write(out, b"out 3\n")
        assert triples(reader.merged((18, 18))) == [
            ("stdout", 18, b"out 3\n"),
            ("stderr", 18, b"err 3\n"),
        ]
    finally:
        os.close(out)
        os.close(err)


def test_a_stream_whose_file_is_not_there_yet_reads_as_empty(tmp_path: Path) -> None:
    folder = direct_folder(tmp_path / "run", b"only out\n")
    stream_paths(folder)[1].unlink()  # as between the two opens of open_output_files
    reader = OutputReader(folder)
    assert isinstance(reader.layout(), DirectReader)
    assert reader.end(1) == 0
    assert list(reader.read(1, 0)) == []
    assert triples(reader.merged()) == [("stdout", 0, b"only out\n")]
    totals = reader.totals(1)
    assert (totals.written, totals.kept, totals.dropped, bytes(totals.tail)) == (0, 0, 0, b"")


def test_a_punched_prefix_is_reported_dropped_never_read_as_zeros(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    block = block_of(folder)
    data = lines(block * 3 // 11 + 1)  # a little over 3 blocks, lines across their edges
    direct_folder(folder, data, b"why\n")
    punch(stream_paths(folder)[0], 2 * block)
    reader = OutputReader(folder)
    fd = os.open(stream_paths(folder)[0], os.O_RDONLY)
    try:
        assert kept_from(fd) == 2 * block
    finally:
        os.close(fd)
    for start in (0, 1, block, 2 * block - 1, 2 * block):  # inside the dropped prefix
        chunks = triples(reader.read(0, start))
        assert chunks[0][1] == 2 * block
        assert b"".join(c[2] for c in chunks) == data[2 * block :]
    assert triples(reader.read(0, 2 * block + 5)) == [
        ("stdout", 2 * block + 5, data[2 * block + 5 :])
    ]
    assert list(reader.read(0, 0, block)) == []  # a range wholly dropped reads as nothing
    merged = triples(reader.merged())
    assert b"\0" not in b"".join(c[2] for c in merged)
    assert [(c[0], c[1]) for c in merged] == [("stdout", 2 * block), ("stderr", 0)]
    totals = reader.totals(0)
    assert (totals.written, totals.kept, totals.dropped) == (
        len(data),
        len(data) - 2 * block,
        2 * block,
    )
    assert bytes(totals.tail) == data[max(2 * block, len(data) - 8192) :]  # only what is kept


def test_a_file_punched_whole_reads_as_nothing_and_all_dropped(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    block = block_of(folder)
    direct_folder(folder, b"x" * (2 * block))
    punch(stream_paths(folder)[0], 2 * block)
    reader = OutputReader(folder)
    assert list(reader.read(0, 0)) == []
    assert reader.end(0) == 2 * block  # offsets never move
    totals = reader.totals(0)
    assert (totals.written, totals.kept, totals.dropped, bytes(totals.tail)) == (
        2 * block,
        0,
        2 * block,
        b"",
    )


def test_a_large_stream_comes_in_bounded_chunks_at_their_offsets(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    reader = OutputReader(direct_folder(tmp_path / "run", data))
    chunks = triples(reader.read(0, 10))
    assert all(len(c[2]) <= 1024 * 1024 for c in chunks)
    assert [c[1] for c in chunks] == [
        10 + sum(len(c[2]) for c in chunks[:i]) for i in range(len(chunks))
    ]
    assert b"".join(c[2] for c in chunks) == data[10:]


def test_the_totals_of_a_direct_folder_are_the_agents_summary(tmp_path: Path) -> None:
    """What a salvage reads (``OutputReader.totals``) is what the agent would have recorded."""
    folder = tmp_path / "run"
    folder.mkdir()
    block = block_of(folder)
    direct_folder(folder, lines(2000), b"e" * 20_000)
    punch(stream_paths(folder)[0], block)
    facts = OutputFiles(folder, 1 << 20, probe=lambda _: None).summarize()
    reader = OutputReader(folder)
    for stream, fact in enumerate((facts.stdout, facts.stderr)):
        totals = reader.totals(stream)
        assert (totals.written, totals.kept, totals.dropped, bytes(totals.tail)) == (
            fact.written,
            fact.kept,
            fact.dropped,
            fact.tail,
        )


# --- the application's readers on a ledger's process ----------------------------------------


def started(registry: ProcessRegistry, process_id: str) -> object:
    """A running command of this host's, and the lease its terminal write needs."""
    registry.register(command_registration(process_id))
    host = this_host_id()
    assert host is not None
    facts = OsFacts(pid=os.getpid(), pgid=os.getpgid(0), start_time=0, host_id=host)
    registry.record_started(process_id, registry.now_ms(), os=facts)
    return registry.claim_lease(process_id, LeaseOwner.local_process("test"), 600_000).lease  # type: ignore[union-attr]


def ended(registry: ProcessRegistry, process_id: str, folder: Path | None, lease: object) -> None:
    """Record the run's end with the summary naming ``folder`` (totals read from it)."""
    output = None
    if folder is not None:
        totals = [OutputReader(folder).totals(stream) for stream in (0, 1)]
        counts = [StreamOutput(written=t.written, kept=t.kept, dropped=t.dropped) for t in totals]
        output = OutputSummary(
            capture=True,
            host_id=this_host_id(),
            folder=str(folder),
            limit=1 << 20,
            stdout=counts[0],
            stderr=counts[1],
        )
    registry.record_completed(
        process_id,
        "exited",
        "exited",
        exit_code=0,
        output=output,
        tails={} if output is None else {"stdout": "", "stderr": ""},
        lease=lease,  # type: ignore[arg-type]
    )


def live_folder(registry: ProcessRegistry, process_id: str) -> Path:
    """Where a running process's output is looked for on this host (no summary yet)."""
    key = store_key(registry.location)
    assert key is not None
    return folder_for(output_root(), key, process_id)


def test_read_output_of_an_ended_run_in_the_direct_layout(
    registry: ProcessRegistry, tmp_path: Path
) -> None:
    folder = direct_folder(tmp_path / "direct", OUT, ERR)
    ended(registry, "job", folder, started(registry, "job"))
    assert registry.get("job").output.stdout.written == len(OUT)  # type: ignore[union-attr]
    assert triples(read_output(registry, "job")) == [("stdout", 0, OUT), ("stderr", 0, ERR)]
    assert triples(read_output(registry, "job", stream="stderr", since_offset=6)) == [
        ("stderr", 6, ERR[6:])
    ]
    assert triples(follow_output(registry, "job", since_offset=(len(OUT), 0))) == [
        ("stderr", 0, ERR)
    ]

    async def collect() -> list[tuple[str, int, bytes]]:
        return [(c.stream, c.offset, c.data) async for c in output_chunks(registry, "job")]

    assert anyio.run(collect) == [("stdout", 0, OUT), ("stderr", 0, ERR)]


def test_follow_output_reads_a_running_direct_folder_until_the_run_ends(
    registry: ProcessRegistry, tmp_path: Path
) -> None:
    lease = started(registry, "live")
    folder = live_folder(registry, "live")
    out, err = write_direct(folder, b"one\n")
    try:
        block = block_of(folder)
        followed = follow_output(registry, "live", poll_s=0.005)
        assert triple(next(followed)) == ("stdout", 0, b"one\n")
        os.write(err, b"bad\n")
        assert triple(next(followed)) == ("stderr", 0, b"bad\n")
        os.write(out, b"y" * (3 * block))  # the follower falls behind; the bound drops a prefix
        punch(stream_paths(folder)[0], 2 * block)
        os.write(out, b"two\n")
        ended(registry, "live", None, lease)  # the run ends with bytes still unread
        rest = triples(followed)
    finally:
        os.close(out)
        os.close(err)
    assert rest == [("stdout", 2 * block, b"y" * (block + 4) + b"two\n")]


# --- procledger logs ---------------------------------------------------------------------------


def logs(url: str, process_id: str, *args: str) -> str:
    done = run_cli("logs", process_id, *args, url=url)
    assert done.returncode == 0, done.stderr
    return done.stdout


def chunks_of(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def both_layouts(registry: ProcessRegistry, tmp_path: Path) -> tuple[str, str]:
    """Two ended runs with the same output, one in each layout: ``seg`` and ``direct``."""
    out = lines(40)
    segmented_folder(tmp_path / "seg", out, ERR)
    direct_folder(tmp_path / "direct", out, ERR)
    ended(registry, "seg", tmp_path / "seg", started(registry, "seg"))
    ended(registry, "direct", tmp_path / "direct", started(registry, "direct"))
    return "seg", "direct"


LOGS_ARGS = [
    [],
    ["--stream", "stdout"],
    ["--stream", "stderr"],
    ["--tail", "3"],
    ["--tail", "3", "--stream", "stdout"],
    ["--since-offset", "30"],
    ["--since-offset", "7", "--stream", "stderr"],
    ["--json"],
    ["--json", "--since-offset", "12", "--tail", "2"],
    ["-f"],
    ["-f", "--tail", "1", "--json"],
]


@pytest.mark.parametrize("args", LOGS_ARGS, ids=" ".join)
def test_logs_prints_a_direct_folder_as_it_prints_the_same_segments(
    shared_url: str, both_layouts: tuple[str, str], args: list[str]
) -> None:
    seg, direct = both_layouts
    printed = logs(shared_url, direct, *args)
    assert printed
    assert printed == logs(shared_url, seg, *args)


def test_logs_since_offset_inside_the_dropped_prefix_starts_where_the_kept_bytes_do(
    registry: ProcessRegistry, shared_url: str, tmp_path: Path
) -> None:
    (tmp_path / "probe").mkdir()
    block = block_of(tmp_path / "probe")
    if segment_size_for(4 * block) != block:
        pytest.skip(f"segments are not {block} bytes: the two layouts drop different prefixes")
    data = lines(5 * block // 11 + 1)[: 5 * block - 4]  # with stderr's 4: 5 blocks
    writer = segmented_folder(tmp_path / "seg", data, b"why\n", limit=4 * block)
    assert writer.streams[0].dropped == block  # the oldest segment went
    direct_folder(tmp_path / "direct", data, b"why\n")
    punch(stream_paths(tmp_path / "direct")[0], block)  # the same prefix, as the bound drops it
    ended(registry, "seg", tmp_path / "seg", started(registry, "seg"))
    ended(registry, "direct", tmp_path / "direct", started(registry, "direct"))
    for args in (["--stream", "stdout"], [], ["--tail", "2"]):
        for since in ("0", "100", str(block - 1), str(block), str(block + 3)):
            text = logs(shared_url, "direct", "--since-offset", since, *args)
            assert "\0" not in text
            assert text == logs(shared_url, "seg", "--since-offset", since, *args)
    for name in ("direct", "seg"):  # chunked differently, the same bytes at the same offsets
        found = chunks_of(logs(shared_url, name, "--json", "--since-offset", "100"))
        stdout = [c for c in found if c["stream"] == "stdout"]
        assert stdout[0]["offset"] == block
        assert "".join(str(c["data"]) for c in stdout) == data[block:].decode()
    shown = json.loads(run_cli("show", "direct", "--json", url=shared_url).stdout)
    assert shown["record"]["output"]["stdout"] == {
        "written": 5 * block - 4,
        "kept": 4 * block - 4,
        "dropped": block,
    }


def test_logs_follow_reads_a_running_direct_folder_to_its_end(
    registry: ProcessRegistry, shared_url: str
) -> None:
    lease = started(registry, "live")
    folder = live_folder(registry, "live")
    out, err = write_direct(folder, b"one\n")
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    follower = subprocess.Popen(
        [*CLI, "--url", shared_url, "logs", "live", "-f", "--json"],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())
        assert (first["stream"], first["offset"], first["data"]) == ("stdout", 0, "one\n")
        os.write(err, b"bad\n")
        os.write(out, b"two\n")
        ended(registry, "live", None, lease)  # what was written before the end is drained
        rest, _ = follower.communicate(timeout=60)
        assert follower.returncode == 0
    finally:
        os.close(out)
        os.close(err)
        end_process(follower)
    found = [first, *chunks_of(rest.decode())]
    for stream, text in (("stdout", "one\ntwo\n"), ("stderr", "bad\n")):
        mine = [c for c in found if c["stream"] == stream]
        assert "".join(str(c["data"]) for c in mine) == text
        offsets = [0]
        for chunk in mine[:-1]:
            offsets.append(int(str(chunk["offset"])) + len(str(chunk["data"])))
        assert [c["offset"] for c in mine] == offsets
