"""Execution: one owner of a child's lifetime (docs/design.md §6.1).

``run_captured`` and ``run_streaming`` are thin wrappers over ``OwnedChild``, the only code that
spawns, feeds stdin, drains output, waits, interrupts and cleans up. The Supervisor uses
``OwnedChild`` directly: it needs the pid, and stops trees with policies of its own (interrupt
without escalation, terminate, kill now), from another thread, while its owner thread waits::

    with OwnedChild.spawn(argv, stdout=on_chunk, stop=policy) as child:
        record_started(child.pid)
        returncode = child.wait(cancel)          # owner thread; Interrupted if cancel is set
    ...
    child.stop(StopPolicy((SIGINT,), grace_s=10), escalate=False)   # any other thread

Design, and why:

- **No I/O threads.** The owner's thread multiplexes the child's pipes and its exit descriptor
  in one selector. Stdin is written as fast as the pipe accepts it, concurrently with draining
  output, so neither a prompt the child never reads nor a full output pipe can block the loop,
  and a consumer's exception surfaces on the caller's own thread as the very same object.
  (Thread-per-pipe was measured first: four thread start/joins cost ~0.6 ms on a 2-CPU VM,
  65% of ``subprocess.run(["true"])`` -- over the 1.3x budget on their own.)
- **Completion = exit observed AND every owned pipe at EOF.** Exit is observed without
  reaping (``os_seam.ExitSignal``); the child is reaped last, so while a descendant still holds its
  stdout the child's pid -- and so its process-group id -- cannot be reused by a stranger.
- **Interruption.** ``cancel`` is a ``threading.Event``, which cannot be selected on, so the loop
  polls it every ``POLL_S``. Output that a descendant holds never blocks the loop.
- **One cleanup path.** Every way out after spawn but normal completion goes through ``_abort``:
  close stdin, stop the tree with the policy (still draining output during the grace, so a
  child flushing its last words cannot block on a full pipe), SIGKILL, close, reap.
"""

from __future__ import annotations

import functools
import math
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, final

from procledger.domain.errors import Interrupted
from procledger.supervisor import os_seam
from procledger.supervisor.pump import Borrower, Consumer, Pump, ReaderGone
from procledger.supervisor.terminal import Terminal, TerminalSize, spawn_on_terminal

__all__ = [
    "Borrower",
    "Cancel",
    "CapturedOutput",
    "Consumer",
    "Input",
    "OwnedChild",
    "ReaderGone",
    "StdinSource",
    "StopPolicy",
    "Streamed",
    "checked_argv",
    "run_captured",
    "run_streaming",
]

POLL_S: Final = 0.02
"""How often a waiting owner looks at ``cancel``: the bound on interruption latency."""


Input = bytes | str | None

StdinSource = int | None
"""What a child without input data reads: ``subprocess.DEVNULL`` (the default), ``None`` to
inherit ours, or an open readable descriptor (the caller keeps and closes it)."""


class Cancel(Protocol):
    """What ``cancel`` must offer; ``threading.Event`` does."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class StopPolicy:
    """How a tree is stopped: each of ``signals`` in turn to every group of the tree, waiting up
    to ``grace_s`` seconds for the child after each (the rest are skipped once it has exited),
    then SIGKILL to every group known. The tree is discovered again before every signal and
    before the SIGKILL, so what the child starts during a grace is stopped too.

    A parameter, not a constant: the CLI's Ctrl-C wants ``(SIGINT, SIGTERM)``, a shutdown
    ``(SIGTERM,)``, a kill ``(SIGKILL,)`` with no grace."""

    signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)
    grace_s: float = 10.0

    def __post_init__(self) -> None:
        signals = tuple(signal.Signals(s) for s in self.signals)
        if not signals:
            raise ValueError("StopPolicy.signals: give at least one signal ((SIGKILL,) kills now)")
        if not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise ValueError(f"StopPolicy.grace_s: must be finite and >= 0, got {self.grace_s!r}")
        object.__setattr__(self, "signals", signals)


@final
@dataclass(frozen=True, slots=True)
class CapturedOutput:
    """A finished child's return code (negative: killed by that signal) and its exact output."""

    returncode: int
    stdout: bytes
    stderr: bytes


@final
@dataclass(frozen=True, slots=True)
class Streamed:
    """A finished streaming child's return code (negative: killed by that signal)."""

    returncode: int


