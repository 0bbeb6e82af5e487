"""The resource sampler (docs/design.md §18.10) on real process trees: a tree's counters are
summed over its members, the peak RSS never goes down, and an ended run's last sample is handed
back once. Every process is killed by exact pid (``procs``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from _shared import Processes, wait_until
from procledger.agent.resources import (
    DEFAULT_INTERVAL_S,
    INTERVAL_ENV,
    ResourceSampler,
    interval_s,
)
from procledger.supervisor.os_seam import Usage

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the agent is Linux only")

TREE = "sleep 300 & sleep 300 & wait"
"""A shell with two children: three processes, one thread each."""


@pytest.fixture
def tree(procs: Processes) -> Iterator[psutil.Process]:
    shell = subprocess.Popen(["sh", "-c", TREE])
    root = procs.add(shell.pid)
    found = wait_until(lambda: len(root.children()) == 2, 20.0, "the shell's two children")
    assert found
    for child in root.children():
        procs.add(child.pid)
    yield root
    for member in [*root.children(), root]:
        member.kill()
    shell.wait(timeout=20)


def test_a_tree_is_summed_over_its_members(tree: psutil.Process) -> None:
    sampler = ResourceSampler()
    assert sampler.sample({"p": tree.pid}) == {}
    sample = sampler.latest()["p"]
    members = [tree, *tree.children()]
    assert sample.threads == 3
    assert sample.rss_bytes >= sum(m.memory_info().rss for m in members) // 2
    assert sample.rss_bytes > tree.memory_info().rss
    assert sample.peak_rss_bytes == sample.rss_bytes
    assert sample.open_files >= 3


def test_an_ended_run_is_handed_back_once_with_its_peak(tree: psutil.Process) -> None:
    sampler = ResourceSampler()
    sampler.sample({"p": tree.pid})
    first = sampler.latest()["p"]
    ended = sampler.sample({})
    assert list(ended) == ["p"]
    assert ended["p"] == first.used()
    assert ended["p"].open_files == first.open_files
    assert sampler.sample({}) == {}
    assert sampler.latest() == {}


def test_a_run_whose_child_is_gone_keeps_its_last_sample(procs: Processes) -> None:
    child = subprocess.Popen(["sleep", "300"])
    procs.add(child.pid)
    sampler = ResourceSampler()
    sampler.sample({"p": child.pid})
    before = sampler.latest()["p"]
    child.kill()
    child.wait(timeout=20)
    sampler.sample({"p": child.pid})  # not settled yet: still among the running
    assert sampler.latest()["p"] == before
    assert sampler.sample({})["p"] == before.used()


def test_what_the_kernel_counted_joins_the_last_sample(procs: Processes) -> None:
    """The larger CPU time and peak of the sample and of the reaping's count; a count that
    comes while the run is still among the running waits for the round that sees it end."""
    child = subprocess.Popen(["sleep", "300"])
    procs.add(child.pid)
    sampler = ResourceSampler()
    sampler.sample({"p": child.pid})
    sampler.reaped("p", Usage(cpu_s=1000.0, peak_rss_bytes=1))  # more CPU, a smaller peak
    assert sampler.sample({"p": child.pid}) == {}  # not ended yet: the count waits
    last = sampler.latest()["p"]
    child.kill()
    child.wait(timeout=20)
    used = sampler.sample({})["p"]
    assert (used.cpu_s, used.peak_rss_bytes) == (1000.0, last.peak_rss_bytes)
    assert used.open_files == last.open_files


def test_a_run_never_sampled_has_what_the_kernel_counted_alone() -> None:
    sampler = ResourceSampler()
    sampler.reaped("short", Usage(cpu_s=0.25, peak_rss_bytes=5 << 20))
    used = sampler.sample({})["short"]
    assert (used.cpu_s, used.peak_rss_bytes, used.open_files, used.threads) == (
        0.25,
        5 << 20,
        None,
        None,
    )
    assert sampler.sample({}) == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.2", 0.2), ("0", 0.05), ("soon", DEFAULT_INTERVAL_S), ("", DEFAULT_INTERVAL_S)],
)
def test_the_interval_comes_from_the_environment(text: str, expected: float) -> None:
    assert interval_s({INTERVAL_ENV: text}) == expected


def test_with_no_child_a_round_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle agent's rounds cost nothing: the process table is not read at all."""
    from procledger.agent import resources

    def unreadable() -> None:
        raise AssertionError("the process table was read")

    monkeypatch.setattr(resources, "_process_table", unreadable)
    assert ResourceSampler().sample({}) == {}
