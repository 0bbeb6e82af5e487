"""Adoption identity at scale (docs/design.md §18.4): ``scan`` of N live children, each
carrying its run marker (the worst case: every record costs a stat, an environment read, a
second stat, a pidfd and a third stat), and of N records whose pids are gone. Prints both.

Run: ``PYTHONPATH=src python benchmarks/agent_adoption.py [N]`` (Linux; N pidfds are opened,
so ``ulimit -n`` must allow them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from procledger.agent.adoption import Adopted, scan, this_host_id
from procledger.domain.records import OsFacts
from procledger.supervisor import os_seam


def main(count: int) -> None:
    """Start ``count`` marked children, scan them, then scan as many gone pids."""
    host = this_host_id()
    assert host is not None, "/proc cannot name this host"
    children: list[subprocess.Popen[bytes]] = []
    try:
        began = time.perf_counter()
        for index in range(count):
            env = {**os.environ, os_seam.RUN_MARKER: f"run-{index}"}
            children.append(subprocess.Popen(["sleep", "600"], env=env))
        print(f"started {count} children in {time.perf_counter() - began:.2f} s")
        records = []
        for child in children:
            stat = os_seam.proc_stat(child.pid)
            assert stat is not None
            records.append(OsFacts(pid=child.pid, pgid=child.pid, start_time=stat[1], host_id=host))
        markers = {record: f"run-{index}" for index, record in enumerate(records)}
        began = time.perf_counter()
        results = scan(records, markers)
        took = time.perf_counter() - began
        adopted = [r for _, r in results if isinstance(r, Adopted)]
        print(f"scan of {count} live children: {took:.3f} s, {len(adopted)} adopted")
        for result in adopted:
            result.close()
    finally:
        for child in children:
            child.kill()
            child.wait()
    began = time.perf_counter()
    results = scan(records, markers)
    print(f"scan of {count} gone pids: {time.perf_counter() - began:.3f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
