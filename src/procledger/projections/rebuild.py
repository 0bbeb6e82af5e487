"""Rebuild every read model from the event log, one batch of streams per write transaction.

The log is read in ``(originator_id, originator_version)`` order, a batch of about ``BATCH``
events at a time, always ending on a whole stream, so memory holds one batch however long the
log. A Process becomes its ``records`` row (``change_seq`` = the highest notification id among
its events, exactly what the live projection wrote); a Session becomes its ``grants`` rows.
Other streams (the retention log, or a stream that does not begin with a creation event) are
counted and skipped.

What readers see (docs/design.md §5.6): each batch replaces the rows of its streams in one
transaction, under the writers' lock, from the log as it stands at that moment; so every
process's record, and every session's grants, is at any time either the one before the
rebuild or the rebuilt one — never a half-built one — and both equal the fold of a committed
log. Writers are held only for one batch at a time and keep the rows they write current.

Damage stays local: a process whose hash chain does not verify (an edited or deleted event,
docs/design.md §13.1) is not rebuilt as if healthy -- its ``records`` row is marked damaged
instead (§13.5) -- and a stream whose events cannot be decoded or applied (or whose id is not a
UUID) keeps its rows as they were; both are reported in ``RebuildReport.damaged``, and every
other stream is rebuilt. A last transaction deletes rows the log no longer backs and sets
tracking.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from uuid import UUID

import orjson

from procledger.adapters.codec import decode_event
from procledger.adapters.sql import event_rows, grant_rows, head_rows, record_rows
from procledger.adapters.sql.damage import chain_fault
from procledger.adapters.sql.store import Store, Tx, is_stored_int
from procledger.domain.errors import StoreCorrupt
from procledger.domain.process import Process, process_key_hex
from procledger.domain.rendering import record_document
from procledger.domain.session import Session, session_uuid
from procledger.projections.reports import RebuildReport

Progress = Callable[[int, int], None]
Row = tuple[Any, ...]

BATCH = 2_000
SWEEP = 2_000
"""Record ids per page of the last transaction's sweep for rows the log no longer backs."""
_STREAM_KEY = operator.itemgetter(1)
_POSITION = operator.itemgetter(0)
_PROCESS_TOPIC = Process.Registered.TOPIC
_SESSION_TOPIC = Session.Opened.TOPIC


@dataclass
class _Batch:
    """What one batch transaction rebuilt (merged into the totals only once it commits)."""

    last_stream: Any = None
    applied: int = 0
    sessions: set[str] = field(default_factory=set)
    damaged: dict[str, str] = field(default_factory=dict)
    """stream id → the process or session id when known, else ``""``."""
    marked: set[str] = field(default_factory=set)
    """The processes whose log does not verify, marked damaged in ``records``."""


class _Folded(NamedTuple):
    """A process stream as read and folded: its rows (whose chain is still to be checked)
    and the ``records`` row its fold gives, ``None`` when the fold failed."""

    key: str
    process_id: str
    rows: list[Row]
    row: Row | None


@dataclass
class _Totals:
    since: Any = None
    """The chain position (``head_rows.chain_since``), read by the first batch."""
    applied: int = 0
    sessions: set[str] = field(default_factory=set)
    damaged: dict[str, str] = field(default_factory=dict)
    marked: set[str] = field(default_factory=set)

    def merge(self, batch: _Batch) -> None:
        self.applied += batch.applied
        self.sessions |= batch.sessions
        self.damaged.update(batch.damaged)
        self.marked |= batch.marked


def rebuild_read_models(store: Store, progress: Progress | None = None) -> RebuildReport:
    """Rebuild ``records`` and ``grants`` from the log and reset tracking; see the module."""
    total = store.attempt(event_rows.count_events)
    totals = _Totals(since=store.attempt(head_rows.chain_since))
    after: Any = None
    while True:
        rebuild = functools.partial(_rebuild_batch, store, after, totals.since)
        batch = _stopping_at_damage(store, rebuild, totals)
        if batch.last_stream is None or batch.last_stream == after:
            # The end -- or no step past it: in a damaged SQLite file a key may be a BLOB,
            # which sorts after every text, so ``key > after`` finds it again for ever (the
            # batch that met it first has folded it or named it damaged).
            break
        totals.merge(batch)
        after = batch.last_stream
        if progress is not None:
            progress(totals.applied, max(total, totals.applied))
    damaged = store.attempt(lambda tx: _finish(store, tx, totals), write=True)
    if progress is not None:
        progress(totals.applied, max(total, totals.applied))
    return RebuildReport(applied=totals.applied, damaged=damaged, marked=sorted(totals.marked))


def _stopping_at_damage(store: Store, rebuild: Callable[[Tx], _Batch], totals: _Totals) -> _Batch:
    """One batch; a page of the file that cannot be read stops the rebuild, saying how far it
    got: every batch before was committed whole, nothing after it was rebuilt."""
    try:
        return store.attempt(rebuild, write=True)
    except StoreCorrupt as error:
        if error.file is None:
            raise
        raise StoreCorrupt(
            f"{error} -- the rebuild stopped there, after {totals.applied} events: the read "
            "models of the streams before them were rebuilt, those after were not",
            file=error.file,
        ) from error


