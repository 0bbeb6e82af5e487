"""The anchor: the agent's parent, so that no exit is lost while the agent is dead (issue 28).

``python -m procledger.agent.anchor --journal DIR [OPTIONS] -- AGENT_ARGV...`` (``USAGE``;
docs/design.md §18.1)

A supervised child must never depend on the agent being alive (containerd-shim and conmon
exist for the same reason). The anchor is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``),
so when the agent dies its children re-parent here rather than to init. The anchor then

1. starts the agent, and starts it again whenever it ends, with backoff (``Backoff``);
2. reaps every child that ends and, *before* reaping it, appends ``(pid, start time, exit code
   or signal, time)`` to the fsynced exit journal (``exit_journal``): the start time is read
   from the zombie, whose pid cannot be reused until it is reaped, so the record names that
   process and no later one with the same pid. A record that cannot be written leaves the
   zombie unreaped (the kernel keeps its status) and is tried again every second;
3. on SIGTERM or SIGINT forwards SIGTERM to the agent, waits for it (SIGKILL after
   ``--stop-grace``, or at a second signal), records its exit and exits 0 — leaving the
   supervised children running; the next agent adopts them by pid, start time and run marker.

It does nothing else, and imports nothing but the standard library, ``exit_journal`` and what
the package root loads eagerly (the errors and the vocabulary): it must stay a few MB and have
as little as possible that can fail.

**Signals.** SIGCHLD, SIGTERM and SIGINT are blocked and taken with ``sigtimedwait``: one
thread, no handler running at an arbitrary point, no busy polling (idle is a blocked system
call), and the timeout is the next thing due (a restart, a retry, the stop grace). SIGCHLDs
coalesce, so each wake reaps every zombie there is. The agent is started with
``posix_spawn(setsigmask=())``: a blocked mask would otherwise be inherited across ``exec``.
SIGHUP is left at its default: whoever starts the anchor starts it in a session of its own
(``setsid``; systemd does), so no terminal's hang-up reaches it.

**Linux only, so far.** macOS has no child subreaper (orphans go to launchd and their exits
are lost: the agent records them ``lost_on_restore``), no ``/proc`` start time, and neither
``sigtimedwait`` nor ``os.waitid``: an anchor there would wait with kqueue
(``EVFILT_SIGNAL``/``EVFILT_PROC``) and reap the agent with ``waitpid``; it could only restart
the agent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

from procledger.agent.exit_journal import (
    DEFAULT_SEGMENT_BYTES,
    ExitRecord,
    JournalBusy,
    JournalWriter,
    boot_id,
    now_ms,
    pid_namespace,
)

__all__ = ["USAGE", "Backoff", "Options", "UsageError", "main", "parse_args"]

SIGNALS = frozenset({signal.SIGCHLD, signal.SIGTERM, signal.SIGINT})
"""What the anchor waits for; blocked for the whole of its life, taken by ``sigtimedwait``."""
RETRY_S = 1.0
ALREADY_SERVED = 75
"""The agent's exit status when another agent serves its ledger (``EX_TEMPFAIL``): starting it
again would only fail again, so the anchor stops (``agent.launch.ALREADY_SERVED``)."""
CANNOT_SERVE = 78
"""The agent's exit status when its ledger cannot be served at all (``EX_CONFIG``: a URL that
names nothing, a ledger of a newer release): the anchor stops rather than retry for ever. A
store that is only unreachable now exits 1, and is retried with backoff."""
"""How soon a record that could not be written is tried again."""
JOURNAL_VARIABLE = "PROCLEDGER_EXIT_JOURNAL"
"""Set in the agent's environment: where the journal it must deliver lives."""
_PR_SET_CHILD_SUBREAPER = 36
_DEFAULTED = (signal.SIGPIPE, signal.SIGXFSZ)
"""Python ignores these, and an ignored signal stays ignored across ``exec``: the agent gets
them back at their defaults, as ``subprocess`` (``restore_signals``) would do."""


class Backoff:
    """When to start the agent again: ``initial`` doubling to ``maximum`` over exits that come
    quickly, back to ``initial`` once a run lasted ``healthy_s``. Pure: the caller passes how
    long the run lasted, so a test needs no clock."""

    def __init__(self, initial: float = 0.1, maximum: float = 5.0, healthy_s: float = 10.0):
        self.initial, self.maximum, self.healthy_s = initial, maximum, healthy_s
        self._next = 0.0

    def after_exit(self, uptime_s: float) -> float:
        """The delay before the next start, for a run that lasted ``uptime_s``."""
        if uptime_s >= self.healthy_s or self._next == 0.0:
            self._next = self.initial
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay


class Options(NamedTuple):
    """The command line, parsed."""

    journal: str
    """The journal's directory, absolute."""
    agent_argv: list[str]
    backoff: Backoff
    stop_grace_s: float
    segment_bytes: int


