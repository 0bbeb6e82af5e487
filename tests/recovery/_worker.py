"""Recovery worker OS processes for the recovery tests (run as a script, never imported by pytest).

``python _worker.py URL PARAMS_JSON OWNER_ID...`` imports procledger once, then forks one worker
process per owner id (so ten workers cost one interpreter start-up, not ten). Each worker opens
its own registry and writes ``ready INDEX PID``; when this process reads a line on stdin (the
start signal) it releases them all at once; each runs one ``sweep`` (or ``drain``) with the
default runner and writes ``report INDEX JSON``. This process exits once every worker has
ended: 0 if all exited 0, else 1. Every line is one ``write`` (shorter than a pipe buffer), so
lines from several workers never interleave.

PARAMS: ``ttl_ms``, ``renew_ms``, ``liveness`` (``local``: provably dead once the worker is gone;
``opaque``: never provably dead), ``mode`` (``sweep`` or ``drain``).
"""

from __future__ import annotations

import os
import sys
import traceback
import uuid
from typing import Any

import orjson

from procledger import LeaseOwner, LeaseTimings, open_registry
from procledger.recovery import RecoveryWorker


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def work(url: str, params: dict[str, Any], index: int, owner_id: str, start: int) -> None:
    if params.get("liveness", "local") == "local":
        owner = LeaseOwner.local_process(owner_id)
    else:
        owner = LeaseOwner(owner_id=owner_id, incarnation_id=uuid.uuid4().hex)
    registry = open_registry(url)
    try:
        timings = LeaseTimings(ttl_ms=params["ttl_ms"], renew_ms=params["renew_ms"])
        worker = RecoveryWorker(registry, owner, timings=timings)
        say(f"ready {index} {os.getpid()}")
        os.read(start, 1)
        report = worker.drain() if params.get("mode") == "drain" else worker.sweep()
        say(f"report {index} {report.model_dump_json()}")
    finally:
        registry.close()


def main() -> int:
    url, raw, *owner_ids = sys.argv[1:]
    params = orjson.loads(raw)
    gates: list[int] = []
    children: list[int] = []
    for index, owner_id in enumerate(owner_ids):
        start, gate = os.pipe()
        pid = os.fork()
        if pid == 0:
            for other in gates:
                os.close(other)
            os.close(gate)
            code = 0
            try:
                work(url, params, index, owner_id, start)
            except BaseException:
                traceback.print_exc()
                sys.stderr.flush()
                code = 1
            os._exit(code)
        os.close(start)
        gates.append(gate)
        children.append(pid)
    sys.stdin.readline()
    for gate in gates:
        os.write(gate, b"g")
        os.close(gate)
    statuses = [os.waitpid(pid, 0)[1] for pid in children]
    return 0 if all(status == 0 for status in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
