"""When a process is damaged, decided from its stored rows alone: its hash chain (the events
and their ``heads`` row, docs/design.md §13.1) and the ``records`` row that says so
(§13.5, "How a damaged process shows in the read model").

Standard library and orjson only: the CLI's fast read path reads the ``records`` table with
the stdlib ``sqlite3`` module and must come to the same conclusion as the store, by calling the
same functions (``read_record_row``, ``damage_of``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from procledger.domain.errors import StoreCorrupt

__all__ = [
    "DAMAGED",
    "RecordRow",
    "chain_fault",
    "damage_marker",
    "damage_of",
    "damaged_process",
    "event_digest",
    "link_of",
    "read_record_row",
]

DAMAGED = "damaged"
"""The one key of the JSON object a damaged process's ``records`` row holds instead of its
record: ``{"damaged": "<why>"}``."""


# -- the hash chain ----------------------------------------------------------------------------


def event_digest(topic: str | bytes, version: int, state: bytes | bytearray | memoryview) -> str:
    """``sha256:<hex>`` of one stored event: its topic, version and stored state bytes (the
    stored form, so an upcast on reading never changes it). A topic read raw (bytes) digests
    as its text would. (``hashlib`` is imported here, by what checks a log: a list of records
    never loads it, docs/design.md §8.1.)"""
    from hashlib import sha256  # noqa: PLC0415

    digest = sha256(topic.encode() if isinstance(topic, str) else topic)
    digest.update(b"\n%d\n" % version)
    digest.update(state)
    return "sha256:" + digest.hexdigest()


_LINK_START = b',"prev_digest":"sha256:'
_LINK_SIZE = len(_LINK_START) + 64 + 1  # the key, 64 hex digits, the closing quote
_TAIL = b',"class_version":'
_TAIL_SIZE = len(_TAIL)
_TAIL_ROOM = _TAIL_SIZE + 21  # the key, a 64-bit integer, the closing brace
_LINK_KEY = len(_LINK_START) - len("sha256:")  # where the digest's text begins
_QUOTE = ord('"')


def link_of(state: bytes | bytearray | memoryview) -> str | None:
    """The ``prev_digest`` the unit of work spliced into a stored event's state, or ``None``.

    Read where the splice puts it -- last of the top-level keys, before the codec's
    ``class_version`` -- so neither a nested ``prev_digest`` (in a payload or a definition)
    nor the cost of parsing the whole state comes into it: a rebuild reads it of every
    event."""
    if not isinstance(state, bytes):
        state = bytes(state)
    end = len(state) - 1  # the closing brace
    tail = state.rfind(_TAIL, end - _TAIL_ROOM)
    if tail != -1 and state[tail + _TAIL_SIZE : end].isdigit():
        end = tail
    start = end - _LINK_SIZE
    if start < 0 or state[end - 1] != _QUOTE or not state.startswith(_LINK_START, start):
        return None
    return state[start + _LINK_KEY : end - 1].decode("ascii", errors="replace")


def chain_fault(
    events: Sequence[tuple[Any, Any, Any, Any]],
    head: tuple[Any, Any] | None,
    since: int,
    *,
    whole: bool = True,
) -> str | None:
    """Why one process's stored events do not verify, or ``None`` when they do.

    ``events`` are ``(position, version, topic, state)`` in version order, to the end of the
    log; ``whole`` when they begin at its first event (otherwise the first one's own link is
    not checked: its predecessor was not read). ``head`` is the process's ``heads`` row
    ``(version, digest)``, or ``None``; ``since`` the log position at or before which events
    predate chains (docs/design.md §13.1). Each event after the first must hold the digest of
    the one before it, and the last must equal its head: an edited event breaks the link
    after it, or (the last) its head; a deleted one leaves a gap or a head past the log."""
    digest: str | None = None
    chained = False
    expected: Any = 1 if whole else None
    position: Any = None
    for position, version, topic, state in events:
        if (fault := _row_fault(version, state, expected)) is not None:
            return fault
        link = link_of(state)
        if (
            expected is not None
            and link != digest
            and (
                fault := _link_fault(version, position, link, digest, chained=chained, since=since)
            )
        ):
            return fault
        chained = chained or link is not None
        digest = event_digest(topic, version, state)
        expected = version + 1
    if digest is None:
        return None
    return _head_fault(head, expected - 1, digest, position, since)


def _row_fault(version: Any, state: Any, expected: Any) -> str | None:
    if not _is_int(version):
        return f"an event's version is damaged ({version!r})"
    if not isinstance(state, bytes | bytearray | memoryview):
        return f"event v{version}'s state is damaged (of type {type(state).__name__})"
    if expected is not None and version != expected:
        missing = f"v{expected}" + (f"..v{version - 1}" if version > expected + 1 else "")
        return f"event {missing} is missing"
    return None


def _link_fault(
    version: int, position: Any, link: str | None, before: str | None, *, chained: bool, since: int
) -> str | None:
    if version == 1:
        return None if link is None else "the first event carries a prev_digest"
    if link is None:
        if chained or not _is_int(position) or position > since:
            return f"event v{version} carries no digest"
        return None  # written before chains existed
    if link != before:
        return f"event v{version - 1} was changed (v{version} holds another digest)"
    return None


def _head_fault(
    head: tuple[Any, Any] | None, last: int, digest: str | None, position: Any, since: int
) -> str | None:
    if head is None:
        if _is_int(position) and position <= since:
            return None  # an unchained process has no head
        return "it has chained events but no head row"
    version, stored = head
    if not _is_int(version) or not isinstance(stored, str):
        return f"its head row is damaged (version {version!r})"
    if version > last:
        return f"event v{last + 1} (up to v{version}) is missing"
    if version < last:
        return f"its head is at v{version}, its log at v{last}"
    if stored != digest:
        return f"the last event v{last} was changed"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# -- the records row ---------------------------------------------------------------------------


def damage_marker(why: str) -> str:
    """What a damaged process's ``records`` row holds in its ``record`` column instead of the
    record: ``{"damaged": "<why>"}``."""
    return orjson.dumps({DAMAGED: why}).decode()


class RecordRow(NamedTuple):
    """A ``records`` row's ``record`` column as read: the record's JSON document, or why the
    row serves none (``damage``); exactly one of the two is set. ``marked``: the damage is
    the marker of a process whose log does not verify, not a row that cannot be decoded."""

    document: dict[str, Any] | None
    damage: str | None
    marked: bool = False


def read_record_row(process_id: str, record: str | bytes | memoryview | None) -> RecordRow:
    """The ``record`` column of process ``process_id``'s ``records`` row, read as the store
    reads it: a JSON object naming that process is its record; a damage marker (``{"damaged":
    ...}``), text that is not UTF-8 or not JSON, anything but an object, or an object naming
    another process is a damaged process -- listed among the damaged ids, never served.
    (The store also refuses a record whose fields its model rejects.)"""
    if record is None:
        return RecordRow(None, "it has no stored record")
    try:
        document = orjson.loads(bytes(record) if isinstance(record, memoryview) else record)
    except orjson.JSONDecodeError as error:
        return RecordRow(None, f"its stored record is not JSON text ({error})")
    if not isinstance(document, dict):
        return RecordRow(None, "its stored record is not a JSON object")
    if DAMAGED in document:
        return RecordRow(None, f"its log does not verify: {document[DAMAGED]}", marked=True)
    if document.get("id") != process_id:
        return RecordRow(None, f"its stored record names another process ({document.get('id')!r})")
    return RecordRow(document, None)


def damage_of(process_id: str, record: str | bytes | memoryview | None) -> str | None:
    """Why process ``process_id``'s ``records`` row is damaged, or ``None`` when it holds a
    record (``read_record_row``)."""
    return read_record_row(process_id, record).damage


def damaged_process(process_id: str, why: str) -> StoreCorrupt:
    """``StoreCorrupt`` for a process that is damaged (``why``: its log does not verify, or
    its row cannot be read): named, not served, and where to look next."""
    return StoreCorrupt(
        f"process {process_id!r} is damaged ({why}): it is not served; run procledger verify "
        "to see what does not hold",
        process_id=process_id,
    )
