"""The one seam between a child's lifetime and the operating system (Linux and macOS).

``execution`` decides *what* to do with a child; this module is *how*, one system call or
psutil query per function, so that policy can be read without knowing the platform:

- ``spawn`` starts argv in a new process group (``process_group=0``) but in the caller's
  session, so the whole group can be signalled while terminal job control stays the host's.
- ``ExitSignal`` is a descriptor that becomes readable when the child exits, **without reaping
  it**. An unreaped child keeps its pid, and so its process-group id, reserved: that is what
  makes ``killpg(child.pid)`` safe until the very end. Linux uses a pidfd, macOS a kqueue
  ``NOTE_EXIT``; where neither exists a thread blocked in ``waitid(WNOWAIT)`` closes a pipe.
- ``Tree`` is what we have seen of the child's descendants. It keeps ``psutil.Process`` objects
  (which remember each process's start time) and only signals a group that a live process we
  discovered still belongs to, so a reused pid is never mistaken for ours.
- Reaping is ``wait4`` on our own child (``Popen``'s own wait, plus what the child used): no
  ``waitpid(-1)``, no SIGCHLD handler, so the host application's own subprocesses are never
  disturbed.
"""

# psutil is imported when a tree is first stopped, not by every run: start-up time.

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import select
import selectors
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final

from procledger.domain.errors import SpawnError
from procledger.supervisor.terminal import take_terminal

if TYPE_CHECKING:
    import psutil

READ_CHUNK: Final = 1 << 20
"""Bytes asked of a pipe per read, and the size output pipes are widened to (see ``_widen``)."""

StrPath = str | os.PathLike[str]


def describe(argv: Sequence[str]) -> str:
    """The command as a shell would spell it, for error messages."""
    return shlex.join(argv)


ChildEnv = Mapping[str, str] | Mapping[bytes, bytes]


def marked_env(env: Mapping[str, str] | None, marker: str) -> ChildEnv:
    """``env`` (ours when None) with ``RUN_MARKER=marker``. Ours is copied as bytes
    (``os.environb``): ``Popen`` encodes every variable again, so a str copy decoded and
    re-encoded each one on every spawn."""
    if env is None and os.supports_bytes_environ:
        return {**os.environb, RUN_MARKER.encode(): marker.encode()}
    return {**(os.environ if env is None else env), RUN_MARKER: marker}


