"""What /proc says about a process: its start time, whether it still runs, and which host and
boot this is -- plain reads of plain files, with no model behind them, so the liveness probe
(``adapters.liveness``) and the CLI's fast path (which marks a run whose supervisor is gone
without loading pydantic, docs/design.md §8) judge a pid by the same code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Identity:
    """This OS process as a lease holder is known by (``Liveness`` of a ``local_process``)."""

    host_id: str
    boot_id: str
    pid: int
    process_start: str


PROC = Path("/proc")


def read_process_start(pid: int, proc: Path = PROC) -> str | None:
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


def live_process_start(pid: int, proc: Path = PROC) -> str | None:
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


def started_at(pid: int, start_time: int | float, proc: Path = PROC) -> bool:
    """Whether OS process ``pid`` of this PID namespace still runs (not a zombie) and is the
    one that started at ``start_time`` (clock ticks, field 22 of /proc/<pid>/stat): the pid
    **and** its start time, since a pid alone may have passed to a stranger. Any read error
    means no: nothing is ever signalled on a guess."""
    try:
        start = live_process_start(pid, proc)
        return start is not None and int(start) == int(start_time)
    except (OSError, ValueError, IndexError):
        return False


def _machine_id(proc: Path) -> str:
    for candidate in (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id")):
        try:
            return candidate.read_text().strip()
        except OSError:
            continue
    return (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()


def read_identity(proc: Path = PROC) -> Identity | None:
    """This process's own facts as /proc gives them, or None where it cannot say."""
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
    return Identity(host_id=host_id, boot_id=boot_id, pid=pid, process_start=start)


_OWN: dict[int, Identity] = {}


def own_identity(proc: Path = PROC) -> Identity | None:
    """``read_identity``, read once per OS process (a forked child reads its own): none of it
    changes while a process lives."""
    if proc is not PROC:
        return read_identity(proc)
    cached = _OWN.get(os.getpid())
    if cached is None:
        cached = read_identity(proc)
        if cached is not None:
            _OWN.clear()
            _OWN[os.getpid()] = cached
    return cached


def this_host_id(proc: Path = PROC) -> str | None:
    """This host as ``OsFacts.host_id`` names it (machine id and PID namespace), or ``None``
    where /proc cannot tell: then no output or outbox entry is ever taken for this host's."""
    identity = own_identity(proc)
    return identity.host_id if identity is not None else None


def host_id() -> str:
    """``this_host_id``, else the host name: an owner id must name the same host in every
    `procledger` started on it."""
    found = this_host_id()
    if found:
        return found
    import socket  # noqa: PLC0415 -- only where /proc cannot tell

    return socket.gethostname()


def runs_here(pid: int, start_time: int | float, host_id: str, proc: Path = PROC) -> bool:
    """``started_at``, for a process recorded on host ``host_id`` (``OsFacts.host_id``:
    machine and PID namespace): never true of another host's, or where /proc cannot say which
    host this is."""
    identity = own_identity(proc)
    if identity is None or identity.host_id != host_id:
        return False
    return started_at(pid, start_time, proc)


StartReader = Callable[[int], "str | None"]


def holder_dead(
    holder: Mapping[str, Any], claimant: Mapping[str, Any], read_start: StartReader
) -> bool:
    """Whether the lease holder whose liveness facts are ``holder`` (a ``Liveness`` as JSON) is
    provably dead as seen by ``claimant`` (the same): both ``local_process`` owners of this host
    and boot, and the holder's pid gone, a zombie or another process (docs/design.md §3.5).
    Any read error means no: a lease is never stolen on a guess."""
    if holder.get("kind") != "local_process" or claimant.get("kind") != "local_process":
        return False
    if holder.get("host_id") != claimant.get("host_id"):
        return False
    if holder.get("boot_id") != claimant.get("boot_id"):
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        start = read_start(pid)
    except (OSError, ValueError, IndexError):
        return False
    return start is None or start != holder.get("process_start")
