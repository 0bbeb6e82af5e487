"""What the CLI's hot commands read, as the ledger stores it: records as their JSON documents,
events as the registry's ``ProcessEvent`` JSON, lease holders as their owner documents
(docs/design.md §8.1).

Every read is a function of a transaction (``Tx``) over the same SQL the registry uses
(``record_rows``, ``event_rows``, ``lease_rows``); where the transaction comes from is the only
difference between the paths: a plain read-only ``sqlite3`` connection on the fast path, the
registry's store (any backend, riding through outages) on the full path, the agent's store when
it answers for a PostgreSQL ledger. So both print the same bytes, and nothing here builds a
model: a stored record is printed as it is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson

from procledger.adapters.sql import event_rows, head_rows, lease_rows, record_rows, service_rows
from procledger.adapters.sql.damage import damaged_process, read_record_row
from procledger.adapters.sql.head_rows import text_of
from procledger.adapters.sql.location import locate, store_key
from procledger.adapters.sql.plain_sqlite import NeedsFullPath, Runner, is_shared, plain_reads
from procledger.adapters.sql.record_rows import Condition
from procledger.adapters.sql.store import Tx, is_stored_int
from procledger.domain import id_prefix
from procledger.domain.errors import AmbiguousProcessId, NotFound, StoreCorrupt
from procledger.domain.event_kinds import EVENT_CLASSES, PRODUCER_EVENT, TOPIC_PREFIX
from procledger.domain.process_keys import process_uuid

__all__ = ["Condition", "Document", "LedgerReads", "NeedsFullPath", "open_reads"]

T = TypeVar("T")
Document = dict[str, Any]

_DROPPED = frozenset({"timestamp", "originator_topic", "class_version", "prev_digest"})
"""An event's stored bookkeeping, which the registry's ``ProcessEvent`` leaves out."""


class LedgerReads:
    """The hot commands' reads over one ledger."""

    def __init__(
        self,
        run: Runner,
        *,
        store_key: str,
        close: Callable[[], None],
        registry: Any = None,
    ) -> None:
        self._run = run
        self.store_key = store_key
        """The ledger's key (``application.outbox.store_key``): which agent serves it."""
        self.close = close
        self.registry = registry
        """On the full path, the registry: what a plain read cannot decode, it can (an older
        event shape), or it names what is wrong (a damaged row) as every full read does; and a
        command that must wait waits on it."""

    def _full(self, read: Callable[[Any], T]) -> T:
        if self.registry is None:
            raise NeedsFullPath
        return read(self.registry)

    def record(self, process_id: str) -> Document:
        """The stored record. Raises ``NotFound``."""
        payload = self._run(lambda tx: record_rows.record_payload(tx, process_id))
        if payload is None:
            raise NotFound(f"process {process_id!r} not found")
        document = decode_record(process_id, payload)
        if document is None:  # the registry says what is wrong with it
            return self._full(lambda registry: _dump(registry.get(process_id)))
        return document

    def resolve(self, text: str) -> str:
        """The process id ``text`` names (``id_prefix.resolve``)."""
        return id_prefix.resolve(text, self._matching, self._is_first_attempt, self._named)

    def _matching(self, prefix: str, limit: int) -> list[str]:
        return list(self._run(lambda tx: record_rows.matching_ids(tx, prefix, limit)))

    def wanted_up(self, name: str) -> bool:
        """Whether ``up`` left the service ``name`` desired: the next agent of its host brings
        it back, so a dead supervisor is not the end of it (docs/design.md §19.4)."""
        return bool(self._run(lambda tx: service_rows.wanted_up(tx, name)))

    def _named(self, name: str) -> str | None:
        holder: str | None = self._run(lambda tx: service_rows.held_name(tx, name))
        return holder

    def _is_first_attempt(self, process_id: str) -> bool:
        try:
            return self.record(process_id).get("attempt") == 1
        except NotFound:
            return False

    def scoped(self, text: str) -> tuple[Document, bool]:
        """The record ``text`` names for ``show``, ``logs`` and the web view, and whether it
        stands for its whole service (docs/design.md §15.4): a service is known by its name and
        by its first attempt's id (what ``run --background`` printed), so those -- and a
        prefix naming the service -- mean every attempt; an attempt's own id means that attempt
        alone. ``NAME.N`` (or a prefix naming the service, then ``.N``) is attempt N of that
        service -- ``ID.1`` too, the first attempt alone, which no stored id names. Composed of
        ``record`` and ``resolve``, so it reads alike on every path (the agent's too).

        Raises:
            NotFound, AmbiguousProcessId: as ``resolve``.
        """
        base, dot, number = text.rpartition(".")
        if dot and base and number.isdigit() and not self._stored(text):
            attempt = self._attempt_named(base, int(number))
            if attempt is not None:
                return attempt, False
        record = self.record(self.resolve(text))
        return record, record.get("attempt") == 1

    def _stored(self, process_id: str) -> bool:
        try:
            self.record(process_id)
        except NotFound:
            return False
        return True

    def _attempt_named(self, text: str, number: int) -> Document | None:
        """Attempt ``number`` of the service ``text`` names, if it names one that has it."""
        try:
            first = self.record(self.resolve(text))
            if first.get("attempt") != 1:
                return None
            later = first if number == 1 else self.record(f"{first['id']}.{number}")
        except (NotFound, AmbiguousProcessId):
            return None
        return later if later is first or later.get("attempt_of") == first["id"] else None

    def newest_first(
        self, conditions: list[Condition], limit: int | None, before: tuple[int, str] | None
    ) -> tuple[list[Document], list[str], tuple[int, str] | None]:
        """A page of records by creation, newest first: the records, the ids of the damaged
        rows, and where the next page begins (``None`` after the last)."""
        try:
            rows = self._run(
                lambda tx: record_rows.select_by_creation(tx, conditions, limit, before=before)
            )
        except StoreCorrupt as error:
            if error.file is None or self.registry is None:
                raise
            rows = self._salvaged(error.file, conditions, limit, before)
        records: list[Document] = []
        damaged: list[str] = []
        for row in rows:
            document = decode_record(str(row["process_id"]), row["record"])
            if document is None:
                damaged.append(str(row["process_id"]))
            else:
                records.append(document)
        last = (int(rows[-1]["created_at_ms"]), str(rows[-1]["process_id"])) if rows else None
        return records, damaged, last if limit is not None and len(rows) == limit else None

    def _salvaged(
        self,
        file: str,
        conditions: list[Condition],
        limit: int | None,
        before: tuple[int, str] | None,
    ) -> list[dict[str, Any]]:
        """The page ``newest_first`` reads, from a damaged SQLite file: every matching row
        that can still be read (the registry's lists do the same, docs/design.md §7.3), with
        a warning saying what could not be."""
        from procledger.projections.records import report_unreadable  # noqa: PLC0415 -- rare

        found, unreadable = self._run(lambda tx: record_rows.readable_records(tx, conditions))
        report_unreadable(file, unreadable)
        rows = []
        for raw_id, record in found:
            process_id = text_of(raw_id)
            if not isinstance(process_id, str):
                continue
            document = decode_record(process_id, record)
            created = document["created_at_ms"] if document is not None else 0
            if before is None or (created, process_id) < before:
                rows.append({"process_id": process_id, "created_at_ms": created, "record": record})
        rows.sort(key=lambda row: (row["created_at_ms"], row["process_id"]), reverse=True)
        return rows if limit is None else rows[:limit]

    def changes_since(self, cursor: int, limit: int) -> tuple[list[Document], int]:
        """Records changed after ``cursor``, in feed order, and the cursor of the last one."""
        rows = self._run(lambda tx: record_rows.select_changed(tx, cursor, limit))
        records = [decode_record(str(row["process_id"]), row["record"]) for row in rows]
        if any(record is None for record in records):  # the registry's feed names the damage
            found, after = self._full(lambda registry: registry.changes_since(cursor, limit))
            return [_dump(record) for record in found], int(after)
        return records, (int(rows[-1]["change_seq"]) if rows else cursor)  # type: ignore[return-value]

    def events(self, process_id: str) -> list[Document]:
        """The process's events as the registry's ``ProcessEvent`` JSON, in order."""
        rows, fault = self._run(lambda tx: _verified_log(tx, process_id))
        if not rows:
            raise NotFound(f"process {process_id!r} not found")
        if fault is not None:
            raise damaged_process(process_id, f"its log does not verify: {fault}")
        try:
            return [
                event_document(process_id, row["originator_version"], row["topic"], row["state"])
                for row in rows
            ]
        except NeedsFullPath:
            return self._full(lambda registry: [_dump(e) for e in registry.events(process_id)])

    def attempts(self, process_id: str) -> list[Document]:
        """Every attempt of the service ``process_id`` belongs to, first to newest."""
        record = self.record(process_id)
        if record.get("attempt") is None:
            return [record]
        first = record.get("attempt_of") or record["id"]
        found = [record if record["id"] == first else self.record(first)]
        while (later := self._attempt(first, len(found) + 1)) is not None:
            found.append(later)
        return found

    def newest_attempt(self, process_id: str) -> Document:
        """The newest attempt of the service ``process_id`` belongs to (itself otherwise)."""
        record = self.record(process_id)
        if record.get("attempt") is None:
            return record
        first, number = record.get("attempt_of") or record["id"], record["attempt"]
        while (later := self._attempt(first, number + 1)) is not None:
            record, number = later, number + 1
        return record

    def _attempt(self, first: str, number: int) -> Document | None:
        try:
            later = self.record(f"{first}.{number}")
        except NotFound:
            return None
        return later if later.get("attempt_of") == first else None

    def holders(self, process_ids: Iterable[str]) -> dict[str, Document]:
        """The unreleased leases (live or expired) of these going processes, as ``{"owner":
        <owner document>, "expires_at_ms": ...}``: whom ``ps`` and ``show`` judge gone or
        alive."""
        wanted = set(process_ids)
        if not wanted:
            return {}
        rows = self._run(lambda tx: lease_rows.held(tx, -1))  # expiring after -1: every one
        return {
            str(row["process_id"]): {
                "owner": orjson.loads(row["owner"]),
                "expires_at_ms": int(row["expires_at_ms"]),
            }
            for row in rows
            if str(row["process_id"]) in wanted
        }


