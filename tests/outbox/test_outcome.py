"""``Outcome``: the one value a terminal's fields travel in (docs/design.md §6.2), checked when
made, fingerprinted as 0.1.0 and 0.2.0 did (§3.2, §11.4), saved in the outbox in the entry's
old JSON form (§6.3)."""

from __future__ import annotations

import inspect

import orjson
import pytest

from _shared import command_registration
from procledger import LeaseOwner, ProcessRegistry, open_registry
from procledger.adapters.outbox import OutboxEntry
from procledger.domain.errors import NotFound, ProcessLifecycleValidationError
from procledger.domain.outcome import Outcome, completed_fingerprint
from procledger.domain.records import OutputSummary
from procledger.domain.vocabulary import ProcessState, TerminalReason

S, R = ProcessState, TerminalReason


def test_fingerprints_are_the_bytes_0_1_0_and_0_2_0_wrote() -> None:
    """Stored retries and the golden ledgers match these strings: they never change."""
    assert Outcome(S.exited, R.exited, exit_code=0).fingerprint() == (
        '["completed","exited","exited",0,null,null]'
    )
    signaled = Outcome.of("signaled", "signaled", signal=9, survivors=[7, 3, 7])
    assert signaled.fingerprint() == '["completed","signaled","signaled",null,null,null,9,[3,7]]'
    assert signaled.fingerprint() == completed_fingerprint(
        "signaled", "signaled", None, None, None, signal=9, survivors=[3, 7]
    )


def test_words_become_members_and_survivors_are_kept_sorted_once() -> None:
    outcome = Outcome.of("killed", "runner_shutdown", signal=9, survivors=[5, 2, 5])
    assert (outcome.state, outcome.reason) == (S.killed, R.runner_shutdown)
    assert outcome.survivors == (2, 5)


@pytest.mark.parametrize(
    ("state", "reason", "details", "field"),
    [
        ("exited", "failed", {}, "state_reason"),
        ("bogus", "exited", {}, "state_reason"),
        ("exited", "exited", {}, "exit_code"),
        ("failed", "failed", {"value": 1}, "value"),
        ("exited", "exited", {"exit_code": 0, "diagnostic": "x"}, "diagnostic"),
        ("exited", "exited", {"exit_code": 0, "signal": 9}, "signal"),
        ("signaled", "signaled", {}, "signal"),
        ("killed", "killed", {"survivors": [0]}, "survivors"),
    ],
)
def test_an_outcome_is_checked_when_made(
    state: str, reason: str, details: dict[str, object], field: str
) -> None:
    with pytest.raises(ProcessLifecycleValidationError) as refused:
        Outcome.of(state, reason, **details)
    assert refused.value.field == field


def _entry(outcome: Outcome) -> OutboxEntry:
    return OutboxEntry.of(
        outcome,
        store="sqlite:/x",
        host_id="h",
        process_id="p",
        registration_hash="sha256:x",
        event_id="00000000-0000-5000-8000-000000000000",
        owner=LeaseOwner.local_process("o").model_dump(mode="json"),
        written_at_ms=1,
    )


def test_an_outbox_entry_gives_back_the_outcome_it_saved() -> None:
    summary = OutputSummary(capture=True, host_id="h", folder="/tmp/o", limit=10)
    outcome = Outcome(S.terminated, R.terminated, signal=15, survivors=(4,)).with_output(
        summary, {"stdout": "aGk="}
    )
    entry = OutboxEntry.from_json(_entry(outcome).to_json())
    assert entry.outcome() == outcome
    assert (entry.state, entry.signal, entry.survivors) == ("terminated", 15, [4])


def test_an_entry_in_the_form_older_versions_wrote_still_loads() -> None:
    old = {
        "store": "sqlite:/x",
        "host_id": "h",
        "process_id": "p",
        "registration_hash": "sha256:x",
        "event_id": "e",
        "state": "exited",
        "reason": "exited",
        "owner": LeaseOwner.local_process("o").model_dump(mode="json"),
        "written_at_ms": 1,
        "exit_code": 3,
        "diagnostic": None,
        "format": 1,
    }
    outcome = OutboxEntry.from_json(orjson.dumps(old)).outcome()
    assert outcome == Outcome(S.exited, R.exited, exit_code=3)


def test_an_outcome_with_a_value_has_no_outbox_entry() -> None:
    with pytest.raises(ValueError, match="value"):
        _entry(Outcome(S.exited, R.exited, exit_code=0, value={"k": 1}))


@pytest.fixture
def registry() -> ProcessRegistry:
    return open_registry("memory://")


def test_record_completed_keeps_its_keywords_and_its_error_order(
    registry: ProcessRegistry,
) -> None:
    """One signature for ``record_completed`` and ``completed_write``; a refused outcome is
    still refused when the write is made: an unknown process is ``NotFound`` first, and
    ``write_all`` hands the error to its own write."""
    signature = inspect.signature(ProcessRegistry.record_completed)
    assert list(signature.parameters)[1:4] == ["process_id", "state", "reason"]
    assert signature.return_annotation == "ProcessRecord"
    assert "Raises:" in (ProcessRegistry.record_completed.__doc__ or "")
    with pytest.raises(NotFound):
        registry.record_completed("nobody", "bogus", "exited")
    registry.register(command_registration("known"))
    refused = registry.completed_write("known", "exited", "failed")
    results = registry.write_all([refused, registry.completed_write("nobody", "exited", "failed")])
    assert isinstance(results[0], ProcessLifecycleValidationError)
    assert isinstance(results[1], NotFound)
