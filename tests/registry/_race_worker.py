"""The worker OS processes of ``test_concurrency.py`` (started by multiprocessing).

``worker_main`` opens the registry, reports ``ready``, waits for the start event (so every
worker begins at once), then works and sends back one dict per operation it performed.

Modes:
- ``churn``: claim / append / renew / release, walk away or complete the same process, until it
  is terminal. Every claim is a fresh incarnation, so each acquisition has its own fence.
- ``reclaim``: one ``reclaim_lease`` of the observed (dead) holder, as a ``local_process`` owner.
"""

from __future__ import annotations

import random
import time
import traceback
import uuid
from typing import Any

from procledger import (
    Acquired,
    AlreadyTerminal,
    Lease,
    LeaseLost,
    LeaseOwner,
    ProcessRegistry,
    open_registry,
)

_ops: list[dict[str, Any]] = []


def emit(**fields: Any) -> None:
    _ops.append(fields)


def lease_json(lease: Lease) -> dict[str, Any]:
    return lease.model_dump(mode="json")


class Churn:
    def __init__(self, registry: ProcessRegistry, pid: str, index: int, params: dict[str, Any]):
        self.registry = registry
        self.pid = pid
        self.index = index
        self.ttl = int(params["ttl_ms"])
        self.complete_after = int(params["complete_after_fence"])
        self.deadline = time.monotonic() + float(params["duration_s"])
        self.random = random.Random(index)
        self.stale: Lease | None = None

    def run(self) -> None:
        while not self.finished():
            owner = LeaseOwner(owner_id=f"worker-{self.index}", incarnation_id=uuid.uuid4().hex)
            try:
                result = self.registry.claim_lease(self.pid, owner, self.ttl)
            except AlreadyTerminal:
                return  # completed by another worker: nothing left to hold
            if not isinstance(result, Acquired):
                emit(op="claim", ok=False, holder_fence=result.holder.fencing_token)
                self.try_stale_completion(result.holder.fencing_token)
                time.sleep(0.002)  # pacing only: let the holder run on 2 cores
                continue
            emit(op="claim", ok=True, lease=lease_json(result.lease))
            if not self.hold(result.lease):
                return

    def finished(self) -> bool:
        return self.registry.get(self.pid).is_terminal

    def try_stale_completion(self, holder_fence: int) -> None:
        """A writer whose lease was superseded tries to finish anyway (must be refused)."""
        if self.stale is None or holder_fence <= self.stale.fencing_token:
            return
        lease, self.stale = self.stale, None
        self.complete(lease, stale=True)

    def complete(self, lease: Lease, *, stale: bool) -> bool:
        try:
            record = self.registry.record_completed(
                self.pid, "exited", "exited", exit_code=self.index, lease=lease
            )
        except (LeaseLost, AlreadyTerminal) as error:
            emit(op="complete", ok=False, error=type(error).__name__, fence=lease.fencing_token)
            return False
        emit(
            op="complete",
            ok=True,
            fence=lease.fencing_token,
            stale=stale,
            exit_code=record.exit_code,
        )
        return True

    def hold(self, lease: Lease) -> bool:
        """Work under a held lease; False once the process is terminal."""
        key = f"w{self.index}-f{lease.fencing_token}"
        payload = {"worker": self.index, "fence": lease.fencing_token}
        try:
            event = self.registry.append_event(self.pid, "signal.tick", payload, replay_key=key)
            again = self.registry.append_event(self.pid, "signal.tick", payload, replay_key=key)
        except AlreadyTerminal:
            emit(op="append", ok=False, key=key)
            return False
        emit(op="append", ok=True, key=key, sequence=event.sequence, again=again.sequence)
        for _ in range(self.random.randrange(4)):
            try:
                lease = self.registry.renew_lease(lease, self.ttl)
            except LeaseLost:
                emit(op="renew", ok=False, fence=lease.fencing_token)
                self.stale = lease
                return True
            emit(op="renew", ok=True, lease=lease_json(lease))
        late = time.monotonic() > self.deadline
        choice = self.random.random()
        if lease.fencing_token >= self.complete_after and (late or choice < 0.3):
            return not self.complete(lease, stale=False)
        if choice < 0.7:
            self.registry.release_lease(lease)
            emit(op="release", fence=lease.fencing_token)
        else:
            emit(op="walk_away", fence=lease.fencing_token)
            self.stale = lease
        return True


def reclaim(registry: ProcessRegistry, pid: str, index: int, params: dict[str, Any]) -> None:
    observed = Lease.model_validate(params["observed"])
    claimant = LeaseOwner.local_process(f"claimant-{index}")
    result = registry.reclaim_lease(pid, claimant, observed, int(params["ttl_ms"]))
    if isinstance(result, Acquired):
        emit(op="reclaim", ok=True, lease=lease_json(result.lease), liveness=claimant.liveness.kind)
    else:
        emit(op="reclaim", ok=False, holder=lease_json(result.holder))


def worker_main(job: dict[str, Any], ready: Any, go: Any, out: Any) -> None:
    """Entry point of one worker process; ``out`` receives ``(index, ops | traceback)``.

    ``job`` names the ``mode``, ``url``, process ``pid``, worker ``index`` and ``params``.
    """
    mode, url, pid, index, params = (job[k] for k in ("mode", "url", "pid", "index", "params"))
    try:
        registry = open_registry(url)
        try:
            ready.put(index)
            if not go.wait(timeout=60):
                raise TimeoutError("no start signal")
            if mode == "churn":
                Churn(registry, pid, index, params).run()
            else:
                reclaim(registry, pid, index, params)
        finally:
            registry.close()
    except BaseException:
        ready.put(index)  # never leave the parent waiting
        out.put((index, traceback.format_exc()))
        raise
    out.put((index, list(_ops)))
