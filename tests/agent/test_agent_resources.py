"""Resources per process (docs/design.md §18.10): the agent samples each running child's tree,
`ps --resources` shows the latest sample, and the last one is kept on the record once the run
ended, so `show` tells how big a finished job was.

A real agent samples every 0.2 s (``PROCLEDGER_RESOURCE_INTERVAL_S``); a real child allocates
and touches 200 MiB. Every child is cleaned up by exact pid (``procs``; the agent's tree by the
autouse fixture).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from _shared import Processes, run_cli, wait_until
from procledger import (
    NotFound,
    Originator,
    ProcessInput,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)
from procledger.agent.resources import INTERVAL_ENV
from procledger.domain.registration import env_ref_for

from .live_agent import DEADLINE, LiveAgent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the agent is Linux only")

MIB = 2**20
ALLOCATES = (
    "import time\n"
    "block = bytearray(200 * 1024 * 1024)\n"
    "for at in range(0, len(block), 4096):\n"
    "    block[at] = 1\n"
    "print('allocated', flush=True)\n"
    "time.sleep(300)\n"
)
"""A child whose RSS is at least 200 MiB once it says ``allocated``, and stays so."""


@pytest.fixture
def agent(tmp_path: Path) -> LiveAgent:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    agent.start(**{INTERVAL_ENV: "0.2"})
    return agent


def live_sample(agent: LiveAgent, process_id: str) -> dict[str, Any] | None:
    ran = agent.cli("ps", "--resources", "--json")
    assert ran.returncode == 0, ran.stderr
    sample: dict[str, Any] | None = orjson.loads(ran.stdout)["resources"].get(process_id)
    return sample


def test_a_child_that_allocates_200_mib_shows_it_live_and_on_its_record_once_ended(
    agent: LiveAgent, procs: Processes
) -> None:
    ran = agent.run_background(sys.executable, "-c", ALLOCATES)
    assert ran.returncode == 0, ran.stderr
    process_id = ran.stdout.strip()
    pid = agent.record(process_id).os_pid
    assert pid is not None
    procs.add(pid)
    wait_until(lambda: "allocated" in agent.logs(process_id), DEADLINE, "the allocation")

    def big() -> dict[str, Any] | None:
        sample = live_sample(agent, process_id)
        return sample if sample and sample["rss_bytes"] >= 200 * MIB else None

    sample = wait_until(big, DEADLINE, "a sample of 200 MiB")
    assert sample["threads"] >= 1
    assert sample["open_files"] >= 3  # stdin, stdout, stderr
    table = agent.cli("ps", "--resources")
    header, row = table.stdout.splitlines()[0].split("\t"), table.stdout.splitlines()[1]
    assert header[-5:] == ["CPU", "RSS", "FILES", "THREADS", "COMMAND"]
    rss = row.split("\t")[header.index("RSS")]
    assert rss.endswith("M"), row
    assert float(rss[:-1]) >= 200, row

    assert agent.cli("stop", process_id).returncode == 0
    used = wait_until(lambda: agent.record(process_id).resources, DEADLINE, "resources recorded")
    assert used.peak_rss_bytes >= 200 * MIB
    assert used.cpu_s > 0
    assert agent.record(process_id).status.value != "running"
    shown = agent.cli("show", process_id)
    line = next(line for line in shown.stdout.splitlines() if line.startswith("resources"))
    assert "peak RSS 2" in line, line
    assert "M," in line, line
    assert "resources_used" in agent.event_kinds(process_id)
    assert live_sample(agent, process_id) is None  # ended: no live sample


def test_a_restarted_service_s_next_attempt_is_sampled_too(
    agent: LiveAgent, procs: Processes, tmp_path: Path
) -> None:
    """A restart's attempt is started by the service, not by an awaited start: it runs on an
    owner thread, and is sampled as the first attempt was."""
    flag = tmp_path / "second"
    script = f"[ -e {flag} ] && exec sleep 300; touch {flag}; exit 1"
    ran = agent.cli(
        "run", "--background", "--restart", "on-failure", "--name", "svc",
        "--", "sh", "-c", script,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    second = f"{ran.stdout.strip()}.2"
    record = wait_until(lambda: _running(agent, second), DEADLINE, "the second attempt to run")
    procs.add(record.os_pid)
    sample = wait_until(lambda: live_sample(agent, second), DEADLINE, "its sample")
    assert sample["threads"] == 1
    assert sample["rss_bytes"] > 0


def _running(agent: LiveAgent, process_id: str) -> Any:
    try:
        record = agent.record(process_id)
    except NotFound:  # not registered yet
        return None
    return record if record.os_pid is not None and not record.is_terminal else None


SHORT = (
    "block = bytearray(150 * 1024 * 1024)\n"
    "for at in range(0, len(block), 4096):\n"
    "    block[at] = 1\n"
)
"""A child that peaks at 150 MiB and ends at once: a sample every 2 s rarely sees it."""


def test_a_run_too_short_to_sample_has_what_the_kernel_counted(tmp_path: Path) -> None:
    """The agent reaps its child with ``wait4``: the peak RSS and CPU time the kernel counted
    reach the record whether or not a sample ever saw the run."""
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    agent.start(**{INTERVAL_ENV: "2"})
    ran = agent.run_background(sys.executable, "-c", SHORT)
    assert ran.returncode == 0, ran.stderr
    process_id = ran.stdout.strip()
    used = wait_until(lambda: agent.record(process_id).resources, DEADLINE, "resources recorded")
    assert used.peak_rss_bytes >= 150 * MIB
    assert used.cpu_s > 0
    assert agent.record(process_id).exit_code == 0
    shown = agent.cli("show", process_id)
    line = next(line for line in shown.stdout.splitlines() if line.startswith("resources"))
    assert "peak RSS 1" in line, line
    if used.open_files is None:  # never sampled: said so
        assert line.endswith("(counted at exit)"), line
    history = next(row for row in shown.stdout.splitlines() if "\tresources_used\t" in row)
    assert "peak_rss=1" in history, history


def test_without_an_agent_the_resource_columns_say_dash(tmp_path: Path) -> None:
    """A running record (this test's own pid: nothing is started) and no agent to ask."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    registry = open_registry(url)
    try:
        registration = ProcessRegistration(
            id="alone",
            input=ProcessInput.command(["sleep", "300"]),
            disposition=RecoveryDisposition.owner_bound,
            originator=Originator.host(),
            env_ref=env_ref_for({"PATH": "/usr/bin"}),
        )
        registry.register(registration)
        registry.record_started("alone", os.getpid())
    finally:
        registry.close()
    ran = run_cli("ps", "--resources", url=url)
    assert ran.returncode == 0, ran.stderr
    header, row = (line.split("\t") for line in ran.stdout.splitlines()[:2])
    cells = row[header.index("CPU") : header.index("COMMAND")]
    assert cells == ["-", "-", "-", "-"]
    listed = orjson.loads(run_cli("ps", "--resources", "--json", url=url).stdout)
    assert listed["resources"] == {}
