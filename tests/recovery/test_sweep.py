"""The sweep and the drain, case by case, on the in-memory store with an injected clock
(docs/design.md §3.6). Runners are recording fakes; owners that must be provably dead carry the
liveness of a real process that has exited."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from _shared import Processes, dead_owner, wait_until
from procledger import (
    Acquired,
    Busy,
    CompletionAuthority,
    Interrupted,
    Lease,
    LeaseOwner,
    LeaseTimings,
    ProcessRecord,
    ProcessRegistry,
    ProcessState,
    TerminalReason,
    open_registry,
)
from procledger.adapters.output_files import OutputWriter
from procledger.application.output import output_folder, stored_tail
from procledger.recovery import RecoveryWorker, RunResult, SweepReport
from procledger.supervisor.decide import event_ids
from procledger.testing import FakeClock

from ._support import RecordingRunner, kinds, opaque_owner, register

TIMINGS = LeaseTimings(ttl_ms=3_000, renew_ms=1_000)
ALIVE = LeaseOwner.local_process("alive-supervisor")  # this test process: alive


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> Iterator[ProcessRegistry]:
    opened = open_registry("memory://", clock=clock)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def runner() -> RecordingRunner:
    return RecordingRunner()


@pytest.fixture
def worker(registry: ProcessRegistry, runner: RecordingRunner) -> RecoveryWorker:
    return RecoveryWorker(registry, LeaseOwner.local_process("w"), runner, timings=TIMINGS)


def claim(registry: ProcessRegistry, process_id: str, owner: LeaseOwner, ttl: int = 3_000) -> Lease:
    outcome = registry.claim_lease(process_id, owner, ttl)
    assert isinstance(outcome, Acquired), outcome
    return outcome.lease


def start_by(
    registry: ProcessRegistry, process_id: str, owner: LeaseOwner, *, ttl: int = 3_000
) -> Lease:
    """What a supervisor does before spawning: lease, first_started, started."""
    lease = claim(registry, process_id, owner, ttl)
    registry.record_first_started(process_id, owner, registry.now_ms())
    registry.record_started(process_id, registry.now_ms())
    return lease


# -- externally_owned ------------------------------------------------------------------------------


def test_externally_owned_is_never_claimed_or_run(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner, clock: FakeClock
) -> None:
    register(registry, "ext", "externally_owned", external=True)
    clock.advance(10**9)  # however long it has been

    report = worker.sweep()

    assert report == SweepReport(skipped=["ext"])
    assert runner.calls == []
    assert registry.get_lease("ext") is None
    assert kinds(registry, "ext") == ["registered"]


def test_externally_owned_with_an_abandon_request_is_abandoned_without_an_owner(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner
) -> None:
    register(registry, "ext", "externally_owned", external=True)
    registry.request_abandon("ext", "operator", reason="gone")

    report = worker.sweep()

    assert report == SweepReport(abandoned=["ext"])
    record = registry.get("ext")
    assert (record.state, record.reason) == (
        ProcessState.abandoned,
        TerminalReason.abandon_requested,
    )
    assert record.abandon_evidence is None
    assert registry.events("ext")[-1].payload["authority"] == (
        CompletionAuthority.reconciled_abandon().model_dump(mode="json")
    )
    assert runner.calls == []
    assert registry.get_lease("ext") is None


# -- rerunnable ------------------------------------------------------------------------------------


def test_rerunnable_never_started_is_run_and_completed(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner
) -> None:
    register(registry, "job", "rerunnable")

    report = worker.sweep()

    assert report == SweepReport(ran=["job"])
    [(seen, lease)] = runner.calls
    assert seen.state is ProcessState.running  # `started` recorded before the runner
    assert lease.owner.owner_id.startswith("w:recovery:")
    assert lease.owner.liveness == worker.owner.liveness
    assert lease.fencing_token == 1
    record = registry.get("job")
    assert (record.state, record.exit_code, record.value) == (
        ProcessState.exited,
        0,
        {"ran": "job"},
    )
    assert record.first_started is None  # only owner_bound work records a first start
    assert kinds(registry, "job") == ["registered", "started", "completed"]
    assert registry.get_lease("job") is None  # released with the terminal


def test_rerunnable_with_a_live_holder_waits_for_the_lease_to_expire(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner, clock: FakeClock
) -> None:
    register(registry, "job", "rerunnable")
    holder = start_by(registry, "job", opaque_owner("elsewhere"))

    assert worker.sweep() == SweepReport()  # held: not even visited
    assert runner.calls == []

    clock.advance(holder.expires_at_ms - clock.now_ms)  # expires_at_ms == now: no longer live
    assert worker.sweep() == SweepReport(ran=["job"])
    [(_, lease)] = runner.calls
    assert lease.fencing_token == holder.fencing_token + 1
    assert kinds(registry, "job") == ["registered", "first_started", "started", "completed"]


def test_rerunnable_held_by_a_provably_dead_owner_is_reclaimed_at_once(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner
) -> None:
    register(registry, "job", "rerunnable")
    holder = claim(registry, "job", dead_owner("crashed-worker"), ttl=10**9)
    registry.record_started("job", registry.now_ms())

    assert worker.sweep() == SweepReport(ran=["job"])
    [(_, lease)] = runner.calls
    assert lease.fencing_token == holder.fencing_token + 1
    assert registry.get("job").state is ProcessState.exited


def test_rerunnable_held_by_an_alive_local_owner_is_left_alone(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner
) -> None:
    register(registry, "job", "rerunnable")
    holder = claim(registry, "job", ALIVE)

    assert worker.sweep() == SweepReport()  # held by a live owner: not even visited
    assert registry.get_lease("job") == holder
    assert runner.calls == []


def test_the_sweep_walks_in_id_order_and_each_attempt_is_a_fresh_incarnation(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner
) -> None:
    for process_id in ["b", "a10", "c", "a2", "A"]:
        register(registry, process_id, "rerunnable")

    assert worker.sweep().ran == ["A", "a10", "a2", "b", "c"]
    assert runner.ran == ["A", "a10", "a2", "b", "c"]
    owners = [lease.owner for _, lease in runner.calls]
    assert len({owner.owner_id for owner in owners}) == 5
    assert len({owner.incarnation_id for owner in owners}) == 5
    assert worker.sweep() == SweepReport()  # nothing non-terminal is left


# -- owner_bound -----------------------------------------------------------------------------------


def test_owner_bound_never_started_runs_once_with_first_started_recorded_before(
    registry: ProcessRegistry, worker: RecoveryWorker, clock: FakeClock
) -> None:
    register(registry, "step", "owner_bound")
    seen_before_run: list[ProcessRecord] = []

    def behaviour(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        seen_before_run.append(registry.get(record.id))
        return RunResult(exit_code=3)

    worker.runner = RecordingRunner(behaviour)
    assert worker.sweep() == SweepReport(ran=["step"])

    [stored] = seen_before_run
    assert stored.first_started is not None
    assert stored.state is ProcessState.running
    [(_, lease)] = worker.runner.calls  # type: ignore[attr-defined]
    assert stored.first_started.owner == lease.owner
    assert kinds(registry, "step") == ["registered", "first_started", "started", "completed"]
    assert registry.get("step").exit_code == 3

    clock.advance(10**9)
    assert worker.sweep() == SweepReport()  # terminal now: never run again


def test_owner_bound_started_is_never_run_again_and_time_alone_never_abandons(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner, clock: FakeClock
) -> None:
    register(registry, "live", "owner_bound")
    register(registry, "lapsed", "owner_bound")
    register(registry, "released", "owner_bound")
    start_by(registry, "live", ALIVE)
    start_by(registry, "lapsed", opaque_owner("gone-quiet"))
    registry.release_lease(start_by(registry, "released", opaque_owner("walked-away")))

    assert worker.sweep() == SweepReport(skipped=["released"])  # live leases: not visited
    clock.advance(10**10)  # every lease long expired, and no abandon request
    assert worker.sweep() == SweepReport(skipped=["lapsed", "live", "released"])

    assert runner.calls == []
    for process_id in ("live", "lapsed", "released"):
        assert registry.get(process_id).state is ProcessState.running


def test_owner_bound_started_by_a_provably_dead_holder_is_abandoned_owner_dead(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner
) -> None:
    register(registry, "step", "owner_bound")
    dead = dead_owner("dead-supervisor")
    holder = start_by(registry, "step", dead, ttl=10**9)  # live for ages: proof, not time

    assert worker.sweep() == SweepReport(abandoned=["step"])
    record = registry.get("step")
    assert (record.state, record.reason) == (ProcessState.abandoned, TerminalReason.owner_dead)
    assert record.abandon_evidence is not None
    assert record.abandon_evidence.owner == dead
    assert runner.calls == []
    assert registry.get_lease("step") is None  # written with the reclaimed lease, released
    abandoned = registry.events("step")[-1]
    assert abandoned.payload["authority"] is None
    assert holder.fencing_token == 1


def test_a_child_spawned_for_a_start_never_recorded_is_found_by_its_marker_and_stopped(
    registry: ProcessRegistry, worker: RecoveryWorker, procs: Processes
) -> None:
    """A supervisor SIGKILLed between a spawn and the ``started`` write leaves a ``starting``
    record with no child on it, and the child running (a burst of starts spawns a whole batch
    before it records them): the sweep finds it by the run's marker, stops it, and says so.
    The id is the test's own: the marker is searched for host-wide, and a fixed one would also
    find (and stop) the child of this test run elsewhere at the same time."""
    step = f"step-{uuid.uuid4().hex[:8]}"
    record = register(registry, step, "owner_bound")
    dead = dead_owner("dead-supervisor")
    claim(registry, step, dead, ttl=10**9)
    registry.record_first_started(step, dead, registry.now_ms())
    marker = event_ids(record.id, record.registration_hash).run_marker
    child = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, "PROCLEDGER_RUN": marker}, start_new_session=True
    )
    spawned = procs.add(child.pid)

    assert worker.sweep() == SweepReport(abandoned=[step])
    child.wait(timeout=30)
    Processes.assert_dead(spawned)
    final = registry.get(step)
    assert (final.state, final.reason) == (ProcessState.abandoned, TerminalReason.owner_dead)
    assert final.diagnostic == (
        f"sweep stopped OS pid {child.pid} carrying its run marker: spawned, but its start was "
        "never recorded"
    )


def test_a_dead_holders_captured_output_goes_into_the_abandoned_record(
    registry: ProcessRegistry, runner: RecordingRunner, tmp_path: Path
) -> None:
    """What the dead supervisor's capture left on this host is read back into the record, as
    ``restore`` does (docs/design.md §14), so another host can show its tail."""
    register(registry, "step", "owner_bound", argv=["sh", "-c", "echo hi"])
    start_by(registry, "step", dead_owner("dead-supervisor"), ttl=10**9)
    folder = output_folder(registry, registry.get("step"), tmp_path)
    assert folder is not None
    left = OutputWriter(folder, 1 << 20)  # the dead supervisor's capture, never closed
    left.write(0, b"hello\n")
    left.write(1, b"oops\n")
    worker = RecoveryWorker(
        registry, LeaseOwner.local_process("w"), runner, timings=TIMINGS, output_dir=tmp_path
    )

    assert worker.sweep() == SweepReport(abandoned=["step"])
    left.close()
    output = registry.get("step").output
    assert output is not None
    assert (output.stdout.written, output.stderr.written, output.limit) == (6, 5, None)
    assert output.stopped is not None
    assert stored_tail(registry, "step") == {"stdout": b"hello\n", "stderr": b"oops\n"}


def test_owner_bound_abandon_request_waits_for_a_lapsed_lease(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner, clock: FakeClock
) -> None:
    register(registry, "expiring", "owner_bound")
    register(registry, "released", "owner_bound")
    first = opaque_owner("supervisor-1")
    holder = start_by(registry, "expiring", first)
    registry.release_lease(start_by(registry, "released", opaque_owner("supervisor-2")))
    registry.request_abandon("expiring", "operator")
    registry.request_abandon("released", "operator")

    assert worker.sweep() == SweepReport(abandoned=["released"])  # "expiring" is held
    clock.advance(holder.expires_at_ms - clock.now_ms)
    assert worker.sweep() == SweepReport(abandoned=["expiring"])

    for process_id, evidence in (("expiring", first), ("released", None)):
        record = registry.get(process_id)
        assert (record.state, record.reason) == (
            ProcessState.abandoned,
            TerminalReason.abandon_requested,
        )
        assert record.abandon_evidence is not None
        assert record.first_started is not None
        assert record.abandon_evidence.owner == record.first_started.owner
        if evidence is not None:
            assert record.abandon_evidence.owner == evidence
    assert runner.calls == []


# -- outcomes --------------------------------------------------------------------------------------


def test_a_runner_that_raises_records_failed_with_a_bounded_diagnostic(
    registry: ProcessRegistry, worker: RecoveryWorker
) -> None:
    register(registry, "short", "rerunnable")
    register(registry, "long", "rerunnable")

    def behaviour(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        raise RuntimeError("boom" if record.id == "short" else "é" * 1000)

    worker.runner = RecordingRunner(behaviour)
    assert worker.sweep() == SweepReport(failed=["long", "short"])
    short, long = registry.get("short"), registry.get("long")
    assert (short.state, short.diagnostic) == (ProcessState.failed, "RuntimeError: boom")
    assert long.diagnostic is not None
    assert long.diagnostic.startswith("RuntimeError: éé")
    assert 500 < len(long.diagnostic.encode()) <= 512
    assert registry.get_lease("short") is None


def test_engines_run_by_kind_and_an_unknown_engine_fails(registry: ProcessRegistry) -> None:
    register(registry, "known", "rerunnable", engine="double", payload=21)
    register(registry, "unknown", "rerunnable", engine="mystery")

    def double(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        assert lease.process_id == record.id
        return RunResult(value=record.input.payload * 2)  # type: ignore[operator]

    worker = RecoveryWorker(
        registry, opaque_owner("w"), timings=TIMINGS, engines={"double": double}
    )
    assert worker.sweep() == SweepReport(ran=["known"], failed=["unknown"])
    assert registry.get("known").value == 42
    diagnostic = registry.get("unknown").diagnostic
    assert diagnostic is not None
    assert "mystery" in diagnostic
    assert diagnostic.startswith("LookupError:")


def test_external_input_is_never_executed_whatever_the_disposition(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner
) -> None:
    register(registry, "ext-rerun", "rerunnable", external=True)
    assert worker.sweep() == SweepReport(skipped=["ext-rerun"])
    assert runner.calls == []


# -- renewal and self-fencing ----------------------------------------------------------------------


def fast_worker(
    registry: ProcessRegistry, runner: RecordingRunner, **timings: int
) -> RecoveryWorker:
    chosen = LeaseTimings(**(timings or {"ttl_ms": 300, "renew_ms": 20}))
    return RecoveryWorker(registry, opaque_owner("w"), runner, timings=chosen)


def test_a_running_attempt_renews_its_lease(registry: ProcessRegistry, clock: FakeClock) -> None:
    register(registry, "long", "rerunnable")

    def behaviour(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        for _ in range(3):  # 3 x 200 ms of store time > the 300 ms ttl
            clock.advance(200)
            wait_until(
                lambda: registry.get_lease("long").expires_at_ms == clock.now_ms + 300,  # type: ignore[union-attr]
                what="a renewal",
            )
        return RunResult()

    assert fast_worker(registry, RecordingRunner(behaviour)).sweep() == SweepReport(ran=["long"])


def test_a_failed_renewal_cancels_the_runner_and_writes_nothing(
    registry: ProcessRegistry, clock: FakeClock
) -> None:
    register(registry, "job", "rerunnable")
    usurper: list[Lease] = []
    cancelled: list[bool] = []

    def behaviour(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        clock.advance(301)  # our lease expires; another worker takes over
        usurper.append(claim(registry, "job", opaque_owner("usurper")))
        cancelled.append(cancel.wait(10))
        raise Interrupted("stopped")

    report = fast_worker(registry, RecordingRunner(behaviour)).sweep()

    assert report == SweepReport(lost=["job"])
    assert cancelled == [True]
    assert registry.get_lease("job") == usurper[0]  # the new holder is untouched
    assert usurper[0].fencing_token == 2
    assert kinds(registry, "job") == ["registered", "started"]


def test_a_late_result_is_refused_by_the_fence(registry: ProcessRegistry, clock: FakeClock) -> None:
    register(registry, "job", "rerunnable")
    usurper: list[Lease] = []

    def behaviour(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        clock.advance(10**6)
        usurper.append(claim(registry, "job", opaque_owner("usurper")))
        return RunResult(exit_code=0)  # finished "in time" as far as this runner knows

    # a renewal period longer than the run: only the fence can catch the late write
    worker = fast_worker(registry, RecordingRunner(behaviour), ttl_ms=300_000, renew_ms=100_000)
    assert worker.sweep() == SweepReport(lost=["job"])
    assert registry.get_lease("job") == usurper[0]
    assert kinds(registry, "job") == ["registered", "started"]


def test_stop_cancels_running_attempts_and_hands_work_back(registry: ProcessRegistry) -> None:
    register(registry, "a-rerun", "rerunnable")
    register(registry, "b-bound", "owner_bound")
    register(registry, "c-later", "rerunnable")
    worker_box: list[RecoveryWorker] = []

    def behaviour(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        if record.id == "a-rerun":
            return RunResult()
        worker_box[0].stop()  # e.g. Ctrl-C while the second attempt runs
        assert cancel.wait(10)
        raise Interrupted("tree stopped")

    runner = RecordingRunner(behaviour)
    worker = fast_worker(registry, runner, ttl_ms=3_000, renew_ms=1_000)
    worker_box.append(worker)

    assert worker.sweep() == SweepReport(ran=["a-rerun"], lost=["b-bound"])
    assert runner.ran == ["a-rerun", "b-bound"]  # nothing new starts once stopping
    bound = registry.get("b-bound")
    assert (bound.state, bound.reason) == (ProcessState.terminated, TerminalReason.runner_shutdown)
    assert registry.get("c-later").state is ProcessState.starting
    assert worker.sweep() == SweepReport()


def test_stop_releases_a_rerunnable_lease_for_the_next_worker(
    registry: ProcessRegistry,
) -> None:
    register(registry, "job", "rerunnable")
    worker_box: list[RecoveryWorker] = []

    def behaviour(record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        worker_box[0].stop()
        assert cancel.wait(10)
        raise Interrupted("tree stopped")

    worker = fast_worker(registry, RecordingRunner(behaviour), ttl_ms=3_000, renew_ms=1_000)
    worker_box.append(worker)
    assert worker.sweep() == SweepReport(lost=["job"])
    assert registry.get_lease("job") is None  # released: no waiting for expiry
    assert registry.get("job").state is ProcessState.running

    other = RecoveryWorker(registry, opaque_owner("next"), RecordingRunner(), timings=TIMINGS)
    assert other.sweep() == SweepReport(ran=["job"])


# -- drain -----------------------------------------------------------------------------------------


def test_drain_abandons_only_this_owners_started_owner_bound_processes(
    registry: ProcessRegistry, clock: FakeClock
) -> None:
    me = LeaseOwner.local_process("me")
    mine_released, mine_recovered, mine_live = "a-mine", "b-mine-recovery", "c-mine-live"
    for process_id in (mine_released, mine_recovered, mine_live, "d-other", "e-prefix", "f-new"):
        register(registry, process_id, "owner_bound")
    register(registry, "g-rerun-mine", "rerunnable")
    register(registry, "h-external", "externally_owned", external=True)

    registry.release_lease(start_by(registry, mine_released, me))
    start_by(registry, mine_recovered, opaque_owner("me:recovery:1234"), ttl=100)
    live = start_by(registry, mine_live, ALIVE.model_copy(update={"owner_id": "me"}))
    start_by(registry, "d-other", opaque_owner("other"), ttl=100)
    start_by(registry, "e-prefix", opaque_owner("meme:recovery:1"), ttl=100)
    registry.release_lease(start_by(registry, "g-rerun-mine", me))
    clock.advance(100)  # the short leases lapse; the live one (3 s) does not

    runner = RecordingRunner()
    report = RecoveryWorker(registry, me, runner, timings=TIMINGS).drain()

    assert report.abandoned == [mine_released, mine_recovered]
    assert report.skipped == [
        mine_live,
        "d-other",
        "e-prefix",
        "f-new",
        "g-rerun-mine",
        "h-external",
    ]
    assert report.ran == report.failed == report.lost == []
    for process_id in report.abandoned:
        record = registry.get(process_id)
        assert (record.state, record.reason) == (ProcessState.abandoned, TerminalReason.owner_drain)
        assert record.abandon_evidence is not None
        assert record.abandon_evidence.owner == me
    for process_id in report.skipped:
        assert not registry.get(process_id).state.is_terminal
    assert registry.get_lease(mine_live) == live
    assert runner.calls == []


def test_drain_takes_over_from_a_dead_holder(registry: ProcessRegistry) -> None:
    me = LeaseOwner.local_process("me")
    register(registry, "step", "owner_bound")
    dead_attempt = dead_owner("me:recovery:abcd")
    start_by(registry, "step", dead_attempt, ttl=10**9)

    assert RecoveryWorker(registry, me, timings=TIMINGS).drain() == SweepReport(abandoned=["step"])
    assert registry.get("step").reason is TerminalReason.owner_drain


def test_a_busy_claim_is_skipped_not_waited_for(registry: ProcessRegistry) -> None:
    """The race the re-check covers: a provably dead holder's lease, planned as ours to take
    and taken by someone else first."""
    register(registry, "job", "rerunnable")
    claim(registry, "job", dead_owner("crashed"), ttl=10**9)
    racer = LeaseOwner.local_process("racer")
    worker = RecoveryWorker(
        registry, LeaseOwner.local_process("w"), RecordingRunner(), timings=TIMINGS
    )
    original = registry.reclaim_lease

    def reclaim_after_racer(
        process_id: str, owner: LeaseOwner, observed: Lease, ttl_ms: int
    ) -> Acquired | Busy:
        assert isinstance(original(process_id, racer, observed, ttl_ms), Acquired)
        return original(process_id, owner, observed, ttl_ms)

    registry.reclaim_lease = reclaim_after_racer  # type: ignore[method-assign]
    try:
        assert worker.sweep() == SweepReport(skipped=["job"])
    finally:
        del registry.reclaim_lease
    assert registry.get_lease("job").owner == racer  # type: ignore[union-attr]
    assert kinds(registry, "job") == ["registered"]


def test_a_first_start_recorded_by_someone_else_first_is_never_run(
    registry: ProcessRegistry, runner: RecordingRunner, worker: RecoveryWorker
) -> None:
    """The race ``first_started`` settles: it lands between our claim and our first start."""
    register(registry, "step", "owner_bound")
    other = opaque_owner("other-supervisor")
    original = registry.renew_lease

    def renew_after_other_starts(lease: Lease, ttl_ms: int) -> Lease:
        registry.record_first_started("step", other, registry.now_ms())
        return original(lease, ttl_ms)

    registry.renew_lease = renew_after_other_starts  # type: ignore[method-assign]
    try:
        assert worker.sweep() == SweepReport(skipped=["step"])
    finally:
        del registry.renew_lease
    assert runner.calls == []
    record = registry.get("step")
    assert record.first_started is not None
    assert record.first_started.owner == other
    assert record.state is ProcessState.starting
    assert registry.get_lease("step") is None  # our claim was handed back


def test_serve_sweeps_until_its_limit_or_stop(
    registry: ProcessRegistry, worker: RecoveryWorker, runner: RecordingRunner
) -> None:
    register(registry, "job", "rerunnable")
    reports: list[SweepReport] = []
    assert worker.serve(interval_s=0, max_sweeps=2, on_report=reports.append) == 2
    assert reports == [SweepReport(ran=["job"]), SweepReport()]

    stopper = threading.Thread(target=lambda: wait_until(lambda: reports[2:]) and worker.stop())
    stopper.start()
    try:
        passes = worker.serve(interval_s=3600, on_report=reports.append)  # stop cuts the wait
    finally:
        stopper.join()
    assert passes == 1
    assert worker.stopping
    assert worker.sweep() == SweepReport()  # a stopped worker starts nothing
    assert runner.ran == ["job"]


def test_a_rerun_first_stops_what_an_earlier_run_left_running_here(
    registry: ProcessRegistry, procs: Processes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker SIGKILLed mid-run leaves its command alive and unrecorded; the next sweep
    used to run the command again beside it (two copies at once). The leftover carries the
    run's marker in its environment, as every run's child now does: it is stopped first, and
    the log says so."""
    seen = tmp_path / "marker-seen"
    record = register(
        registry,
        "job",
        "rerunnable",
        argv=["sh", "-c", f'printf %s "$PROCLEDGER_RUN" > "{seen}"'],
    )
    marker = event_ids(record.id, record.registration_hash).run_marker
    leftover = subprocess.Popen(
        ["sleep", "600"], env={**os.environ, "PROCLEDGER_RUN": marker}, start_new_session=True
    )
    left = procs.add(leftover.pid)
    worker = RecoveryWorker(registry, LeaseOwner.local_process("w"), timings=TIMINGS)
    with caplog.at_level(logging.WARNING, logger="procledger.recovery"):
        report = worker.sweep()
    assert report.ran == ["job"], report
    leftover.wait(timeout=30)  # its status: psutil, waiting for it as our child, reaped it
    Processes.assert_dead(left)
    final = registry.get("job")
    assert (final.state, final.exit_code) == (ProcessState.exited, 0)
    assert [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()] == [
        f"process 'job': stopped what an earlier run left running on this host before running "
        f"it again (OS pids {leftover.pid})"
    ]
    assert seen.read_text() == marker  # the rerun's own child is marked the same way


def test_a_rerun_with_nothing_left_over_stops_nothing(
    registry: ProcessRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    register(registry, "job", "rerunnable", argv=["true"])
    worker = RecoveryWorker(registry, LeaseOwner.local_process("w"), timings=TIMINGS)
    with caplog.at_level(logging.WARNING, logger="procledger.recovery"):
        assert worker.sweep().ran == ["job"]
    assert not [r for r in caplog.records if "earlier run" in r.getMessage()]