USAGE = f"""\
usage: python -m procledger.agent.anchor --journal DIR [--backoff-initial S] [--backoff-max S]
         [--healthy-s S] [--stop-grace S] [--segment-bytes N] -- AGENT_ARGV...

Start the procledger agent (AGENT_ARGV) and start it again whenever it ends: after
--backoff-initial seconds (0.1) doubling to --backoff-max (5), back to the first once a run
lasted --healthy-s (10). Journal in DIR the exit of every child that ends here, the agent's
orphans included (segments of --segment-bytes, {DEFAULT_SEGMENT_BYTES}). On SIGTERM or SIGINT
send the agent SIGTERM (SIGKILL after --stop-grace seconds, 30), then exit 0, leaving the
agent's children running.
"""
_NUMBERS = {
    "--backoff-initial": 0.1,
    "--backoff-max": 5.0,
    "--healthy-s": 10.0,
    "--stop-grace": 30.0,
    "--segment-bytes": float(DEFAULT_SEGMENT_BYTES),
}


class UsageError(Exception):
    """A command line the anchor cannot run; the message names the culprit."""


def parse_args(argv: Sequence[str]) -> Options | None:
    """The options before ``--`` and the agent's argv after it; None when help was asked.
    Hand-written, not ``argparse``, which would cost the anchor ~1 MB (it loads ``shutil``,
    ``gettext`` and the compression modules). Raises ``UsageError``."""
    args = list(argv)
    split = args.index("--") if "--" in args else len(args)
    options, agent = args[:split], args[split + 1 :]
    if "-h" in options or "--help" in options:
        return None
    values = _option_values(options)
    if "--journal" not in values:
        raise UsageError("--journal DIR is required")
    if not agent:
        raise UsageError("the agent's command is missing: -- AGENT_ARGV...")
    number = {name: _number(name, values.get(name), default) for name, default in _NUMBERS.items()}
    backoff = Backoff(number["--backoff-initial"], number["--backoff-max"], number["--healthy-s"])
    segment_bytes = max(1, int(number["--segment-bytes"]))
    journal = os.path.abspath(values["--journal"])  # the agent may run elsewhere
    return Options(journal, agent, backoff, number["--stop-grace"], segment_bytes)


def _option_values(options: list[str]) -> dict[str, str]:
    """``--name VALUE`` and ``--name=VALUE`` pairs, each name known."""
    values: dict[str, str] = {}
    pending = iter(options)
    for option in pending:
        name, equals, value = option.partition("=")
        if name != "--journal" and name not in _NUMBERS:
            raise UsageError(f"unknown option {option!r} (the agent's argv goes after --)")
        if not equals:
            following = next(pending, None)
            if following is None:
                raise UsageError(f"{name} needs a value")
            value = following
        values[name] = value
    return values


def _number(name: str, text: str | None, default: float) -> float:
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} takes a number of seconds, not {text!r}") from None
    if not 0 <= value < float("inf"):
        raise UsageError(f"{name} must be a finite number, 0 or more, not {text!r}")
    return value


def set_child_subreaper() -> bool:
    """Become a child subreaper (Linux); False where the platform has none or refuses."""
    if sys.platform != "linux":
        return False
    import ctypes  # noqa: PLC0415 -- Linux only, and ~1 MB the macOS anchor need not carry

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def zombie_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time, clock ticks); None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read().decode("ascii", "replace")
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _log(message: str) -> None:
    """One line on stderr: the anchor's only output, for the journal of whoever started it."""
    with contextlib.suppress(OSError):
        os.write(2, f"procledger-anchor[{os.getpid()}]: {message}\n".encode())


