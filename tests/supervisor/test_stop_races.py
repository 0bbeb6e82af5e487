"""`stop` against a process that ends as it is asked (docs/design.md §8, §15.4): its owner
releases the lease in the transaction that writes its end, so a stop that found no live owner
must look at the record again before it concludes that nobody is there to stop it."""

from __future__ import annotations

import os

import pytest

from _shared import command_registration
from procledger import AlreadyTerminal, LeaseOwner, ProcessRegistry
from procledger.supervisor.control import stop_process
from procledger.supervisor.modes import StopMode

OWNER = LeaseOwner.local_process("supervisor")  # this test process: a live owner


def test_a_process_that_ended_after_it_was_read_is_already_terminal_not_unstoppable(
    registry: ProcessRegistry,
) -> None:
    _, lease = registry.register_claimed(command_registration("job"), OWNER, 30_000)
    assert lease is not None
    registry.record_started("job", 1)
    read_before_its_end = registry.get("job")
    registry.record_completed("job", "exited", "exited", exit_code=0, lease=lease)
    me = LeaseOwner.local_process(f"stopper-{os.getpid()}")
    with pytest.raises(AlreadyTerminal):
        stop_process(registry, read_before_its_end, StopMode.terminate, 1.0, me)
    assert registry.get("job").stop_requested == []  # nothing was recorded
