"""Prometheus metrics computed from the ledger when scraped (docs/design.md §16, Metrics).

Counters an exporter increments in memory lose what happened while it was down, and miss a
restart that comes and goes between two scrapes; the ledger already holds every end and every
attempt. So nothing here is incremented: each scrape reads the change feed since the last one
into one small summary per record, and every number is a sum over those summaries. A fresh
exporter reads the feed from the start and arrives at the same totals, and a counter can only
grow, because a record's contribution is fixed once it has ended.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from procledger.application.retention import PrunedSince
from procledger.domain.errors import OptionError
from procledger.domain.records import ProcessRecord
from procledger.domain.vocabulary import ProcessState, ProcessStatus

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry


class MetricsAddressError(OptionError):
    """A metrics address (``--metrics``) that names no host and port."""


FEED_PAGE = 1000
"""Records read per page of the change feed: a large first scrape in bounded pieces."""
STREAMS = ("stdout", "stderr")


@dataclass(frozen=True, slots=True)
class _Seen:
    """What one record adds to the metrics: a few words and numbers, not the record."""

    state: str
    status: str
    reason: str
    service: str | None
    first_id: str | None
    attempt: int
    kept: tuple[int, int]
    dropped: tuple[int, int]


def _seen(record: ProcessRecord) -> _Seen:
    output = record.output
    kept = (output.stdout.kept, output.stderr.kept) if output else (0, 0)
    dropped = (output.stdout.dropped, output.stderr.dropped) if output else (0, 0)
    first = None
    if record.attempt is not None:
        first = record.attempt_of or record.id
    return _Seen(
        state=record.state.value,
        status=record.status.value,
        reason=record.reason.value if record.reason is not None else "",
        service=record.name or first,
        first_id=first,
        attempt=record.attempt or 0,
        kept=kept,
        dropped=dropped,
    )


class LedgerCollector(Collector):
    """The ledger's metrics, caught up with its change feed at every scrape.

    A record the ledger prunes leaves the gauges (they say what the ledger holds now) and
    stays in the counters (they keep what happened): each scrape asks ``PrunedSince`` which
    of the records seen are gone (one indexed read unless there was a new prune).
    """

    def __init__(self, registry: ProcessRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()  # two scrapes at once read the feed once each, in turn
        self._cursor = 0
        self._pruned = PrunedSince(registry)
        self._seen: dict[str, _Seen] = {}
        self._gone: list[_Seen] = []  # ended records the ledger no longer holds

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not read the ledger."""
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._forget_pruned()
            self._catch_up()
            lag = max(0, self._registry.latest_change_seq() - self._cursor)
            held = list(self._seen.values())
            happened = held + self._gone
        yield from _process_gauges(held)
        yield _ends(happened)
        yield _restarts(happened)
        yield from _output_bytes(happened)
        lag_gauge = GaugeMetricFamily(
            "procledger_feed_lag_changes",
            "Change-feed positions written after the newest one these metrics have read.",
        )
        lag_gauge.add_metric([], lag)
        yield lag_gauge

    def _forget_pruned(self) -> None:
        for gone in self._pruned.gone(list(self._seen)):
            self._gone.append(self._seen.pop(gone))

    def _catch_up(self) -> None:
        while True:
            records, cursor = self._registry.changes_since(self._cursor, FEED_PAGE)
            for record in records:
                self._seen[record.id] = _seen(record)
            self._cursor = cursor.value
            if len(records) < FEED_PAGE:
                return


def _process_gauges(seen: list[_Seen]) -> Iterator[Metric]:
    states = Counter(s.state for s in seen)
    by_state = GaugeMetricFamily(
        "procledger_processes", "Processes in the ledger by state.", labels=["state"]
    )
    for state in ProcessState:
        by_state.add_metric([state.value], states[state.value])
    yield by_state
    statuses = Counter(s.status for s in seen)
    by_status = GaugeMetricFamily(
        "procledger_processes_by_status",
        "Processes in the ledger by coarse status.",
        labels=["status"],
    )
    for status in ProcessStatus:
        by_status.add_metric([status.value], statuses[status.value])
    yield by_status


def _ends(seen: list[_Seen]) -> Metric:
    ends = Counter((s.state, s.reason) for s in seen if ProcessState(s.state).is_terminal)
    family = CounterMetricFamily(
        "procledger_process_ends",
        "Processes that ended, by terminal state and reason (from their terminal records).",
        labels=["state", "reason"],
    )
    for (state, reason), count in sorted(ends.items()):
        family.add_metric([state, reason], count)
    return family


def _restarts(seen: list[_Seen]) -> Metric:
    newest: dict[str, int] = {}
    service_of: dict[str, str] = {}
    for s in seen:
        if s.first_id is not None and s.service is not None:
            newest[s.first_id] = max(newest.get(s.first_id, 0), s.attempt)
            service_of[s.first_id] = s.service
    restarts: Counter[str] = Counter()
    for first_id, attempt in newest.items():
        restarts[service_of[first_id]] += max(0, attempt - 1)
    family = CounterMetricFamily(
        "procledger_service_restarts",
        "Restarts of each service: its attempts in the ledger less its first, by name "
        "(or first attempt's id when unnamed).",
        labels=["service"],
    )
    for service, count in sorted(restarts.items()):
        family.add_metric([service], count)
    return family


def _output_bytes(seen: list[_Seen]) -> Iterator[Metric]:
    for kind, helped in (("kept", "kept on disk"), ("dropped", "dropped (oldest first)")):
        family = CounterMetricFamily(
            f"procledger_output_{kind}_bytes",
            f"Bytes of captured output {helped}, from the output summaries of ended runs.",
            labels=["stream"],
        )
        for index, stream in enumerate(STREAMS):
            family.add_metric([stream], sum(getattr(s, kind)[index] for s in seen))
        yield family


def metrics_registry(registry: ProcessRegistry) -> CollectorRegistry:
    """A Prometheus registry of the ledger's metrics and this process's own memory and CPU
    (``process_resident_memory_bytes``, ``process_cpu_seconds_total``, …)."""
    collectors = CollectorRegistry()
    collectors.register(LedgerCollector(registry))
    ProcessCollector(registry=collectors)
    return collectors


def metrics_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` as the host and port to serve metrics
    on; without a host, loopback only: the metrics name services, so other machines see them
    only when asked for by name.

    Raises:
        MetricsAddressError: ``text`` is not such an address.
    """
    host, colon, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]") if colon else ""
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise MetricsAddressError("--metrics", f"{text!r} is not HOST:PORT (a port 1-65535)")
    return host or "127.0.0.1", int(port)


__all__ = ["LedgerCollector", "MetricsAddressError", "metrics_address", "metrics_registry"]