class Anchor:
    """The anchor's state between two wakes: the agent (pid, when it started, when it is due
    again), a record waiting for the disk, and a stop under way. ``run`` is the only loop."""

    def __init__(self, options: Options, writer: JournalWriter) -> None:
        self._options = options
        self._writer = writer
        self._backoff = options.backoff
        self._boot_id = boot_id()
        self._pid_ns = pid_namespace()
        self._env = {**os.environ, JOURNAL_VARIABLE: options.journal}
        self._agent_pid: int | None = None
        self._agent_started = 0.0
        self._start_at: float | None = time.monotonic()
        self._retry_at: float | None = None
        self._stop_deadline: float | None = None
        self._stopping = False

    def run(self) -> int:
        """Start the agent, then wait for signals and act on them until a stop is complete."""
        while True:
            now = time.monotonic()
            if _due(self._start_at, now):
                self._start_agent(now)
            if _due(self._stop_deadline, now):
                self._kill_agent()
            if self._stopping and self._agent_pid is None:
                if self._retry_at is not None:
                    _log("stopped with exits not journaled: the disk refused them")
                return 0
            timeout = _soonest(now, self._start_at, self._retry_at, self._stop_deadline)
            info: signal.struct_siginfo | None
            if timeout is None:
                info = signal.sigwaitinfo(SIGNALS)
            else:
                info = signal.sigtimedwait(SIGNALS, timeout)
            if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
                self._on_stop()
            self._reap_all()

    def _start_agent(self, now: float) -> None:
        self._start_at = None
        argv = self._options.agent_argv
        try:
            pid = os.posix_spawnp(argv[0], argv, self._env, setsigmask=(), setsigdef=_DEFAULTED)
        except OSError as error:
            delay = self._backoff.after_exit(0.0)
            self._start_at = now + delay
            _log(f"cannot start the agent {argv[0]!r}: {error}; trying again in {delay:g} s")
            return
        self._agent_pid, self._agent_started = pid, now
        _log(f"started the agent, pid {pid}")

    def _on_stop(self) -> None:
        """A first SIGTERM/SIGINT asks the agent to stop; a second one kills it."""
        if self._stopping:
            self._kill_agent()
            return
        self._stopping, self._start_at = True, None
        if self._agent_pid is not None:
            _log(f"stopping: SIGTERM to the agent, pid {self._agent_pid}")
            os.kill(self._agent_pid, signal.SIGTERM)  # unreaped, so still that process
            self._stop_deadline = time.monotonic() + self._options.stop_grace_s

    def _kill_agent(self) -> None:
        self._stop_deadline = None
        if self._agent_pid is not None:
            _log(f"the agent, pid {self._agent_pid}, did not stop: SIGKILL")
            os.kill(self._agent_pid, signal.SIGKILL)

    def _reap_all(self) -> None:
        """Reap every child that ended, each recorded first. The agent is looked for by its
        pid first: a child whose record waits for the disk must not hide the agent's end."""
        self._retry_at = None
        if self._agent_pid is not None:
            self._reap_one(os.P_PID, self._agent_pid)
        while self._reap_one(os.P_ALL, 0):
            pass

    def _reap_one(self, idtype: int, ident: int) -> bool:
        """Record and reap one ended child; False when there is none, or its record failed."""
        try:
            info = os.waitid(idtype, ident, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return False
        if info is None:
            return False
        record = self._record(info)
        if not self._append(record):
            return False
        os.waitpid(record.pid, 0)  # a zombie: does not block
        if record.agent:
            self._agent_ended(record)
        return True

    def _record(self, info: os.waitid_result) -> ExitRecord:
        """The exit of a zombie, read while its pid is still its own."""
        killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        return ExitRecord(
            pid=info.si_pid,
            start_time=zombie_start_time(info.si_pid),
            exit_code=None if killed else info.si_status,
            signal=info.si_status if killed else None,
            core_dumped=info.si_code == os.CLD_DUMPED,
            time_ms=now_ms(),
            boot_id=self._boot_id,
            pid_ns=self._pid_ns,
            agent=info.si_pid == self._agent_pid,
        )

    def _append(self, record: ExitRecord) -> bool:
        """Journal ``record``; on failure keep the zombie (and its status) for a retry — but
        the agent's, whose restart matters more than its record, is reaped regardless."""
        try:
            self._writer.append(record)
        except OSError as error:
            if record.agent:
                _log(f"the agent's exit is not journaled ({error}): {record}")
                return True
            _log(f"cannot journal the exit of pid {record.pid} ({error}); kept for a retry")
            self._retry_at = time.monotonic() + RETRY_S
            return False
        return True

    def _agent_ended(self, record: ExitRecord) -> None:
        now = time.monotonic()
        self._agent_pid = None
        self._stop_deadline = None
        how = f"code {record.exit_code}" if record.signal is None else f"signal {record.signal}"
        uptime = now - self._agent_started
        if self._stopping:
            _log(f"the agent, pid {record.pid}, ended ({how}); stopped")
            return
        if record.exit_code in (ALREADY_SERVED, CANNOT_SERVE):
            self._stopping = True
            why = (
                "found another agent serving"
                if record.exit_code == ALREADY_SERVED
                else ("cannot serve")
            )
            _log(f"the agent, pid {record.pid}, {why} its ledger; stopped")
            return
        delay = self._backoff.after_exit(uptime)
        self._start_at = now + delay
        _log(
            f"the agent, pid {record.pid}, ended ({how}) after {uptime:.3f} s;"
            f" restarting in {delay:g} s"
        )


def _due(at: float | None, now: float) -> bool:
    return at is not None and at <= now


def _soonest(now: float, *moments: float | None) -> float | None:
    """Seconds until the earliest of ``moments`` (never negative); None if there is none."""
    due = [moment for moment in moments if moment is not None]
    return max(0.0, min(due) - now) if due else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the anchor; its exit status (0 after a stop, 2 when it cannot start)."""
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as error:
        sys.stderr.write(f"{USAGE}\nerror: {error}\n")
        return 2
    if options is None:
        sys.stdout.write(USAGE)
        return 0
    if not hasattr(signal, "sigtimedwait") or not hasattr(os, "waitid"):
        _log(f"the anchor runs on Linux only so far, not on {sys.platform}")
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)  # before the agent exists: none is lost
    writer = JournalWriter(options.journal, options.segment_bytes)
    try:
        writer.open()
    except (JournalBusy, OSError) as error:
        _log(f"cannot open the exit journal: {error}")
        return 2
    if not set_child_subreaper():
        _log("not a child subreaper here: the exits of the agent's orphans will not be seen")
    try:
        return Anchor(options, writer).run()
    finally:
        writer.close()


if __name__ == "__main__":
    sys.exit(main())
