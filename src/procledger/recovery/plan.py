"""The decision of docs/design.md §3.6, as a pure function: what a recovery worker may do with
one process, given its record, its stored lease, the time and whether the holder is provably
dead. Nothing here reads or writes, so the table can be tested exhaustively on its own
(``tests/recovery/test_plan.py``) and the worker only carries decisions out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from procledger.domain.leases import Lease, LeaseOwner
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import RecoveryDisposition, TerminalReason

__all__ = ["SKIP", "Action", "Plan", "plan", "still_runnable"]


class Action(StrEnum):
    skip = "skip"
    run = "run"
    abandon = "abandon"


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with one process. ``reclaim``: claim against the observed (provably dead)
    holder; ``authority``: abandon without a lease (externally_owned, reconciled)."""

    action: Action
    reason: TerminalReason | None = None
    evidence: LeaseOwner | None = None
    reclaim: bool = False
    authority: bool = False

    @property
    def claims(self) -> bool:
        """Whether carrying it out takes the process's lease."""
        return self.action is Action.run or (self.action is Action.abandon and not self.authority)


SKIP: Final = Plan(Action.skip)


def plan(record: ProcessRecord, lease: Lease | None, *, now_ms: int, holder_dead: bool) -> Plan:
    """The disposition table of §3.6 as a pure function.

    ``lease`` is the stored lease (``get_lease``: possibly expired, ``None`` when released or
    never claimed); ``holder_dead`` says whether its owner is provably dead for this worker.
    """
    if record.state.is_terminal:
        return SKIP
    if record.disposition is RecoveryDisposition.externally_owned:
        if record.abandon_request is None:
            return SKIP
        return Plan(Action.abandon, TerminalReason.abandon_requested, authority=True)
    dead = lease is not None and holder_dead
    live = lease is not None and lease.is_live(now_ms)
    if record.disposition is RecoveryDisposition.owner_bound and record.first_started is not None:
        if dead:
            assert lease is not None
            return Plan(Action.abandon, TerminalReason.owner_dead, lease.owner, reclaim=True)
        if record.abandon_request is not None and not live:
            evidence = record.first_started.owner
            return Plan(Action.abandon, TerminalReason.abandon_requested, evidence)
        return SKIP
    if record.input.type == "external" or (live and not dead):
        return SKIP  # external work is never executed here; a live holder keeps its work
    return Plan(Action.run, reclaim=dead)


def still_runnable(record: ProcessRecord) -> bool:
    """Re-checked once the lease is ours: the record we planned from may be stale."""
    if record.state.is_terminal:
        return False
    return not (
        record.disposition is RecoveryDisposition.owner_bound and record.first_started is not None
    )
