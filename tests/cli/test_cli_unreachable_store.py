"""A command that only reads (`ps`, `show`, `wait`, `logs`, `feed`, `prune --dry-run`: the opens
with ``read_only=True``) tries an unreachable PostgreSQL server once and fails at once with one
line naming the URL; the retry window that rides through a server restart is for writers, which
have something to record (docs/design.md §7.1, §8).

No server is needed: the URL names a port nobody listens on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from _shared import run_cli
from procledger import StoreUnavailable, open_registry

NOBODY = "postgresql://u:hunter2@127.0.0.1:1/db"
"""Nobody listens on port 1: each connection is refused at once. The default window (30 s)."""


@pytest.mark.parametrize(
    "args",
    [
        ["ps"],
        ["show", "some-id"],
        ["wait", "some-id"],
        ["logs", "some-id"],
        ["feed"],
        ["prune", "--older-than", "1d", "--dry-run"],
    ],
)
def test_a_reader_fails_at_once_with_one_line(args: list[str]) -> None:
    started = time.monotonic()
    ran = run_cli(*args, url=NOBODY, timeout=60)
    took = time.monotonic() - started
    assert ran.returncode == 1, ran.stderr
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert ran.stderr.startswith(
        f"procledger {args[0]}: store URL 'postgresql://u:***@127.0.0.1:1/db': cannot connect"
    )
    assert "refused" in ran.stderr
    assert "hunter2" not in ran.stderr
    assert took < 10, f"{args[0]} took {took:.1f} s; a writer's window is 30 s"


def connects(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each connection attempt is made from now on (psycopg's own ``connect``)."""
    attempts: list[float] = []
    connect: Callable[..., Any] = psycopg.connect

    def counted(*args: Any, **kwargs: Any) -> Any:
        attempts.append(time.monotonic())
        return connect(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", counted)
    return attempts


def test_a_read_only_open_makes_one_attempt_and_a_writer_rides_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    attempts = connects(monkeypatch)
    with pytest.raises(StoreUnavailable, match="cannot connect"):
        open_registry(NOBODY, create=False, read_only=True)
    assert len(attempts) == 1
    attempts.clear()
    with pytest.raises(StoreUnavailable, match="cannot connect"):
        open_registry(f"{NOBODY}?retry_s=0.5", create=False)
    assert len(attempts) > 1  # retried for the window (20 ms doubling to 200 ms)
    assert attempts[-1] - attempts[0] >= 0.3
