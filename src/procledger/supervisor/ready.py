"""A run's readiness (docs/design.md §15.2): its probes watched until they all held (the
``ready`` fact), its ready timeout passed (the tree is stopped; the completion path records
``failed``/``ready_timeout``) or it ended.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from procledger.domain.errors import InvalidTransition
from procledger.domain.vocabulary import TerminalReason
from procledger.supervisor.decide import request_policy
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.readiness import ReadinessWatch
from procledger.supervisor.runs import Run

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["watch_ready"]

log = logging.getLogger("procledger.supervisor")


def watch_ready(
    registry: ProcessRegistry, run: Run, watch: ReadinessWatch, policy: StopPolicy
) -> None:
    """Watch ``run``'s probes (blocks: run it on a thread of its own)."""

    def on_ready(probes: list[str]) -> None:
        try:
            registry.record_ready(run.process_id, registry.now_ms(), probes=probes)
        except InvalidTransition:
            return  # it ended first: never ready
        except Exception as error:  # a store outage: the run goes on, unready on record
            log.warning("process %r: readiness not recorded: %s", run.process_id, error)
        run.mark_ready()

    def on_timeout(missing: list[str]) -> None:
        why = f"not ready within {watch.spec.timeout_s:g} s: {', '.join(missing)} did not hold"
        if not run.mark_ready_timeout(why):
            return
        log.info("process %r: %s; stopping its tree", run.process_id, why)
        run.child.stop(request_policy(TerminalReason.terminated, policy), escalate=True)

    watch.watch(lambda: not run.ended, on_ready, on_timeout)
