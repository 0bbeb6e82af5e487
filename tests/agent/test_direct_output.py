"""A child's output as files it writes itself (procledger.adapters.direct_output, issue 28).

Real children and real files: the child never depends on the follower being alive; a follower
reports each new byte once, at its offset, from one inotify descriptor for many files; the bound
is kept by punching holes, so offsets stay and disk use does not grow; where holes cannot be
punched, that is said. Children are stopped by exact pid; waits are on state (the files, the
follower), with deadlines only as fail-fast nets.
"""

from __future__ import annotations

import base64
import fcntl
import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _shared import Processes, child_env, is_dead, wait_until
from procledger.adapters.direct_output import (
    POLL_INTERVAL,
    Follower,
    OutputFiles,
    Update,
    check_hole_punching,
    kept_from,
    open_output_files,
    plan_allotments,
    plan_kept_from,
    probe_hole_punching,
    read_range,
    stream_paths,
)
from procledger.domain.records import OutputSummary

from .conftest import DEADLINE, follow_until, reached
from .programs import CHUNK, LINE, line, pattern

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="inotify and PUNCH_HOLE: Linux")
MiB = 1024 * 1024


def spawn_on_files(children, folder: Path, *argv: str | Path, **options: object):
    """A child with its stdout and stderr on ``folder``'s new output files (our copies of the
    descriptors closed once it has its own), as the agent will spawn one."""
    out, err = open_output_files(folder)
    try:
        return children(*argv, stdout=out, stderr=err, **options)
    finally:
        os.close(out)
        os.close(err)


def say(child: subprocess.Popen[bytes], *numbers: int) -> None:
    assert child.stdin is not None
    child.stdin.write(b"".join(b"%d\n" % n for n in numbers))
    child.stdin.flush()


def joined(updates: list[Update], path: Path) -> bytes:
    return b"".join(u.data for u in updates if u.path == path)


# --- opening --------------------------------------------------------------------------------


def test_the_output_files_are_private_append_only_and_not_inherited(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "stale").write_text("a previous run under this id")
    out, err = open_output_files(folder)
    try:
        for fd in (out, err):
            assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
            assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
            assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
    finally:
        os.close(out)
        os.close(err)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == ["stderr", "stdout"]


# --- the child never depends on its supervisor ---------------------------------------------


def read_offsets(supervisor: subprocess.Popen[bytes], until: int) -> int:
    """Offsets the stand-in supervisor printed, until one reaches ``until``."""
    assert supervisor.stdout is not None
    while True:
        text = supervisor.stdout.readline()
        assert text, "the supervisor ended before its child wrote enough"
        if int(text) >= until:
            return int(text)


def lines_of(path: Path, prefix: str = "") -> list[int]:
    text = path.read_text()
    assert text.endswith("\n"), "a line was cut"
    return [int(t.removeprefix(prefix)) for t in text.splitlines()]


@linux_only
def test_a_chatty_child_outlives_its_killed_supervisor_and_loses_no_line(
    tmp_path: Path, children, procs: Processes
) -> None:
    folder, pidfile = tmp_path / "run", procs.pidfile("ticker.pid")
    supervisor = children("supervisor", folder, pidfile, stdout=subprocess.PIPE, env=child_env())
    ticker = procs.await_pid(pidfile)
    read_offsets(supervisor, until=len(b"".join(b"%d\n" % n for n in range(20))))
    supervisor.kill()
    supervisor.wait()
    stdout, stderr = stream_paths(folder)
    with Follower() as follower:  # the child goes on writing with nobody reading
        follower.watch(stdout, stdout.stat().st_size, data=False)
        after_kill = len(lines_of(stdout))
        follow_until(follower, lambda _: len(stdout.read_text().splitlines()) >= after_kill + 50)
    assert ticker.is_running()
    assert ticker.status() != psutil.STATUS_ZOMBIE
    ticker.kill()
    wait_until(lambda: is_dead(ticker), DEADLINE, "the ticker to die")  # init reaps it, if ever
    numbers = lines_of(stdout)
    assert numbers == list(range(len(numbers)))
    errors = lines_of(stderr, "e")
    assert errors == list(range(len(errors)))
    assert len(numbers) >= after_kill + 50