def _dump(model: Any) -> Document:
    return model.model_dump(mode="json")  # type: ignore[no-any-return]


def decode_record(process_id: str, payload: str | bytes | None) -> Document | None:
    """A stored record's document, or ``None`` when the row is damaged (not JSON, not a record,
    the marker of a log that does not verify: ``damage.read_record_row``): the list names it
    rather than failing, and a single read goes to the registry, which says what is wrong."""
    document = read_record_row(process_id, payload).document
    if document is None or not isinstance(document.get("state"), str):
        return None
    return document


def _verified_log(tx: Tx, process_id: str) -> tuple[list[Any], str | None]:
    """The process's stored events, and why its log does not verify (``None`` when it does),
    as the registry's ``events`` checks it (``head_rows.log_fault``)."""
    rows = event_rows.aggregate_rows(tx, process_uuid(process_id))
    if not rows:
        return rows, None
    since = head_rows.chain_since(tx)
    since = since if since is None or is_stored_int(since) else 0
    return rows, head_rows.log_fault(tx, process_id, rows, since, whole=True)


def event_document(process_id: str, version: Any, topic: Any, state: Any) -> Document:
    """One stored event as the registry's ``ProcessEvent`` JSON: its kind, its payload (the
    stored state without bookkeeping), its event id and time -- for an event of the shape this
    code writes; any other needs the full path's upcasting."""
    name = topic[len(TOPIC_PREFIX) :] if isinstance(topic, str) else ""
    try:
        fields = orjson.loads(bytes(state))
    except (orjson.JSONDecodeError, TypeError):
        raise NeedsFullPath from None
    if not (isinstance(fields, dict) and isinstance(version, int) and name):
        raise NeedsFullPath
    if name == PRODUCER_EVENT:
        head = {"process_id": process_id, "sequence": version, "kind": fields["event_type"]}
        return head | {
            "payload": fields["payload"],
            "event_id": None,
            "occurred_at_ms": fields["at_ms"],
            "replay_key": fields["replay_key"],
        }
    if name not in EVENT_CLASSES or fields.get("class_version", 1) != EVENT_CLASSES[name][1]:
        raise NeedsFullPath
    payload = {key: value for key, value in fields.items() if key not in _DROPPED}
    head = {"process_id": process_id, "sequence": version, "kind": EVENT_CLASSES[name][0]}
    return head | {
        "payload": payload,
        "event_id": payload.pop("event_id", None),
        "occurred_at_ms": payload.pop("at_ms"),
        "replay_key": None,
    }


def open_reads(
    url: str | None, *, fast: bool, agent: Callable[[str], LedgerReads] | None = None
) -> LedgerReads:
    """The ledger ``url`` names (``$PROCLEDGER_URL``, else the default), opened to read: on
    the fast path a SQLite file with the standard library, a server's ledger through ``agent``
    (this host's agent for it); else -- and whenever the fast path declines
    (``NeedsFullPath``) -- through the registry, read-only. Raises what opening the registry
    raises (a missing ledger is a ``StoreURLError``)."""
    location = locate(url)
    key = store_key(location) or ""
    if fast and agent is not None and is_shared(location):
        return agent(key)
    if fast:
        run, close = plain_reads(location)
        return LedgerReads(run, store_key=key, close=close)
    from procledger.application.bootstrap import open_registry  # noqa: PLC0415 -- the full stack

    registry = open_registry(url, create=False, read_only=True)
    return LedgerReads(registry.run_read, store_key=key, close=registry.close, registry=registry)
