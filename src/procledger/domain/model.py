"""Shared pydantic plumbing: frozen strict models and single-class tagged unions.

A tagged union is one class whose tag field picks which other fields exist. One class (rather
than a union of subclasses) lets callers write ``ProcessInput(type="command", argv=[...])`` or
pass the JSON dict, and still get an error naming the field when a key does not belong to the
chosen variant. Its JSON carries only the variant's own keys, so hashes stay canonical.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

M = TypeVar("M", bound=BaseModel)
_set_attribute = object.__setattr__


def assemble(model: type[M], fields: dict[str, Any]) -> M:
    """A model from a complete set of values that are already validated.

    ``model_construct`` without its per-field alias and default lookups, which cost most of a
    command's record (it runs once per write). The caller passes every field; tests hold the
    result equal to the validated model.
    """
    instance = model.__new__(model)
    _set_attribute(instance, "__dict__", fields)
    _set_attribute(instance, "__pydantic_fields_set__", set(fields))
    _set_attribute(instance, "__pydantic_extra__", None)
    _set_attribute(instance, "__pydantic_private__", None)
    return instance


class Frozen(BaseModel):
    """Immutable, closed to unknown keys: what a stored fact should be."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Tagged(Frozen):
    """Base of single-class tagged unions.

    Subclasses set ``TAG`` (the discriminating key), ``DEFAULT_TAG`` (or ``None`` when the tag is
    required) and ``VARIANTS`` (tag → (required keys, optional keys)).
    """

    TAG: ClassVar[str]
    DEFAULT_TAG: ClassVar[str | None] = None
    VARIANTS: ClassVar[Mapping[str, tuple[frozenset[str], frozenset[str]]]]

    @model_validator(mode="before")
    @classmethod
    def _check_variant(cls, data: Any) -> Any:
        # Runs for every record a list decodes: set comparisons, no copy unless the tag is
        # filled in from the default.
        if not isinstance(data, Mapping):
            return data
        tag = data.get(cls.TAG, cls.DEFAULT_TAG)
        if not isinstance(tag, str) or tag not in cls.VARIANTS:
            allowed = ", ".join(sorted(cls.VARIANTS))
            raise ValueError(f"{cls.TAG} must be one of {allowed}, not {tag!r}")
        required, keys = cls.VARIANTS[tag][0], _variant_keys(cls, tag)
        present = data.keys()
        if not present <= keys:
            key = next(key for key in data if key not in keys)
            raise ValueError(f"key {key!r} does not belong to {cls.TAG}={tag!r}")
        if not required <= present:
            raise ValueError(f"{cls.TAG}={tag!r} requires {min(required - present)!r}")
        return data if cls.TAG in data else {**data, cls.TAG: tag}

    @model_serializer(mode="wrap")
    def _variant_keys_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        full: dict[str, Any] = handler(self)
        keep = _variant_keys(type(self), getattr(self, self.TAG))
        return {key: value for key, value in full.items() if key in keep}


@functools.cache
def _variant_keys(model: type[Tagged], tag: str) -> frozenset[str]:
    """Every key ``tag``'s variant of ``model`` may carry, its tag included."""
    required, optional = model.VARIANTS[tag]
    return required | optional | {model.TAG}


def canonical_json(value: Any) -> bytes:
    """Sorted-key compact JSON: the byte form that hashes are taken of."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
