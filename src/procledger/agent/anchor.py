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
   supervised children running; the next agent adopts them by pid, start time and run marker;
4. holds a duplicate of each descriptor the agent hands it — a PTY's master, whose last close
   would hang up the child's terminal — and hands them all to each agent it starts
   (``DescriptorStore``, systemd's file descriptor store; docs/design.md §18.9).

It does nothing else, and imports nothing but the standard library, ``exit_journal`` and what
the package root loads eagerly (the errors and the vocabulary): it must stay a few MB and have
as little as possible that can fail.

**Signals.** SIGCHLD, SIGTERM and SIGINT are blocked and taken with ``sigtimedwait``: one
thread, no handler running at an arbitrary point, no busy polling (idle is a blocked system
call), and the timeout is the next thing due (a restart, a retry, the stop grace). The
descriptor store's thread (one per agent, blocked in ``recvmsg``) inherits the blocked mask, so
the signals stay pending for the main thread's ``sigtimedwait``. SIGCHLDs
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

import array
import contextlib
import json
import os
import resource
import select
import signal
import socket
import sys
import threading
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

__all__ = [
    "MAX_HELD",
    "MAX_KEY_BYTES",
    "MAX_MESSAGE_BYTES",
    "STORE_FD",
    "STORE_VARIABLE",
    "USAGE",
    "Backoff",
    "DescriptorStore",
    "Options",
    "UsageError",
    "encode",
    "key_problem",
    "main",
    "parse_args",
    "receive_message",
]

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
STORE_VARIABLE = "PROCLEDGER_FD_STORE"
"""Set in the agent's environment to ``STORE_FD``: the agent's end of the descriptor store."""
STORE_FD = 3
"""The descriptor the agent's end of the store is given as (the first after stdio)."""
MAX_HELD = 8192
"""Descriptors the store holds at most: a bound on what a faulty agent can pin in the anchor."""
MAX_KEY_BYTES = 256
MAX_MESSAGE_BYTES = 4096
"""One message of the store, either way: the longest, a 256-byte key escaped, is under 2 KB."""
_JOIN_S = 2.0
"""How long the anchor waits for a dead agent's store thread to end (it ends at once)."""
_CLOEXEC_ON_RECEIPT = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
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


# -- the descriptor store (docs/design.md §18.9) ----------------------------------------------


def key_problem(key: object) -> str | None:
    """Why ``key`` cannot name a stored descriptor; None when it can. Both ends check: the
    anchor because it trusts nothing it receives, the agent to fail before sending anything."""
    if not isinstance(key, str) or not key:
        return "a key is a non-empty string"
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        return "a key is text UTF-8 can encode (it holds a lone surrogate)"
    if size > MAX_KEY_BYTES:
        return f"a key is at most {MAX_KEY_BYTES} bytes of UTF-8, not {size}"
    return None


def encode(message: dict[str, object]) -> bytes:
    """One message of the store: compact JSON in ASCII (a key's other characters escaped)."""
    return json.dumps(message, separators=(",", ":")).encode()


def receive_message(sock: socket.socket, max_fds: int) -> tuple[bytes, list[int], int]:
    """One message, the descriptors it carried (close-on-exec, the caller's to close) and its
    flags (``MSG_TRUNC``, ``MSG_CTRUNC``). Not ``socket.recv_fds``, which drops its flags
    (CPython 3.11): a descriptor received without ``MSG_CMSG_CLOEXEC`` would leak into a
    program spawned before it is marked. Raises ``OSError``."""
    fds = array.array("i")
    space = socket.CMSG_SPACE(max_fds * fds.itemsize)
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE_BYTES, space, _CLOEXEC_ON_RECEIPT)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    if not _CLOEXEC_ON_RECEIPT:
        for fd in received:
            os.set_inheritable(fd, False)
    return data, received, flags


