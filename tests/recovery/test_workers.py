"""Recovery across real worker OS processes sharing one SQLite file or one PostgreSQL schema.

Workers are ``_worker.py`` processes (or the ``procledger`` CLI); the work is real commands run
by the default runner. Runs are counted through the commands' own side effect -- each run
appends a line to a file -- never through the log. Every worker is killed by its PID if it
outlives its test, and every orphaned command by its PID (checked to be ours first).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest

from _shared import CLI, child_env, end_process, run_cli, wait_until
from procledger import (
    LeaseOwner,
    LeaseTimings,
    ProcessRegistry,
    ProcessState,
    RecoveryDisposition,
    TerminalReason,
)
from procledger.recovery import RecoveryWorker, SweepReport

from ._support import Workers, kill_if_alive, kinds, lines, opaque_owner, pid_alive, register

pytestmark = pytest.mark.slow

WORKER_OPTIONS = ("--ttl-ms", "30000", "--renew-ms", "10000", "--interval", "0.05", "--json")
APPEND = 'echo "$1" >> "$2"'
"""``sh -c APPEND sh ID FILE``: one line per run."""

FIRST_RUN_BLOCKS = 'echo $$ >> "$1"; if [ "$(wc -l < "$1")" -eq 1 ]; then exec sleep 30; fi'
"""``sh -c FIRST_RUN_BLOCKS sh FILE``: each run appends its PID; the first then sleeps (as that
same PID) until stopped, later runs exit 0 at once."""

FIRST_RUN_FINISHES_LATE = 'echo $$ >> "$1"; if [ "$(wc -l < "$1")" -eq 1 ]; then exec sleep 1; fi'


@pytest.fixture
def workers() -> Iterator[Workers]:
    started = Workers()
    try:
        yield started
    finally:
        started.cleanup()


@pytest.fixture
def orphans() -> Iterator[list[int]]:
    """PIDs of commands a killed worker may have left running; killed by PID afterwards."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for pid in pids:
            kill_if_alive(pid, "sleep")


def test_the_default_runner_runs_commands_with_their_stored_environment(
    registry: ProcessRegistry, tmp_path: Path
) -> None:
    register(
        registry,
        "env-and-cwd",
        "rerunnable",
        argv=["sh", "-c", 'echo "$MARK $(pwd)" > out'],
        env={"MARK": "from-the-env-store", "PATH": os.environ["PATH"]},
        cwd=str(tmp_path),
    )
    register(registry, "exit-7", "owner_bound", argv=["sh", "-c", "exit 7"])
    register(registry, "killed", "rerunnable", argv=["sh", "-c", "kill -KILL $$"])
    register(registry, "no-such-program", "rerunnable", argv=[str(tmp_path / "missing")])

    report = RecoveryWorker(registry, opaque_owner("w")).sweep()

    assert report == SweepReport(
        ran=["env-and-cwd", "exit-7"], failed=["killed", "no-such-program"]
    )
    assert (tmp_path / "out").read_text() == f"from-the-env-store {tmp_path}\n"
    assert registry.get("exit-7").exit_code == 7
    assert "SIGKILL" in (registry.get("killed").diagnostic or "")
    assert registry.get("no-such-program").diagnostic.startswith("SpawnError")  # type: ignore[union-attr]


@pytest.mark.parametrize("liveness", ["opaque", "local"])
def test_a_sigkilled_worker_is_rerun_once_by_another_with_a_higher_fence(
    registry: ProcessRegistry,
    *,
    shared_url: str,
    workers: Workers,
    orphans: list[int],
    tmp_path: Path,
    liveness: str,
) -> None:
    runs = tmp_path / "runs"
    register(registry, "job", "rerunnable", argv=["sh", "-c", FIRST_RUN_BLOCKS, "sh", str(runs)])
    timings = {"ttl_ms": 1500, "renew_ms": 500, "liveness": liveness}
    batch = workers.start(shared_url, ["worker-a"], timings)
    [first_pid] = wait_until(lambda: lines(runs), what="the first run")
    orphans.append(int(first_pid))
    held = registry.get_lease("job")
    assert held is not None
    assert held.owner.owner_id.startswith("worker-a:recovery:")
    assert held.fencing_token == 1

    os.kill(batch.pids[0], signal.SIGKILL)  # no cleanup: its command lives on as an orphan
    assert batch.reports() == {}  # reaped, without a report

    second = RecoveryWorker(
        registry,
        opaque_owner("worker-b") if liveness == "opaque" else LeaseOwner.local_process("b"),
        timings=LeaseTimings(ttl_ms=1500, renew_ms=500),
    )
    if liveness == "opaque":  # nobody can prove it dead: only expiry frees the work
        assert second.sweep() == SweepReport()  # held: not visited
        assert lines(runs) == [first_pid]
        lease = registry.get_lease("job")
        assert lease is not None
        assert lease.fencing_token == 1
        wait_until(lambda: registry.now_ms() >= registry.get_lease("job").expires_at_ms)  # type: ignore[union-attr]

    assert second.sweep() == SweepReport(ran=["job"])
    assert len(lines(runs)) == 2
    assert second.sweep() == SweepReport()
    assert len(lines(runs)) == 2  # exactly once
    assert kinds(registry, "job") == ["registered", "started", "output_captured", "completed"]
    record = registry.get("job")
    assert (record.state, record.exit_code) == (ProcessState.exited, 0)
    assert registry.get_lease("job") is None
    fences = _fences_seen(registry, "job")
    assert fences == 2  # the rerun's claim came after fence 1