def test_on_a_pipe_the_same_child_dies_with_its_reader(tmp_path: Path, children) -> None:
    """The control: what files save a child from. A reader that goes away (here: closed by
    the test, as a killed supervisor's are by the kernel) kills the ticker at its next write."""
    read, write = os.pipe()
    try:
        ticker = children("ticker", tmp_path / "pid", stdout=write, stderr=subprocess.DEVNULL)
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as reader:
        assert reader.readline() == b"0\n"  # it runs, and writes
    assert ticker.wait(DEADLINE) == -signal.SIGPIPE


# --- following ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["inotify", "poll"])
def test_a_follower_reports_each_new_line_at_its_offset(
    tmp_path: Path, children, backend: str
) -> None:
    if backend == "inotify" and sys.platform != "linux":
        pytest.skip("inotify is Linux's")
    child = spawn_on_files(children, tmp_path / "run", "lines", stdin=subprocess.PIPE)
    path = stream_paths(tmp_path / "run")[0]
    with Follower(backend) as follower:  # type: ignore[arg-type]
        assert follower.timeout() == (None if backend == "inotify" else POLL_INTERVAL)
        follower.watch(path)
        for number in range(20):
            say(child, number)
            updates = follow_until(follower, reached(path, (number + 1) * LINE))
            assert updates[0].offset == number * LINE
            assert joined(updates, path) == line(number)
            assert all(u.dropped == 0 for u in updates)


@linux_only
def test_a_follower_started_at_an_offset_reports_only_what_follows(
    tmp_path: Path, children
) -> None:
    child = spawn_on_files(children, tmp_path / "run", "lines", stdin=subprocess.PIPE)
    path = stream_paths(tmp_path / "run")[0]
    with Follower() as follower:
        follower.watch(path, data=False)
        say(child, *range(10))
        follow_until(follower, reached(path, 10 * LINE))
        follower.unwatch(path)
        follower.watch(path, 5 * LINE)
        say(child, *range(10, 15))
        updates = follow_until(follower, reached(path, 15 * LINE))
    assert updates[0].offset == 5 * LINE
    assert joined(updates, path) == b"".join(line(n) for n in range(5, 15))


def inotify_fds() -> int:
    return sum(
        os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}")
    )


@linux_only
def test_one_inotify_descriptor_serves_fifty_files(tmp_path: Path, children) -> None:
    paths = [tmp_path / f"f{n}" for n in range(50)]
    for path in paths:
        path.touch(mode=0o600)
    child = children("fan", *paths, stdin=subprocess.PIPE)
    before = inotify_fds()
    with Follower() as follower:
        for path in paths:
            follower.watch(path)
        assert inotify_fds() == before + 1
        say(child, 7)
        updates = follow_until(follower, lambda u: all(reached(p, LINE)(u) for p in paths))
        say(child, 8)
        more = follow_until(follower, lambda u: all(reached(p, 2 * LINE)(u) for p in paths))
    for path in paths:
        assert joined(updates, path) == line(7)
        assert joined(more, path) == line(8)
        assert next(u for u in more if u.path == path).offset == LINE


