"""What a caller declares about a process before anything runs (docs/design.md §3.1).

These rules belong to the model, so an invalid registration cannot even be constructed:
pydantic's ``ValidationError`` names the field. Environment values never appear here; a
command's environment is referred to by the hash of its content (``env_ref``).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from procledger.domain.model import Frozen, Tagged, canonical_json
from procledger.domain.service import Readiness, RestartPolicy
from procledger.domain.service_names import check_service_name
from procledger.domain.vocabulary import RecoveryDisposition

MAX_PROCESS_ID_CHARS = 256

ENV_REF_PREFIX = "process-env:sha256:"
# fullmatch, not match with ``$``: ``$`` lets a trailing newline through.
_ENV_REF = re.compile(r"process-env:sha256:[0-9a-f]{64}")
_SIGNAL_TYPE = re.compile(r"signal\.[A-Za-z0-9_-]+")
_NONE: frozenset[str] = frozenset()


class ProcessInput(Tagged):
    """What the work is: an OS ``command``, ``engine`` work, or ``external`` work."""

    TAG: ClassVar[str] = "type"
    VARIANTS: ClassVar[dict[str, tuple[frozenset[str], frozenset[str]]]] = {
        "command": (frozenset({"argv"}), frozenset({"cwd"})),
        "engine": (frozenset({"kind"}), frozenset({"payload"})),
        "external": (_NONE, frozenset({"metadata"})),
    }

    type: Literal["command", "engine", "external"]
    argv: list[str] | None = None
    cwd: str | None = None
    kind: str | None = None
    payload: JsonValue = None
    metadata: JsonValue = None

    @classmethod
    def command(cls, argv: list[str], cwd: str | None = None) -> ProcessInput:
        return cls(type="command", argv=argv, cwd=cwd)

    @classmethod
    def engine(cls, kind: str, payload: JsonValue = None) -> ProcessInput:
        return cls(type="engine", kind=kind, payload=payload)

    @classmethod
    def external(cls, metadata: JsonValue = None) -> ProcessInput:
        return cls(type="external", metadata=metadata)

    @model_validator(mode="after")
    def _check_content(self) -> ProcessInput:
        if self.type == "command" and (not self.argv or not self.argv[0]):
            raise ValueError("argv must name a program (a non-empty first element)")
        if self.type == "engine" and not (self.kind or "").strip():
            raise ValueError("kind must be a non-empty engine name")
        if self.type == "external" and not isinstance(self.metadata, dict | None):
            raise ValueError("metadata must be a JSON object")
        return self

    def identity(self) -> tuple[str, str | None]:
        """The derived (kind, label) that lists and handles show."""
        return input_identity(
            {"type": self.type, "argv": self.argv, "kind": self.kind, "metadata": self.metadata}
        )


def input_identity(data: Mapping[str, Any]) -> tuple[str, str | None]:
    """(kind, label) of an input given as its JSON form (what stored events hold)."""
    if data["type"] == "command":
        program: str = data["argv"][0]
        return "command", posixpath.basename(program) or program
    if data["type"] == "engine":
        return data["kind"], None
    return "external", _external_label(data.get("metadata"))


def _external_label(metadata: JsonValue) -> str | None:
    if isinstance(metadata, dict):
        for key in ("label", "name", "title"):
            value = metadata.get(key)
            if isinstance(value, str):
                return value
    return None


class SessionScope(Frozen):
    """A session, optionally narrowed to one agent frame of it."""

    session_id: str = Field(min_length=1)
    agent_frame_id: str | None = None

    @property
    def scope_id(self) -> str:
        return session_scope_id(self.session_id, self.agent_frame_id)


def session_scope_id(session_id: str, agent_frame_id: str | None) -> str:
    base = f"session:{session_id}"
    return base if agent_frame_id is None else f"{base}/frame:{agent_frame_id}"


class Originator(Tagged):
    """Who asked for the process: the ``host`` (optionally scoped) or a ``session``."""

    TAG: ClassVar[str] = "type"
    VARIANTS: ClassVar[dict[str, tuple[frozenset[str], frozenset[str]]]] = {
        "host": (_NONE, frozenset({"scope"})),
        "session": (frozenset({"scope"}), _NONE),
    }

    type: Literal["host", "session"]
    scope: SessionScope | str | None = None

    @classmethod
    def host(cls, scope: str | None = None) -> Originator:
        return cls(type="host", scope=scope)

    @classmethod
    def session(cls, scope: SessionScope) -> Originator:
        return cls(type="session", scope=scope)

    @model_validator(mode="before")
    @classmethod
    def _coerce_scope(cls, data: Any) -> Any:
        # Decide the scope's shape from the tag, so a dict never becomes a host scope string.
        if isinstance(data, dict) and data.get("type") == "session":
            scope = data.get("scope")
            if isinstance(scope, dict):
                return {**data, "scope": SessionScope.model_validate(scope)}
            if not isinstance(scope, SessionScope):  # None too: a session names one
                raise ValueError("a session originator's scope must be a SessionScope")
        host = isinstance(data, dict) and data.get("type", "host") == "host"
        if host and not isinstance(data.get("scope"), str | None):
            raise ValueError("a host originator's scope must be a string or null")
        return data

    @property
    def scope_id(self) -> str:
        return originator_scope_id(self.model_dump(mode="json"))


def originator_scope_id(data: Mapping[str, Any]) -> str:
    """``host``, ``host:<scope>``, ``session:<sid>`` or ``session:<sid>/frame:<frame>``, from
    an originator's JSON form (what stored events and records hold)."""
    scope: Any = data.get("scope")
    if data.get("type") == "session":
        return session_scope_id(scope["session_id"], scope.get("agent_frame_id"))
    return "host" if scope is None else f"host:{scope}"


