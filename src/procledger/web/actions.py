"""Stop and Abandon from the web view: the CLI's rules (``supervisor/control.py``), carried out
by this server as ``procledger-web@<host id>`` (docs/design.md §8, §16)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import parse_qsl

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from procledger.agent.launch import tell_of_stop
from procledger.application.outbox import store_key
from procledger.supervisor.control import (
    NobodyToStop,
    StillOwned,
    abandon_process,
    host_owner,
    stop_target,
)
from procledger.supervisor.modes import StopMode

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry
    from procledger.domain.records import ProcessRecord

_STOP_WORDS = {"asked": "asked", "here": "stopped", "orphan": "stopped", "ended": "ended"}
"""``stop_target``'s answers in the page's words (a kept orphan's child stopped here too)."""

DEFAULT_GRACE_S = 10.0
"""As ``procledger stop --grace``: how long an orphaned tree stopped here gets before SIGKILL."""
MAX_GRACE_S = 86_400.0


MAX_BODY = 16 * 1024
"""An action's body is a few short fields: anything longer is refused unread."""


class BadAction(ValueError):
    """An action's parameter that names no mode, or a grace that is not 0 to 86400 seconds;
    a body that is not a JSON object or a form of the action's fields. ``field`` names the
    one at fault, where there is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class _Body(BaseModel):
    """An action's fields: nothing else is accepted, since a misspelt key (``mod``) silently
    ignored would carry out an action nobody asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    csrf: str | None = None


class StopBody(_Body):
    """``POST .../stop``: the mode and the grace an orphaned tree stopped here gets."""

    mode: StopMode = StopMode.interrupt
    grace: Annotated[float, Field(ge=0.0, le=MAX_GRACE_S, allow_inf_nan=False)] = DEFAULT_GRACE_S


class AbandonBody(_Body):
    """``POST .../abandon``: why, if said."""

    reason: Annotated[str, Field(max_length=1000)] | None = None


BodyT = TypeVar("BodyT", bound=_Body)


def parse_body(model: type[BodyT], body: bytes, content_type: str) -> BodyT:
    """An action's body as ``model``: empty (every default), a JSON object, or -- what the
    pages' forms send -- an urlencoded form with the same fields.

    Raises:
        BadAction: too long, not JSON nor a form, not an object, an unknown field, a bad value;
            naming the field at fault.
    """
    if len(body) > MAX_BODY:
        raise BadAction(f"the body is longer than {MAX_BODY} bytes")
    form = content_type.startswith("application/x-www-form-urlencoded")
    try:
        if not body.strip():
            return model.model_validate({})
        if form and body.lstrip()[:1] not in (b"{", b"["):
            return model.model_validate(_form(body))  # strings: "5" is a grace
        fields = _json(body)
        if not isinstance(fields, dict):
            kind = type(fields).__name__
            raise BadAction(f"the body must be a JSON object of fields, not a {kind}")
        return model.model_validate_json(body, strict=True)  # JSON's types: true is no grace
    except ValidationError as error:
        raise _bad_field(model, error) from None


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadAction(f"the body is not JSON: {error}") from None


def _form(body: bytes) -> dict[str, str]:
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        raise BadAction("the body is not a form (name=value&...) nor JSON") from None
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise BadAction("a field is given twice in the form")
    return fields


def _bad_field(model: type[_Body], error: ValidationError) -> BadAction:
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    known = ", ".join(name for name in model.model_fields if name != "csrf")
    if first["type"] == "extra_forbidden":
        return BadAction(f"{field!r} is not a field of this action (it takes {known})", field)
    return BadAction(f"field {field!r}: {first['msg']} (got {first['input']!r})", field)


class Actions:
    """The actions of one server; each opens nothing, runs in a worker thread and returns the
    record as it is after the action."""

    def __init__(self, registry: ProcessRegistry) -> None:
        self.registry = registry
        self.owner = host_owner("procledger-web")

    def stop(
        self, text: str, mode: str, grace: str | float = DEFAULT_GRACE_S
    ) -> tuple[ProcessRecord, str]:
        """Stop the process ``text`` names -- a whole service for any attempt's id, a kept
        orphan's child (``supervisor.control.stop_target``); the record and what happened:
        ``asked`` (its owner carries it out), ``stopped`` (here) or ``ended`` (already).
        ``NobodyToStop`` when nobody can."""
        chosen = _mode(mode)
        grace_s = _grace(grace)
        found = self.registry.resolve_process_id(text)
        done = stop_target(self.registry, found, chosen, grace_s, self.owner)
        if done.how == "asked":  # this host's agent, if it holds the process, acts on it now
            tell_of_stop(store_key(self.registry.location), done.record.id)
        return done.record, _STOP_WORDS[done.how]

    def abandon(self, text: str, reason: str | None) -> tuple[ProcessRecord, str]:
        """Abandon the process ``text`` names: ``abandoned`` or ``ended`` (already);
        ``StillOwned`` while someone holds it."""
        record = self.registry.get(self.registry.resolve_process_id(text))
        if record.state.is_terminal:
            return record, "ended"
        return abandon_process(self.registry, record, self.owner, reason), "abandoned"

    def stop_said(self, text: str, mode: str) -> str:
        """As ``stop``, for the page: a word for what happened, refusals included."""
        try:
            return self.stop(text, mode)[1]
        except NobodyToStop:
            return "nobody"

    def abandon_said(self, text: str, reason: str | None) -> str:
        try:
            return self.abandon(text, reason)[1]
        except StillOwned:
            return "owned"


def _mode(text: str) -> StopMode:
    try:
        return StopMode(text)
    except ValueError:
        raise BadAction(f"{text!r} is not a stop mode (interrupt, terminate, kill)") from None


def _grace(value: str | float) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0.0 <= seconds <= MAX_GRACE_S):
        raise BadAction(f"grace {value!r} is not a number of seconds from 0 to 86400")
    return seconds