class DescriptorStore:
    """The descriptors agents handed over, held as long as the anchor lives and handed to each
    agent it starts: a PTY child dies of SIGHUP when the last descriptor of its master closes,
    and it must outlive the agent (systemd's file descriptor store, ``FDSTORE=1``). ``serve``
    is one agent's connection, on a thread of its own; the lock keeps the last requests of a
    dead agent's thread apart from the next agent's hand-over."""

    def __init__(self, max_held: int = MAX_HELD) -> None:
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self._max_held = max_held

    def serve(self, sock: socket.socket) -> None:
        """Hand over what is held, then answer each request until the agent's end closes. A
        bad request gets an error reply: nothing an agent sends ends the store or the anchor."""
        try:
            self._hand_over(sock)
            while (request := _next_request(sock)) is not None:
                reply = self.answer(*request)
                with contextlib.suppress(OSError):  # a dead agent's last requests still count
                    sock.send(reply)
        except OSError as error:
            _log(f"descriptor store: an agent's connection failed: {error}")

    def answer(self, data: bytes, fds: list[int], flags: int) -> bytes:
        """Carry out one request and return its reply; each of ``fds`` is kept or closed."""
        try:
            problem = self._carry_out(data, fds, flags)
        except Exception as error:  # a bug here must cost one request, not the store
            problem = f"the anchor failed: {error!r}"
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if problem is None:
            return encode({"ok": True})
        _log(f"descriptor store: refused a request: {problem}")
        return encode({"ok": False, "error": problem})

    def _carry_out(self, data: bytes, fds: list[int], flags: int) -> str | None:
        """What is wrong with the request, or None once it is done. A descriptor kept is
        taken out of ``fds``."""
        if flags & socket.MSG_TRUNC:
            return f"a message is at most {MAX_MESSAGE_BYTES} bytes"
        if flags & socket.MSG_CTRUNC:
            return "descriptors were cut off: more than one sent, or the anchor has no room"
        request = _parse(data)
        if isinstance(request, str):
            return request
        op, key = request.get("op"), request.get("key")
        if op not in ("keep", "drop"):
            return f"unknown op {_short(op)}: the store knows keep and drop"
        problem = key_problem(key)
        if problem is not None or not isinstance(key, str):
            return f"{op}: {problem}"
        if op == "drop":
            if fds:
                return f"drop {key!r} carries no descriptor, not {len(fds)}"
            self._drop(key)
            return None
        if len(fds) != 1:
            return f"keep {key!r} carries exactly one descriptor, not {len(fds)}"
        return self._keep(key, fds.pop())

    def _keep(self, key: str, fd: int) -> str | None:
        with self._lock:
            if key not in self._held and len(self._held) >= self._max_held:
                os.close(fd)
                return f"the store is full ({self._max_held} descriptors): {key!r} is not kept"
            replaced = self._held.get(key)
            self._held[key] = fd
        if replaced is not None:
            os.close(replaced)
        return None

    def _drop(self, key: str) -> None:
        with self._lock:
            fd = self._held.pop(key, None)
        if fd is not None:
            os.close(fd)

    def _hand_over(self, sock: socket.socket) -> None:
        """Each held descriptor in a ``held`` message of its own, then ``end``."""
        with self._lock:
            for key, fd in self._held.items():
                socket.send_fds(sock, [encode({"op": "held", "key": key})], [fd])
        sock.send(encode({"op": "end"}))


def _next_request(sock: socket.socket) -> tuple[bytes, list[int], int] | None:
    """The agent's next request; None once its end is closed, or shut down by the anchor.
    An empty read is an empty message unless the peer hung up (SEQPACKET allows both)."""
    data, fds, flags = receive_message(sock, 1)
    if data or fds or not _hung_up(sock):
        return data, fds, flags
    return None


def _hung_up(sock: socket.socket) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return any(events & select.POLLHUP for _, events in poller.poll(0))


def _parse(data: bytes) -> dict[str, object] | str:
    """The request as a JSON object, or what is wrong with it."""
    if not data:
        return "an empty message"
    try:
        request = json.loads(data)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        return f"not JSON: {_short(str(error))}"
    if not isinstance(request, dict):
        return "a request is a JSON object"
    return request


