"""A lease holder that has exited but not yet been reaped (a zombie) is provably dead: it will
never write again (issue 14: `restore` right after `kill -9` of an unreaped supervisor)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from _shared import Processes, wait_until
from procledger.adapters.liveness import ProcProbe, local_identity, read_process_start
from procledger.domain.leases import LeaseOwner, Liveness


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_an_unreaped_holder_is_provably_dead(procs: Processes) -> None:
    mine = local_identity()
    assert mine is not None
    child = subprocess.Popen(["sh", "-c", "exit 0"])
    procs.add(child.pid)
    start = read_process_start(child.pid)
    assert start is not None
    wait_until(lambda: _state(child.pid) == "Z", what="the child to become a zombie")
    holder = LeaseOwner(
        owner_id="supervisor",
        incarnation_id="dead",
        liveness=Liveness(
            kind="local_process",
            host_id=mine.host_id,
            boot_id=mine.boot_id,
            pid=child.pid,
            process_start=start,
        ),
    )
    claimant = LeaseOwner(owner_id="restore", incarnation_id="alive", liveness=mine)
    try:
        assert ProcProbe().provably_dead(holder, claimant)
    finally:
        child.wait()
    assert ProcProbe().provably_dead(holder, claimant)


def test_a_living_holder_is_not() -> None:
    mine = local_identity()
    assert mine is not None
    holder = LeaseOwner(owner_id="me", incarnation_id="a", liveness=mine)
    claimant = LeaseOwner(owner_id="other", incarnation_id="b", liveness=mine)
    assert not ProcProbe().provably_dead(holder, claimant)