def _process_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _lease_row_free(registry: ProcessRegistry, process_id: str) -> bool:
    """Whether no transaction holds the lease row (SQLite: the write lock) right now."""
    if registry.location.sqlite_path:  # a SQLite file: its write lock guards the row
        connection = sqlite3.connect(registry.location.sqlite_path, timeout=0)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.rollback()
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            connection.close()
    try:
        with registry._store.write() as tx:
            tx.execute("SET LOCAL lock_timeout = '100ms'")
            table = registry._store.table("leases")
            tx.execute(f"SELECT 1 FROM {table} WHERE process_id=? FOR UPDATE", (process_id,))
        return True
    except psycopg.errors.LockNotAvailable:
        return False


def pause_between_transactions(pid: int, registry: ProcessRegistry, process_id: str) -> None:
    """SIGSTOP a worker at a moment it holds no lock on the lease (a frozen transaction would
    block the taker, not test the fence); if it was mid-renewal, resume it and try again."""
    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: _process_state(pid) == "T", what="the worker to stop")
        if _lease_row_free(registry, process_id):
            return
        os.kill(pid, signal.SIGCONT)
    raise AssertionError("the worker was always caught inside a transaction")


def _fences_seen(registry: ProcessRegistry, process_id: str) -> int:
    """The stored fence (kept after release): how many claims there have been. A claim cannot
    probe it: a terminal process refuses claims (``AlreadyTerminal``)."""
    from procledger.adapters.sql import lease_rows

    with registry._store.read() as tx:
        row = lease_rows.lease_row(tx, process_id)
    assert row is not None
    return int(row["fencing_token"])


