"""A PostgreSQL restart costs callers no failed call (issue 13, docs/design.md §7.3).

Four writer threads keep registering and starting processes while the test cluster is
restarted with ``pg_ctl restart -m fast`` and ``-m immediate``. Every call must succeed (each
rides through the outage within the store's retry window) and every acknowledged write must
be in the ledger afterwards; writes must resume within a second of the server accepting.

Restarting the shared cluster disturbs any other test using it at that moment, so these tests
live in their own module, are marked ``slow``, and wait for the server before returning.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest

from _cluster import Cluster
from _shared import wait_until
from procledger import ProcessRegistry, StoreUnavailable, open_registry
from registry.conformance import registration

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WRITERS = 4
_STATES_AFTER = {"registered": {"starting", "running"}, "started": {"running"}}


@dataclass
class Writer:
    """One thread's acknowledged writes (id → "registered" or "started") and failures."""

    name: str
    acknowledged: dict[str, str] = field(default_factory=dict)
    done_at: list[float] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)

    def run(self, registry: ProcessRegistry, stop: threading.Event) -> None:
        index = 0
        while not stop.is_set():
            process_id = f"{self.name}-{index:05d}"
            try:
                registry.register(registration(process_id))
                self.acknowledged[process_id] = "registered"
                event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, process_id))
                registry.record_started(process_id, index, event_id=event_id)
                self.acknowledged[process_id] = "started"
            except BaseException as error:
                self.failures.append(error)
                return
            self.done_at.append(time.monotonic())
            index += 1

    def writes_after(self, moment: float) -> int:
        return sum(1 for at in self.done_at if at > moment)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_under_four_writers_fails_no_call_and_loses_no_write(
    mode: str, cluster: Cluster, restart_url: str
) -> None:
    registry = open_registry(restart_url)
    writers = [Writer(f"w{n}") for n in range(WRITERS)]
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(registry, stop)) for w in writers]
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: all(len(w.done_at) >= 5 for w in writers), 60, "writes before")
        ready = cluster.restart(mode)
        wait_until(
            lambda: all(w.writes_after(ready) >= 5 or w.failures for w in writers),
            60,
            "writes after the restart",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    try:
        assert [f for w in writers for f in w.failures] == []
        first_after = min(min(at for at in w.done_at if at > ready) for w in writers)
        assert first_after - ready < 1.0, f"writes resumed {first_after - ready:.2f} s after"
        stored = {r.id: r.state.value for r in registry.list_processes({"status": "any"})}
        lost = [
            (process_id, step, stored.get(process_id))
            for writer in writers
            for process_id, step in writer.acknowledged.items()
            if stored.get(process_id) not in _STATES_AFTER[step]
        ]
        assert lost == []
    finally:
        registry.close()


def test_past_the_retry_window_a_call_is_unavailable_naming_the_masked_url(
    cluster: Cluster, restart_url: str
) -> None:
    """With the server stopped for longer than ``retry_s``, a call fails with
    ``StoreUnavailable`` naming the URL (password masked) once the window has passed."""
    registry = open_registry(restart_url + "&retry_s=1")
    try:
        registry.register(registration("before"))
        options = cluster.stop()
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable) as caught:
                registry.get("before")
            waited = time.monotonic() - began
        finally:
            cluster.start(options)
        assert 0.9 <= waited < 15, waited
        message = str(caught.value)
        assert ":***@" in message, message
        assert "retry" in message, message
        assert registry.get("before").id == "before"  # and back once the server is
    finally:
        registry.close()
