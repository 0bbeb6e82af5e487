"""Verifying a ledger: is the log what procledger wrote, and do the read models follow from it?

``verify`` checks, in one transaction that writes nothing (docs/design.md §13.3):

- the database's own integrity check (SQLite ``PRAGMA integrity_check``; PostgreSQL has no cheap
  one without amcheck, so only the log's extent is read);
- every process's log: versions contiguous from its registration, every event decodable, every
  ``prev_digest`` equal to the digest of the event before it, and the last event equal to the
  ``heads`` row — an edited event breaks the link after it (or, for the last one, its head);
  a deleted one leaves a gap or a head beyond the log;
- every registration against its ``registration_hash``;
- that ``records`` and ``grants`` equal what a rebuild would write, computed in memory (a dry
  run: nothing is rebuilt);
- that every plain env row hashes to its env ref.

Events written before chains existed (at or before the ``chain`` tracking position) carry no
digest; their processes are reported ``unchained``, which is not a failure. A problem names
its process whenever one can be named, so one damaged process never hides the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import orjson

from procledger.adapters.codec import decode_event
from procledger.adapters.sql import event_rows, head_rows
from procledger.adapters.sql.damage import event_digest, read_record_row
from procledger.adapters.sql.record_rows import document_row
from procledger.adapters.sql.sqlite_files import leave_mark
from procledger.adapters.sql.store import Store, Tx, is_stored_int
from procledger.application import cipher
from procledger.domain.errors import StoreCorrupt
from procledger.domain.process import process_uuid
from procledger.domain.registration import env_ref_for, registration_hash_of
from procledger.domain.rendering import record_document, render_record
from procledger.domain.vocabulary import MAX_LEDGER_INT
from procledger.projections.records import decode_record

_PROCESS_PREFIX = "procledger:Process."
_SQLITE_LINES = 10
"""How many of SQLite's own lines about a damaged file a report keeps."""
_SESSION_PREFIX = "procledger:Session."


@dataclass(frozen=True)
class VerifyProblem:
    """One thing that does not hold: ``check`` is ``database``, ``log``, ``chain``, ``head``,
    ``registration``, ``decode``, ``read_model``, ``grants`` or ``env``; ``process_id`` names
    the process concerned when there is one."""

    check: str
    detail: str
    process_id: str | None = None

    def describe(self) -> str:
        where = f"process {self.process_id!r}" if self.process_id is not None else "ledger"
        return f"{where}: {self.check}: {self.detail}"


@dataclass(frozen=True)
class VerifyReport:
    """What ``ProcessRegistry.verify`` found. ``ok`` only when every check holds."""

    database: str
    """``ok``, ``not checked`` (PostgreSQL) or ``damaged``."""
    processes: int = 0
    events: int = 0
    unchained: list[str] = field(default_factory=list)
    """Processes with events written before hash chains existed (not a failure)."""
    problems: list[VerifyProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def failed(self) -> list[str]:
        """The ids of the processes with at least one problem, sorted."""
        return sorted({p.process_id for p in self.problems if p.process_id is not None})

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "database": self.database,
            "processes": self.processes,
            "events": self.events,
            "unchained": self.unchained,
            "failed": self.failed,
            "problems": [
                {"process_id": p.process_id, "check": p.check, "detail": p.detail}
                for p in self.problems
            ],
        }


def verify_ledger(store: Store) -> VerifyReport:
    """Check the whole ledger (see the module docstring); writes nothing.

    One read transaction compares the log, heads and read models at one moment: on SQLite a
    read transaction is a snapshot, so writers go on meanwhile; PostgreSQL's statements would
    each see their own moment, so there it holds the events table's lock and writers wait. It
    never needs a write, so it works on a ledger opened read-only (an archived one, §7.3).
    """
    with store.read() as tx:
        store.lock_log(tx)
        found = head_rows.integrity_problems(tx)
        checker = _Checker(tx, salvaging=bool(found))
        database = checker.check_database(found)
        checker.read_log()
        checker.finish_stream()
        checker.check_leftovers()
        checker.check_envs(head_rows.env_rows(tx, checker.unreadable))
        checker.report_unreadable()
    if found and store.location.sqlite_path:
        leave_mark(store.location.sqlite_path, f"SQLite's integrity check: {found[0]}")
    return VerifyReport(
        database=database,
        processes=checker.process_count,
        events=checker.event_count,
        unchained=sorted(checker.unchained),
        problems=checker.problems,
    )


