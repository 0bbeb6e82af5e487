"""orjson encoding of stored events.

Our events hold JSON-native values only, so the one value that needs restoring is
eventsourcing's own ``timestamp``. Decoding failures become ``StoreError`` naming the process
version and topic, so one corrupt row never hides the rest of the store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
from eventsourcing.persistence import Mapper, StoredEvent, Transcoder
from eventsourcing.utils import get_topic, resolve_topic

from procledger.domain.errors import StoreError

_BOOKKEEPING = ("originator_id", "originator_version")


class OrjsonTranscoder(Transcoder):
    """Unused by our mapper but required by eventsourcing's factory signature."""

    def encode(self, obj: Any) -> bytes:
        return orjson.dumps(obj)

    def decode(self, data: bytes) -> Any:
        return orjson.loads(data)


class OrjsonMapper(Mapper[UUID]):
    def __init__(self) -> None:
        super().__init__(transcoder=OrjsonTranscoder())

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        state = dict(vars(domain_event))
        originator_id = state.pop("originator_id")
        originator_version = state.pop("originator_version")
        return StoredEvent(
            originator_id=originator_id,
            originator_version=originator_version,
            topic=get_topic(type(domain_event)),
            state=orjson.dumps(state),
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        try:
            return decode_event(
                stored_event.originator_id,
                stored_event.originator_version,
                stored_event.topic,
                stored_event.state,
            )
        except StoreError:
            raise
        except Exception as error:
            raise StoreError(
                f"stored event {stored_event.originator_id} v{stored_event.originator_version} "
                f"({stored_event.topic}) cannot be decoded: {error}"
            ) from error


def decode_event(originator_id: UUID | str, version: int, topic: str, state: bytes) -> Any:
    """Rebuild an event object without calling ``__init__`` (as eventsourcing does)."""
    cls = resolve_topic(topic)
    fields: dict[str, Any] = orjson.loads(bytes(state))
    if not isinstance(fields, dict):
        raise StoreError(f"stored event {originator_id} v{version} is not a JSON object")
    fields["timestamp"] = datetime.fromisoformat(fields["timestamp"])
    fields["originator_id"] = (
        originator_id if isinstance(originator_id, UUID) else UUID(originator_id)
    )
    fields["originator_version"] = version
    event = object.__new__(cls)
    event.__dict__.update(fields)
    return event
