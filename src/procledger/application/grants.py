"""Grants: which session may see which process, kept as ``Session`` aggregate events so the
``grants`` read model can be rebuilt. A transfer moves every handle or none (one save)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from procledger.application.retry import retry_on_conflict
from procledger.application.unit_of_work import Ledger
from procledger.domain.errors import NotFound
from procledger.domain.records import ProcessRecord
from procledger.domain.registration import HandleDescriptor
from procledger.domain.session import Session


def not_granted(process_id: str) -> NotFound:
    """The same message for "ungranted" and "unknown": a session learns nothing it can't see."""
    return NotFound(f"process {process_id!r} not found")


def descriptor_json(descriptor: Any, record: ProcessRecord) -> dict[str, Any]:
    """The descriptor a grant stores: the given one, the registration's, or kind and label."""
    if descriptor is None:
        descriptor = record.descriptor or HandleDescriptor(
            kind=record.identity.kind, label=record.identity.label
        )
    if not isinstance(descriptor, HandleDescriptor):
        descriptor = HandleDescriptor.model_validate(descriptor)
    dumped: dict[str, Any] = descriptor.model_dump(mode="json")
    return dumped


class Grants:
    """The grant commands of one ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def _open(self, session_id: str, now: int) -> Session:
        return self.ledger.load_session(session_id) or Session.open(session_id, at_ms=now)

    def _save(self, *sessions: Session) -> None:
        self.ledger.save((), sessions, now_ms=self.ledger.now_ms())

    def grant(self, session_id: str, process_id: str, descriptor: Any = None) -> None:
        stored = descriptor_json(descriptor, self.ledger.read_record(process_id))

        def attempt() -> None:
            now = self.ledger.now_ms()
            session = self._open(session_id, now)
            if session.grant(process_id, stored, at_ms=now):
                self._save(session)

        retry_on_conflict(attempt, f"session {session_id!r}: grant")

    def revoke(self, session_id: str, process_id: str) -> None:
        def attempt() -> None:
            session = self.ledger.load_session(session_id)
            if session is None or not session.revoke(process_id, at_ms=self.ledger.now_ms()):
                raise not_granted(process_id)
            self._save(session)

        retry_on_conflict(attempt, f"session {session_id!r}: revoke")

    def transfer(self, from_session: str, to_session: str, process_ids: Sequence[str]) -> None:
        moving = list(dict.fromkeys(process_ids))  # a repeated id moves once

        def attempt() -> None:
            now = self.ledger.now_ms()
            source = self.ledger.load_session(from_session)
            for process_id in moving:
                if source is None or not source.holds(process_id):
                    raise not_granted(process_id)
            if source is None or from_session == to_session:
                return  # nothing to move (no ids, or to itself)
            target = self._open(to_session, now)
            for process_id in moving:
                descriptor = source.grants[process_id]
                source.revoke(process_id, at_ms=now)
                target.grant(process_id, descriptor, at_ms=now)
            self._save(source, target)

        retry_on_conflict(attempt, f"session {from_session!r}: transfer")
