"""Blocking calls made from many tasks at once, run together in a worker thread.

A write alone costs a worker thread's hop and a transaction's overhead as much again as its own
work, and under one GIL those add up: 500 tasks starting a child each spent most of their time
handing writes to threads, not writing. ``Batches`` queues the calls; while a call is under
way the others gather, and the next free runner (at most one per thread of the limiter, each
in a worker thread of it) takes up to ``most`` of them in one call of ``run_all``, which makes
their writes in one transaction (``Supervisor.start_all``, ``Settle.together``). One call made
alone runs alone, as soon as it is made.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import anyio
from anyio import CapacityLimiter, to_thread

T = TypeVar("T")
R = TypeVar("R")


class _Call(Generic[T, R]):
    __slots__ = ("done", "item", "outcome")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = anyio.Event()
        self.outcome: R | BaseException | None = None


class Batches(Generic[T, R]):
    """``await batches(item)``: ``run_all([..., item, ...])``'s outcome for ``item``, where
    ``run_all`` takes the items of one batch and returns, in order, each one's result or the
    exception it alone raised. Awaiting callers should shield the call: a batch once taken
    runs to its end, and each of its callers is owed its outcome."""

    def __init__(
        self,
        run_all: Callable[[list[T]], Sequence[R | Exception]],
        limiter: CapacityLimiter,
        *,
        most: int,
    ) -> None:
        self._run_all = run_all
        self._limiter = limiter
        self._most = most
        self._pending: deque[_Call[T, R]] = deque()
        self._runners = 0

    async def __call__(self, item: T) -> R:
        call: _Call[T, R] = _Call(item)
        self._pending.append(call)
        if self._runners < self._limiter.total_tokens:  # a runner per thread it may use
            self._runners += 1
            try:
                while self._pending:  # a runner takes what has gathered meanwhile, too
                    await self._run(self._take())
            finally:
                self._runners -= 1
        await call.done.wait()
        if isinstance(call.outcome, BaseException):
            raise call.outcome
        return call.outcome  # type: ignore[return-value]

    def _take(self) -> list[_Call[T, R]]:
        pending = self._pending
        return [pending.popleft() for _ in range(min(self._most, len(pending)))]

    async def _run(self, batch: list[_Call[T, R]]) -> None:
        outcomes: Sequence[R | BaseException] = ()
        try:
            outcomes = await to_thread.run_sync(
                self._run_all, [call.item for call in batch], limiter=self._limiter
            )
        except BaseException as error:  # the whole batch failed: each caller gets why
            outcomes = [copy.copy(error) for _ in batch]
            if not isinstance(error, Exception):
                raise  # the program is being stopped (the callers are shielded)
        finally:
            for call, outcome in zip(batch, outcomes, strict=True):
                call.outcome = outcome
                call.done.set()
