"""Named services started by a real Supervisor in the test process (docs/design.md §19.6), for
the CLI's and the web view's tests of a service followed as one.

The Supervisor is shut down at the end (its children's trees stopped, every terminal recorded);
each attempt's child is known by its exact pid (``procs``) as soon as it is seen.
"""

from __future__ import annotations

import contextlib
import uuid

import psutil

from _shared import Processes
from procledger import (
    LeaseOwner,
    ProcessHandle,
    ProcessRecord,
    ProcessRegistry,
    RestartPolicy,
    StopPolicy,
    Supervisor,
    open_registry,
)

CRASH_LOOP = RestartPolicy(
    mode="on-failure", max_restarts=2, backoff_initial_s=0.2, backoff_max_s=0.4
)
"""Three attempts (two restarts), then ``crash_loop``."""
LONG_BACKOFF = RestartPolicy(mode="on-failure", backoff_initial_s=30, backoff_max_s=30)
"""A next attempt that waits 30 s: a service seen in its backoff."""


class Services:
    """A Supervisor on the test's ledger, and the registry it writes through."""

    def __init__(self, url: str, procs: Processes) -> None:
        self.registry: ProcessRegistry = open_registry(url)
        owner = LeaseOwner.local_process(f"test-{uuid.uuid4().hex[:8]}")
        self.supervisor = Supervisor(self.registry, owner=owner, stop=StopPolicy(grace_s=5.0))
        self.procs = procs

    def start(self, script: str, name: str, policy: RestartPolicy) -> ProcessHandle:
        return self.supervisor.start(["sh", "-c", script], name=name, restart=policy)

    def crash_loop(self, name: str = "svc") -> list[ProcessRecord]:
        """``sh -c 'echo attempt; exit 1'`` until it gives up: its three attempts."""
        handle = self.start("echo attempt; exit 1", name, CRASH_LOOP)
        newest = self.supervisor.wait(handle, timeout=60)
        assert (newest.attempt, newest.gave_up) == (3, "crash_loop")
        return self.registry.attempts(handle.process_id)

    def attempt(self, first: str, number: int) -> ProcessRecord | None:
        """Attempt ``number`` of ``first``'s service once registered; its child is known."""
        found = [a for a in self.registry.attempts(first) if a.attempt == number]
        if found and found[0].os is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.procs.add(found[0].os.pid)
        return found[0] if found else None

    def close(self) -> None:
        self.supervisor.shutdown(grace_s=1.0)
        self.registry.close()