def _short(value: object) -> str:
    """``repr(value)``, cut to fit an error reply."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


class _AgentLink:
    """One agent's connection to the store: a SEQPACKET socket pair, the agent's end given to
    it as ``STORE_FD``, the anchor's served by a thread of its own until the agent is gone."""

    def __init__(self, store: DescriptorStore) -> None:
        self._store = store
        self._anchor_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if agent_end.fileno() == STORE_FD:  # dup2 onto itself would keep close-on-exec
            with agent_end:
                try:
                    agent_end = agent_end.dup()
                except OSError:
                    self._anchor_end.close()
                    raise
        self._agent_end = agent_end
        self._thread: threading.Thread | None = None

    def spawn_action(self) -> tuple[int, int, int]:
        """The ``posix_spawn`` file action giving the agent its end as ``STORE_FD`` (``dup2``
        clears close-on-exec on the copy)."""
        return (os.POSIX_SPAWN_DUP2, self._agent_end.fileno(), STORE_FD)

    def serve(self) -> None:
        """The agent holds its end now: close the anchor's copy, so the agent's death closes
        it, and serve the anchor's end. Raises ``RuntimeError`` if no thread can start."""
        self._agent_end.close()
        self._thread = threading.Thread(
            target=self._store.serve, args=(self._anchor_end,), name="fd-store", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """The agent is gone: end its connection. Shutting the anchor's end down wakes the
        thread even when a descendant of the agent still holds the agent's end; the thread
        reads what the agent sent before it died, then ends."""
        self._agent_end.close()
        with contextlib.suppress(OSError):
            self._anchor_end.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(_JOIN_S)
            if self._thread.is_alive():
                _log("descriptor store: an agent's thread did not end; its socket stays open")
                return
        self._anchor_end.close()


def raise_descriptor_limit() -> None:
    """The soft ``RLIMIT_NOFILE`` up to the hard one (best effort): the store holds up to
    ``MAX_HELD`` descriptors, and the agent, which inherits the limit, receives them all."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as error:
        _log(f"cannot raise the limit of open descriptors: {error}")


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
        self._env.pop(STORE_VARIABLE, None)  # an anchor's own store is not its agent's
        self._store = DescriptorStore()
        self._link: _AgentLink | None = None
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
        link = _open_link(self._store)
        env, actions = self._env, []
        if link is not None:
            env = {**self._env, STORE_VARIABLE: str(STORE_FD)}
            actions = [link.spawn_action()]
        try:
            pid = os.posix_spawnp(
                argv[0], argv, env, file_actions=actions, setsigmask=(), setsigdef=_DEFAULTED
            )
        except OSError as error:
            if link is not None:
                link.close()
            delay = self._backoff.after_exit(0.0)
            self._start_at = now + delay
            _log(f"cannot start the agent {argv[0]!r}: {error}; trying again in {delay:g} s")
            return
        self._agent_pid, self._agent_started = pid, now
        _log(f"started the agent, pid {pid}")
        if link is not None:
            self._link = _serve_link(link)

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
        if self._link is not None:
            self._link.close()
            self._link = None
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


def _open_link(store: DescriptorStore) -> _AgentLink | None:
    """A new agent's connection to the store; None (the agent starts without a store, as
    one started by no anchor) when no socket can be made."""
    try:
        return _AgentLink(store)
    except OSError as error:
        _log(f"descriptor store: no socket for the agent ({error}); it starts without one")
        return None


def _serve_link(link: _AgentLink) -> _AgentLink | None:
    """``link`` served; None when no thread can serve it (the agent then reads the end of
    its store, and runs without one)."""
    try:
        link.serve()
    except RuntimeError as error:
        _log(f"descriptor store: cannot serve the agent ({error})")
        link.close()
        return None
    return link


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
    raise_descriptor_limit()
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