def run_captured(
    argv: Sequence[str],
    *,
    cwd: os_seam.StrPath | None = None,
    env: Mapping[str, str] | None = None,
    stdin: Input = None,
    stop: StopPolicy = StopPolicy(),  # an immutable value, not infrastructure
    cancel: Cancel | None = None,
) -> CapturedOutput:
    """Run ``argv`` to completion and return its status and exact stdout and stderr bytes.

    A non-zero status is a result. Raises ``SpawnError``, ``StdinError``, ``Interrupted``, or a
    read or wait failure -- each only after the tree is stopped and the child reaped.
    """
    out, err = bytearray(), bytearray()
    returncode = _run(
        argv, out.extend, err.extend, cwd=cwd, env=env, stdin=stdin, stop=stop, cancel=cancel
    )
    return CapturedOutput(returncode, bytes(out), bytes(err))


def run_streaming(
    argv: Sequence[str],
    consumer: Consumer,
    *,
    cwd: os_seam.StrPath | None = None,
    env: Mapping[str, str] | None = None,
    stdin: Input = None,
    stop: StopPolicy = StopPolicy(),  # an immutable value, not infrastructure
    cancel: Cancel | None = None,
    stderr: Consumer | None = None,
    marker: str | None = None,
) -> Streamed:
    """Run ``argv`` to completion, handing raw stdout chunks to ``consumer`` and stderr chunks
    to ``stderr`` (inherited when ``None``); ``marker`` names the run in the child's
    environment, as ``OwnedChild.spawn``'s.

    Errors as ``run_captured``; an exception from a consumer stops the tree and is re-raised
    as the same object. No consumer is called if the command cannot start.
    """
    returncode = _run(
        argv,
        consumer,
        stderr,
        cwd=cwd,
        env=env,
        stdin=stdin,
        stop=stop,
        cancel=cancel,
        marker=marker,
    )
    return Streamed(returncode)


def _run(
    argv: Sequence[str],
    stdout: Consumer,
    stderr: Consumer | None,
    *,
    cwd: os_seam.StrPath | None,
    env: Mapping[str, str] | None,
    stdin: Input,
    stop: StopPolicy,
    cancel: Cancel | None,
    marker: str | None = None,
) -> int:
    """The whole lifetime, shared by both public operations."""
    if _is_set(cancel):
        raise Interrupted(f"command {os_seam.describe(argv)!r} not started: cancel was already set")
    with OwnedChild.spawn(
        argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr, stop=stop, marker=marker
    ) as child:
        return child.wait(cancel)


def _is_set(cancel: Cancel | None) -> bool:
    return cancel is not None and cancel.is_set()


def _poll_timeout(*, cancellable: bool, exited: bool) -> float | None:
    """How long one select may block. ``cancel`` cannot be selected on, nor can a stop from
    another thread once the child has exited (pipes then close only if their holders die):
    those are polled. Otherwise the exit descriptor and the pipes wake us."""
    return POLL_S if cancellable or exited else None


