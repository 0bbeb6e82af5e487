"""Adoption identity: is a live process the recorded child of a run, and holding it once it is
(docs/design.md §18.4; issue 28). The agent's takeover calls it for each process it finds.

A (re)started agent adopts every live child of its ledger on this host. A pid alone is never
enough -- the OS hands a freed pid to a stranger -- so a process is the record's child only if,
on the host the record names, the pid exists, its ``/proc/<pid>/stat`` start time (clock ticks,
as ``OsFacts.start_time``) equals the recorded one, **and** its ``/proc/<pid>/environ`` carries
``PROCLEDGER_RUN=<marker>`` (``os_seam.RUN_MARKER``). Every refusal is a typed ``Refusal`` with
a sentence, because the agent writes it into the record's diagnostic, and the record must tell
the truth: when procledger cannot know (an environment it may not read, a host it cannot name),
it says so rather than guessing.

``adopt`` then opens a pidfd and reads the start time again *after* opening it: a pid reused
between the check and the open would give a pidfd on the stranger, whose start time differs.
Once the check passes, the pidfd pins the identity (it never follows a reused pid).

Standard library only, no psutil: the agent reads ``/proc`` directly (``this_host_id``, the
default ``host_id``, loads the liveness adapter, and with it pydantic, on first use). Linux
only: macOS has no ``/proc`` (no start time in clock ticks, no other process's environment
short of ``sysctl KERN_PROCARGS2``) and no pidfd (a kqueue ``EVFILT_PROC``/``NOTE_EXIT``
watches the end, but names a pid, not a process, and cannot collect a status).
"""

from __future__ import annotations

import enum
import os
import select
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

from procledger.supervisor.os_seam import RUN_MARKER

__all__ = [
    "Adopted",
    "Identified",
    "NotAdoptable",
    "Recorded",
    "Refusal",
    "adopt",
    "identify",
    "parent_of",
    "scan",
    "this_host_id",
]

_MARKER_PREFIX: Final = RUN_MARKER.encode() + b"="

EXEC_SETTLE_S: Final = 0.02
"""How long an empty environment is read again before it counts as one without a marker."""


class Recorded(Protocol):
    """What a record says of its child (``OsFacts`` has these)."""

    @property
    def pid(self) -> int: ...
    @property
    def start_time(self) -> int | float: ...
    @property
    def host_id(self) -> str: ...


class Refusal(enum.Enum):
    """Why a process is not the record's child, or why procledger cannot tell."""

    gone = "gone"
    other_host = "other_host"
    host_unknown = "host_unknown"
    pid_reused = "pid_reused"
    zombie = "zombie"
    marker_missing = "marker_missing"
    marker_other = "marker_other"
    environ_unreadable = "environ_unreadable"


@dataclass(frozen=True, slots=True)
class NotAdoptable:
    """A refusal: the typed ``reason`` and ``detail``, a sentence for the record's diagnostic."""

    pid: int
    reason: Refusal
    detail: str


@dataclass(frozen=True, slots=True)
class Identified:
    """The record's child, as seen by ``identify`` (no descriptor yet: see ``adopt``)."""

    pid: int
    start_time: int
    parent: int


@dataclass(frozen=True, slots=True)
class _Stat:
    state: str
    ppid: int
    start_time: int


def this_host_id() -> str | None:
    """This host as ``OsFacts.host_id`` names it (``application.outbox.this_host_id``).
    Imported here, not at the top: it brings pydantic, and a caller that passes ``host_id``
    (the agent, once) keeps this path to the standard library."""
    from procledger.application.outbox import this_host_id as host_id  # noqa: PLC0415

    return host_id()


