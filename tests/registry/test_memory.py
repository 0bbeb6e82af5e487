"""The registry conformance suite on ``memory://``."""

from __future__ import annotations

from _stores import MemoryCase
from procledger import open_registry

from .conformance import RegistryConformance


class TestMemoryRegistry(MemoryCase, RegistryConformance):
    pass


def test_memory_registries_are_private() -> None:
    from .conformance import registration

    first = open_registry("memory://")
    second = open_registry("memory://")
    try:
        first.register(registration("only-in-first"))
        assert [e.kind for e in first.events("only-in-first")] == ["registered"]
        try:
            second.get("only-in-first")
        except LookupError:
            pass
        else:  # pragma: no cover - the failure being tested for
            raise AssertionError("memory:// registries share data")
    finally:
        first.close()
        second.close()
