"""Several OS processes writing to one ledger at once (docs/design.md §3.5, §7).

Workers are separate OS processes (multiprocessing, ``forkserver`` with procledger preloaded,
so starting one costs milliseconds rather than a second of imports). Each reports ``ready``
once its registry is open, and all start on one event. The parent then checks the ledger and
the workers' reports: at most one live holder at a time, fences strictly increasing without
gaps, exactly one terminal, and no lost or duplicated event. Every worker is a recorded
``Process`` and is killed by its PID if it outlives the test.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _shared import dead_owner
from procledger import (
    Busy,
    EventType,
    Lease,
    LeaseOwner,
    Originator,
    ProcessInput,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)

from ._race_worker import worker_main

TERMINAL_KINDS = {"completed", "lost", "abandoned"}
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["procledger", "procledger.application.registry"])


def _registration(process_id: str) -> ProcessRegistration:
    return ProcessRegistration(
        id=process_id,
        input=ProcessInput.external({"label": "contended"}),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.host(),
        event_types=[EventType(name="signal.tick")],
    )


class Workers:
    """Worker processes started together; every one is killed by PID on the way out."""

    def __init__(self) -> None:
        self.procs: list[Any] = []
        self.ready = _CONTEXT.Queue()
        self.out = _CONTEXT.Queue()
        self.go = _CONTEXT.Event()

    def start(self, mode: str, url: str, pid: str, count: int, params: dict[str, Any]) -> None:
        for index in range(count):
            proc = _CONTEXT.Process(
                target=worker_main,
                args=(
                    {"mode": mode, "url": url, "pid": pid, "index": index, "params": params},
                    self.ready,
                    self.go,
                    self.out,
                ),
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
        for _ in range(count):  # synchronise on state: every registry is open
            self.ready.get(timeout=60)
        self.go.set()

    def reports(self, timeout: float = 60) -> list[list[dict[str, Any]]]:
        results: dict[int, Any] = {}
        while len(results) < len(self.procs):
            try:
                index, report = self.out.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"workers {set(range(len(self.procs))) - set(results)} hung")
            assert isinstance(report, list), report  # else: the worker's traceback
            results[index] = report
        for proc in self.procs:
            proc.join(timeout=timeout)
            assert proc.exitcode == 0
        return [results[index] for index in range(len(self.procs))]

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
            proc.close()
        for channel in (self.ready, self.out):
            channel.close()
            channel.join_thread()


@pytest.fixture
def workers() -> Iterator[Workers]:
    started = Workers()
    try:
        yield started
    finally:
        started.cleanup()


def _check_one_holder_at_a_time(ops: list[dict[str, Any]]) -> list[int]:
    """Fences 1..N, and each acquisition starts after the previous holder's lease ended."""
    acquired = sorted(
        (Lease.model_validate(op["lease"]) for op in ops if op["op"] == "claim" and op["ok"]),
        key=lambda lease: lease.fencing_token,
    )
    fences = [lease.fencing_token for lease in acquired]
    assert fences == list(range(1, len(fences) + 1)), fences
    assert len({lease.lease_token for lease in acquired}) == len(acquired)
    last_expiry = {lease.fencing_token: lease.expires_at_ms for lease in acquired}
    for op in ops:
        if op["op"] == "renew" and op["ok"]:
            renewed = Lease.model_validate(op["lease"])
            fence = renewed.fencing_token
            last_expiry[fence] = max(last_expiry[fence], renewed.expires_at_ms)
    ended = {op["fence"] for op in ops if op["op"] == "release"}
    ended |= {op["fence"] for op in ops if op["op"] == "complete" and op["ok"]}
    for previous, following in itertools.pairwise(acquired):
        fence = previous.fencing_token
        assert fence in ended or following.claimed_at_ms >= last_expiry[fence], (
            f"fence {following.fencing_token} claimed at {following.claimed_at_ms} while fence "
            f"{fence} was live until {last_expiry[fence]}"
        )
    return fences