def spawn(
    argv: Sequence[str],
    *,
    cwd: StrPath | None,
    env: ChildEnv | None,
    stdin_pipe: bool,
    stdout_pipe: bool,
    stderr_pipe: bool,
    stdin_source: int | None = subprocess.DEVNULL,
    files: tuple[int, int] | None = None,
    terminal: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new process group; ``SpawnError`` if it cannot start.

    Pipes are unbuffered and non-blocking on our side: the caller multiplexes them and must
    never block in a read or write it cannot interrupt. Without a stdin pipe the child reads
    ``stdin_source`` (``subprocess.DEVNULL``, ``None`` to inherit ours, or a descriptor);
    absent stdout/stderr are inherited, or are ``files`` (two open descriptors the child
    writes itself: no pipe to us, so it outlives us -- docs/design.md §14.1). ``terminal``:
    the child's side of a pseudo-terminal, which is then all three and its controlling
    terminal, in a session of its own (``supervisor.terminal``).
    """
    out, err = files if files is not None else (None, None)
    wiring: dict[str, Any] = {
        "stdin": subprocess.PIPE if stdin_pipe else stdin_source,
        "stdout": subprocess.PIPE if stdout_pipe else out,
        "stderr": subprocess.PIPE if stderr_pipe else err,
        "process_group": 0,
    }
    if terminal is not None:  # the leader of a session of its own, on its terminal (§20.1)
        wiring = {"stdin": terminal, "stdout": terminal, "stderr": terminal}
        wiring.update(start_new_session=True, preexec_fn=take_terminal)
    try:
        child = subprocess.Popen(list(argv), bufsize=0, cwd=cwd, env=env, close_fds=True, **wiring)
    except (OSError, ValueError) as exc:
        raise _spawn_error(argv, cwd, exc) from exc
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)
    for pipe in (child.stdout, child.stderr):
        if pipe is not None:
            _widen(pipe.fileno())
    return child


def _widen(fd: int) -> None:
    """Give an output pipe room for ``READ_CHUNK`` bytes (Linux; elsewhere a no-op): a fast
    writer then fills it while the loop handles the last chunk, so the loop reads in large
    pieces rather than a page at a time. Past /proc/sys/fs/pipe-max-size (1 MiB by default)
    only CAP_SYS_RESOURCE may go, which even root lacks in a container, so more is not asked;
    a refused pipe keeps its size."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, set_size, READ_CHUNK)


def _spawn_error(argv: Sequence[str], cwd: StrPath | None, exc: Exception) -> SpawnError:
    """``SpawnError`` naming the command (and the directory), keeping the errno if any."""
    where = "" if cwd is None else f" in directory {os.fspath(cwd)!r}"
    if not isinstance(exc, OSError) or exc.errno is None:
        return SpawnError(f"cannot start command {describe(argv)!r}{where}: {exc}")
    reason = exc.strerror if exc.filename is None else f"{exc.strerror}: {exc.filename!r}"
    return SpawnError(exc.errno, f"cannot start command {describe(argv)!r}{where}: {reason}")


def discard(child: subprocess.Popen[bytes]) -> None:
    """Kill the group of a child we could not finish setting up, reap it, close its pipes.

    Only for the instant after ``spawn``: nothing else of its tree can be known yet.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    close_pipes(child)


def close_pipes(child: subprocess.Popen[bytes]) -> None:
    """Close our ends of the child's pipes (idempotent)."""
    for pipe in (child.stdin, child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()


def peek(child: subprocess.Popen[bytes]) -> int:
    """Our child's return code once it has exited, **without reaping it** (``waitid`` with
    ``WNOWAIT``): its zombie keeps the pid, and -- should this process die before the ledger
    has the terminal -- its status, for the anchor to journal (docs/design.md §18.6)."""
    info = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert info is not None  # no WNOHANG: waits for the exit
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return info.si_status


@dataclass(frozen=True, slots=True)
class Usage:
    """What a reaped child used, as the kernel counted it (``wait4``'s rusage): CPU seconds
    of the child and of the descendants it reaped, and the peak RSS of the largest of them.
    Exact, where a sample taken every few seconds misses a short run, or a peak between two."""

    cpu_s: float
    peak_rss_bytes: int


_MAXRSS_UNIT: Final = 1 if sys.platform == "darwin" else 1024  # macOS counts bytes, Linux KiB


def reap(child: subprocess.Popen[bytes]) -> tuple[int, Usage | None]:
    """Wait for our own child only (``wait4(child.pid)``): its return code, and what it used
    (``None`` when it was reaped already, or by someone else)."""
    if child.returncode is not None:
        return child.returncode, None
    try:
        _, status, rusage = os.wait4(child.pid, 0)
    except ChildProcessError:  # reaped behind our back: ``Popen`` says what it can
        return child.wait(), None
    child.returncode = os.waitstatus_to_exitcode(status)
    cpu_s = rusage.ru_utime + rusage.ru_stime
    return child.returncode, Usage(round(cpu_s, 3), rusage.ru_maxrss * _MAXRSS_UNIT)


# --- pipes ---------------------------------------------------------------------------------


def new_selector() -> selectors.BaseSelector:
    """A selector for a handful of descriptors of one child.

    ``poll`` needs no descriptor of its own (200 concurrent runs must not cost 200 epoll fds)
    and has no FD_SETSIZE limit. macOS's ``poll`` is unreliable for some descriptor kinds, so
    there the default (kqueue) is used.
    """
    if sys.platform == "linux":
        return selectors.PollSelector()
    return selectors.DefaultSelector()


def read_available(pipe: IO[bytes]) -> bytes | None:
    """What the pipe holds now (at most ``READ_CHUNK``): ``b""`` at EOF, ``None`` if empty."""
    try:
        return os.read(pipe.fileno(), READ_CHUNK)
    except BlockingIOError:
        return None
    except OSError as exc:  # as in ``read_into``
        if exc.errno == errno.EIO:
            return b""
        raise


def read_into(pipe: IO[bytes], buffer: bytearray | mmap.mmap) -> int | None:
    """Read what the pipe holds now into ``buffer`` (at most its size): the byte count, 0 at
    EOF, ``None`` if empty. A buffer reused across reads costs no allocation and no fresh
    pages per chunk, which ``os.read`` of a megabyte does (an mmap, its page faults, munmap)."""
    try:
        return os.readv(pipe.fileno(), [buffer])
    except BlockingIOError:
        return None
    except OSError as exc:  # a terminal's master, once the child's side hung up: its EOF
        if exc.errno == errno.EIO:
            return 0
        raise


def write_available(pipe: IO[bytes], data: memoryview) -> int:
    """Write as much of ``data`` as the pipe takes now; ``BrokenPipeError`` if nobody reads."""
    try:
        return os.write(pipe.fileno(), data)
    except BlockingIOError:
        return 0


# --- exit without reaping --------------------------------------------------------------------


class ExitSignal:
    """A descriptor that becomes (and stays) readable once the child has exited.

    Level-triggered, so the owner's selector and a stopping thread may both watch it. It
    never reaps: the child stays a zombie, its pid and group id reserved, until ``reap``.
    """

    def __init__(self, fd: int, closers: Iterable[Callable[[], None]]) -> None:
        self._fd = fd
        self._closers = list(closers)
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self._fd

    def wait(self, timeout: float | None) -> bool:
        """True once the child has exited; False if ``timeout`` seconds pass first.

        Safe from any thread, even while the owner closes the signal: it waits on a duplicate,
        so a descriptor number closed (and reused) under it is never polled.
        """
        with self._lock:
            if not self._closers:  # closed: only ever after the child was reaped
                return True
            fd = os.dup(self._fd)
        try:
            with new_selector() as sel:
                sel.register(fd, selectors.EVENT_READ)
                return bool(sel.select(timeout))
        finally:
            os.close(fd)

    def close(self) -> None:
        """Release the descriptor; only once the child has exited (a watcher thread joins)."""
        with self._lock:
            closers, self._closers = self._closers, []
        for close in closers:
            close()


def watch_exit(pid: int) -> ExitSignal:
    """An ``ExitSignal`` for our unreaped child ``pid``, by the best means the platform has."""
    if sys.platform == "linux":
        return _pidfd_exit(pid) or _thread_exit(pid)
    else:
        return _kqueue_exit(pid)


if sys.platform == "linux":

    def _pidfd_exit(pid: int) -> ExitSignal | None:
        """Linux >= 5.3: a pidfd polls readable once the process has exited."""
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # ENOSYS before Linux 5.3, EPERM under some seccomp profiles
            return None
        return ExitSignal(fd, [lambda: os.close(fd)])

    def _thread_exit(pid: int) -> ExitSignal:
        """Fallback: a thread blocked in a non-reaping ``waitid`` closes a pipe on exit."""
        read_fd, write_fd = os.pipe()

        def watch() -> None:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:  # someone reaped it already: it has exited all the same
                pass
            finally:
                os.close(write_fd)

        watcher = threading.Thread(target=watch, name=f"procledger-exit-{pid}", daemon=True)
        watcher.start()
        return ExitSignal(read_fd, [watcher.join, lambda: os.close(read_fd)])

else:

    def _exited_already() -> ExitSignal:
        """A pipe whose write end is closed: readable (EOF) from the start."""
        read_fd, write_fd = os.pipe()
        os.close(write_fd)
        return ExitSignal(read_fd, [lambda: os.close(read_fd)])

    def _kqueue_exit(pid: int) -> ExitSignal:
        """macOS/BSD: a kqueue holding an undelivered NOTE_EXIT event is readable, and stays
        so (we never collect the event)."""
        kq = select.kqueue()
        event = select.kevent(
            pid, filter=select.KQ_FILTER_PROC, flags=select.KQ_EV_ADD, fflags=select.KQ_NOTE_EXIT
        )
        try:
            kq.control([event], 0)
        except ProcessLookupError:  # it exited before we could register: say so at once
            kq.close()
            return _exited_already()
        return ExitSignal(kq.fileno(), [kq.close])


# --- the tree --------------------------------------------------------------------------------
# psutil (a C extension, ~50 ms to import) is imported by the functions that need it: only
# stopping a tree does, and most runs end on their own.


def _pgid(process: psutil.Process) -> int | None:
    """The group of a process we discovered, or None if it is gone (or its pid reused)."""
    import psutil

    try:
        if not process.is_running():  # compares the start time: a reused pid is not ours
            return None
        return os.getpgid(process.pid)
    except (psutil.Error, OSError):
        return None


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a killed orphan may wait a while for init to reap it)."""
    import psutil

    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _group_members(pgid: int) -> list[int]:
    """Pids now in group ``pgid``: members whose parent died are no longer descendants."""
    import psutil

    members = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pgid:
                members.append(pid)
    return members


RUN_MARKER: Final = "PROCLEDGER_RUN"
"""The environment variable each supervised child gets, naming its run: descendants inherit
it, so a stop finds those that escaped both the child's group and its ancestry."""


def _marked(marker: str | None, child_pid: int) -> list[int]:
    """Pids whose environment carries ``RUN_MARKER=marker`` and that started no earlier than
    the child (a marker copied into an older process is not ours to signal)."""
    import psutil

    if marker is None:
        return []
    try:
        born = psutil.Process(child_pid).create_time()
    except psutil.Error:
        return []
    found = []
    for process in _carrying(marker):
        with contextlib.suppress(psutil.Error, OSError):
            if process.create_time() >= born:
                found.append(process.pid)
    return found


def _carrying(marker: str) -> Iterator[psutil.Process]:
    """The processes on this host (but this one) whose environment carries ``RUN_MARKER=marker``
    -- as far as this user may read environments."""
    import psutil

    me = os.getpid()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if process.pid != me and process.environ().get(RUN_MARKER) == marker:
                yield process


def carrying(marker: str) -> list[int]:
    """The pids of the processes on this host (but this one) carrying ``marker``."""
    return [process.pid for process in _carrying(marker)]


def stop_marked(marker: str, grace_s: float) -> tuple[list[int], list[int]]:
    """Stop every process carrying ``marker``: SIGTERM, SIGKILL to those left after
    ``grace_s``. ``(stopped, survivors)`` as pids: what was found, and what outlived SIGKILL.
    For a run's leftovers with no child of ours to start from (its supervisor died)."""
    found = list(_carrying(marker))
    for process in found:
        _signal_process(process, signal.SIGTERM)
    alive = _await_gone(found, grace_s)
    for process in alive:
        _signal_process(process, signal.SIGKILL)
    alive = _await_gone(alive, KILL_SETTLE_S)
    return [p.pid for p in found], [p.pid for p in alive]


def _await_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still alive after waiting up to ``timeout`` (briefly polling:
    they are not our children). A zombie is gone: an orphan killed when its parent died
    waits for init to reap it, which may take a long time (``psutil.wait_procs`` waited the
    whole grace for each such one)."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    alive = [p for p in processes if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
        alive = [p for p in alive if _alive(p)]
    return alive


KILL_SETTLE_S: Final = 1.0
"""How long, after SIGKILL, to wait for the known tree to be dead before going on anyway (a
process stuck in uninterruptible sleep must not hang its owner)."""


def proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, starttime)`` of ``pid`` from ``/proc/<pid>/stat`` (state ``Z``: a zombie);
    ``None`` if there is no such process or ``/proc`` cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read().decode("ascii", "replace")
        fields = text[text.rindex(")") + 2 :].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_process(process: psutil.Process, sig: int) -> None:
    import psutil

    with contextlib.suppress(psutil.Error):  # psutil refuses a reused pid (NoSuchProcess)
        process.send_signal(sig)


