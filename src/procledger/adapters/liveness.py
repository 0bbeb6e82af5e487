"""The /proc liveness probe: can a claimant *prove* that a lease holder is dead?

Only ``local_process`` owners in the same PID namespace (``host_id``) and the same boot can be
judged, and only a missing PID, a zombie (exited, not yet reaped by its parent) or a PID whose
start time differs counts as proof. Any read error means "not provably dead": a lease is never
stolen on a guess.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from procledger.domain.leases import LeaseOwner, Liveness, install_local_identity_source

_PROC = Path("/proc")


def read_process_start(pid: int, proc: Path = _PROC) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks); None if the pid is gone.

    Raises ``OSError`` when the file exists but cannot be read or parsed.
    """
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19]


def live_process_start(pid: int, proc: Path = _PROC) -> str | None:
    """The start time of a *living* process: ``None`` when the pid is gone or is a zombie
    (exited, not yet reaped — it will never write again, so it counts as dead)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return None
    state_and_rest = stat[stat.rindex(")") + 2 :].split()
    if state_and_rest[0] in ("Z", "X"):
        return None
    return state_and_rest[19]


def started_at(pid: int, start_time: int | float, proc: Path = _PROC) -> bool:
    """Whether OS process ``pid`` of this PID namespace still runs (not a zombie) and is the
    one that started at ``start_time`` (clock ticks, field 22 of /proc/<pid>/stat): the pid
    **and** its start time, since a pid alone may have passed to a stranger. Any read error
    means no: nothing is ever signalled on a guess."""
    try:
        start = live_process_start(pid, proc)
        return start is not None and int(start) == int(start_time)
    except (OSError, ValueError, IndexError):
        return False


def runs_here(pid: int, start_time: int | float, host_id: str, proc: Path = _PROC) -> bool:
    """``started_at``, for a process recorded on host ``host_id`` (``OsFacts.host_id``:
    machine and PID namespace): never true of another host's, or where /proc cannot say which
    host this is."""
    identity = local_identity(proc)
    if identity is None or identity.host_id != host_id:
        return False
    return started_at(pid, start_time, proc)


def _machine_id(proc: Path) -> str:
    for candidate in (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id")):
        try:
            return candidate.read_text().strip()
        except OSError:
            continue
    return (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()


def local_identity(proc: Path = _PROC) -> Liveness | None:
    """This process's liveness facts, or None where /proc is unreadable (then: opaque).

    Read once per OS process: none of them can change while it lives (its pid, start time,
    PID namespace and the boot are fixed; a forked child has another pid, so it reads its
    own). Five /proc reads cost ~150 µs, and a supervised run asked three times."""
    if proc is _PROC:
        cached = _IDENTITY.get(os.getpid())
        if cached is not None:
            return cached
    identity = _read_identity(proc)
    if proc is _PROC and identity is not None:
        _IDENTITY.clear()  # a forked child forgets its parent's
        _IDENTITY[os.getpid()] = identity
    return identity


_IDENTITY: dict[int, Liveness] = {}


def _read_identity(proc: Path) -> Liveness | None:
    try:
        pid_namespace = os.stat(proc / "self" / "ns" / "pid").st_ino
        boot_id = (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
        pid = os.getpid()
        start = read_process_start(pid, proc)
        host_id = f"{_machine_id(proc)}:{pid_namespace}"
    except (OSError, ValueError, IndexError):
        return None
    if start is None:
        return None
    return Liveness(
        kind="local_process", host_id=host_id, boot_id=boot_id, pid=pid, process_start=start
    )


StartReader = Callable[[int], str | None]


class ProcProbe:
    """Decides "provably dead" for a holder, as seen by a claimant on this host."""

    def __init__(self, read_start: StartReader = live_process_start) -> None:
        self._read_start = read_start

    def provably_dead(self, holder: LeaseOwner, claimant: LeaseOwner) -> bool:
        mine, theirs = claimant.liveness, holder.liveness
        if not (mine.is_local_process and theirs.is_local_process):
            return False
        if mine.host_id != theirs.host_id or mine.boot_id != theirs.boot_id:
            return False
        assert theirs.pid is not None
        try:
            start = self._read_start(theirs.pid)
        except (OSError, ValueError, IndexError):
            return False
        return start is None or start != theirs.process_start


install_local_identity_source(local_identity)
