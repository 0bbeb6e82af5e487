"""A process's read side, rendered from its aggregate: the record (as JSON and as a model) and
the log entries callers see.

The record has two forms on the write path: the JSON document the read model stores and the
``ProcessRecord`` the caller gets back. Both come from one table, ``RECORD_FIELDS``: a row per
field, saying how to read its JSON form (from what the events stored, with no model round
trip) and its model value (from parts already validated), so the two can never list different
fields or drift apart field by field; a property test holds them equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from procledger.domain.caches import RegistrationCache
from procledger.domain.event_kinds import EVENT_CLASSES
from procledger.domain.model import Frozen, assemble
from procledger.domain.process import Process
from procledger.domain.records import (
    Identity,
    InputWaitState,
    ProcessEvent,
    ProcessRecord,
    ResourceUse,
)
from procledger.domain.registration import input_identity
from procledger.domain.vocabulary import ProcessStatus, coarse_status

Getter = Callable[[Process], Any]


@dataclass(frozen=True, slots=True)
class RecordField:
    """One record field: its JSON form and its model value, each read from the aggregate."""

    name: str
    document: Getter
    value: Getter
    registered: bool = False
    """Whether the registration alone decides it: the same in every record of a process."""


def same_field(name: str, get: Getter, *, registered: bool = False) -> RecordField:
    """A field whose value is already JSON-native (ints, strings, stored JSON)."""
    return RecordField(name, get, get, registered)


def enum_field(name: str, get: Callable[[Process], Enum | None]) -> RecordField:
    def document(process: Process) -> Any:
        member = get(process)
        # ``_value_``: what ``.value`` returns, without its descriptor (twice the cost on 3.11).
        return None if member is None else member._value_

    return RecordField(name, document, get)


def model_field(name: str, get: Callable[[Process], Frozen | None]) -> RecordField:
    def document(process: Process) -> Any:
        model = get(process)
        return None if model is None else model.model_dump(mode="json")

    return RecordField(name, document, get)


def registered_field(name: str) -> RecordField:
    """A field the registration alone decides: stored JSON, or the parsed registration's."""
    return RecordField(
        name,
        lambda process: process.registration_json[name],
        lambda process: getattr(process.registration, name),
        registered=True,
    )


def optional_registered_field(name: str) -> RecordField:
    """A registration field older registrations lack (docs/design.md §15): null for them."""
    get: Getter = lambda process: process.registration_json.get(name)  # noqa: E731
    return RecordField(name, get, get, registered=True)


# Built once per registration: a registry reuses an aggregate across its writes, and a
# rebuild renders many aggregates of few registrations.
_IDENTITIES: RegistrationCache[tuple[dict[str, Any], Identity]] = RegistrationCache()


def identity_forms(process: Process) -> tuple[dict[str, Any], Identity]:
    """The record's identity as JSON and as a model, from the same stored fields."""
    forms = _IDENTITIES.get(process.registration_hash)
    if forms is None:
        registration = process.registration_json
        kind, label = input_identity(registration["input"])
        document = {"kind": kind, "label": label, "definition": registration["definition"]}
        forms = _IDENTITIES.put(
            process.registration_hash, (document, assemble(Identity, dict(document)))
        )
    return forms


def identity_document(process: Process) -> dict[str, Any]:
    """The record's identity as JSON: the cached form when the model was built too, else the
    JSON alone (a rebuild renders each registration once and never needs the model)."""
    forms = _IDENTITIES.get(process.registration_hash)
    if forms is not None:
        return forms[0]
    registration = process.registration_json
    kind, label = input_identity(registration["input"])
    return {"kind": kind, "label": label, "definition": registration["definition"]}


def status_of(process: Process) -> ProcessStatus:
    return coarse_status(process.state, process.reason, process.exit_code)


def wake_target_document(process: Process) -> Any:
    return None if process.wake_target_cleared else process.registration_json["wake_target"]


