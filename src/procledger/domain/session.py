"""A session's handle grants, as an aggregate of its own.

Grants are not facts about a process, so they stay out of its log; but they must survive a
rebuild of the read models, so they are events too — in the session's log. Transfers save two
sessions in one transaction, which is what makes them all-or-nothing.
"""

from __future__ import annotations

import uuid
from typing import Any, cast

from eventsourcing.domain import Aggregate

from procledger.domain.process import timestamp_of

_NAMESPACE = uuid.UUID("0b7e4d52-8f36-4f7a-a1e9-3c2d5b6a7f10")


def session_uuid(session_id: str) -> uuid.UUID:
    return uuid.uuid5(_NAMESPACE, session_id)


class Session(Aggregate):
    TOPIC = "procledger:Session"

    class Event(Aggregate.Event):
        TOPIC = "procledger:Session.Event"
        class_version = 1
        at_ms: int

    class Opened(Event, Aggregate.Created):
        TOPIC = "procledger:Session.Opened"
        class_version = 1
        session_id: str

    class Granted(Event):
        TOPIC = "procledger:Session.Granted"
        class_version = 1
        process_id: str
        descriptor: dict[str, Any] | None

        def apply(self, aggregate: Any) -> None:
            cast(Session, aggregate).grants[self.process_id] = self.descriptor

    class Revoked(Event):
        TOPIC = "procledger:Session.Revoked"
        class_version = 1
        process_id: str

        def apply(self, aggregate: Any) -> None:
            cast(Session, aggregate).grants.pop(self.process_id, None)

    def __init__(self, session_id: str, at_ms: int) -> None:
        self.session_id = session_id
        self.grants: dict[str, dict[str, Any] | None] = {}

    @classmethod
    def open(cls, session_id: str, *, at_ms: int) -> Session:
        return cls._create(
            cls.Opened,
            id=session_uuid(session_id),
            session_id=session_id,
            at_ms=at_ms,
            timestamp=timestamp_of(at_ms),
        )

    def grant(self, process_id: str, descriptor: dict[str, Any] | None, *, at_ms: int) -> bool:
        if process_id in self.grants and self.grants[process_id] == descriptor:
            return False
        self.trigger_event(
            self.Granted,
            process_id=process_id,
            descriptor=descriptor,
            at_ms=at_ms,
            timestamp=timestamp_of(at_ms),
        )
        return True

    def revoke(self, process_id: str, *, at_ms: int) -> bool:
        if process_id not in self.grants:
            return False
        self.trigger_event(
            self.Revoked, process_id=process_id, at_ms=at_ms, timestamp=timestamp_of(at_ms)
        )
        return True

    def holds(self, process_id: str) -> bool:
        return process_id in self.grants