def test_concurrent_claims_on_one_process(workers: Workers, shared_url: str) -> None:
    parent = open_registry(shared_url)
    try:
        parent.register(_registration("contended"))
        parent.record_started("contended", 1)
        workers.start(
            "churn",
            shared_url,
            "contended",
            count=3,
            params={"ttl_ms": 60, "complete_after_fence": 8, "duration_s": 1.0},
        )
        reports = workers.reports()
        ops = [op for report in reports for op in report]
        fences = _check_one_holder_at_a_time(ops)
        assert len(fences) >= 8
        assert sum(1 for op in ops if op["op"] == "claim" and not op["ok"]) > 0  # contention

        events = parent.events("contended")
        assert [e.sequence for e in events] == list(range(1, len(events) + 1))
        terminals = [e for e in events if e.kind in TERMINAL_KINDS]
        assert len(terminals) == 1
        wins = [op for op in ops if op["op"] == "complete" and op["ok"]]
        assert len(wins) == 1
        assert not wins[0]["stale"]
        for op in ops:
            if op["op"] == "complete" and not op["ok"]:
                assert op["error"] in {"LeaseLost", "AlreadyTerminal"}
        record = parent.get("contended")
        assert record.is_terminal
        assert record.exit_code == wins[0]["exit_code"] == terminals[0].payload["exit_code"]
        assert events[-1] == terminals[0]  # nothing after the terminal

        appended = {op["key"]: op["sequence"] for op in ops if op["op"] == "append" and op["ok"]}
        assert all(op["sequence"] == op["again"] for op in ops if op["op"] == "append" and op["ok"])
        ticks = [e for e in events if e.kind == "signal.tick"]
        logged = [e.replay_key for e in ticks]
        assert len(logged) == len(set(logged)), "a replayed tick was appended twice"
        assert {e.replay_key: e.sequence for e in ticks} == appended
        assert record.change_seq >= max(e.sequence for e in events)
        final = parent.get_lease("contended")
        assert final is None or final.fencing_token == max(fences)
    finally:
        parent.close()


def test_reclaim_race_among_processes_has_one_winner(workers: Workers, shared_url: str) -> None:
    parent = open_registry(shared_url)
    try:
        parent.register(_registration("orphan"))
        parent.record_started("orphan", 1)
        claimed = parent.claim_lease("orphan", dead_owner("crashed-runner"), 600_000)
        observed = claimed.lease  # type: ignore[union-attr]
        workers.start(
            "reclaim",
            shared_url,
            "orphan",
            count=3,
            params={"ttl_ms": 60_000, "observed": observed.model_dump(mode="json")},
        )
        ops = [op for report in workers.reports() for op in report]
        assert len(ops) == 3
        winners = [Lease.model_validate(op["lease"]) for op in ops if op["ok"]]
        assert len(winners) == 1, ops
        [winner] = winners
        assert winner.fencing_token == observed.fencing_token + 1
        assert winner.owner.liveness.kind == "local_process"
        assert all(Lease.model_validate(op["holder"]) == winner for op in ops if not op["ok"])
        assert parent.get_lease("orphan") == winner
        assert [e.kind for e in parent.events("orphan")] == ["registered", "started"]
    finally:
        parent.close()


def test_real_probe_refuses_to_reclaim_from_a_live_holder(tmp_path: Path) -> None:
    registry = open_registry(f"sqlite:///{tmp_path}/live.db")
    try:
        registry.register(_registration("held"))
        me = LeaseOwner.local_process("this-test")
        if not me.liveness.is_local_process:
            pytest.skip("/proc is not readable here")
        held = registry.claim_lease("held", me, 600_000)
        observed = held.lease  # type: ignore[union-attr]
        result = registry.reclaim_lease(
            "held", LeaseOwner.local_process("claimant"), observed, 1_000
        )
        assert result == Busy(holder=observed)
        dead = registry.reclaim_lease("held", dead_owner("crashed-runner"), observed, 1_000)
        assert dead == Busy(holder=observed)  # whoever asks, a live holder keeps its lease
    finally:
        registry.close()