def _rebuild_batch(store: Store, after: Any, since: Any, tx: Tx) -> _Batch:
    """Fold the next batch of whole streams and replace their rows (one transaction)."""
    store.lock_log(tx)
    batch = _Batch()
    rows = event_rows.log_batch(tx, after, BATCH)
    if not rows:
        return batch
    last = rows[-1]
    rows.extend(event_rows.stream_rest(tx, last[1], last[2]))
    processes: list[_Folded] = []
    grants: list[Row] = []
    for _, stream in itertools.groupby(rows, _STREAM_KEY):
        _fold_stream(list(stream), batch, processes, grants)
    records, marks = _checked(tx, processes, since, batch)
    record_rows.write_rebuilt(tx, records)
    record_rows.mark_damaged(tx, marks)
    _replace_changed_grants(tx, sorted(batch.sessions), grants)
    batch.last_stream = last[1]
    batch.applied = len(rows)
    return batch


def _checked(
    tx: Tx, processes: list[_Folded], since: Any, batch: _Batch
) -> tuple[list[Row], list[tuple[str, str, Row | None]]]:
    """The rebuilt ``records`` rows of the processes whose hash chain verifies against its
    head (one read of the batch's heads), and the marks of those whose chain does not
    (docs/design.md §13.5): ``(process_id, why, the row the fold gave or None)``. A fold that
    failed on a chain that verifies (an event of a newer procledger, say) keeps its row."""
    heads = head_rows.heads_of(tx, [folded.process_id for folded in processes])
    records: list[Row] = []
    marks: list[tuple[str, str, Row | None]] = []
    for folded in processes:
        fault = _chain_fault(folded.rows, heads.get(folded.process_id), since)
        if fault is None:
            if folded.row is not None:
                records.append(folded.row)
            continue
        batch.damaged[folded.key] = folded.process_id
        batch.marked.add(folded.process_id)
        marks.append((folded.process_id, f"its log does not verify: {fault}", folded.row))
    return records, marks


def _chain_fault(rows: list[Row], head: Any, since: Any) -> str | None:
    """``damage.chain_fault`` of one stream's rebuild rows (none where nothing is chained)."""
    if since is None:
        return None
    events = [(row[0], row[2], row[3], row[4]) for row in rows]
    return chain_fault(events, head, since if is_stored_int(since) else 0)


def _replace_changed_grants(tx: Tx, sessions: list[str], grants: list[Row]) -> None:
    """Replace the grants of the sessions whose rebuilt grants differ from the stored ones."""
    rebuilt: dict[str, set[Row]] = {session_id: set() for session_id in sessions}
    for row in grants:
        rebuilt[str(row[0])].add(tuple(row))
    stored: dict[str, set[Row]] = {session_id: set() for session_id in sessions}
    for row in grant_rows.rows_of_sessions(tx, sessions):
        stored[str(row[0])].add(row)
    changed = [session_id for session_id in sessions if stored[session_id] != rebuilt[session_id]]
    if changed:
        kept = set(changed)
        grant_rows.replace_sessions(tx, changed, [row for row in grants if row[0] in kept])


def _text(value: Any) -> str:
    """A column read raw (bytes on SQLite): text, or ``ValueError`` if it is not UTF-8."""
    if isinstance(value, bytes | memoryview):
        return bytes(value).decode()
    return str(value)


_TOPICS: dict[Any, str] = {}
"""Raw topic column values already decoded: a log holds a few dozen topics, each read once per
event (decoding each costs a rebuild of many events a few per cent)."""


def _topic(value: Any) -> str:
    """``_text`` of a topic column, remembered for the hashable raw values (bytes, text)."""
    if isinstance(value, memoryview):
        return _text(value)
    text = _TOPICS.get(value)
    if text is None:
        text = _text(value)
        if len(_TOPICS) < 1_000:
            _TOPICS[value] = text
    return text


def _fold_stream(
    rows: list[Row], batch: _Batch, processes: list[_Folded], grants: list[Row]
) -> None:
    """One stream's rows into a process's ``_Folded`` (its chain checked by the caller) or
    grant rows; a stream that cannot be folded is noted damaged instead (and, when its
    process is known, handed on too: its chain decides whether its row is marked).

    The creation event's ``mutate`` builds the aggregate, then each event's ``apply`` runs
    without re-checking the stream id (every event here was read from the aggregate's own
    stream); each version must follow on, so a gap in a stream is damage, as eventsourcing's
    own replay would say. The loop makes no call per event but the decoding and the event's
    own: it runs for every event of the log."""
    first = rows[0][1]  # the key as text: a UUID's (PostgreSQL) or as stored (SQLite)
    aggregate: Any = None
    try:
        if _topic(rows[0][3]) not in (_PROCESS_TOPIC, _SESSION_TOPIC):
            return
        key = UUID(_text(first))
        for _, _, version, topic, state in rows:
            event = decode_event(key, version, _topic(topic), state)
            if aggregate is None:
                aggregate = event.mutate(None)
            elif version == aggregate.version + 1:
                event.apply(aggregate)
                aggregate.version = version
                aggregate.modified_on = event.timestamp
            else:
                raise ValueError(f"version {version} after {aggregate.version}")
    except Exception:  # any failure to decode or apply: this stream only is damaged
        name = batch.damaged[_stream_name(first)] = _name(aggregate)
        if isinstance(aggregate, Process):
            processes.append(_Folded(_stream_name(first), name, rows, None))
        return
    if isinstance(aggregate, Process):
        document = record_document(aggregate, max(map(_POSITION, rows)))
        row = record_rows.document_row(document)
        processes.append(_Folded(_stream_name(first), aggregate.process_id, rows, row))
        return
    batch.sessions.add(aggregate.session_id)
    for process_id, descriptor in aggregate.grants.items():
        encoded = None if descriptor is None else orjson.dumps(descriptor).decode()
        grants.append((aggregate.session_id, process_id, encoded))


