"""The one retry-on-conflict loop.

Optimistic concurrency means a write can find that another writer appended first; the store
reports that as ``WriteConflict``. The caller's ``attempt`` re-reads and re-decides from
scratch, so a decision that is no longer valid raises its own typed error on the next try
instead of a store error. Every command that can conflict goes through ``retry_on_conflict``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from procledger.domain.errors import StoreError, WriteConflict

T = TypeVar("T")

CONFLICT_RETRIES = 50
"""Attempts before a command gives up: far more than contention between a few writers needs."""


def retry_on_conflict(attempt: Callable[[], T], what: str) -> T:
    """``attempt()`` until it does not raise ``WriteConflict``.

    Raises:
        StoreError: ``what`` kept conflicting ``CONFLICT_RETRIES`` times.
    """
    for _ in range(CONFLICT_RETRIES):
        try:
            return attempt()
        except WriteConflict:
            continue
    raise StoreError(f"{what}: gave up after {CONFLICT_RETRIES} conflicting writes")
