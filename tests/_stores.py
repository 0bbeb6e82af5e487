"""One base per store kind, for the conformance suites that run against every store.

A suite (``registry/conformance.py``, ``projections/contract.py``) subclasses ``StoreCase`` and
is run once per store by test classes that mix in ``MemoryCase``, ``SQLiteCase`` or
``PostgresCase``. Each test gets a fresh, empty ledger as ``registry``, opened with the
hand-moved ``clock`` (``procledger.testing.FakeClock``), and closed afterwards.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from procledger import ProcessRegistry, open_registry
from procledger.testing import FakeClock


class StoreCase(abc.ABC):
    """One store kind; subclasses say how to open a fresh, empty ledger."""

    @abc.abstractmethod
    def make_registry(self, clock: Callable[[], int]) -> ProcessRegistry:
        """Open a registry on a fresh, empty ledger of this store kind."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def registry(self, clock: FakeClock) -> Iterator[ProcessRegistry]:
        opened = self.make_registry(clock)
        try:
            yield opened
        finally:
            opened.close()


class MemoryCase(StoreCase):
    def make_registry(self, clock: Callable[[], int]) -> ProcessRegistry:
        return open_registry("memory://", clock=clock)


class SQLiteCase(StoreCase):
    @pytest.fixture(autouse=True)
    def _database(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'ledger.db'}"

    def make_registry(self, clock: Callable[[], int]) -> ProcessRegistry:
        return open_registry(self.url, clock=clock)


class PostgresCase(StoreCase):
    @pytest.fixture(autouse=True)
    def _schema(self, postgres_schema_url: str) -> None:
        self.url = postgres_schema_url

    def make_registry(self, clock: Callable[[], int]) -> ProcessRegistry:
        return open_registry(self.url, clock=clock)
