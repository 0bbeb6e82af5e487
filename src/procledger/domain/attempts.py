"""The attempts of a service, read from the ledger (docs/design.md §15).

A service's first attempt keeps its own id; the n-th is ``<first id>.<n>``, linked to the first
by ``attempt_of``. Whether an ended attempt may still be followed by another is decided here
from its record alone, so a reader in another process (``procledger wait``) can tell when a
service is over.
"""

from __future__ import annotations

from procledger.domain.records import ProcessRecord
from procledger.domain.service import RestartMode
from procledger.domain.vocabulary import ProcessState, ProcessStatus, TerminalReason

__all__ = ["attempt_id", "first_attempt_id", "newest_per_service", "restart_may_follow"]


def attempt_id(first_id: str, attempt: int) -> str:
    """The process id of a service's ``attempt``-th attempt (the first keeps its own)."""
    return first_id if attempt == 1 else f"{first_id}.{attempt}"


def first_attempt_id(record: ProcessRecord) -> str:
    """The id of the first attempt of ``record``'s service (its own id for a first attempt
    and for a process that is not a service)."""
    return record.attempt_of or record.id


def restart_may_follow(record: ProcessRecord, *, first: ProcessRecord | None = None) -> bool:
    """Whether another attempt may still follow ``record`` by its policy: it ended, its
    service was not given up or stopped (``first``, the service's first attempt when the
    caller read it, carries a stop of the whole service), it was not shut down or lost, and
    the policy restarts such an end (``always``; ``on-failure`` after a failure). A supervisor
    that died in the backoff never starts it (the schedule is not resumed), so a reader needs
    a timeout."""
    policy = record.restart
    if policy is None or not record.is_terminal or record.gave_up is not None:
        return False
    if record.stop_requested or record.reason is TerminalReason.runner_shutdown:
        return False
    if record.service_stop_requested or (first is not None and first.service_stop_requested):
        return False
    if record.state in (ProcessState.lost_on_restore, ProcessState.abandoned):
        return False
    if policy.mode is RestartMode.never:
        return False
    return policy.mode is RestartMode.always or record.status is ProcessStatus.failed


def newest_per_service(records: list[ProcessRecord]) -> list[ProcessRecord]:
    """``records`` with each service shown once: its newest attempt among them, where its
    first attempt listed (``ps``: one row per service)."""
    newest: dict[str, ProcessRecord] = {}
    order: list[str] = []
    for record in records:
        key = first_attempt_id(record) if record.attempt is not None else record.id
        if key not in newest:
            order.append(key)
            newest[key] = record
        elif (record.attempt or 0) > (newest[key].attempt or 0):
            newest[key] = record
    return [newest[key] for key in order]
