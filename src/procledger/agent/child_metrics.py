"""What each running child uses, on the agent's ``/metrics`` (docs/design.md §18.10).

The names are OpenTelemetry's process conventions as Prometheus spells them
(``process.memory.usage`` → ``process_memory_usage_bytes``, ``process.cpu.time`` →
``process_cpu_time_seconds_total``, ``process.thread.count``,
``process.open_file_descriptor.count``), one series per running child labelled by its process
id and name: a scrape reads the sampler's latest samples from memory, never ``/proc``, so it
costs the same however often Prometheus asks. The agent's own memory and CPU keep
``prometheus_client``'s unlabelled ``process_*`` names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from procledger.agent.resources import ResourceSampler, Sample
from procledger.domain.errors import ProcledgerError

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

LABELS = ["process_id", "name"]


class ChildResourcesCollector(Collector):
    """The sampler's latest sample of each running child, as Prometheus series."""

    def __init__(self, sampler: ResourceSampler, registry: ProcessRegistry) -> None:
        self._sampler = sampler
        self._registry = registry
        self._names: dict[str, str] = {}  # a run's name never changes: read once per run

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not read the ledger."""
        return []

    def collect(self) -> Iterator[Metric]:
        latest = self._sampler.latest()
        self._names = {pid: self._names.get(pid) or self._name_of(pid) for pid in latest}
        families = (
            ("process_memory_usage_bytes", "RSS of the child's process tree.", "rss_bytes"),
            ("process_thread_count", "Threads of the child's process tree.", "threads"),
            (
                "process_open_file_descriptor_count",
                "Open descriptors of the child's process tree.",
                "open_files",
            ),
        )
        for name, text, field in families:
            gauge = GaugeMetricFamily(name, text, labels=LABELS)
            for pid, sample in latest.items():
                gauge.add_metric([pid, self._names[pid]], getattr(sample, field))
            yield gauge
        yield _cpu(latest, self._names)

    def _name_of(self, process_id: str) -> str:
        try:
            return self._registry.get(process_id).name or ""
        except ProcledgerError:  # pruned or unreadable: the id alone still says which
            return ""


def _cpu(latest: dict[str, Sample], names: dict[str, str]) -> Metric:
    counter = CounterMetricFamily(
        "process_cpu_time_seconds",
        "CPU seconds (user + system) of the child's process tree.",
        labels=LABELS,
    )
    for pid, sample in latest.items():
        counter.add_metric([pid, names[pid]], sample.cpu_s)
    return counter
