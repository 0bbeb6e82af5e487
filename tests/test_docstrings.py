"""Every public method of the main classes says what it guarantees and raises (``help()`` is a
user's first documentation), and the registry exposes no half-working inherited API."""

from __future__ import annotations

import inspect

import pytest

from procledger import (
    LoopInbox,
    Notifier,
    ProcessRegistry,
    RecoveryWorker,
    Supervisor,
    open_registry,
)
from procledger.aio import AsyncProcessHandle, AsyncSupervisor

DOCUMENTED = [
    ProcessRegistry,
    Supervisor,
    Notifier,
    RecoveryWorker,
    LoopInbox,
    AsyncSupervisor,
    AsyncProcessHandle,
]


def public_methods(cls: type) -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    ]


@pytest.mark.parametrize("cls", DOCUMENTED, ids=lambda cls: cls.__name__)
def test_every_public_method_has_a_docstring(cls: type) -> None:
    undocumented = [name for name in public_methods(cls) if not inspect.getdoc(getattr(cls, name))]
    assert undocumented == []


def test_the_registry_has_no_inherited_application_api() -> None:
    registry = open_registry("memory://")
    try:
        for name in ("save", "repository", "notification_log", "recorder", "mapper"):
            assert not hasattr(registry, name), name
    finally:
        registry.close()
