"""``GET /metrics`` (docs/design.md §16, Metrics): numbers computed from the ledger when
scraped, so a counter equals what the ledger holds, never goes back between scrapes, and is the
same from an exporter started afresh; and the host agent's own ``/metrics`` when asked (§18.5).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.agent.live_agent import LiveAgent

from _shared import Processes, wait_until
from procledger import ProcessRecord, RestartPolicy
from procledger.agent.resources import INTERVAL_ENV

from .conftest import TOKEN, Server, free_port

RESTARTS = 100
FAST_LOOP = RestartPolicy(
    mode="on-failure", max_restarts=RESTARTS, window_s=3600, backoff_initial_s=0, backoff_max_s=0
)
"""A hundred restarts one straight after another, then ``crash_loop``."""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base: str, token: str | None = TOKEN) -> Samples:
    """Every sample of one scrape, by name and labels."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = httpx.get(f"{base}/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def restarts(samples: Samples, service: str) -> float:
    return samples.get(("procledger_service_restarts_total", (("service", service),)), 0.0)


def of(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (found, labels), value in samples.items() if found == name}


def test_the_counters_equal_the_ledger_across_a_hundred_restarts(
    server: Server, services: Any
) -> None:
    script = "printf 'out\\n'; printf 'err!\\n' >&2; exit 1"
    handle = services.start(script, "loop", FAST_LOOP)
    seen: list[float] = []

    def gave_up() -> bool:
        seen.append(restarts(scrape(server.base), "loop"))
        newest = services.registry.newest_attempt(handle.process_id)
        return newest.is_terminal and newest.gave_up == "crash_loop"

    wait_until(gave_up, 120, "the service to give up after its restarts")
    final = scrape(server.base)
    attempts = services.registry.attempts(handle.process_id)
    assert len(attempts) == RESTARTS + 1
    assert restarts(final, "loop") == len(attempts) - 1
    assert seen == sorted(seen), "a counter went back between scrapes"
    assert len([v for v in seen if 0 < v < RESTARTS]) >= 2, f"too few scrapes in the loop: {seen}"
    records = services.registry.list_processes({"status": "any"})
    assert_matches_ledger(final, records)
    server.kill()  # an exporter started afresh finds the same totals in the ledger
    server.start()
    again = scrape(server.base)
    for name in ("procledger_process_ends_total", "procledger_service_restarts_total"):
        assert of(again, name) == of(final, name)


def assert_matches_ledger(samples: Samples, records: list[ProcessRecord]) -> None:
    ends = Counter((r.state.value, r.reason.value if r.reason else "") for r in records)
    assert all(r.is_terminal for r in records)
    found = of(samples, "procledger_process_ends_total")
    assert found == {
        (("reason", reason), ("state", state)): n for (state, reason), n in ends.items()
    }
    assert of(samples, "procledger_processes")[(("state", "exited"),)] == len(records)
    assert of(samples, "procledger_processes_by_status")[(("status", "failed"),)] == len(records)
    summaries = [r.output for r in records if r.output is not None]
    assert len(summaries) == len(records)
    kept = of(samples, "procledger_output_kept_bytes_total")
    assert (
        kept[(("stream", "stdout"),)] == sum(s.stdout.kept for s in summaries) == 4 * len(records)
    )
    assert (
        kept[(("stream", "stderr"),)] == sum(s.stderr.kept for s in summaries) == 5 * len(records)
    )
    dropped = of(samples, "procledger_output_dropped_bytes_total")
    assert set(dropped.values()) == {0}
    assert samples["procledger_feed_lag_changes", ()] == 0


def test_metrics_need_the_token(server: Server) -> None:
    assert httpx.get(f"{server.base}/metrics", timeout=30).status_code == 401


def test_the_agent_serves_its_metrics_when_asked(ledger: str, procs: Processes) -> None:
    port = free_port()
    agent = LiveAgent(ledger)
    bad = agent.cli("agent", "start", "--metrics", "127.0.0.1:http")
    assert bad.returncode == 2, bad.stderr
    assert "--metrics" in bad.stderr
    ran = agent.cli("agent", "start", "--metrics", f"127.0.0.1:{port}", **{INTERVAL_ENV: "0.2"})
    assert ran.returncode == 0, ran.stderr
    base = f"http://127.0.0.1:{port}"

    def answered() -> Samples | None:
        try:
            return scrape(base, token=None)
        except httpx.TransportError:
            return None

    samples = wait_until(answered, 30, "the agent's /metrics")
    assert samples["process_resident_memory_bytes", ()] > 1_000_000
    assert ("process_cpu_seconds_total", ()) in samples
    assert of(samples, "procledger_processes")[(("state", "running"),)] == 0
    assert of(samples, "process_memory_usage_bytes") == {}  # no child yet

    started = agent.cli("run", "--background", "--name", "napper", "--", "sleep", "600")
    assert started.returncode == 0, started.stderr
    process_id = started.stdout.strip()
    procs.add(agent.record(process_id).os_pid)
    child = (("name", "napper"), ("process_id", process_id))

    def sampled() -> Samples | None:
        now = scrape(base, token=None)
        return now if ("process_memory_usage_bytes", child) in now else None

    samples = wait_until(sampled, 30, "the child's resources on the agent's /metrics")
    assert samples["process_memory_usage_bytes", child] > 100_000  # a sleep's RSS
    assert samples["process_thread_count", child] == 1
    assert samples["process_open_file_descriptor_count", child] >= 3
    assert ("process_cpu_time_seconds_total", child) in samples


def test_a_metrics_address_is_host_and_port_loopback_by_default() -> None:
    from procledger.application.metrics import MetricsAddressError, metrics_address

    assert metrics_address("9464") == ("127.0.0.1", 9464)
    assert metrics_address(":9464") == ("127.0.0.1", 9464)
    assert metrics_address("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert metrics_address("[::1]:9464") == ("::1", 9464)
    for bad in ("", "host", "host:0", "host:65536", "host:-1"):
        with pytest.raises(MetricsAddressError, match="--metrics"):
            metrics_address(bad)