def checked_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as a list, checked before anything is recorded or spawned.

    A single string is refused rather than split (``"ls -l"`` would run a program named
    ``ls -l``), and so is an empty program name, which no OS can run.

    Raises:
        TypeError: ``argv`` is a string, is empty, holds a non-string or names no program.
    """
    if isinstance(argv, str | bytes):
        raise TypeError(f"argv must be a list of strings, not a single string: {argv!r}")
    args = list(argv)
    if not args or not all(isinstance(a, str) for a in args) or not args[0]:
        raise TypeError(f"argv must be a non-empty list of strings, got {args!r}")
    return args


def _encoded(stdin: Input) -> bytes | None:
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    if isinstance(stdin, str):
        return stdin.encode()
    raise TypeError(f"stdin must be bytes, str or None, not {type(stdin).__name__}")


@final
class OwnedChild:
    """A child process in its own process group, owned from a successful spawn until reaped.

    One thread -- the owner -- calls ``wait``, which drives all of the child's I/O and returns
    only when the child is reaped, the tree stopped if need be, and every pipe closed. Any
    thread may call ``stop`` meanwhile. Use it as a context manager: leaving the block before
    ``wait`` has finished stops the tree and reaps the child (nothing is ever left running
    unowned).

    - ``pid`` / ``pgid``: the child's pid and its process group (the same number).
    - ``wait(cancel=None) -> int``: the return code once the child has exited and every owned
      pipe is done. If ``cancel`` is set, stops the tree with the spawn policy and raises
      ``Interrupted``. On a stdin, consumer, read or wait failure, stops the tree and re-raises
      the original exception (``Interrupted`` instead if ``cancel`` is set by then).
    - ``stop(policy=None, *, escalate=True) -> bool``: signal the tree as ``policy`` says;
      with ``escalate`` finish with SIGKILL (then ``wait`` returns as soon as the child is
      reaped, even if an escaped process still holds a pipe). Returns whether the child has
      exited. ``StopPolicy((SIGINT,), g), escalate=False`` interrupts without escalating;
      ``StopPolicy((SIGKILL,), 0)`` kills now. Stopping a reaped child signals nothing.
    """

    def __init__(
        self,
        child: subprocess.Popen[bytes],
        exit_signal: os_seam.ExitSignal,
        pump: Pump,
        command: str,
        policy: StopPolicy,
        *,
        marker: str | None = None,
        hold_zombie: bool = False,
    ) -> None:
        """Private: use ``OwnedChild.spawn``."""
        self._child = child
        self._exit_signal = exit_signal
        self._pump = pump
        self._command = command
        self._policy = policy
        self._tree = os_seam.Tree(child.pid, marker)
        self._survivors: list[int] = []
        self._lock = threading.Lock()  # orders signalling against reaping (pid reuse)
        self._reaped = False
        self._hold_zombie, self._released, self._release_asked = hold_zombie, False, False
        self._returncode: int | None = None
        self._killed = False
        self._failure: Exception | None = None  # met by ``advance``; ``wait`` handles it
        self.terminal: Terminal | None = None  # its pseudo-terminal's master, if it has one
        self.on_reaped: Callable[[os_seam.Usage], None] | None = None  # told what it used

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        cwd: os_seam.StrPath | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Input = None,
        stdout: Consumer | None = None,
        stderr: Consumer | None = None,
        stop: StopPolicy = StopPolicy(),  # an immutable value, not infrastructure
        stdin_source: StdinSource = subprocess.DEVNULL,
        marker: str | None = None,
        files: tuple[int, int] | None = None,
        hold_zombie: bool = False,
        pty: TerminalSize | None = None,
    ) -> OwnedChild:
        """Start ``argv`` in a new process group; ``SpawnError`` (naming it) if it cannot start.

        ``stdin=None`` reads ``stdin_source`` (``/dev/null`` by default); bytes or str (UTF-8)
        are written once, then closed. ``stdout``/``stderr``: a consumer for raw chunks, or
        ``None`` to inherit ours. ``stop`` is the policy ``wait`` uses when cancelled or
        failing. ``marker`` names the run in the child's environment (``os_seam.RUN_MARKER``),
        so a stop finds descendants that left both its group and its ancestry. ``files``: the
        child's stdout and stderr as two descriptors it writes itself (no consumer then).
        ``hold_zombie``: once it exits, read its status but leave it unreaped until
        ``release`` (after its terminal is recorded), so that a crash in between leaves the
        status to the anchor (docs/design.md §18.6). ``pty``: on a new pseudo-terminal of that
        size, its master ``terminal`` (``terminal.spawn_on_terminal``).
        """
        args = checked_argv(argv)
        data = _encoded(stdin)
        child_env = env if marker is None else os_seam.marked_env(env, marker)
        spawn = functools.partial(
            os_seam.spawn, args, cwd=cwd, env=child_env, stdin_pipe=data is not None,
            stdin_source=stdin_source, files=files,
        )  # fmt: skip
        terminal = None
        if pty is None:
            child = spawn(stdout_pipe=stdout is not None, stderr_pipe=stderr is not None)
        else:  # its terminal's one stream is read as its stdout
            on_terminal = functools.partial(spawn, stdout_pipe=False, stderr_pipe=False)
            child, terminal, stdout = spawn_on_terminal(pty, on_terminal, stdout, files)
            stderr = None
        owned = cls._owning(
            child, data, (stdout, stderr), stop, marker=marker, hold_zombie=hold_zombie
        )
        owned.terminal = terminal
        return owned

    @classmethod
    def _owning(
        cls,
        child: subprocess.Popen[bytes],
        data: bytes | None,
        sinks: tuple[Consumer | None, Consumer | None],
        stop: StopPolicy,
        *,
        marker: str | None,
        hold_zombie: bool,
    ) -> OwnedChild:
        """The spawned child, owned: its exit watched and its pipes pumped (or, if that cannot
        be set up, killed and reaped at once)."""
        command = os_seam.describe(child.args if isinstance(child.args, list) else [])
        exit_signal = None
        try:
            exit_signal = os_seam.watch_exit(child.pid)
            pump = Pump(child, exit_signal, data, sinks, command)
        except BaseException:
            os_seam.discard(child)
            if exit_signal is not None:
                exit_signal.close()
            raise
        return cls(child, exit_signal, pump, command, stop, marker=marker, hold_zombie=hold_zombie)

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def policy(self) -> StopPolicy:
        """How this child's tree is stopped when no other policy is asked for."""
        return self._policy

    @property
    def pgid(self) -> int:
        """The child's process group: it leads it, so this is its pid."""
        return self._child.pid

    @property
    def command(self) -> str:
        return self._command

    @property
    def survivors(self) -> list[int]:
        """OS pids of the tree still alive after the last stop's final SIGKILL (and its
        settling time): processes that could not be killed, or escaped before they were seen.
        Empty when no stop escalated, or when the tree died."""
        return list(self._survivors)

    @property
    def returncode(self) -> int | None:
        """``None`` until reaped; then as ``subprocess`` (negative: killed by that signal)."""
        return self._returncode if self._reaped else None

    def __enter__(self) -> OwnedChild:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._abort(deliver=False)

    @property
    def exited(self) -> bool:
        """Whether the child's exit has been observed (it may still be unreaped)."""
        return self._pump.exited

    def watched(self) -> list[tuple[int, bool]]:
        """For an owner that waits in an event loop instead of in ``wait``: the descriptors
        to wait for before the next ``advance``, each with whether it is awaited writable.
        Once the exit is observed, a stop from another thread cannot be waited for: poll
        ``advance`` every ``POLL_S`` as well."""
        if self._reaped or self._failure is not None:
            return []
        return self._pump.watched()

    def advance(self) -> bool:
        """One step of ``wait`` that never blocks: handle what is ready now. True once
        ``wait`` would no longer wait for the child -- it completed, or a stdin, consumer or
        read failure happened, which ``wait`` then handles as always (stops the tree,
        reaps, raises it). The owner then calls ``wait`` (on a thread that may block)."""
        if self._reaped or self._failure is not None:
            return True
        try:
            if not self._completed():
                self._pump.step(0)
        except Exception as failure:
            self._failure = failure
            return True
        return self._completed()

    def _completed(self) -> bool:
        return self._pump.exited and (not self._pump.busy or self._killed)

    def wait(self, cancel: Cancel | None = None) -> int:
        """Drive the child's I/O to completion and reap it; see the class docstring."""
        if self._reaped:
            assert self._returncode is not None
            return self._returncode
        try:
            if self._failure is not None:
                raise self._failure
            cancelled = self._supervise(cancel)
        except BaseException as failure:
            self._abort(deliver=False)
            if _is_set(cancel):  # an observed interruption takes precedence
                raise self._interrupted() from failure
            raise
        if cancelled:
            self._abort(deliver=True)
            raise self._interrupted()
        return self._finish()

    def stop(self, policy: StopPolicy | None = None, *, escalate: bool = True) -> bool:
        """Stop the tree from any thread; see the class docstring."""
        if self._reaped:
            return True
        return self._stop(policy or self._policy, escalate, self._exit_signal.wait)

    def _supervise(self, cancel: Cancel | None) -> bool:
        """Pump until completion (False) or until ``cancel`` is seen set (True)."""
        pump = self._pump
        while not _is_set(cancel):
            if self._completed():
                pump.drain()  # after a stop from elsewhere: what the dead tree left behind
                return False
            pump.step(_poll_timeout(cancellable=cancel is not None, exited=pump.exited))
        return True

    def _abort(self, *, deliver: bool) -> None:
        """The one cleanup path for every way out but completion: stop the tree, reap, close.

        ``deliver``: keep handing output to the sinks during the grace (an interruption) or
        not (a failure: the consumer or the reader is what failed)."""
        if self._reaped:
            return
        self._pump.close_input()
        if not deliver:
            self._pump.mute()
        self._stop(self._policy, True, self._pump_until_exit)
        self._finish()

    def stop_steps(
        self, policy: StopPolicy | None = None, *, escalate: bool = True
    ) -> Generator[float | None, bool, bool]:
        """``stop`` for a caller that waits for the exit itself (an event loop): each step
        signals as the policy says, then yields how long to wait for the child's exit
        (``None``: until it exits); send back whether it exited. Returns what ``stop`` does.
        The steps signal and discover the tree (psutil): drive them from a thread that may
        block for a moment."""
        if self._reaped:
            return True
        policy = policy or self._policy
        exited = False
        for sig in policy.signals:
            self._signal(sig)
            exited = yield policy.grace_s
            if exited:
                break
        if not escalate:
            return exited
        self._signal(signal.SIGKILL)
        self._killed = True
        if not self._tree.await_gone(os_seam.KILL_SETTLE_S):
            self._survivors = self._tree.survivors()
        self._tree.reap_adopted(self._child.pid)
        return (yield None)

    def _stop(self, policy: StopPolicy, escalate: bool, wait_exit: _WaitExit) -> bool:
        """Signal the tree as ``policy`` says; with ``escalate``, SIGKILL whatever is known."""
        steps = self.stop_steps(policy, escalate=escalate)
        try:
            timeout = next(steps)
            while True:
                timeout = steps.send(wait_exit(timeout))
        except StopIteration as done:
            return bool(done.value)

    def _signal(self, sig: int) -> None:
        """(Re-)discover the tree, then signal it. Under the lock: once the child is reaped
        its pid may belong to a stranger, so neither discovery nor its group are used."""
        with self._lock:
            unreaped = not self._reaped or (self._hold_zombie and not self._released)
            early = unreaped and self._hold_zombie  # see ``Tree.signal_own_group``
            if early:
                self._tree.signal_own_group(sig)
            if unreaped:
                self._tree.discover()
            self._tree.signal(sig, child_unreaped=unreaped, own_group_done=early)
        if self._release_asked:  # asked while we held the lock: done now that we let go
            self.release()

    def _pump_until_exit(self, timeout: float | None) -> bool:
        """The owner's way to wait for exit during a stop: keep draining, so a child flushing
        output as it shuts down cannot block on a full pipe. A sink failing now is muted: the
        tree is being stopped for a reason that already takes precedence."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._pump.exited:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            try:
                self._pump.step(remaining)
            except Exception:
                self._pump.mute()
        return True

    def _finish(self) -> int:
        """Close what is left, reap the (exited or killed) child, release the exit signal."""
        self._pump.close()
        if self._hold_zombie and not self._released:
            # Reading a held zombie's status frees nothing: its pid stays ours, so this need
            # not wait for a stop's discovery (which holds the lock for a /proc scan).
            returncode = os_seam.peek(self._child)
            self._reaped, self._returncode = True, returncode
        else:
            with self._lock:
                returncode = self._reap()
                self._reaped, self._returncode = True, returncode
        self._exit_signal.close()
        os_seam.close_pipes(self._child)
        if self.terminal is not None:
            self.terminal.close()
        return returncode

    def release(self) -> None:
        """Reap a zombie held by ``hold_zombie`` (its terminal is on record now); a no-op
        otherwise, and once done. Never waits for a stop under way, whose tree discovery (a
        ``/proc`` scan) holds the lock for a while: that stop reaps it as it lets go."""
        if not self._hold_zombie:
            return
        self._release_asked = True
        while self._release_asked and self._lock.acquire(blocking=False):
            try:
                if self._release_asked and self._reaped and not self._released:
                    self._reap()
                    self._released = True
                self._release_asked = False
            finally:
                self._lock.release()

    def _reap(self) -> int:
        """(Under the lock.) Reap the child and tell ``on_reaped`` what it used."""
        returncode, usage = os_seam.reap(self._child)
        if usage is not None and self.on_reaped is not None:
            self.on_reaped(usage)
        return returncode

    def _interrupted(self) -> Interrupted:
        return Interrupted(
            f"command {self._command!r} interrupted: its process tree was stopped and reaped"
        )


_WaitExit = Callable[[float | None], bool]