def test_ten_workers_sweeping_at_once_recover_everything_exactly_once(
    registry: ProcessRegistry, shared_url: str, workers: Workers, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    rerunnable = [f"r{i:02}" for i in range(24)]
    first_runs = [f"o{i:02}" for i in range(8)]
    held_elsewhere = [f"s{i:02}" for i in range(4)]
    requested = [f"x{i:02}" for i in range(3)]
    external = [f"y{i:02}" for i in range(3)]
    for process_id in rerunnable:
        register(
            registry,
            process_id,
            "rerunnable",
            argv=["sh", "-c", APPEND, "sh", process_id, str(runs)],
        )
    for process_id in first_runs + held_elsewhere:
        register(
            registry,
            process_id,
            "owner_bound",
            argv=["sh", "-c", APPEND, "sh", process_id, str(runs)],
        )
    for process_id in held_elsewhere:
        registry.claim_lease(process_id, opaque_owner("supervisor"), 3_600_000)
        registry.record_first_started(process_id, opaque_owner("supervisor"), registry.now_ms())
        registry.record_started(process_id, registry.now_ms())
    for process_id in requested + external:
        register(registry, process_id, "externally_owned", external=True)
    for process_id in requested:
        registry.request_abandon(process_id, "operator")
    leases_before = {pid: registry.get_lease(pid) for pid in held_elsewhere}

    reports = workers.start(
        shared_url,
        [f"w{i}" for i in range(10)],
        {"ttl_ms": 10_000, "renew_ms": 2_000, "liveness": "local"},
    ).all_reports()

    recoverable = sorted(rerunnable + first_runs)
    assert Counter(lines(runs)) == Counter(recoverable)  # each ran exactly once, none lost
    ran = [pid for report in reports for pid in report.ran]
    assert sorted(ran) == recoverable
    assert [pid for r in reports for pid in r.failed + r.lost] == []
    assert {pid for r in reports for pid in r.abandoned} == set(requested)
    for report in reports:
        assert report.ran == sorted(report.ran)  # each walked in id order
        assert not set(report.skipped) & set(report.ran)
    for process_id in recoverable:
        record = registry.get(process_id)
        assert (record.state, record.exit_code) == (ProcessState.exited, 0)
        expected = ["registered", "started", "output_captured", "completed"]
        if record.disposition is RecoveryDisposition.owner_bound:
            expected.insert(1, "first_started")
        assert kinds(registry, process_id) == expected
    for process_id in held_elsewhere:  # started owner_bound work under a live lease: untouched
        assert registry.get(process_id).state is ProcessState.running
        assert registry.get_lease(process_id) == leases_before[process_id]
    for process_id in requested:
        assert kinds(registry, process_id) == ["registered", "abandon_requested", "abandoned"]
    for process_id in external:
        assert kinds(registry, process_id) == ["registered"]


@pytest.mark.parametrize("first_run", ["blocks", "finishes-during-the-pause"])
def test_a_worker_paused_past_its_lease_is_fenced_off_and_stops_its_tree(
    registry: ProcessRegistry,
    *,
    shared_url: str,
    workers: Workers,
    orphans: list[int],
    tmp_path: Path,
    first_run: str,
) -> None:
    runs = tmp_path / "runs"
    script = FIRST_RUN_BLOCKS if first_run == "blocks" else FIRST_RUN_FINISHES_LATE
    register(registry, "job", "rerunnable", argv=["sh", "-c", script, "sh", str(runs)])
    batch = workers.start(
        shared_url, ["worker-a"], {"ttl_ms": 600, "renew_ms": 200, "liveness": "local"}
    )
    [paused] = batch.pids
    [child] = wait_until(lambda: lines(runs), what="the first run")
    child_pid = int(child)
    orphans.append(child_pid)

    pause_between_transactions(paused, registry, "job")
    wait_until(lambda: registry.now_ms() >= registry.get_lease("job").expires_at_ms)  # type: ignore[union-attr]
    taker = RecoveryWorker(
        registry,
        LeaseOwner.local_process("worker-b"),
        timings=LeaseTimings(ttl_ms=600, renew_ms=200),
    )
    assert taker.sweep() == SweepReport(ran=["job"])  # expired: claimed, though its holder lives
    after_takeover = registry.get("job")
    log_after_takeover = registry.events("job")
    if first_run != "blocks":  # its command is done; only the paused worker can still write
        wait_until(lambda: not pid_alive(child_pid), what="the first run to end")

    os.kill(paused, signal.SIGCONT)
    [report] = batch.all_reports()

    assert report == SweepReport(lost=["job"])
    assert not pid_alive(child_pid)  # it stopped (or reaped) its own tree
    assert registry.get("job") == after_takeover  # nothing from it after the takeover
    assert registry.events("job") == log_after_takeover
    assert [e.kind for e in log_after_takeover] == [
        "registered",
        "started",
        "output_captured",
        "completed",
    ]
    assert len(lines(runs)) == 2
    assert _fences_seen(registry, "job") == 2


def test_cli_drain_abandons_only_this_owners_started_owner_bound_processes(
    registry: ProcessRegistry, shared_url: str
) -> None:
    mine = opaque_owner("cli-owner")
    for process_id in ("a-mine", "b-mine-recovery", "c-other", "d-never-started"):
        register(registry, process_id, "owner_bound", argv=["true"])
    register(registry, "e-rerunnable-mine", "rerunnable", argv=["true"])
    started = {
        "a-mine": mine,
        "b-mine-recovery": opaque_owner("cli-owner:recovery:0f0f"),
        "c-other": opaque_owner("cli-owner-2"),
        "e-rerunnable-mine": mine,
    }
    for process_id, owner in started.items():
        registry.record_first_started(process_id, owner, registry.now_ms())
        registry.record_started(process_id, registry.now_ms())

    done = run_cli("sweep", "--drain", "--owner", "cli-owner", "--json", url=shared_url)

    assert done.returncode == 0, done.stderr
    report = SweepReport.model_validate(orjson.loads(done.stdout))
    assert report.abandoned == ["a-mine", "b-mine-recovery"]
    assert report.skipped == ["c-other", "d-never-started", "e-rerunnable-mine"]
    for process_id in report.abandoned:
        record = registry.get(process_id)
        assert record.reason is TerminalReason.owner_drain
        assert record.abandon_evidence is not None
        assert record.abandon_evidence.owner.owner_id == "cli-owner"
    for process_id in report.skipped:
        assert not registry.get(process_id).state.is_terminal


@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_cli_worker_stops_cleanly_and_hands_its_work_back(
    registry: ProcessRegistry,
    *,
    shared_url: str,
    orphans: list[int],
    tmp_path: Path,
    signum: int,
    exit_code: int,
) -> None:
    runs = tmp_path / "runs"
    register(registry, "job", "rerunnable", argv=["sh", "-c", FIRST_RUN_BLOCKS, "sh", str(runs)])
    worker = subprocess.Popen(
        [*CLI, "--url", shared_url, "worker", "--owner", "cli-w", *WORKER_OPTIONS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        [child] = wait_until(lambda: lines(runs), what="the first run")
        orphans.append(int(child))
        worker.send_signal(signum)
        out, err = worker.communicate(timeout=30)
    finally:
        end_process(worker)

    assert worker.returncode == exit_code, err
    assert not pid_alive(int(child))  # the tree was stopped before the worker exited
    assert SweepReport.model_validate_json(out.splitlines()[-1]) == SweepReport(lost=["job"])
    assert registry.get_lease("job") is None  # released: the next worker need not wait 30 s
    assert registry.get("job").state is ProcessState.running
    assert RecoveryWorker(registry, opaque_owner("next")).sweep() == SweepReport(ran=["job"])
    assert len(lines(runs)) == 2
