"""The async API (docs/design.md §17): supervise, wait, follow the change feed, the output
and a loop's completion notifications from one event loop, under asyncio or trio (anyio).

Needs the ``async`` extra (``pip install procledger[async]``). ``import procledger`` never
loads it.
"""

from __future__ import annotations

from procledger.aio.feed import FeedChange, follow
from procledger.aio.inbox import notifications
from procledger.aio.supervisor import AsyncProcessHandle, AsyncSupervisor, OnExit

__all__ = [
    "AsyncProcessHandle",
    "AsyncSupervisor",
    "FeedChange",
    "OnExit",
    "follow",
    "notifications",
]