def _read_stat(pid: int) -> _Stat | None:
    """State, parent and start time from ``/proc/<pid>/stat``; ``None`` when there is no such
    process. The command name may hold spaces and parentheses, so fields are counted from the
    last ``)``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read().decode("ascii", "replace")
        fields = text[text.rindex(")") + 2 :].split()
        return _Stat(fields[0], int(fields[1]), int(fields[19]))
    except (OSError, ValueError, IndexError):
        return None


def parent_of(pid: int, start_time: int) -> int | None:
    """The parent of the process ``(pid, start_time)``, ended but unreaped included; ``None``
    when it is gone (or the pid names another process now)."""
    stat = _read_stat(pid)
    return stat.ppid if stat is not None and stat.start_time == start_time else None


def _read_marker(pid: int) -> bytes | OSError | None:
    """The value of ``RUN_MARKER`` in the process's environment (``None``: it has none), or the
    error that kept us from reading it (another user's process without ``CAP_SYS_PTRACE``).

    An empty environment is read again for up to ``EXEC_SETTLE_S``: a process in ``execve``
    shows none until the new image's stack is set up (the kernel closes the spawner's
    close-on-exec pipe, which ``Popen`` waits on, before that), so a child spawned a moment
    ago may look unmarked."""
    deadline = time.monotonic() + EXEC_SETTLE_S
    while True:
        try:
            with open(f"/proc/{pid}/environ", "rb") as file:
                environ = file.read()
        except OSError as exc:
            return exc
        if environ or time.monotonic() >= deadline:
            break
        time.sleep(0.001)  # nothing tells us when another process's exec completes
    for entry in environ.split(b"\0"):
        if entry.startswith(_MARKER_PREFIX):
            return entry[len(_MARKER_PREFIX) :]
    return None


def _refuse(pid: int, reason: Refusal, detail: str) -> NotAdoptable:
    return NotAdoptable(pid, reason, f"OS pid {pid}: {detail}")


def _host_refusal(record: Recorded, here: str | None) -> NotAdoptable | None:
    """A record of another host (machine and PID namespace) names a pid that means nothing
    here; a host ``/proc`` cannot name cannot be told from another."""
    if here is None:
        return _refuse(
            record.pid,
            Refusal.host_unknown,
            "this host cannot be named (/proc cannot tell its PID namespace): procledger "
            "cannot know whether the recorded child runs here",
        )
    if record.host_id != here:
        return _refuse(
            record.pid,
            Refusal.other_host,
            f"recorded on another host ({record.host_id}; this is {here}): not adoptable here",
        )
    return None


def _stat_refusal(pid: int, expected: int, stat: _Stat | None) -> NotAdoptable | None:
    """Gone, a zombie, or another process under the pid; ``None`` if the stat matches."""
    if stat is None:
        return _refuse(pid, Refusal.gone, "no such process: the recorded child is gone")
    if stat.start_time != expected:
        return _refuse(
            pid,
            Refusal.pid_reused,
            f"the pid was reused: the process there started at {stat.start_time} clock "
            f"ticks, the recorded child at {expected}",
        )
    if stat.state == "Z":
        return _refuse(
            pid,
            Refusal.zombie,
            f"ended but not reaped (a zombie): its exit status is its parent's (pid "
            f"{stat.ppid}) to collect",
        )
    return None


def _marker_refusal(pid: int, marker: str, found: bytes | OSError | None) -> NotAdoptable | None:
    if isinstance(found, OSError):
        return _refuse(
            pid,
            Refusal.environ_unreadable,
            f"its environment cannot be read ({found.strerror or found}): procledger cannot "
            "know whether it carries the run's marker",
        )
    if found is None:
        return _refuse(
            pid,
            Refusal.marker_missing,
            f"its environment has no {RUN_MARKER}",
        )
    if found != marker.encode():
        text = found.decode("utf-8", "replace")
        return _refuse(
            pid, Refusal.marker_other, f"it carries another run's marker ({RUN_MARKER}={text})"
        )
    return None


def identify(
    record: Recorded, marker: str, *, host_id: str | Callable[[], str | None] | None = this_host_id
) -> Identified | NotAdoptable:
    """The record's child if it runs here with its recorded start time and its run's marker,
    else why not. ``host_id`` is this host's id (``OsFacts.host_id`` semantics: machine and PID
    namespace), or how to get it.

    The stat is read again after the environment: a process that ended and whose pid was
    reused between the two reads would otherwise lend the stranger's environment to our record.
    """
    here = host_id() if callable(host_id) else host_id
    refused = _host_refusal(record, here)
    if refused is not None:
        return refused
    pid, expected = record.pid, int(record.start_time)
    stat = _read_stat(pid)
    refused = _stat_refusal(pid, expected, stat)
    if refused is not None:
        return refused
    found = _read_marker(pid)
    after = _read_stat(pid)
    refused = _stat_refusal(pid, expected, after) or _marker_refusal(pid, marker, found)
    if refused is not None:
        return refused
    assert after is not None  # _stat_refusal refused a missing stat
    return Identified(pid, expected, after.ppid)


class Adopted:
    """An adopted child: a pidfd pinned to it, readable once it ends (select, poll or a
    selector: ``fileno``). ``is_parent`` says whether the adopter is its parent: only then can
    ``collect`` read its real status (``waitid(P_PIDFD)``); otherwise only the exit journal
    (§18.2) can tell how it ended, and without a record there the status is unknown."""

    __slots__ = ("_fd", "is_parent", "pid", "start_time")

    def __init__(self, pid: int, start_time: int, fd: int, *, is_parent: bool) -> None:
        self.pid = pid
        self.start_time = start_time
        self.is_parent = is_parent
        self._fd: int | None = fd

    def fileno(self) -> int:
        """The pidfd (``ValueError`` once closed)."""
        if self._fd is None:
            raise ValueError("adopted child's pidfd is closed")
        return self._fd

    def ended(self) -> bool:
        """Whether the child has ended (its pidfd is readable), without waiting."""
        readable = select.poll()  # not select(): an agent holds descriptors past FD_SETSIZE
        readable.register(self.fileno(), select.POLLIN)
        return bool(readable.poll(0))

    def collect(self) -> os.waitid_result | None:
        """Reap the ended child and return its status if we are its parent; ``None`` if it
        has not ended. Not our child: ``ChildProcessError`` -- its status is not ours to read
        (look in the exit journal, else record it unknown)."""
        if not self.is_parent:
            raise ChildProcessError(f"OS pid {self.pid} is not the adopter's child")
        return os.waitid(os.P_PIDFD, self.fileno(), os.WEXITED | os.WNOHANG)

    def close(self) -> None:
        """Close the pidfd (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> Adopted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Adopted(pid={self.pid}, start_time={self.start_time}, parent={self.is_parent})"


def adopt(
    record: Recorded, marker: str, *, host_id: str | Callable[[], str | None] | None = this_host_id
) -> Adopted | NotAdoptable:
    """Identify the record's child and hold it by a pidfd, or say why not.

    The start time is read again *after* ``pidfd_open``: the pid may have been freed and reused
    between the check and the open, and the pidfd would then name the stranger. A pidfd never
    follows a reused pid, so once this check passes the identity is pinned.
    """
    seen = identify(record, marker, host_id=host_id)
    if isinstance(seen, NotAdoptable):
        return seen
    try:
        fd = os.pidfd_open(seen.pid)
    except ProcessLookupError:
        return _refuse(seen.pid, Refusal.gone, "ended before a pidfd could be opened")
    after = _read_stat(seen.pid)
    refused = _stat_refusal(seen.pid, seen.start_time, after)
    if refused is not None or after is None:
        os.close(fd)
        return refused or _refuse(seen.pid, Refusal.gone, "no such process")
    return Adopted(seen.pid, seen.start_time, fd, is_parent=after.ppid == os.getpid())


R = TypeVar("R", bound=Recorded)


def _live_pids() -> frozenset[int]:
    """The pids in this PID namespace (one ``/proc`` listing)."""
    return frozenset(int(name) for name in os.listdir("/proc") if name.isdigit())


def scan(
    records: Iterable[R],
    marker_of: Callable[[R], str] | Mapping[R, str],
    *,
    host_id: str | Callable[[], str | None] | None = this_host_id,
) -> list[tuple[R, Adopted | NotAdoptable]]:
    """``adopt`` for many records: this host's id is read once, and ``/proc`` listed once so
    that a gone pid -- most records, after a reboot or a long outage -- costs a set lookup,
    not a failed open. ``marker_of`` gives each record's run marker. The caller owns (and
    closes) every ``Adopted``."""
    here = host_id() if callable(host_id) else host_id
    live = _live_pids()
    get = marker_of.__getitem__ if isinstance(marker_of, Mapping) else marker_of
    results: list[tuple[R, Adopted | NotAdoptable]] = []
    for record in records:
        result: Adopted | NotAdoptable
        refused = _host_refusal(record, here)
        if refused is not None:
            result = refused
        elif record.pid not in live:
            result = _refuse(
                record.pid, Refusal.gone, "no such process: the recorded child is gone"
            )
        else:
            result = adopt(record, get(record), host_id=here)
        results.append((record, result))
    return results
