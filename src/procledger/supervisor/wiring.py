"""How a child is wired to its output capture and its readiness probes, and what is left of
both once it ended: one piece that the Supervisor's starter and recovery's runner share, so that
a run started by either is captured and watched the same way and a fix is made once
(docs/design.md §14, §15.2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from procledger.application.outbox import this_host_id
from procledger.domain.records import OutputSummary
from procledger.domain.service import Readiness
from procledger.supervisor.capture import Capture, no_capture
from procledger.supervisor.execution import Consumer
from procledger.supervisor.file_capture import FileCapture
from procledger.supervisor.readiness import ReadinessWatch

__all__ = ["Kept", "OutputFacts", "Wiring", "output_facts", "watch_for", "wire"]

Kept = Capture | FileCapture
"""How a run's output is kept: read from its pipes, or written by the child to files."""

OutputFacts = tuple[OutputSummary, dict[str, str]]
"""What a terminal says of a run's output: the summary and the tails of its streams."""


@dataclass(frozen=True, slots=True)
class Wiring:
    """Where a child's output goes and the environment it runs with."""

    stdout: Consumer | None
    stderr: Consumer | None
    env: Mapping[str, str] | None
    files: tuple[int, int] | None = None


def wire(
    capture: Kept | None,
    watch: ReadinessWatch | None,
    env: Mapping[str, str] | None,
    *,
    stdout: Consumer | None = None,
    stderr: Consumer | None = None,
) -> Wiring:
    """The child's sinks and environment: the capture's sinks where output is kept (else
    ``stdout``/``stderr``), read by the readiness probes on their way, and the probes' port
    variables added to ``env`` (the caller's environment where ``env`` is ``None``, since a
    child given an environment no longer inherits one). A ``FileCapture`` gives the child its
    files instead of sinks (no pipe), and the probes read what its follower feeds them."""
    if isinstance(capture, FileCapture):
        return _wire_files(capture, watch, env)
    if capture is not None:
        stdout, stderr = capture.sinks()
    if watch is not None:
        if stdout is not None and stderr is not None:
            stdout, stderr = watch.sink(0, stdout), watch.sink(1, stderr)
        env = watch.child_env(dict(os.environ if env is None else env))
    return Wiring(stdout, stderr, env)


def _wire_files(
    capture: FileCapture, watch: ReadinessWatch | None, env: Mapping[str, str] | None
) -> Wiring:
    files = capture.open()
    if files is None:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        files = (null, os.dup(null))
    if watch is not None:
        capture.feeds = (watch.sink(0, _ignore), watch.sink(1, _ignore))
        env = watch.child_env(dict(os.environ if env is None else env))
    return Wiring(None, None, env, files)


def _ignore(chunk: bytes) -> None:
    """The probe's own sink is all a followed file's bytes are for: they are on disk."""


def watch_for(readiness: Readiness | None, cwd: str) -> ReadinessWatch | None:
    """The probes a run declared, relative to the directory it runs in (none: no watch)."""
    return None if readiness is None else ReadinessWatch(readiness, cwd)


def output_facts(capture: Kept | None, watch: ReadinessWatch | None = None) -> OutputFacts:
    """The run's output facts for its terminal, its files and probes closed (both idempotent,
    so every way out of a run may call this)."""
    if watch is not None:
        watch.close()
    return no_capture(this_host_id()) if capture is None else capture.finish()
