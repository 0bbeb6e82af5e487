"""``ProcessListFilter``: what ``list_processes``, ``handles`` and ``prune_terminal`` select.

A filter is a frozen model whose fields are ANDed. ``decode`` is the strict entry point for
filters that arrive as data (a CLI flag, a tool call): it accepts exactly the keys below and
raises ``FilterError`` naming the first key that is unknown or of the wrong type.

``definition`` compares JSON: a filter that names it (even as ``null``) matches the records
whose ``identity.definition`` has the same canonical JSON; one that omits it matches all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import JsonValue, StrictBool, StrictInt, StrictStr, ValidationError

from procledger.domain.errors import FilterError
from procledger.domain.model import Frozen, canonical_json
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import ProcessStatus

if TYPE_CHECKING:
    from procledger.adapters.sql.record_rows import Condition

StatusFilter = Literal["running", "completed", "failed", "cancelled", "abandoned", "any"]
STATUS_VALUES: tuple[str, ...] = (*(status.value for status in ProcessStatus), "any")

_STRING_KEYS = ("originator_scope_id", "identity_kind", "identity_label")
_INT_KEYS = ("created_at_start_ms", "created_at_end_ms")
FILTER_KEYS: tuple[str, ...] = (
    "status",
    "waiting",
    *_STRING_KEYS,
    "definition",
    *_INT_KEYS,
)


class ProcessListFilter(Frozen):
    """Which processes to select; every given field must match (docs/design.md §5)."""

    status: StatusFilter = "running"
    waiting: StrictBool | None = None
    originator_scope_id: StrictStr | None = None
    identity_kind: StrictStr | None = None
    identity_label: StrictStr | None = None
    definition: JsonValue = None
    """Only applied when given (see ``filters_definition``); ``None`` then means "no
    definition"."""
    created_at_start_ms: StrictInt | None = None
    """Inclusive lower bound of ``created_at_ms``."""
    created_at_end_ms: StrictInt | None = None
    """Exclusive upper bound of ``created_at_ms``."""

    @classmethod
    def decode(cls, mapping: Mapping[str, Any] | ProcessListFilter | None) -> ProcessListFilter:
        """A filter from data; ``FilterError`` names an unknown key or a mistyped value."""
        if mapping is None:
            return cls()
        if isinstance(mapping, ProcessListFilter):
            return mapping
        if not isinstance(mapping, Mapping):
            raise FilterError("filter", "expects a mapping of filter keys to values")
        for key in mapping:
            if key not in FILTER_KEYS:
                raise FilterError(
                    str(key), f"unknown filter key (allowed: {', '.join(FILTER_KEYS)})"
                )
        for key, value in mapping.items():
            _check_value(key, value)
        try:
            return cls(**dict(mapping))
        except ValidationError as error:
            first = error.errors()[0]
            key = str(first["loc"][0]) if first["loc"] else "filter"
            raise FilterError(key, first["msg"]) from None

    @property
    def filters_definition(self) -> bool:
        return "definition" in self.model_fields_set

    def matches(self, record: ProcessRecord) -> bool:
        """The same selection as the SQL the registry runs, for one record in memory."""
        checks = (
            self.status in ("any", record.status.value),
            self.waiting is None or (record.wait is not None) == self.waiting,
            self.originator_scope_id is None
            or record.originator.scope_id == self.originator_scope_id,
            self.identity_kind is None or record.identity.kind == self.identity_kind,
            self.identity_label is None or record.identity.label == self.identity_label,
            not self.filters_definition
            or _canonical(record.identity.definition) == _canonical(self.definition),
            self.created_at_start_ms is None or record.created_at_ms >= self.created_at_start_ms,
            self.created_at_end_ms is None or record.created_at_ms < self.created_at_end_ms,
        )
        return all(checks)

    def conditions(self) -> list[Condition]:
        """The selection as conditions on the records table's columns."""
        found: list[Condition] = []
        if self.status != "any":
            found.append(("status", "=", self.status))
        if self.waiting is not None:
            found.append(("waiting", "=", int(self.waiting)))
        for key in _STRING_KEYS:
            value = getattr(self, key)
            if value is not None:
                found.append((key, "=", value))
        if self.filters_definition:
            if self.definition is None:
                found.append(("definition", "is null", None))
            else:
                found.append(("definition", "=", _canonical(self.definition)))
        if self.created_at_start_ms is not None:
            found.append(("created_at_ms", ">=", self.created_at_start_ms))
        if self.created_at_end_ms is not None:
            found.append(("created_at_ms", "<", self.created_at_end_ms))
        return found


def _canonical(value: Any) -> str | None:
    return None if value is None else canonical_json(value).decode()


def _check_value(key: str, value: Any) -> None:
    problem = _type_problem(key, value)
    if problem is not None:
        raise FilterError(key, problem)


def _type_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` for ``key`` (``definition`` is checked by the model)."""
    kind = type(value).__name__
    if key == "status" and not (isinstance(value, str) and value in STATUS_VALUES):
        return f"must be one of {', '.join(STATUS_VALUES)}, not {value!r}"
    if key == "waiting" and not isinstance(value, bool):
        return f"must be a boolean, not {kind}"
    if key in _STRING_KEYS and not isinstance(value, str):
        return f"must be a string, not {kind}"
    if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
        return f"must be an integer (epoch ms), not {kind}"
    return None