def _stream_name(key: Any) -> str:
    """A damaged stream's key as the sweep names keys (a UUID's hex), or as stored when it is
    not a UUID (``NULL``: a NULL key, which only a damaged SQLite file holds)."""
    if key is None:
        return "NULL"
    text = key if isinstance(key, str) else bytes(key).decode(errors="replace")
    try:
        return UUID(text).hex
    except ValueError:
        return text


def _name(aggregate: Any) -> str:
    """The id of a partly folded aggregate, when its creation event was read."""
    for attribute in ("process_id", "session_id"):
        value = getattr(aggregate, attribute, None)
        if isinstance(value, str):
            return value
    return ""


def _finish(store: Store, tx: Tx, totals: _Totals) -> list[str]:
    """Delete rows the log no longer backs (a process or session written after its batch
    passed has a log, and rows its own writes keep current), set tracking; the damaged
    streams, named."""
    store.lock_log(tx)
    damaged = dict(totals.damaged)
    named = _delete_stale_records(tx, damaged)
    _mark_if_unverified(tx, named, totals)
    kept = set(totals.sessions)
    for session_id in grant_rows.session_ids(tx):
        if session_id not in kept and _backed(tx, damaged, session_uuid(session_id), session_id):
            kept.add(session_id)
    grant_rows.delete_sessions_except(tx, kept)
    record_rows.set_tracking(tx, event_rows.max_position(tx))
    return sorted(name or f"stream {_uuid_text(stream)}" for stream, name in damaged.items())


def _delete_stale_records(tx: Tx, damaged: dict[str, str]) -> list[tuple[str, str]]:
    """Delete the records whose process has no events left, a page of ids at a time (so
    memory stays flat however many processes there are); a damaged stream's record stays,
    and names it. Returns the damaged streams named so (``(key, process_id)``): their fold
    failed before it learnt whose they are."""
    named: list[tuple[str, str]] = []
    after: Any = ""
    while ids := record_rows.ids_after(tx, after, SWEEP):
        keys = {process_key_hex(process_id): process_id for process_id in ids if _is_id(process_id)}
        for key, process_id in keys.items() if damaged else ():
            if damaged.get(key) == "":
                named.append((key, process_id))
            _name_damaged(damaged, key, process_id)
        stale = [process_id for process_id in ids if not _is_id(process_id)]  # no log backs them
        stale.extend(keys[key] for key in event_rows.streams_missing(tx, list(keys)))
        if stale:
            record_rows.delete_ids(tx, stale)
        after = ids[-1]
    return named


def _mark_if_unverified(tx: Tx, named: list[tuple[str, str]], totals: _Totals) -> None:
    """Mark the rows of those processes, among the damaged streams first named by their
    record, whose chain does not verify (their rows were read whole again: they are few)."""
    heads = head_rows.heads_of(tx, [process_id for _, process_id in named])
    marks: list[tuple[str, str, Row | None]] = []
    for key, process_id in named:
        rows = event_rows.stream_rest(tx, key, 0)
        fault = _chain_fault(rows, heads.get(process_id), totals.since)
        if fault is not None:
            marks.append((process_id, f"its log does not verify: {fault}", None))
            totals.marked.add(process_id)
    record_rows.mark_damaged(tx, marks)


def _is_id(process_id: Any) -> bool:
    """Whether a stored id is text, as every id procledger writes (a damaged SQLite file may
    hold a BLOB in the column: it names no process, so no log backs its row)."""
    return isinstance(process_id, str)


def _name_damaged(damaged: dict[str, str], key: str, name: str) -> bool:
    """Whether the stream of ``key`` (its UUID's hex) is a damaged one (then named ``name``
    if it had no name yet)."""
    if key not in damaged:
        return False
    damaged[key] = damaged[key] or name
    return True


def _uuid_text(stream: str) -> str:
    """A stream id as a UUID's usual text (SQLite stores hex), or as stored if it is none."""
    try:
        return str(UUID(stream))
    except ValueError:
        return stream


def _backed(tx: Tx, damaged: dict[str, str], stream: UUID, name: str) -> bool:
    """Whether ``stream`` still has events (a damaged one is then named ``name``)."""
    return _name_damaged(damaged, stream.hex, name) or event_rows.max_version(tx, stream) > 0
