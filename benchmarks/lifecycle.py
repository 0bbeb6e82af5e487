"""One lifecycle decision through the Process aggregate, beside building a python-statemachine
instance and sending it one event — the per-decision alternative the design rules out.

    PYTHONPATH=src python benchmarks/lifecycle.py [--rounds 7] [--decisions 4000] [--machines 300]

Each round measures, interleaved so drift hits all alike:

* ``lookup``: the table checks alone (``check_row`` + ``check_transition``), for scale;
* ``started``: ``Process.record_started`` on a fresh, registered aggregate (starting → running);
* ``completed``: ``Process.complete(exited, exit_code=0)`` on a fresh running aggregate;
* ``machine``: ``ProcessLifecycle()`` constructed, then ``send("started")``.

``started`` and ``completed`` are whole commands: validation, the table lookups, and
triggering the event (eventsourcing builds it and applies it to the aggregate). Fresh
aggregates are built outside the timed loop, one per decision. Costs are per decision, medians
over the rounds. Target (issue 2): an aggregate decision at least 50× cheaper than a machine
per decision. The exit status is 0 either way: this prints figures, it is not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from procledger.domain.leases import CompletionAuthority
from procledger.domain.lifecycle import ProcessLifecycle, check_row, check_transition
from procledger.domain.process import Process
from procledger.domain.registration import ProcessRegistration, env_ref_for
from procledger.domain.vocabulary import LifecycleKind, ProcessState, TerminalReason

TARGET_RATIO = 50.0
AUTHORITY = CompletionAuthority.workflow_key("bench")


def _registration(index: int) -> ProcessRegistration:
    return ProcessRegistration.model_validate(
        {
            "id": f"bench-{index}",
            "input": {"type": "command", "argv": ["/bin/true"]},
            "disposition": "owner_bound",
            "originator": {"type": "host"},
            "env_ref": env_ref_for({"PATH": "/bin"}),
        }
    )


def _fresh(count: int, *, started: bool) -> list[Process]:
    """``count`` registered aggregates (optionally running), their events already collected."""
    processes = []
    for index in range(count):
        process = Process.register(_registration(index), at_ms=1)
        if started:
            process.record_started(2, at_ms=2, event_id=None)
        process.collect_events()
        processes.append(process)
    return processes


def time_lookup(count: int) -> float:
    kind, state, reason = LifecycleKind.completed, ProcessState.exited, TerminalReason.exited
    running = ProcessState.running
    begin = time.perf_counter_ns()
    for _ in range(count):
        check_row(kind, state, reason)
        check_transition(running, kind, state)
    return (time.perf_counter_ns() - begin) / count


def time_started(count: int) -> float:
    processes = _fresh(count, started=False)
    begin = time.perf_counter_ns()
    for process in processes:
        process.record_started(10, at_ms=11, event_id=None)
    elapsed = time.perf_counter_ns() - begin
    assert all(p.state.value == "running" for p in processes)
    return elapsed / count


def time_completed(count: int) -> float:
    processes = _fresh(count, started=True)
    begin = time.perf_counter_ns()
    for process in processes:
        process.complete(
            "exited",
            "exited",
            exit_code=0,
            diagnostic=None,
            value=None,
            event_id=None,
            authority=AUTHORITY,
            at_ms=12,
        )
    elapsed = time.perf_counter_ns() - begin
    assert all(p.state.value == "exited" for p in processes)
    return elapsed / count


def time_machine(count: int) -> float:
    begin = time.perf_counter_ns()
    for _ in range(count):
        machine = ProcessLifecycle()
        machine.send("started")
    elapsed = time.perf_counter_ns() - begin
    assert machine.current_state_value == "running"
    return elapsed / count


def measure(rounds: int, decisions: int, machines: int) -> dict[str, float]:
    """Median nanoseconds per decision for each contender."""
    runs: dict[str, Callable[[], float]] = {
        "lookup": lambda: time_lookup(decisions * 10),
        "started": lambda: time_started(decisions),
        "completed": lambda: time_completed(decisions),
        "machine": lambda: time_machine(machines),
    }
    for run in runs.values():  # warm-up: imports, caches, first-call costs
        run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(run())
    return {name: statistics.median(values) for name, values in samples.items()}


def _us(nanoseconds: float) -> str:
    return f"{nanoseconds / 1000:10.2f} µs"


ROWS = {
    "lookup": "table lookups only (check_row + check_transition)",
    "started": "aggregate record_started (command → event)",
    "completed": "aggregate complete(exited) (command → event)",
    "machine": "ProcessLifecycle() + send('started')",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--decisions", type=int, default=4000, help="aggregates per round")
    parser.add_argument("--machines", type=int, default=300, help="machines per round")
    args = parser.parse_args(argv)
    medians = measure(args.rounds, args.decisions, args.machines)
    print(f"lifecycle decision cost per decision, median of {args.rounds} rounds")
    for name, label in ROWS.items():
        print(f"  {label:52} {_us(medians[name])}")
    print(f"machine per decision / aggregate (target ≥ {TARGET_RATIO:.0f}×)")
    for name in ("lookup", "started", "completed"):
        ratio = medians["machine"] / medians[name]
        verdict = "meets" if ratio >= TARGET_RATIO else "misses"
        print(f"  {name:10} {ratio:10.1f}×  {verdict} the target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