#: Every ``ProcessRecord`` field but ``change_seq`` (the caller's), in the model's order.
RECORD_FIELDS: tuple[RecordField, ...] = (
    registered_field("id"),
    same_field("registration_hash", lambda process: process.registration_hash, registered=True),
    registered_field("input"),
    registered_field("disposition"),
    RecordField(
        "identity",
        identity_document,
        lambda process: identity_forms(process)[1],
        registered=True,
    ),
    registered_field("originator"),
    RecordField("wake_target", wake_target_document, lambda process: process.wake_target),
    registered_field("env_ref"),
    registered_field("event_types"),
    registered_field("descriptor"),
    enum_field("state", lambda process: process.state),
    enum_field("reason", lambda process: process.reason),
    same_field("exit_code", lambda process: process.exit_code),
    same_field("signal", lambda process: process.signal),
    RecordField(
        "survivors",
        lambda process: list(process.survivors),
        lambda process: list(process.survivors),
    ),
    same_field("diagnostic", lambda process: process.diagnostic),
    same_field("value", lambda process: process.value),
    enum_field("status", status_of),
    RecordField(
        "stop_requested",
        lambda process: [reason._value_ for reason in process.stop_requested],
        lambda process: list(process.stop_requested),
    ),
    same_field("backgrounded", lambda process: process.backgrounded),
    same_field("created_at_ms", lambda process: process.created_at_ms),
    same_field("updated_at_ms", lambda process: process.updated_at_ms),
    same_field("started_at_ms", lambda process: process.started_at_ms),
    same_field("finished_at_ms", lambda process: process.finished_at_ms),
    same_field("os_pid", lambda process: process.os_pid),
    RecordField("os", lambda process: process.os_json, lambda process: process.os),
    RecordField(
        "first_started",
        lambda process: process.first_started_json,
        lambda process: process.first_started,
    ),
    model_field("abandon_request", lambda process: process.abandon_request),
    model_field("abandon_evidence", lambda process: process.abandon_evidence),
    model_field("wait", lambda process: process.wait),
    model_field("external_ref", lambda process: process.external_ref),
    RecordField("output", lambda process: process.output_json, lambda process: process.output),
    same_field("ready_at_ms", lambda process: process.ready_at_ms),
    optional_registered_field("attempt"),
    optional_registered_field("attempt_of"),
    same_field("gave_up", lambda process: process.gave_up),
    RecordField(
        "service_stop_requested",
        lambda process: [reason._value_ for reason in process.service_stop_requested],
        lambda process: list(process.service_stop_requested),
    ),
    RecordField(
        "readiness",
        lambda process: process.registration_json.get("readiness"),
        lambda process: process.registration.readiness,
        registered=True,
    ),
    RecordField(
        "restart",
        lambda process: process.registration_json.get("restart"),
        lambda process: process.registration.restart,
        registered=True,
    ),
    optional_registered_field("name"),
    optional_registered_field("digest"),
    optional_registered_field("port"),
    optional_registered_field("starts_at_ms"),
    optional_registered_field("pty"),
    RecordField(
        "waiting_for_input",
        lambda process: process.waiting_json,
        lambda process: (
            None
            if process.waiting_json is None
            else InputWaitState.model_validate(process.waiting_json)
        ),
    ),
    RecordField(
        "resources",
        lambda process: process.resources_json,
        lambda process: (
            None
            if process.resources_json is None
            else ResourceUse.model_validate(process.resources_json)
        ),
    ),
)

if (*(field.name for field in RECORD_FIELDS), "change_seq") != tuple(ProcessRecord.model_fields):
    raise RuntimeError("RECORD_FIELDS and ProcessRecord list different fields")  # pragma: no cover

_DOCUMENT_GETTERS = tuple((field.name, field.document) for field in RECORD_FIELDS)
_VALUE_GETTERS = tuple((field.name, field.value) for field in RECORD_FIELDS)


def record_document(process: Process, change_seq: int) -> dict[str, Any]:
    """The record as JSON: what the read model stores, built from what the events stored."""
    document = {name: get(process) for name, get in _DOCUMENT_GETTERS}
    document["change_seq"] = change_seq
    return document


