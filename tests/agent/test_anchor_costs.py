"""The anchor stays tiny: the standard library only, a few MB, no CPU while idle (issue 28).

Bounds are generous (a regression by a factor, not a benchmark); the figures measured when
this was written are in each test's docstring."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from _shared import Processes, run_python, wait_until

from .conftest import AnchorRun, ppid_of

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a child subreaper is Linux's")

ALLOWED_OURS = {
    "procledger.agent",
    "procledger.agent.exit_journal",
    # Importing anything under procledger runs the package root, which loads eagerly only the
    # errors and the vocabulary's enums (standard library only; tests/test_startup.py).
    "procledger",
    "procledger.domain",
    "procledger.domain.errors",
    "procledger.domain.vocabulary",
}


TRIMMED = {"argparse", "dataclasses", "pathlib", "shutil", "inspect", "ctypes"}
"""Standard modules the anchor avoids: ~1 MB each (``ctypes`` is loaded only to become a
subreaper, after ``--help`` would have returned)."""
LOADED = """
import runpy, sys
before = set(sys.modules)
sys.argv = ["anchor", "--help"]
try:
    runpy.run_module("procledger.agent.anchor", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
print("--- loaded:", *sorted(set(sys.modules) - before - {"runpy"}))
"""
"""What ``python -m procledger.agent.anchor --help`` loads beyond the interpreter's start-up:
``sys.modules`` compared, which (unlike ``-X importtime``) lists no import that failed."""


def test_the_anchor_imports_the_standard_library_and_its_own_modules_only() -> None:
    done = run_python(LOADED)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split("--- loaded:")[1].split())
    ours = {name for name in loaded if name.split(".")[0] == "procledger"}
    assert ours <= ALLOWED_OURS
    assert "procledger.agent.exit_journal" in ours
    others = {name.split(".")[0] for name in loaded - ours}
    assert others - set(sys.stdlib_module_names) == set()
    assert others & TRIMMED == set()


def resident_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith("VmRSS:")]
    return int(line.split()[1])


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (fields 14 and 15 of stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def test_the_anchor_is_a_few_mb(anchor: AnchorRun) -> None:
    """Measured: 12.3 MB RSS (6.2 MB anonymous) on Python 3.11, where a bare ``python -c
    'import time; time.sleep(9)'`` is 8.6 MB; the package root's eager imports are ~1.2 MB."""
    anchor.start()
    anchor.await_starts(1)
    rss_kib = resident_kib(anchor.pid)
    print(f"anchor RSS: {rss_kib / 1024:.1f} MB")
    assert rss_kib < 20 * 1024


def test_an_idle_anchor_with_twenty_orphans_uses_no_cpu(
    anchor: AnchorRun, procs: Processes
) -> None:
    """Measured: 0 ticks over a second. It sleeps in ``sigwaitinfo``: no timer, no polling."""
    pidfiles = [procs.pidfile(f"child-{index}.pid") for index in range(20)]
    spawn = [arg for path in pidfiles for arg in ("--spawn", f"echo $$ > {path}; exec sleep 3600")]
    anchor.start(*spawn)
    anchor.await_spawned()
    written = lambda: all(p.exists() and p.read_text().strip() for p in pidfiles)  # noqa: E731
    wait_until(written, 30, "the children's pids")
    children = [procs.add(int(path.read_text())) for path in pidfiles]
    first_agent = anchor.starts()[0][0]
    os.kill(first_agent, 9)
    anchor.await_record(first_agent, agent=True)
    anchor.await_starts(2)
    assert all(ppid_of(child.pid) == anchor.pid for child in children)
    before = cpu_ticks(anchor.pid)
    time.sleep(1.0)  # the measured interval, not a synchronisation
    spent = cpu_ticks(anchor.pid) - before
    print(f"anchor CPU over 1 s idle with 20 orphans: {spent} ticks of {os.sysconf('SC_CLK_TCK')}")
    assert spent <= 1
