"""Process notifications: metadata-only hand-offs to the loop that owns a process.

Two kinds share one delivery path (docs/design.md §4): ``ProcessCompletionNotification`` (the
process ended) and ``ProcessInputNotification`` (it blocks waiting for input, §4.4). Neither
ever carries the command, output, the prompt's last line, stdin, environment, host path or PID.
Validation runs in a fixed order and raises ``ProcessLifecycleValidationError`` itself (not
wrapped by pydantic, which only wraps ``ValueError``/``AssertionError``), so callers can branch
on ``.field``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import orjson
from pydantic import ConfigDict, model_validator

from procledger.domain.errors import ProcessLifecycleValidationError
from procledger.domain.input import WaitKind
from procledger.domain.lifecycle_table import NOTIFICATION_ROWS
from procledger.domain.model import Frozen
from procledger.domain.records import MAX_PROCESS_HANDLE_BYTES
from procledger.domain.vocabulary import ProcessState, TerminalReason

_HANDLE = re.compile(r"[A-Za-z0-9_-]+")
_FIELDS = ("command_id", "session_id", "loop_id", "process_handle", "state", "reason")
_INPUT_FIELDS = ("command_id", "session_id", "loop_id", "process_handle", "kind")
_UUID_FIELDS = ("command_id", "session_id", "loop_id")
_KINDS = frozenset(kind.value for kind in WaitKind)


def _as_uuid(field: str, value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = uuid.UUID(value)
        except ValueError:
            raise ProcessLifecycleValidationError(field, f"not a UUID: {value!r}") from None
    else:
        raise ProcessLifecycleValidationError(field, "must be a UUID")
    if parsed.int == 0:
        raise ProcessLifecycleValidationError(field, "must not be the zero UUID")
    return parsed


def check_process_handle(value: Any) -> str:
    if not isinstance(value, str):
        raise ProcessLifecycleValidationError("process_handle", "must be a string")
    # fullmatch, not match: ``$`` would let a trailing newline through. The pattern is ASCII, so
    # once it matches, characters are bytes (and a lone surrogate never reaches ``encode``).
    if _HANDLE.fullmatch(value) is None or len(value) > MAX_PROCESS_HANDLE_BYTES:
        raise ProcessLifecycleValidationError(
            "process_handle",
            f"must be 1-{MAX_PROCESS_HANDLE_BYTES} bytes of [A-Za-z0-9_-]",
        )
    return value


def _check_state_reason(state: Any, reason: Any) -> tuple[ProcessState, TerminalReason]:
    try:
        pair = (ProcessState(state), TerminalReason(reason))
    except ValueError:
        pair = None
    if pair is None or pair not in NOTIFICATION_ROWS:
        raise ProcessLifecycleValidationError(
            "state_reason",
            f"({state!r}, {reason!r}) is not a completed or lost row of the lifecycle table",
        )
    return pair


def _check_keys(data: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The checks every kind starts with: no extra key, then the three ids."""
    for key in data:
        if key not in fields:
            raise ProcessLifecycleValidationError(str(key), "unknown key")
    return {field: _as_uuid(field, data.get(field)) for field in _UUID_FIELDS}


def validate_notification_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The ordered checks: extra key, ids, handle, then the (state, reason) row."""
    checked = _check_keys(data, _FIELDS)
    checked["process_handle"] = check_process_handle(data.get("process_handle"))
    checked["state"], checked["reason"] = _check_state_reason(data.get("state"), data.get("reason"))
    return checked


def _check_kind(value: Any) -> WaitKind:
    # Exactly the four values as written: no case folding, nothing coerced from another type.
    if isinstance(value, str) and value in _KINDS:
        return WaitKind(value)
    choices = ", ".join(kind.value for kind in WaitKind)
    raise ProcessLifecycleValidationError("kind", f"must be one of {choices}, not {value!r}")


def validate_input_notification_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The ordered checks: extra key, ids, handle, then the kind of wait."""
    checked = _check_keys(data, _INPUT_FIELDS)
    checked["process_handle"] = check_process_handle(data.get("process_handle"))
    checked["kind"] = _check_kind(data.get("kind"))
    return checked


class _ProcessNotification(Frozen):
    """What both kinds share: the ordered checks run on every way in, JSON included."""

    # An instance passed to ``model_validate`` (or as a field of another model) is checked
    # again: one built with ``model_construct`` skipped every check.
    model_config = ConfigDict(frozen=True, extra="forbid", revalidate_instances="always")

    FIELDS: ClassVar[tuple[str, ...]]

    @classmethod
    def _validate_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @model_validator(mode="before")
    @classmethod
    def _ordered_checks(cls, data: Any) -> Any:
        if isinstance(data, _ProcessNotification):
            # ``model_validate(instance)``: check it again (it may be ``model_construct``ed);
            # an instance of the other kind fails on its first foreign key.
            data = {field: getattr(data, field, None) for field in type(data).FIELDS}
        if not isinstance(data, Mapping):
            raise ProcessLifecycleValidationError("command_id", "a notification is a JSON object")
        return cls._validate_fields(data)

    @classmethod
    def model_validate_json(
        cls,
        json_data: str | bytes | bytearray,
        *,
        strict: bool | None = None,
        extra: Any = None,
        context: Any | None = None,
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        """Parse first, so malformed JSON is our typed error too, then run the same checks."""
        try:
            data = orjson.loads(json_data)
        except orjson.JSONDecodeError as error:
            raise ProcessLifecycleValidationError("command_id", f"not JSON: {error}") from None
        return cls.model_validate(data, strict=strict, context=context)

    def revalidated(self) -> Self:
        """A checked copy; ``model_construct`` can build one that skipped every check."""
        return self.model_validate({field: getattr(self, field, None) for field in self.FIELDS})


class ProcessCompletionNotification(_ProcessNotification):
    """The process ended: its terminal (state, reason), a completed or lost row (§4.1)."""

    FIELDS: ClassVar[tuple[str, ...]] = _FIELDS

    command_id: uuid.UUID
    session_id: uuid.UUID
    loop_id: uuid.UUID
    process_handle: str
    state: ProcessState
    reason: TerminalReason

    @classmethod
    def _validate_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return validate_notification_fields(data)


class ProcessInputNotification(_ProcessNotification):
    """The process blocks waiting for input of ``kind`` (§4.4): enough for the loop to ask
    whoever can answer, nothing of what the process printed (the prompt may hold a secret)."""

    FIELDS: ClassVar[tuple[str, ...]] = _INPUT_FIELDS

    command_id: uuid.UUID
    session_id: uuid.UUID
    loop_id: uuid.UUID
    process_handle: str
    kind: WaitKind

    @classmethod
    def _validate_fields(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        return validate_input_notification_fields(data)


Notification = ProcessCompletionNotification | ProcessInputNotification
"""Either kind: what a loop's inbox holds and the journal stores."""
