"""Which processes of this host listen on a TCP port, read from /proc (docs/design.md §19):
``procledger stop :PORT`` stops what holds a port only once it knows that procledger started
it, and says who it is when it did not.

``/proc/net/tcp`` and ``/proc/net/tcp6`` list the sockets of this network namespace, each with
its state and inode; a process holds a socket when one of its ``/proc/PID/fd`` links names that
inode (``socket:[INODE]``). Every process holding a listening socket is found -- a server that
forked workers shares one -- but only the processes this user may look into: another user's
fds cannot be read, and then the port is held by nobody procledger can name. Standard library
only; Linux only, as the rest of /proc.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PortListeners", "ancestry", "command_line", "listeners"]

PROC = Path("/proc")
_LISTEN = "0A"
"""``TCP_LISTEN`` in the ``st`` column of /proc/net/tcp."""


@dataclass(frozen=True, slots=True)
class PortListeners:
    """The sockets listening on a port (``inodes``: none, nothing listens) and the processes
    found holding them, lowest pid first (``pids``: none while ``inodes`` is not empty, only
    processes this user cannot look into do)."""

    port: int
    inodes: frozenset[int]
    pids: tuple[int, ...]


def listeners(port: int, proc: Path = PROC) -> PortListeners:
    """Who listens on TCP ``port`` of this host, on any address, IPv4 or IPv6."""
    inodes = frozenset(_listening_inodes(port, proc))
    return PortListeners(port, inodes, tuple(_holders(inodes, proc)) if inodes else ())


def _listening_inodes(port: int, proc: Path) -> list[int]:
    """The inodes of the listening sockets bound to ``port`` (one per address)."""
    found: list[int] = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 on this host
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            if int(fields[1].rpartition(":")[2], 16) == port and fields[9] != "0":
                found.append(int(fields[9]))
    return found


def _holders(inodes: frozenset[int], proc: Path) -> list[int]:
    """The pids whose open files include one of the sockets ``inodes``."""
    links = {f"socket:[{inode}]" for inode in inodes}
    pids: list[int] = []
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"{entry.path}/fd")
        except OSError:  # gone, or another user's
            continue
        with fds:
            if any(_link(fd.path) in links for fd in fds):
                pids.append(int(entry.name))
    return sorted(pids)


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:  # closed meanwhile
        return None


def ancestry(pid: int, proc: Path = PROC) -> list[int]:
    """``pid`` and its parents, nearest first, up to (not including) pid 1 or a process that
    is gone; ``[]`` when ``pid`` itself is gone."""
    chain: list[int] = []
    while pid > 1 and pid not in chain:
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            break
        chain.append(pid)
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return chain


def command_line(pid: int, proc: Path = PROC) -> str:
    """What ``pid`` runs, as ps(1) shows it: its arguments joined by spaces (its name in
    brackets when it has none, a kernel thread's or a zombie's; ``?`` when it is gone)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
        if raw.strip(b"\0"):
            return " ".join(raw.rstrip(b"\0").decode(errors="replace").split("\0"))
        return f"[{(proc / str(pid) / 'comm').read_text().strip()}]"
    except OSError:
        return "?"