def _is_bytes(state: Any) -> bool:
    """Whether an event's state column holds bytes, as procledger writes it (a damaged SQLite
    file may hold text, a number or NULL there)."""
    return isinstance(state, bytes | bytearray | memoryview)


class _Stream:
    """The events of one stream seen so far."""

    def __init__(self, key: UUID, topic: str, process_id: str | None) -> None:
        self.key = key
        self.process_id = process_id
        self.kind = (
            "process"
            if topic.startswith(_PROCESS_PREFIX)
            else "session"
            if topic.startswith(_SESSION_PREFIX)
            else None
        )
        self.aggregate: Any = None
        self.version = 0
        self.digest: str | None = None
        self.chained = False
        self.last_position = 0
        self.broken = False


class _Checker:
    """Folds the log one stream at a time and collects what does not hold."""

    def __init__(self, tx: Tx, *, salvaging: bool = False) -> None:
        self.tx = tx
        self.unreadable: list[str] | None = [] if salvaging else None
        """In a damaged file: what could not be read (salvage mode, every table read around
        the pages SQLite cannot read); ``None`` otherwise."""
        self.gone = "missing or unreadable (the file is damaged)" if salvaging else "missing"
        self.since = head_rows.chain_since(tx)
        self.problems: list[VerifyProblem] = []
        chained = self.since is not None  # a 0.1.0 ledger opened read-only has no heads
        if not chained:
            self.since = MAX_LEDGER_INT  # then no event is chained
        heads = head_rows.all_heads(tx, self.unreadable) if chained else {}
        self.heads_read = heads is not None
        self.heads = self.by_id("heads", heads or {})
        self.records = self.by_id("records", head_rows.record_rows(tx, self.unreadable))
        self.grants = head_rows.grant_rows(tx, self.unreadable)
        self.expected_grants: set[tuple[str, str, str | None]] = set()
        self.names = {process_uuid(pid): pid for pid in (*self.heads, *self.records)}
        self.seen: set[str] = set()
        self.bad_keys: set[Any] = set()
        self.unchained: set[str] = set()
        if not is_stored_int(self.since):
            self.problem("chain", f"the chain tracking row is damaged ({self.since!r})")
            self.since = 0  # then every event must be chained: the strictest reading
        self.stream: _Stream | None = None
        self.process_count = 0
        self.event_count = 0

    def problem(self, check: str, detail: str, process_id: str | None = None) -> None:
        self.problems.append(VerifyProblem(check, detail, process_id))

    def by_id(self, table: str, rows: dict[Any, Any]) -> dict[str, Any]:
        """``rows`` whose process id is text; a row whose id is not (undecodable bytes, a
        number) names no process: it is a problem of the ledger's."""
        named = {key: value for key, value in rows.items() if isinstance(key, str)}
        check = "head" if table == "heads" else "read_model"
        for key in rows.keys() - named.keys():
            self.problem(check, f"a {table} row's process id is damaged ({key})")
        return named

    def check_database(self, found: list[str] | None) -> str:
        """SQLite's integrity check: which tables' pages it found damaged, and its first
        lines (``None``: no such check, PostgreSQL)."""
        if found is None:
            return "not checked"
        for tree, pages in head_rows.damaged_trees(self.tx, found).items():
            listed = ", ".join(str(page) for page in pages)
            self.problem("database", f"{tree}: damaged page(s) {listed}")
        for line in found[:_SQLITE_LINES]:
            self.problem("database", line)
        if len(found) > _SQLITE_LINES:
            self.problem("database", f"and {len(found) - _SQLITE_LINES} more such lines")
        return "damaged" if found else "ok"

    def read_log(self) -> None:
        """Fold the log: streamed, or in a damaged file what can be read of it."""
        if self.unreadable is not None:
            for row in event_rows.readable_log(self.tx, self.unreadable):
                self.add(row)
            return
        with event_rows.stream_log(self.tx) as rows:
            for row in rows:
                self.add(row)

    def report_unreadable(self) -> None:
        for line in self.unreadable or ():
            self.problem("database", line)

    # -- the log ----------------------------------------------------------------------------

    def add(self, row: tuple[Any, ...]) -> None:
        position, originator_id, version, raw_topic, state = row
        self.event_count += 1
        stored_key = head_rows.text_of(originator_id)
        try:
            key = UUID(stored_key) if isinstance(stored_key, str) else UUID(str(stored_key))
        except ValueError:  # a damaged SQLite file: the stream it left has a gap, reported
            if stored_key not in self.bad_keys:
                self.bad_keys.add(stored_key)
                self.problem("log", f"an event's stream id is damaged ({stored_key!r})")
            return
        topic = head_rows.text_of(raw_topic)
        if self.stream is None or self.stream.key != key:
            self.finish_stream()
            self.stream = self.start_stream(key, topic)
        stream = self.stream
        if stream.kind is None or stream.broken:
            return
        if not isinstance(topic, str):
            self.problem("log", f"event v{version}'s topic is damaged ({topic})", stream.process_id)
            stream.broken = True
            return
        if not is_stored_int(version) or not _is_bytes(state):
            detail = f"version {version!r}, state of type {type(state).__name__}"
            self.problem("log", f"event row {position} is damaged ({detail})", stream.process_id)
            stream.broken = True
            return
        stream.last_position = max(stream.last_position, int(position))
        if not self.follows(stream, int(version), int(position), topic, bytes(state)):
            stream.broken = True
            return
        stream.version = int(version)
        stream.digest = event_digest(topic, int(version), bytes(state))

    def start_stream(self, key: UUID, topic: Any) -> _Stream:
        """A stream, of a process when its first topic says so -- or, when that topic is not
        text, when a head or record names it (its damage is then that process's)."""
        name = self.names.get(key)
        if not isinstance(topic, str):
            topic = _PROCESS_PREFIX if name is not None else ""
        stream = _Stream(key, topic, name)
        if stream.kind == "process":
            self.process_count += 1
            if stream.process_id is not None:
                self.seen.add(stream.process_id)
        return stream

    def follows(self, s: _Stream, version: int, position: int, topic: str, state: bytes) -> bool:
        """Check one event against its predecessor, then fold it; False once the stream can
        no longer be followed (the problem is recorded)."""
        if version != s.version + 1:
            missing = f"v{s.version + 1}" + (f"..v{version - 1}" if version > s.version + 2 else "")
            self.problem("log", f"event {missing} is {self.gone}", s.process_id)
            return False
        try:
            fields = orjson.loads(state)
            link = fields.get("prev_digest") if isinstance(fields, dict) else None
        except orjson.JSONDecodeError:
            link = None
        if s.kind == "process" and not self.link_holds(s, version, position, link):
            return False  # sessions are not chained: their grants are checked as read models
        return self.fold(s, version, topic, state)

    def link_holds(self, s: _Stream, version: int, position: int, link: Any) -> bool:
        if position <= self.since and s.process_id is not None and s.kind == "process":
            self.unchained.add(s.process_id)
        if version == 1:
            if link is not None:
                self.problem("chain", "the first event carries a prev_digest", s.process_id)
                return False
            return True
        if link is None:
            if s.chained or position > self.since:
                self.problem("chain", f"event v{version} carries no digest", s.process_id)
                return False
            return True
        s.chained = True
        if link != s.digest:
            self.problem(
                "chain",
                f"event v{version - 1} was changed (v{version} holds another digest)",
                s.process_id,
            )
            return False
        return True

    def fold(self, s: _Stream, version: int, topic: str, state: bytes) -> bool:
        try:
            event = decode_event(s.key, version, topic, state)
            event.__dict__.pop("prev_digest", None)
            if version == 1 and s.kind == "process" and not self.registration_holds(s, event):
                return False
            s.aggregate = event.mutate(s.aggregate)
        except Exception as error:  # any failure to decode or apply is this stream's damage
            self.problem("decode", f"event v{version} ({topic}): {error}", s.process_id)
            return False
        return True

    def registration_holds(self, s: _Stream, event: Any) -> bool:
        registration = getattr(event, "registration", None)
        process_id = registration.get("id") if isinstance(registration, dict) else None
        if s.process_id is None and isinstance(process_id, str):
            s.process_id = process_id
            self.seen.add(process_id)
        if (
            not isinstance(registration, dict)
            or process_id is None
            or process_uuid(process_id) != s.key
        ):
            self.problem("registration", "the registration names another process", s.process_id)
            return False
        if registration_hash_of(registration) != event.registration_hash:
            self.problem(
                "registration",
                f"the registration does not match its hash {event.registration_hash}",
                s.process_id,
            )
            return False
        return True

    def finish_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is None or stream.kind is None:
            return
        if stream.kind == "session":
            self.fold_grants(stream.aggregate)
            return
        if stream.process_id is None:
            self.problem("log", f"stream {stream.key} has no registration and no record")
            return
        found = len(self.problems)
        self.check_head(stream)
        if not stream.broken and len(self.problems) == found:
            # A log that does not verify has no rebuild to compare with: its row is the one
            # written before the damage, or marked damaged by a rebuild (§13.5); either holds.
            self.check_record(stream)

    def check_head(self, s: _Stream) -> None:
        if not self.heads_read:
            return  # said once, as a problem of the database
        head = self.heads.get(s.process_id or "")
        if head is None:
            if s.last_position > self.since:
                self.problem("head", "no head row, although it has chained events", s.process_id)
            return
        version, digest = head
        if not is_stored_int(version) or not isinstance(digest, str):
            damaged = f"version {version!r}" if not is_stored_int(version) else f"digest {digest}"
            self.problem("head", f"its head row is damaged ({damaged})", s.process_id)
            return
        if s.broken:
            return
        if version > s.version:
            self.problem(
                "log", f"event v{s.version + 1} (up to v{version}) is {self.gone}", s.process_id
            )
        elif version < s.version:
            self.problem(
                "head", f"the head is at v{version}, the log at v{s.version}", s.process_id
            )
        elif digest != s.digest:
            self.problem("chain", f"the last event v{version} was changed", s.process_id)

    def check_record(self, s: _Stream) -> None:
        """The stored row against the one a rebuild would write: the columns lists and the
        feed query exactly, the record by what it reads as (a row written by an older
        procledger lacks fields that read back as their defaults)."""
        if s.aggregate is None or s.process_id is None:
            return
        stored = self.records.get(s.process_id)
        if stored is None:
            self.problem("read_model", f"its record row is {self.gone}", s.process_id)
            return
        marked = read_record_row(s.process_id, stored[-1])
        if marked.marked:
            self.problem(
                "read_model",
                f"its record row is marked damaged ({marked.damage}), but its log verifies: "
                "procledger rebuild restores it",
                s.process_id,
            )
            return
        expected = document_row(record_document(s.aggregate, s.last_position))
        names = head_rows.RECORD_NAMES
        differing = [
            name
            for name, want, have in zip(names, expected, stored, strict=True)
            if name != "record" and want != have
        ]
        try:
            readable = decode_record(s.process_id, stored[-1])
        except StoreCorrupt:
            differing.append("record (undecodable)")
        else:
            if readable != render_record(s.aggregate, s.last_position):
                differing.append("record")
        if differing:
            self.problem(
                "read_model",
                f"its record row differs from a rebuild in {', '.join(differing)}",
                s.process_id,
            )

    def fold_grants(self, session: Any) -> None:
        if session is None:
            return
        for process_id, descriptor in session.grants.items():
            encoded = None if descriptor is None else orjson.dumps(descriptor).decode()
            self.expected_grants.add((session.session_id, process_id, encoded))

    # -- what the log does not explain ------------------------------------------------------

    def check_leftovers(self) -> None:
        for process_id in sorted(set(self.heads) - self.seen):
            version = self.heads[process_id][0]
            self.problem("log", f"its events are {self.gone} (head at v{version})", process_id)
        for process_id in sorted(set(self.records) - self.seen - set(self.heads)):
            self.problem("read_model", "a record row without events", process_id)
        for session_id, process_id, _ in sorted(self.grants ^ self.expected_grants, key=str):
            self.problem(
                "grants",
                f"the grant to session {session_id!r} differs from a rebuild",
                process_id if isinstance(process_id, str) else None,
            )

    def check_envs(self, rows: Iterable[tuple[Any, Any]]) -> None:
        for env_ref, text in rows:
            if isinstance(text, str) and cipher.is_encrypted(text):
                continue  # authenticated by AES-GCM when it is read
            try:
                values = orjson.loads(text) if isinstance(text, str) else None
                holds = isinstance(values, dict) and env_ref_for(values) == env_ref
            except orjson.JSONDecodeError:
                holds = False
            if not holds:
                self.problem("env", f"environment {env_ref!r} does not match its reference")
