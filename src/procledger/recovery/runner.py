"""The default runner: what an attempt executes when the worker was given no runner of its own
(docs/design.md §3.6) -- a ``command`` input re-run as the Supervisor runs it, its output
captured and its readiness watched through the same wiring (``supervisor.wiring``; §14, §15.2),
or an ``engine`` input handed to the engine registered for its kind.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from procledger.domain.errors import ExecutionError, Interrupted, NotFound, SpawnError
from procledger.domain.leases import Lease, LeaseTimings
from procledger.domain.records import ProcessRecord
from procledger.recovery.results import Engine, RunFailed, RunResult
from procledger.supervisor import os_seam
from procledger.supervisor.capture import DEFAULT_OUTPUT_LIMIT, Capture, open_capture
from procledger.supervisor.decide import event_ids
from procledger.supervisor.execution import StopPolicy, run_streaming
from procledger.supervisor.readiness import NotReadyInTime, StopOnTimeout, watching
from procledger.supervisor.wiring import output_facts, watch_for, wire

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["DefaultRunner", "default_stop_policy"]

log = logging.getLogger("procledger.recovery")


def default_stop_policy(timings: LeaseTimings) -> StopPolicy:
    """SIGTERM, then SIGKILL after half a renewal period: a fenced-off tree stops well before
    the lease it ran under could be taken over."""
    return StopPolicy((signal.SIGTERM,), grace_s=timings.renew_ms / 2000)


class DefaultRunner:
    """Runs ``command`` inputs (environment from ``load_env``, the registration's ``cwd``;
    output captured as the Supervisor captures it, docs/design.md §14, but not passed on) and
    ``engine`` inputs with the engine registered for their kind. An unknown engine, a command
    killed by a signal nobody asked for, or ``external`` input raises, so the attempt is
    recorded ``completed/failed``; a command that ran raises ``RunFailed``, so that terminal
    (or an owner_bound run's ``runner_shutdown`` when the worker stops) still carries the
    output it captured. Engines have no stdout of their own: nothing is captured for them.

    ``output_dir``: the output root (``<state dir>/output`` when omitted); ``output_limit``:
    bytes kept per process (0: none); ``capture`` false: keep nothing."""

    def __init__(
        self,
        registry: ProcessRegistry,
        engines: Mapping[str, Engine],
        stop: StopPolicy,
        *,
        output_dir: Path | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        capture: bool = True,
    ) -> None:
        self.registry = registry
        self.engines = dict(engines)
        self.stop = stop
        self.output_dir = output_dir
        self.output_limit = output_limit
        self.capture = capture

    def __call__(self, record: ProcessRecord, lease: Lease, cancel: threading.Event) -> RunResult:
        spec = record.input
        if spec.type == "command":
            return self._command(record, cancel)
        if spec.type == "engine":
            engine = self.engines.get(spec.kind or "")
            if engine is None:
                known = ", ".join(sorted(self.engines)) or "none"
                raise LookupError(
                    f"process {record.id!r}: no engine registered for kind {spec.kind!r} "
                    f"(this worker knows: {known})"
                )
            return engine(record, lease, cancel)
        raise ValueError(f"process {record.id!r}: {spec.type} work is never executed here")

    def _environment(self, record: ProcessRecord) -> dict[str, str] | None:
        """The stored environment; ``None`` (inherit this worker's) where the process was
        started without an explicit one, whose values were never stored."""
        if not record.env_ref:
            return None
        try:
            return self.registry.load_env(record.env_ref)
        except NotFound:
            return None

    def _command(self, record: ProcessRecord, cancel: threading.Event) -> RunResult:
        """Run a command input as the Supervisor would -- its output captured and, when it
        declared readiness probes, watched: ``ready`` recorded, or stopped past its ready
        timeout (``NotReadyInTime``, recorded ``failed``/``ready_timeout``; §15.2)."""
        argv = list(record.input.argv or ())
        capture = self._capture_for(record.id)
        watch = watch_for(record.readiness, record.input.cwd or os.getcwd())
        wired = wire(capture, watch, self._environment(record), stdout=discard, stderr=discard)
        stdout = wired.stdout or discard  # never None: ``wire`` was given sinks of its own
        stop = StopOnTimeout(cancel)
        registry = self.registry
        ready = lambda probes: registry.record_ready(record.id, registry.now_ms(), probes=probes)  # noqa: E731
        marker = event_ids(record.id, record.registration_hash).run_marker
        self._stop_leftovers(record, marker)
        try:
            with watching(watch, ready, stop):
                ran = run_streaming(
                    argv, stdout, cwd=record.input.cwd, env=wired.env, stop=self.stop,
                    cancel=stop, stderr=wired.stderr, marker=marker,
                )  # fmt: skip
        except SpawnError:
            output_facts(capture, watch)
            raise  # nothing ran, so nothing was written
        except Interrupted as error:
            cause: Exception = error
            if stop.why is not None:
                cause = NotReadyInTime(f"process {record.id!r}: {stop.why}")
            raise RunFailed(cause, *output_facts(capture, watch)) from None
        except Exception as error:
            raise RunFailed(error, *output_facts(capture, watch)) from error
        finally:
            summary, tails = output_facts(capture, watch)  # closes the files on every way out
        if ran.returncode < 0:
            name = signal.Signals(-ran.returncode).name
            killed = ExecutionError(f"process {record.id!r}: {argv[0]!r} was killed by {name}")
            raise RunFailed(killed, summary, tails)
        return RunResult(exit_code=ran.returncode, output=summary, tails=tails)

    def _stop_leftovers(self, record: ProcessRecord, marker: str) -> None:
        """Stop what an earlier run of this process left running on this host before running
        it again: a worker (or supervisor) that was SIGKILLed leaves its command alive, and
        the lease this attempt holds means that run is no longer anybody's -- without this, a
        rerunnable command would run twice at once. Found by the run marker every run's
        environment carries (``os_seam.RUN_MARKER``). Said on the log, naming the pids (an
        exited terminal carries no diagnostic)."""
        stopped, survivors = os_seam.stop_marked(marker, self.stop.grace_s)
        if stopped:
            log.warning(
                "process %r: stopped what an earlier run left running on this host before "
                "running it again (OS pids %s%s)",
                record.id,
                ", ".join(map(str, stopped)),
                f"; {', '.join(map(str, survivors))} outlived SIGKILL" if survivors else "",
            )

    def _capture_for(self, process_id: str) -> Capture | None:
        """The re-run's capture, in the folder the Supervisor would use for this process (so
        ``read_output`` and ``procledger logs`` find it); None when capture is off."""
        if not self.capture:
            return None
        return open_capture(
            self.registry, self.output_dir, process_id, self.output_limit, None, quiet=True
        )


def discard(chunk: bytes) -> None:
    """Output of a run without capture: dropped."""