def test_a_follower_reads_a_flood_in_slices_and_says_when_more_is_pending(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f"
    path.write_bytes(pattern(0, 3 * MiB))
    with Follower() as follower:
        follower.watch(path, 100)
        sizes = []
        while (updates := follower.read_ready()) or follower.timeout() == 0:
            assert follower.timeout() == (0 if follower.position(path) < 3 * MiB else None)
            sizes.extend(len(u.data) for u in updates)
    assert sizes == [MiB, MiB, MiB - 100]


@linux_only
def test_a_follower_behind_the_bound_reports_the_dropped_bytes_never_zeros(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "run"
    out, err = open_output_files(folder)
    files = OutputFiles(folder, 256 * 1024)
    try:
        with Follower() as follower:
            follower.watch(files.paths[0], 10)
            os.write(out, pattern(0, 2 * MiB))
            assert files.enforce_bound() > 0  # before the follower read a byte
            first = follower.read_ready()[0]
    finally:
        os.close(out)
        os.close(err)
    assert first.offset == files.summarize().stdout.dropped
    assert first.dropped == first.offset - 10
    assert first.data == pattern(first.offset, 2 * MiB)


def test_a_watched_file_removed_can_still_be_unwatched(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with Follower() as follower:
        follower.watch(path)
        path.unlink()
        assert [u.data for u in follower.read_ready()] == [b"x"]
        follower.unwatch(path)


def test_a_file_watched_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.touch()
    with Follower() as follower:
        follower.watch(path)
        with pytest.raises(ValueError, match="already followed"):
            follower.watch(path, 10)


# --- the bound on kept bytes ----------------------------------------------------------------


def disk_use(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def assert_kept_range_is_the_newest_bytes(path: Path) -> Update:
    """Read from offset 0: the punched prefix comes back as dropped, never as zeros, and the
    kept bytes are exactly the last bytes the child wrote."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        whole = read_range(fd, path, 0, size)
        assert whole.dropped == whole.offset == kept_from(fd)
    finally:
        os.close(fd)
    assert b"\0" not in whole.data
    assert whole.data == pattern(whole.offset, size)
    return whole


@pytest.fixture(params=["tmp_path", "tmpfs"])
def any_folder(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A folder on the test's file system, then on a tmpfs (``/dev/shm``) where there is one:
    holes are punched per block on one and per page on the other."""
    if request.param == "tmp_path":
        yield tmp_path
        return
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
        yield Path(folder)


@linux_only
def test_the_bound_keeps_disk_use_at_the_limit_while_every_offset_stays(
    any_folder: Path, children
) -> None:
    folder, limit = any_folder / "run", 1 * MiB
    child = spawn_on_files(children, folder, "chunks", stdin=subprocess.PIPE)
    files = OutputFiles(folder, limit)
    assert files.unbounded is None
    path = files.paths[0]
    with Follower() as follower:
        follower.watch(path, data=False)
        for step in range(1, 20 * MiB // CHUNK + 1):  # 20 MiB in lockstep: 64 KiB a step
            say(child, step)
            follow_until(follower, lambda u, step=step: bool(u) and u[-1].offset >= step * CHUNK)
            files.enforce_bound()
            assert disk_use(path) <= limit + 4 * 4096, f"after {step * CHUNK} bytes"
            assert path.stat().st_size == step * CHUNK
    whole = assert_kept_range_is_the_newest_bytes(path)
    assert 20 * MiB - whole.offset >= limit * 7 // 8 - 4096  # not more dropped than the bound asks
    facts = files.summarize()
    assert (facts.stdout.written, facts.stdout.dropped) == (20 * MiB, whole.offset)
    assert facts.stdout.kept == len(whole.data) <= limit


@linux_only
def test_a_flooding_child_stays_bounded_and_its_follower_sees_drops_never_zeros(
    tmp_path: Path, children
) -> None:
    folder, limit, total = tmp_path / "run", 1 * MiB, 20 * MiB
    child = spawn_on_files(children, folder, "flood", total)
    files = OutputFiles(folder, limit)
    path, most, most_before = files.paths[0], 0, 0
    with Follower() as follower:
        follower.watch(path)
        updates: list[Update] = []

        def done(new: list[Update]) -> bool:
            nonlocal most, most_before
            most_before = max(most_before, disk_use(path))
            files.enforce_bound()
            most = max(most, disk_use(path))
            updates.extend(new)
            new.clear()
            return bool(updates) and updates[-1].offset + len(updates[-1].data) >= total

        follow_until(follower, done)
    assert child.wait(DEADLINE) == 0
    at = 0
    for update in updates:  # contiguous: each byte reported once, as data or as dropped
        assert update.offset - update.dropped == at
        assert update.data == pattern(update.offset, update.offset + len(update.data))
        at = update.offset + len(update.data)
    assert at == total == path.stat().st_size
    assert disk_use(path) <= limit + 4 * 4096
    assert_kept_range_is_the_newest_bytes(path)
    drops = sum(u.dropped > 0 for u in updates)
    print(
        f"flood: disk use at most {most_before / MiB:.2f} MiB before an enforcement, "
        f"{most / MiB:.2f} MiB after (limit 1 MiB); {drops} of {len(updates)} updates had drops"
    )


@linux_only
def test_the_larger_stream_pays_for_the_bound(tmp_path: Path) -> None:
    folder, limit = tmp_path / "run", 1 * MiB
    out, err = open_output_files(folder)
    try:
        os.write(err, b"the reason it failed\n")
        files = OutputFiles(folder, limit)
        for at in range(0, 4 * MiB, CHUNK):
            os.write(out, pattern(at, at + CHUNK))
            files.enforce_bound()
    finally:
        os.close(out)
        os.close(err)
    facts = files.summarize()
    assert facts.stderr.kept == facts.stderr.written == 21
    assert facts.stderr.tail == b"the reason it failed\n"
    assert facts.stdout.kept + facts.stderr.kept <= limit
    assert facts.stdout.tail == pattern(4 * MiB - 8192, 4 * MiB)


@linux_only
def test_a_restarted_agent_reads_the_kept_range_from_the_files(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    out, err = open_output_files(folder)
    os.close(err)
    try:
        first = OutputFiles(folder, 256 * 1024)
        os.write(out, pattern(0, 3 * MiB))
        first.enforce_bound()
    finally:
        os.close(out)
    adopted = OutputFiles(folder, 256 * 1024)  # nothing carried over but the folder
    assert adopted.summarize() == first.summarize()
    assert adopted.enforce_bound() == 0
    assert first.summarize().stdout.dropped > 0


def test_the_summary_is_the_ledgers_output_summary(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    out, err = open_output_files(folder)
    try:
        os.write(out, pattern(0, 20_000))
        os.write(err, b"oops\n")
    finally:
        os.close(out)
        os.close(err)
    facts = OutputFiles(folder, 64 * MiB).summarize()
    summary = OutputSummary(**facts.summary_fields("host-1"))  # type: ignore[arg-type]
    assert summary.stdout.written == summary.stdout.kept == 20_000
    assert (summary.stderr.written, summary.limit, summary.folder) == (5, 64 * MiB, str(folder))
    assert summary.stopped is None
    tails = {k: base64.b64decode(v) for k, v in facts.tails().items()}
    assert tails == {"stdout": pattern(20_000 - 8192, 20_000), "stderr": b"oops\n"}


# --- where holes cannot be punched ----------------------------------------------------------


@linux_only
def test_this_file_system_punches_exact_holes(tmp_path: Path) -> None:
    assert check_hole_punching(tmp_path) is None
    assert probe_hole_punching(tmp_path) is None
    assert list(tmp_path.iterdir()) == []  # the scratch file is gone


def test_without_hole_punching_the_bound_is_not_kept_and_says_so(tmp_path: Path) -> None:
    folder, reason = tmp_path / "run", "no PUNCH_HOLE here (forced off by the test)"
    out, err = open_output_files(folder)
    try:
        files = OutputFiles(folder, 64 * 1024, probe=lambda _: reason)
        os.write(out, pattern(0, 1 * MiB))
        assert files.enforce_bound() == 0
    finally:
        os.close(out)
        os.close(err)
    facts = files.summarize()
    assert facts.unbounded == files.unbounded == reason
    assert (facts.stdout.written, facts.stdout.kept, facts.stdout.dropped) == (MiB, MiB, 0)


def test_the_probe_reports_why_it_cannot_probe(tmp_path: Path) -> None:
    reason = probe_hole_punching(tmp_path / "missing")
    assert reason is not None
    assert "cannot probe" in reason


def test_files_gone_under_the_agent_mark_the_bound_not_kept(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    for fd in open_output_files(folder):
        os.close(fd)
    files = OutputFiles(folder, 4096, probe=lambda _: None)
    files.paths[0].unlink()
    assert files.enforce_bound() == 0
    assert files.unbounded is not None
    assert "unreadable" in files.unbounded
    assert files.summarize().stopped == f"output files gone: {files.paths[0]}"


# --- the decisions --------------------------------------------------------------------------


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9))
def test_allotments_fit_the_budget_and_spare_the_smaller_stream(a: int, b: int, budget: int):
    allotted = plan_allotments((a, b), budget)
    assert sum(allotted) <= max(budget, 0) or sum((a, b)) <= budget
    if min(a, b) <= budget // 2:
        assert allotted[(a, b).index(min(a, b))] == min(a, b)


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.sampled_from([512, 4096, 65536]))
def test_kept_from_is_aligned_bounded_and_never_past_the_last_block(
    size: int, allotment: int, block: int
) -> None:
    first = plan_kept_from(size, allotment, block, 0)
    assert first % block == 0
    assert first <= size // block * block
    assert size - first <= allotment or first == size // block * block
