"""The /proc liveness probe: can a claimant *prove* that a lease holder is dead?

Only ``local_process`` owners in the same PID namespace (``host_id``) and the same boot can be
judged, and only a missing PID, a zombie (exited, not yet reaped by its parent) or a PID whose
start time differs counts as proof. Any read error means "not provably dead": a lease is never
stolen on a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from procledger.adapters.proc_facts import (
    PROC,
    holder_dead,
    live_process_start,
    own_identity,
    read_identity,
    read_process_start,
    runs_here,
    started_at,
)
from procledger.domain.leases import LeaseOwner, Liveness, install_local_identity_source

_PROC = PROC
__all__ = [
    "ProcProbe",
    "live_process_start",
    "local_identity",
    "read_process_start",
    "runs_here",
    "started_at",
]


def local_identity(proc: Path = _PROC) -> Liveness | None:
    """This process's liveness facts, or None where /proc is unreadable (then: opaque).

    Read once per OS process (``proc_facts.own_identity``): none of them can change while it
    lives. Five /proc reads cost ~150 µs, and a supervised run asked three times."""
    facts = own_identity(proc) if proc is _PROC else read_identity(proc)
    if facts is None:
        return None
    return Liveness(
        kind="local_process",
        host_id=facts.host_id,
        boot_id=facts.boot_id,
        pid=facts.pid,
        process_start=facts.process_start,
    )


StartReader = Callable[[int], str | None]


class ProcProbe:
    """Decides "provably dead" for a holder, as seen by a claimant on this host."""

    def __init__(self, read_start: StartReader = live_process_start) -> None:
        self._read_start = read_start

    def provably_dead(self, holder: LeaseOwner, claimant: LeaseOwner) -> bool:
        mine, theirs = claimant.liveness, holder.liveness
        return holder_dead(theirs.model_dump(), mine.model_dump(), self._read_start)


install_local_identity_source(local_identity)
