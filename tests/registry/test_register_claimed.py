"""``register_claimed``: a new process registered, leased and stamped with its first starter in
one transaction (a supervised start's writes before the spawn, docs/design.md §6.2); a known id
is left to the caller, exactly as ``register`` leaves it."""

from __future__ import annotations

import pytest

from _shared import command_registration, write_transactions
from procledger import (
    LeaseOwner,
    ProcessRegistry,
    RegistrationConflict,
)

OWNER = LeaseOwner.local_process("supervisor")


def test_a_new_process_is_registered_leased_and_first_started_in_one_write(
    registry: ProcessRegistry,
) -> None:
    begun = write_transactions(registry)
    record, lease = registry.register_claimed(command_registration("job", ["true"]), OWNER, 30_000)
    assert begun.count(True) == 1
    assert lease is not None
    assert (lease.owner, lease.fencing_token) == (OWNER, 1)
    assert registry.get_lease("job") == lease
    assert record.first_started is not None
    assert record.first_started.owner == OWNER
    assert [e.kind for e in registry.events("job")] == ["registered", "first_started"]
    assert registry.verify().ok  # the hash chain and heads are those of two separate writes


def test_a_known_id_comes_back_unclaimed_and_unchanged(registry: ProcessRegistry) -> None:
    registry.register(command_registration("job", ["true"]))
    record, lease = registry.register_claimed(command_registration("job", ["true"]), OWNER, 30_000)
    assert lease is None
    assert registry.get_lease("job") is None
    assert record.first_started is None
    assert [e.kind for e in registry.events("job")] == ["registered"]
    with pytest.raises(RegistrationConflict):
        registry.register_claimed(command_registration("job", ["false"]), OWNER, 30_000)


def test_a_bad_ttl_writes_nothing(registry: ProcessRegistry) -> None:
    with pytest.raises(ValueError, match="ttl_ms"):
        registry.register_claimed(command_registration("job", ["true"]), OWNER, 0)
    assert registry.list_processes({"status": "any"}) == []