def render_record(process: Process, change_seq: int) -> ProcessRecord:
    """The record as a model, assembled without validation: every value already is one."""
    fields = {name: get(process) for name, get in _VALUE_GETTERS}
    fields["change_seq"] = change_seq
    return assemble(ProcessRecord, fields)


_FIELD_NAMES = (*(field.name for field in RECORD_FIELDS), "change_seq")
_REGISTERED = tuple((f.name, f.document, f.value) for f in RECORD_FIELDS if f.registered)
# The fields a write changes; ``None`` where the model value is the JSON form (read it once).
_CHANGING = tuple(
    (f.name, f.document, None if f.value is f.document else f.value)
    for f in RECORD_FIELDS
    if not f.registered
)
# Both forms of a record with the registration's fields filled in and the others still to
# fill, per registration: a registry renders a process on each of its writes, and copying the
# registration's fields is cheaper than reading them again. A rebuild renders each process
# once, so it keeps to the functions above.
_REGISTERED_FORMS: RegistrationCache[tuple[dict[str, Any], dict[str, Any]]] = RegistrationCache()


def _registered_forms(process: Process) -> tuple[dict[str, Any], dict[str, Any]]:
    """The registration's fields as JSON and as model values, every other key present (in the
    model's order) and ``None``; copy before filling."""
    forms = _REGISTERED_FORMS.get(process.registration_hash)
    if forms is None:
        document, values = dict.fromkeys(_FIELD_NAMES), dict.fromkeys(_FIELD_NAMES)
        for name, document_of, value_of in _REGISTERED:
            document[name] = document_of(process)
            values[name] = value_of(process)
        forms = _REGISTERED_FORMS.put(process.registration_hash, (document, values))
    return forms


def record_forms(process: Process, change_seq: int) -> tuple[dict[str, Any], ProcessRecord]:
    """``record_document`` and ``render_record`` at once, for a process written repeatedly:
    the registration's fields are copied (``_registered_forms``), the others read afresh."""
    registered = _registered_forms(process)
    document, values = registered[0].copy(), registered[1].copy()
    for name, document_of, value_of in _CHANGING:
        document[name] = value = document_of(process)
        values[name] = value if value_of is None else value_of(process)
    document["change_seq"] = values["change_seq"] = change_seq
    return document, assemble(ProcessRecord, values)


# -- log entries ---------------------------------------------------------------------------------

_EVENT_KINDS: dict[type[Process.Event], str] = {
    getattr(Process, name): kind for name, (kind, _) in EVENT_CLASSES.items()
}

_BOOKKEEPING = frozenset({"originator_id", "originator_version", "timestamp", "originator_topic"})


def event_kind(event: Process.Event) -> str:
    """A producer event is logged under its declared type; the others under a fixed kind."""
    if isinstance(event, Process.ProducerEvent):
        return event.event_type
    return _EVENT_KINDS[type(event)]


def to_process_event(process_id: str, event: Process.Event) -> ProcessEvent:
    """The log entry a caller sees: kind, payload (no bookkeeping), event id, time; a
    producer event's payload is the producer's own, with its replay key beside it."""
    if isinstance(event, Process.ProducerEvent):
        # The payload as its producer gave it; the replay key beside it (issue #14).
        return ProcessEvent(
            process_id=process_id,
            sequence=event.originator_version,
            kind=event.event_type,
            payload=event.payload,
            event_id=None,
            occurred_at_ms=event.at_ms,
            replay_key=event.replay_key,
        )
    fields = {k: v for k, v in vars(event).items() if k not in _BOOKKEEPING}
    at_ms = fields.pop("at_ms")
    event_id = fields.pop("event_id", None)
    return ProcessEvent(
        process_id=process_id,
        sequence=event.originator_version,
        kind=event_kind(event),
        payload=fields,
        event_id=event_id,
        occurred_at_ms=at_ms,
    )
