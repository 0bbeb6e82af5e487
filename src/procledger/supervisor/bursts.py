"""Several starts, or several terminals, made together (docs/design.md §3.7, §6.2).

A burst of starts (``Supervisor.start_all``) shares its transactions: the registrations one,
the ``started``/``backgrounded`` facts another, the children spawned one after another in
between. Each start still gets its own outcome -- its run, or the error it alone would have met
-- so these steps carry errors as values, which the single start (``Starter.launch``) never
needs to.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from procledger.application.unit_of_work import outcome_of
from procledger.domain.leases import Lease
from procledger.domain.records import ProcessRecord
from procledger.domain.registration import ProcessRegistration
from procledger.supervisor.requests import StartRequest
from procledger.supervisor.runs import Prepared, ProcessHandle, Run
from procledger.supervisor.starter import Starter

__all__ = ["start_all", "through"]

T = TypeVar("T")
R = TypeVar("R")

Opened = tuple[StartRequest, int | None]
"""A checked start with its stdin source open."""

Claimed = tuple[ProcessRecord, Lease | None]
"""A registration made and claimed (no lease: it was known already)."""


def through(
    items: Sequence[T | Exception], step: Callable[[list[T]], Sequence[R | Exception]]
) -> list[R | Exception]:
    """``step`` of the items that are not errors yet, each answer back in its item's place,
    each error kept in its own."""
    answers = iter(step([item for item in items if not isinstance(item, Exception)]))
    return [item if isinstance(item, Exception) else next(answers) for item in items]


def start_all(
    starter: Starter,
    start_service: Callable[[StartRequest, int | None], ProcessHandle],
    items: Sequence[Opened | Exception],
) -> list[ProcessHandle | Exception]:
    """Each item's start, its own outcome in its place (an error stays as it is): one with
    a restart policy as a service of its own (``start_service``, §15), the others together."""
    services = [
        None
        if isinstance(item, Exception) or item[0].restart is None
        else outcome_of(functools.partial(start_service, *item))
        for item in items
    ]
    plain = [item for item, service in zip(items, services, strict=True) if service is None]
    started = iter(through(plain, functools.partial(_start_plain, starter)))
    return [next(started) if service is None else service for service in services]


def _start_plain(starter: Starter, items: Sequence[Opened]) -> list[ProcessHandle | Exception]:
    """The writes of ``Starter.launch`` for all of ``items`` at once; each its own outcome."""
    prepared = _prepare_all(starter, [request for request, _ in items])
    results: list[ProcessHandle | Exception] = []
    spawned: list[tuple[int, Run, bool]] = []
    try:
        for (request, source), made in zip(items, prepared, strict=True):
            run = made if isinstance(made, Exception) else _spawned(starter, request, made, source)
            if isinstance(run, Exception):
                results.append(run)
                continue
            spawned.append((len(results), run, request.background))
            results.append(run.process_handle)
    except BaseException:  # e.g. Ctrl-C: no child spawned so far may go on unowned
        for _, run, _ in spawned:
            starter.abort(run)
        raise
    live = _go_live_all(starter, [(run, background) for _, run, background in spawned])
    for (index, _, _), error in zip(spawned, live, strict=True):
        if error is not None:
            results[index] = error
    return results


def _spawned(
    starter: Starter, request: StartRequest, prepared: Prepared, source: int | None
) -> Run | Exception:
    return outcome_of(functools.partial(starter.spawn, request, prepared, source))


def _prepare_all(starter: Starter, requests: Sequence[StartRequest]) -> list[Prepared | Exception]:
    """Register, claim and stamp each: everything durable before the spawn, in one write."""
    made = [outcome_of(functools.partial(starter.registration, r)) for r in requests]
    since = time.monotonic()
    claimed = through(made, functools.partial(_register_all, starter))
    return [
        c
        if isinstance(c, Exception)
        else outcome_of(functools.partial(_ticketed, starter, r, c, since))
        for r, c in zip(requests, claimed, strict=True)
    ]


def _ticketed(starter: Starter, request: StartRequest, claimed: Claimed, since: float) -> Prepared:
    return starter.ticketed(request, starter.kept(*claimed, since))


def _register_all(
    starter: Starter, registrations: Sequence[ProcessRegistration]
) -> Sequence[Claimed | Exception]:
    return starter.registry.register_claimed_all(registrations, starter.owner, starter.ttl_ms)


def _go_live_all(starter: Starter, runs: Sequence[tuple[Run, bool]]) -> list[Exception | None]:
    """Record each child running (one write for all) and hand it to its owner; a child
    whose write failed is killed at once and its terminal recorded, its error returned."""
    writes = [starter.running_write(run, background) for run, background in runs]
    try:
        records = starter.registry.write_all(writes)
    except BaseException:
        for run, _ in runs:
            starter.abort(run)
        raise
    errors: list[Exception | None] = []
    for (run, _), record in zip(runs, records, strict=True):
        if isinstance(record, Exception):
            starter.abort(run)
            errors.append(record)
            continue
        errors.append(outcome_of(functools.partial(starter.live, run, record)))
    return errors
