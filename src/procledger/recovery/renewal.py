"""Lease renewal while a runner runs: the self-fencing half of docs/design.md §3.6.

While a runner runs, a thread renews the attempt's lease every ``renew_ms``. When a renewal is
refused (``LeaseLost``), or renewals keep failing until less than ``renew_ms`` of the lease is
left by this process's monotonic clock (a paused worker wakes up past that point), the attempt's
``cancel`` is set -- the default runner then stops the process tree, with a grace of half a
renewal period -- and the attempt writes nothing.
"""

from __future__ import annotations

import threading
import time

from procledger.application.lease_keeper import LeaseKeeper, Renewal

__all__ = ["RenewalThread", "keep_alive"]


class RenewalThread:
    """Drives one attempt's ``LeaseKeeper`` on a thread of its own until the ``with`` ends.

    Gives up -- sets ``cancel`` and ``lost`` -- when a renewal is refused, or when the keeper
    says the lease is lapsing (a paused worker, or a store that kept failing): the runner then
    has half a renewal period to stop its tree, and the lease still has at least a whole one.
    """

    def __init__(self, keeper: LeaseKeeper, cancel: threading.Event) -> None:
        self.keeper = keeper
        self.lost = False
        self._cancel = cancel
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"procledger-renew:{keeper.lease.process_id}", daemon=True
        )

    def __enter__(self) -> RenewalThread:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.keeper.wait_s(time.monotonic())):
            if not keep_alive(self.keeper, time.monotonic()):
                self.lost = True
                self._cancel.set()
                return


def keep_alive(keeper: LeaseKeeper, now: float) -> bool:
    """Renew if due; False once the lease is no longer safely ours (refused, or lapsing)."""
    if keeper.is_lapsing(now):
        return False  # paused, or the store kept failing: too late to renew safely
    if not keeper.is_due(now):
        return True
    return keeper.renew(now) is not Renewal.lost