class EventType(Frozen):
    """A producer event type declared at registration, e.g. ``signal.ready``."""

    name: str
    payload_schema: JsonValue = None

    @field_validator("name")
    @classmethod
    def _signal_name(cls, name: str) -> str:
        if not _SIGNAL_TYPE.fullmatch(name):
            raise ValueError(f"event type {name!r} must look like 'signal.<name>' ([A-Za-z0-9_-])")
        return name


class HandleDescriptor(Frozen):
    """How a handle presents itself to a session: a kind and an optional label."""

    kind: str = Field(min_length=1)
    label: str | None = None


def is_env_ref(value: str) -> bool:
    return bool(_ENV_REF.fullmatch(value))


class ProcessRegistration(Frozen):
    """Everything declared about a process; hashed to make registration idempotent."""

    id: str
    input: ProcessInput
    disposition: RecoveryDisposition
    originator: Originator
    wake_target: SessionScope | None = None
    env_ref: str | None = None
    event_types: list[EventType] = Field(default_factory=list)
    descriptor: HandleDescriptor | None = None
    definition: JsonValue = None
    # A service's declarations (docs/design.md §15). Left out of the JSON form when null, so
    # a registration without them hashes exactly as it did before they existed.
    readiness: Readiness | None = None
    restart: RestartPolicy | None = None
    attempt_of: str | None = None
    attempt: int | None = Field(default=None, ge=1)
    # A named service's (docs/design.md §19): its name (at most one live service holds it per
    # ledger), the digest of its service-file definition (``up`` restarts what changed), the
    # port leased to it, and when a later attempt's backoff ends. Null: left out, as above.
    name: str | None = None
    digest: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    starts_at_ms: int | None = Field(default=None, ge=0)
    # Run on a pseudo-terminal (docs/design.md §20): its stdout stream is the terminal's one
    # merged stream, and it takes input by ``send``. Null (not false) when not: left out.
    pty: bool | None = None

    @model_serializer(mode="wrap")
    def _omit_unset_service_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        full: dict[str, Any] = handler(self)
        return {
            key: value
            for key, value in full.items()
            if value is not None or key not in OPTIONAL_REGISTRATION_KEYS
        }

    @model_validator(mode="after")
    def _attempt_link(self) -> ProcessRegistration:
        if self.attempt_of is not None:
            check_process_id(self.attempt_of)
            if self.attempt is None or self.attempt < 2:
                raise ValueError("attempt: a later attempt (attempt_of set) is numbered 2 or more")
        elif self.attempt not in (None, 1):
            raise ValueError("attempt: only a later attempt (attempt_of set) is numbered past 1")
        return self

    @field_validator("name")
    @classmethod
    def _service_name(cls, value: str | None) -> str | None:
        return None if value is None else check_service_name(value, "name")

    @field_validator("id")
    @classmethod
    def _process_id(cls, value: str) -> str:
        check_process_id(value)
        return value

    @field_validator("env_ref")
    @classmethod
    def _env_ref_shape(cls, value: str | None) -> str | None:
        if value is not None and not is_env_ref(value):
            raise ValueError(f"env_ref must be '{ENV_REF_PREFIX}<64 hex digits>', not {value!r}")
        return value

    @field_validator("event_types")
    @classmethod
    def _distinct_event_types(cls, value: list[EventType]) -> list[EventType]:
        names = [event_type.name for event_type in value]
        if len(names) != len(set(names)):
            raise ValueError("event_types declares the same name twice")
        return value

    @model_validator(mode="after")
    def _env_ref_presence(self) -> ProcessRegistration:
        if self.input.type == "external" and self.env_ref is not None:
            raise ValueError("env_ref: an external process has no environment here")
        if self.input.type != "external" and self.env_ref is None:
            raise ValueError(f"env_ref: a {self.input.type} process requires env_ref")
        return self

    def registration_hash(self) -> str:
        return registration_hash_of(self.model_dump(mode="json"))

    def declares(self, event_type: str) -> bool:
        return any(declared.name == event_type for declared in self.event_types)


OPTIONAL_REGISTRATION_KEYS = frozenset(
    {
        "readiness",
        "restart",
        "attempt_of",
        "attempt",
        "name",
        "digest",
        "port",
        "starts_at_ms",
        "pty",
    }
)
"""Registration keys a stored document may lack (registrations made before they existed)."""


def registration_hash_of(document: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a registration's JSON form."""
    return f"sha256:{hashlib.sha256(canonical_json(document)).hexdigest()}"


def check_process_id(value: str) -> None:
    """The id rules, shared by registration and every lookup that takes an id."""
    if not value.strip():
        raise ValueError("id must not be empty or blank")
    if len(value) > MAX_PROCESS_ID_CHARS:
        raise ValueError(f"id must be at most {MAX_PROCESS_ID_CHARS} characters")
    if "#" in value:
        raise ValueError("id must not contain '#'")


def env_ref_for(env: dict[str, str]) -> str:
    """The content hash of an environment; independent of the variables' order."""
    digest = hashlib.sha256(canonical_json(env)).hexdigest()
    return f"{ENV_REF_PREFIX}{digest}"
