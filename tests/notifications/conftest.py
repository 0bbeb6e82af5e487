"""Stores for the notification tests: one fixture per kind, each yielding an ``open`` factory.

``open()`` gives a registry on the test's store; called again it gives another registry on the
*same* store (a restart), except on ``memory://``, which is private to one registry object, so
there it returns the same one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from procledger import ProcessRegistry, open_registry

Opener = Callable[[], ProcessRegistry]


def _opener(url: str) -> Iterator[Opener]:
    opened: list[ProcessRegistry] = []

    def open_() -> ProcessRegistry:
        if url.startswith("memory:") and opened:
            return opened[0]
        registry = open_registry(url)
        opened.append(registry)
        return registry

    yield open_
    for registry in opened:
        registry.close()


@pytest.fixture
def memory_store() -> Iterator[Opener]:
    yield from _opener("memory://")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[Opener]:
    yield from _opener(sqlite_url)


@pytest.fixture
def postgres_store(postgres_schema_url: str) -> Iterator[Opener]:
    yield from _opener(postgres_schema_url)
