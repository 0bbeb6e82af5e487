"""The registry conformance suite on ``memory://``."""

from __future__ import annotations

from collections.abc import Callable

from procledger import ProcessRegistry, open_registry

from .conformance import RegistryConformance


class TestMemoryRegistry(RegistryConformance):
    def make_registry(self, clock: Callable[[], int]) -> ProcessRegistry:
        return open_registry("memory://", clock=clock)


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