class Tree:
    """The processes of one child's tree that we have seen, and how to signal them.

    The tree is the child's process group plus every descendant of the child or of a group
    member, including descendants that made their own group or session. It only grows:
    a process seen once stays a target until it is gone.
    """

    def __init__(self, child_pid: int, marker: str | None = None) -> None:
        self._child_pid = child_pid  # also the group id: the child leads its group
        self._marker = marker
        self._known: set[psutil.Process] = set()

    def discover(self) -> None:
        """Add what is in the tree now. Only while the child is unreaped: its pid is ours.

        Besides the child's group and descendants, every process carrying the run's marker in
        its environment (``RUN_MARKER``) -- a descendant that made its own session *and* lost
        its parent (``setsid`` plus a double fork) is found no other way."""
        import psutil

        seen: set[int] = set()
        marked = _marked(self._marker, self._child_pid)
        for pid in (self._child_pid, *_group_members(self._child_pid), *marked):
            if pid in seen:  # already found below an earlier root
                continue
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                found = [root, *root.children(recursive=True)]
                seen.update(p.pid for p in found)
                self._known.update(found)

    def signal_own_group(self, sig: int) -> None:
        """Send ``sig`` to the child's own group, before any discovery: while the child is
        unreaped its group is ours (it leads it), and most trees are that group. Discovery reads
        every process's environment (~0.1 ms each: 0.1-0.3 s on a host with a thousand
        processes), so a stop that waited for it would reach the child that much later. Then
        ``discover`` and ``signal(..., own_group_done=True)`` reach the rest. Only where this
        process is not the subreaper (the host agent: its anchor is): a subreaper must see a
        descendant before it dies, or it cannot tell the zombie it inherits is one to reap."""
        _signal_group(self._child_pid, sig)

    def signal(self, sig: int, *, child_unreaped: bool, own_group_done: bool = False) -> None:
        """Send ``sig`` to every group of the tree (but the child's own where
        ``own_group_done``: one signal each), and to members of groups not its own."""
        groups, strays = self._targets(child_unreaped)
        if own_group_done:
            groups.discard(self._child_pid)
        for pgid in sorted(groups):
            _signal_group(pgid, sig)
        for process in strays:
            _signal_process(process, sig)

    def _targets(self, child_unreaped: bool) -> tuple[set[int], list[psutil.Process]]:
        """Groups we may signal whole, and processes to signal one by one.

        A group is ours if a process of the tree created it (its id is that process's pid)
        and a live process of the tree still belongs to it: a group id stays reserved while
        the group has a member, so it cannot have been reused. A descendant that joined a
        foreign group (e.g. the host's own) is signalled alone, never its group.
        """
        own_group = os.getpgrp()
        creators = {p.pid for p in self._known} | {self._child_pid}
        groups = {self._child_pid} if child_unreaped else set()
        strays = []
        for process in self._known:
            pgid = _pgid(process)
            if pgid is None:
                continue
            if pgid in creators and pgid != own_group:
                groups.add(pgid)
            else:
                strays.append(process)
        return groups, strays

    def survivors(self) -> list[int]:
        """OS pids of known processes still alive (not zombies), ascending."""
        return sorted(p.pid for p in self._known if _alive(p))

    def reap_adopted(self, child_pid: int) -> None:
        """Reap, by exact pid, the dead processes of the tree that were re-parented to us (we
        are a child subreaper): nobody else will, and ``waitpid(-1)`` would take the host's
        own children. ``child_pid`` is reaped by its ``Popen``, not here."""
        import psutil

        me = os.getpid()
        for process in self._known:
            if process.pid == child_pid:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                if process.ppid() == me and process.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(process.pid, os.WNOHANG)

    def await_gone(self, timeout: float) -> bool:
        """Wait (briefly polling: nothing notifies us about non-children) until every known
        process is dead; True if they all are."""
        return not _await_gone(list(self._known), timeout)
