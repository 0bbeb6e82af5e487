"""Adoption identity (``procledger.agent.adoption``, design §18.4) against real processes.

Every process a test starts is killed and reaped by its exact pid (``Children``); waits are
on the process itself (``waitid(WNOWAIT)``, a pidfd), never a sleep.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _shared import child_env
from procledger.agent import adoption
from procledger.agent.adoption import Adopted, NotAdoptable, Refusal, adopt, identify, scan
from procledger.domain.records import OsFacts
from procledger.supervisor import os_seam

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux: /proc and pidfd")

MARKER = "run-adoption-test-1"
HOST = adoption.this_host_id()


class Children:
    """Processes a test started: each killed and reaped by its exact pid at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, marker: str | None = MARKER, *, ends: bool = False) -> OsFacts:
        """A child carrying ``marker``, returned once it runs its own image (it says so: an
        environment read mid-``execve`` is empty); ``ends``: one that exits at once."""
        env = child_env()
        if marker is not None:
            env[os_seam.RUN_MARKER] = marker
        script = "exit 0" if ends else "echo ready; read line"
        child = subprocess.Popen(
            ["sh", "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.started.append(child)
        if not ends:
            assert child.stdout is not None
            assert child.stdout.readline() == b"ready\n"
        return facts(child.pid)

    def end(self) -> None:
        for child in self.started:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=10)
            for pipe in (child.stdin, child.stdout):
                if pipe is not None:
                    pipe.close()


@pytest.fixture
def children() -> Iterator[Children]:
    made = Children()
    try:
        yield made
    finally:
        made.end()


def facts(pid: int, *, start_time: int | None = None, host_id: str | None = None) -> OsFacts:
    stat = os_seam.proc_stat(pid)
    assert stat is not None
    assert HOST is not None
    start = stat[1] if start_time is None else start_time
    return OsFacts(pid=pid, pgid=pid, start_time=start, host_id=host_id or HOST)


def refused(result: object) -> Refusal:
    assert isinstance(result, NotAdoptable), result
    assert result.detail.startswith(f"OS pid {result.pid}: ")
    return result.reason


def test_this_host_is_named() -> None:
    assert HOST is not None
    assert ":" in HOST


def test_a_live_marked_child_is_adopted_and_its_pidfd_reads_when_killed(
    children: Children,
) -> None:
    record = children.start()
    result = adopt(record, MARKER)
    assert isinstance(result, Adopted), result
    with result:
        assert result.pid == record.pid
        assert result.is_parent
        assert not result.ended()
        assert select.select([result], [], [], 0)[0] == []
        os.kill(record.pid, signal.SIGKILL)
        assert select.select([result], [], [], 10)[0] == [result]
        status = result.collect()
        assert status is not None
        assert status.si_status == signal.SIGKILL
        assert status.si_code == os.CLD_KILLED
    with pytest.raises(ValueError, match="closed"):
        result.fileno()


def test_an_orphan_is_adopted_but_its_status_is_not_ours(children: Children) -> None:
    # sh starts sleep in the background and exits: sleep is re-parented, not our child.
    shell = subprocess.run(
        ["sh", "-c", "sleep 60 </dev/null >/dev/null 2>&1 & echo $!"],
        env={**child_env(), os_seam.RUN_MARKER: MARKER},
        capture_output=True,
        check=True,
        timeout=10,
    )
    pid = int(shell.stdout)
    record = facts(pid)
    try:
        result = adopt(record, MARKER)
        assert isinstance(result, Adopted), result
        with result:
            assert not result.is_parent
            with pytest.raises(ChildProcessError):
                result.collect()
            os.kill(pid, signal.SIGKILL)
            assert select.select([result], [], [], 10)[0] == [result]
    finally:
        current = os_seam.proc_stat(pid)
        if current is not None and current[1] == record.start_time:
            os.kill(pid, signal.SIGKILL)


def test_another_start_time_is_a_reused_pid(children: Children) -> None:
    record = children.start()
    stranger = facts(record.pid, start_time=int(record.start_time) - 1)
    assert refused(identify(stranger, MARKER)) is Refusal.pid_reused
    assert refused(adopt(stranger, MARKER)) is Refusal.pid_reused


@pytest.mark.parametrize("marker", [None, "run-of-another"])
def test_a_missing_or_another_marker_is_refused(children: Children, marker: str | None) -> None:
    record = children.start(marker=marker)
    reason = refused(adopt(record, MARKER))
    assert reason is (Refusal.marker_missing if marker is None else Refusal.marker_other)


def test_a_marker_is_matched_whole(children: Children) -> None:
    record = children.start(marker=MARKER + "0")
    assert refused(adopt(record, MARKER)) is Refusal.marker_other


def test_an_unreaped_zombie_is_refused_as_a_zombie(children: Children) -> None:
    record = children.start(ends=True)
    os.waitid(os.P_PID, record.pid, os.WEXITED | os.WNOWAIT)  # exited, still unreaped
    result = adopt(record, MARKER)
    assert refused(result) is Refusal.zombie
    assert isinstance(result, NotAdoptable)
    assert f"parent's (pid {os.getpid()})" in result.detail


def test_a_gone_pid_is_gone(children: Children) -> None:
    record = children.start(ends=True)
    children.end()
    assert refused(adopt(record, MARKER)) is Refusal.gone


def test_another_host_is_refused_and_an_unknown_host_says_so(children: Children) -> None:
    record = children.start()
    elsewhere = facts(record.pid, host_id="another-machine:4026531836")
    assert refused(adopt(elsewhere, MARKER)) is Refusal.other_host
    result = adopt(record, MARKER, host_id=None)
    assert refused(result) is Refusal.host_unknown
    assert isinstance(result, NotAdoptable)
    assert "cannot know" in result.detail


def test_an_unreadable_environment_says_procledger_cannot_know(children: Children) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to look as another user at root's process")
    record = children.start()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: nobody looks at root's child, then exits
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            result = identify(record, MARKER, host_id=record.host_id)
            reason = result.reason.value if isinstance(result, NotAdoptable) else "adopted"
            os.write(write_fd, f"{reason}|{getattr(result, 'detail', '')}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        reason, detail = pipe.read().decode().split("|", 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert reason == Refusal.environ_unreadable.value
    assert "cannot know" in detail


def test_a_pid_reused_between_the_check_and_the_pidfd_is_refused(
    children: Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = children.start()
    real = adoption._read_stat
    calls: list[int] = []

    def changing(pid: int) -> adoption._Stat | None:
        calls.append(pid)
        stat = real(pid)
        if len(calls) <= 2 or stat is None:  # identify's two reads see the child
            return stat
        return adoption._Stat(stat.state, stat.ppid, stat.start_time + 7)  # then a stranger

    monkeypatch.setattr(adoption, "_read_stat", changing)
    before = len(os.listdir("/proc/self/fd"))
    assert refused(adopt(record, MARKER)) is Refusal.pid_reused
    assert len(calls) == 3
    assert len(os.listdir("/proc/self/fd")) == before  # the stranger's pidfd was closed


def test_a_child_gone_before_its_pidfd_is_gone(
    children: Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = children.start()

    def vanished(pid: int) -> int:
        raise ProcessLookupError(pid)

    monkeypatch.setattr(os, "pidfd_open", vanished)
    assert refused(adopt(record, MARKER)) is Refusal.gone


def _free_pids(count: int) -> list[int]:
    live = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    free = (pid for pid in range(pid_max - 1, 1, -1) if pid not in live)
    return [next(free) for _ in range(count)]


def test_a_scan_of_a_thousand_records_is_quick(children: Children) -> None:
    live = [children.start() for _ in range(5)]
    stranger = children.start(marker="run-of-another")
    assert HOST is not None
    gone = [OsFacts(pid=p, pgid=p, start_time=1, host_id=HOST) for p in _free_pids(994)]
    records = [*gone[:500], *live, stranger, *gone[500:]]
    markers = dict.fromkeys(records, MARKER)
    began = time.perf_counter()
    results = scan(records, markers)
    took = time.perf_counter() - began
    adopted = [result for _, result in results if isinstance(result, Adopted)]
    try:
        assert [r for r, _ in results] == records
        assert sorted(a.pid for a in adopted) == sorted(r.pid for r in live)
        reasons = [result.reason for _, result in results if isinstance(result, NotAdoptable)]
        assert reasons.count(Refusal.gone) == 994
        assert reasons.count(Refusal.marker_other) == 1
        assert took < 2.0, f"scan of 1,000 records took {took:.3f} s"
    finally:
        for result in adopted:
            result.close()


REUSE_IN_NAMESPACE = """
import os, subprocess, sys, time
from procledger.agent.adoption import Adopted, adopt, identify, this_host_id
from procledger.domain.records import OsFacts
from procledger.supervisor import os_seam

assert os.getpid() == 1, "not in a fresh PID namespace: ns_last_pid is not ours to write"
marker = sys.argv[1]
env = {**os.environ, os_seam.RUN_MARKER: marker}
started = []

def start():
    child = subprocess.Popen(["sh", "-c", "echo ready; read line"], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    started.append(child)
    assert child.stdout.readline() == b"ready\\n"
    stat = os_seam.proc_stat(child.pid)
    return child, OsFacts(pid=child.pid, pgid=child.pid, start_time=stat[1],
                          host_id=this_host_id())

try:
    first, record = start()
    first.kill()
    first.wait()
    tick = os.sysconf("SC_CLK_TCK")
    while time.clock_gettime(time.CLOCK_BOOTTIME) * tick < record.start_time + 2:
        pass  # a clock tick must pass, or the stranger could share the child's start time
    with open("/proc/sys/kernel/ns_last_pid", "w") as last:
        last.write(str(record.pid - 1))
    second, stranger = start()
    assert stranger.pid == record.pid, (stranger.pid, record.pid)
    assert stranger.start_time != record.start_time
    assert isinstance(adopt(stranger, marker), Adopted)  # the stranger itself is adoptable
    print(identify(record, marker).reason.value, adopt(record, marker).reason.value)
finally:
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()
"""


def test_a_pid_really_reused_in_a_pid_namespace_is_refused() -> None:
    """A real reuse, inside a fresh PID namespace (``unshare --pid --fork --mount-proc``)
    where writing ``ns_last_pid`` touches nothing of the host's: the child is killed and
    reaped, its pid handed to a stranger carrying the *same* marker, and only the start time
    tells them apart."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a PID namespace")
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    argv += [sys.executable, "-c", REUSE_IN_NAMESPACE, MARKER]
    try:
        out = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=60, env=child_env()
        )
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"no PID namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [Refusal.pid_reused.value, Refusal.pid_reused.value]


def test_importing_adoption_loads_neither_psutil_nor_pydantic() -> None:
    probe = (
        "import sys, procledger.agent.adoption as a; a.identify"
        "; print(sorted(m for m in ('psutil', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert out.stdout.strip() == "[]"
