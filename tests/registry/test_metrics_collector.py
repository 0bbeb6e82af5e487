"""The metrics' collector against a real ledger, SQLite and PostgreSQL (docs/design.md §16,
Metrics): the gauges say what the ledger holds now -- a pruned record leaves them at the next
scrape -- and the counters keep what happened, pruned or not."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from procledger import LeaseOwner, ProcessRegistry, Supervisor
from procledger.application.metrics import LedgerCollector

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(collectors: CollectorRegistry) -> Samples:
    text = generate_latest(collectors).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def run_all(registry: ProcessRegistry, owner: LeaseOwner, codes: list[int]) -> None:
    with Supervisor(registry, owner=owner) as sup:
        for code in codes:
            sup.wait(sup.start(["sh", "-c", f"exit {code}"], capture=False), timeout=30)


EXITED = ("procledger_processes", (("state", "exited"),))
FAILED_ENDS = ("procledger_process_ends_total", (("reason", "exited"), ("state", "exited")))


def test_a_prune_leaves_the_gauges_and_not_the_counters(
    registry: ProcessRegistry, owner: LeaseOwner
) -> None:
    collectors = CollectorRegistry()
    collectors.register(LedgerCollector(registry))
    run_all(registry, owner, [0, 3, 4])
    before = scrape(collectors)
    assert (before[EXITED], before[FAILED_ENDS]) == (3, 3)
    report = registry.prune_terminal(registry.now_ms() + 1)
    assert len(report.processes) == 3
    run_all(registry, owner, [5])
    after = scrape(collectors)
    assert after[EXITED] == 1  # what the ledger holds now
    assert after[FAILED_ENDS] == 4  # what happened, the pruned three included
    assert after["procledger_feed_lag_changes", ()] == 0
    fresh = CollectorRegistry()  # an exporter started afresh sees only what is held
    fresh.register(LedgerCollector(registry))
    assert scrape(fresh)[FAILED_ENDS] == 1
