"""Recovery by declared disposition: the sweep, the owner drain, self-fencing runs.

See docs/design.md §3.6.

A ``RecoveryWorker`` takes the non-terminal processes whose lease is free, one at a time in id
order and passing over what other workers are taking (``claim_next_free``), then those whose
live lease a provably dead holder keeps, and does for each what its declared disposition
allows -- nothing more::

    externally_owned   never claimed, never run; a pending abandon request -> abandoned
    rerunnable         claim (or reclaim from a provably dead holder) and run again
    owner_bound        never started: claim, record first_started, run once;
                       started: never run again -- a provably dead holder -> abandoned/owner_dead,
                       an abandon request and a lapsed lease -> abandoned/abandon_requested,
                       anything else is left alone (elapsed time alone never abandons)

One job per module:

- ``plan``: that decision, as a pure function of the record, the stored lease, the time and
  whether the holder is provably dead;
- ``worker``: ``RecoveryWorker``, the driver that walks the processes, reads those facts
  (through ``ProcessRegistry`` only) and hands each decision on;
- ``claims``: who an attempt claims as (a fresh incarnation of the worker's owner, so a later
  pass never re-enters a running attempt's lease), and the claim;
- ``attempt``: one run of a claimed process and the writing of its outcome;
- ``abandon``: abandoning, by authority or under a claimed lease;
- ``renewal``: the thread that renews an attempt's lease while it runs, and fences it off
  (cancels it; it then writes nothing) when it cannot;
- ``cancels``: how ``RecoveryWorker.stop`` reaches every running attempt;
- ``runner``: the default runner (commands wired as the Supervisor wires them, engines);
- ``results``: the runner's contract and a pass's report.
"""

from __future__ import annotations

from procledger.recovery.claims import is_owned_by as is_owned_by
from procledger.recovery.claims import recovery_owner_id
from procledger.recovery.plan import Action, Plan, plan
from procledger.recovery.results import (
    Engine,
    RunFailed,
    Runner,
    RunResult,
    SweepReport,
)
from procledger.recovery.results import diagnostic_of as diagnostic_of
from procledger.recovery.runner import DefaultRunner
from procledger.recovery.runner import default_stop_policy as default_stop_policy
from procledger.recovery.worker import RecoveryWorker

__all__ = [
    "Action",
    "DefaultRunner",
    "Engine",
    "Plan",
    "RecoveryWorker",
    "RunFailed",
    "RunResult",
    "Runner",
    "SweepReport",
    "plan",
    "recovery_owner_id",
]
