"""The registry conformance suite on a PostgreSQL schema (one fresh schema per test)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from procledger import ProcessRegistry, open_registry

from .conformance import RegistryConformance

pytestmark = pytest.mark.postgres


class TestPostgresRegistry(RegistryConformance):
    @pytest.fixture(autouse=True)
    def _schema(self, postgres_schema_url: str) -> None:
        self.url = postgres_schema_url

    def make_registry(self, clock: Callable[[], int]) -> ProcessRegistry:
        return open_registry(self.url, clock=clock)
