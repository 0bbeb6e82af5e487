"""What each running child's process tree uses, sampled by the host agent (docs/design.md
§18.10): CPU seconds (user + system, summed over the tree), RSS summed, open files and threads.

One round reads the process table once -- on Linux each ``/proc/PID/stat``: parent, CPU times,
threads, RSS -- to find every tree and its counters, then the open descriptors of the trees'
members: a thousand children cost one pass, not a thousand (~20 ms for 500 sleeping children).
The latest sample of each child is kept in memory for ``ps --resources``; the peak RSS is the
highest any sample saw.
When a child is no longer among the running, its last sample is handed back once, for the
ledger (``ResourcesUsed``): so a finished job still tells how big it was. A child the agent
reaped itself also brings what the kernel counted (``reaped``: ``wait4``'s CPU time and peak
RSS), which no sample can miss -- a run shorter than one interval has only those.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil

from procledger.domain.records import ResourceUse
from procledger.supervisor.os_seam import Usage

__all__ = [
    "DEFAULT_INTERVAL_S",
    "INTERVAL_ENV",
    "ResourceSampler",
    "Sample",
    "counted_only",
    "interval_s",
]

DEFAULT_INTERVAL_S: Final = 5.0
"""Seconds between two rounds: a round of a thousand children costs tens of milliseconds."""
INTERVAL_ENV: Final = "PROCLEDGER_RESOURCE_INTERVAL_S"
"""The agent's environment may set another interval (a test samples often)."""
SMALLEST_INTERVAL_S: Final = 0.05
_PROC: Final = Path("/proc")
_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def interval_s(environ: Mapping[str, str] | None = None) -> float:
    """The sampling interval: ``INTERVAL_ENV`` when it holds a number (not below
    ``SMALLEST_INTERVAL_S``), else ``DEFAULT_INTERVAL_S``."""
    text = (os.environ if environ is None else environ).get(INTERVAL_ENV, "")
    try:
        return max(float(text), SMALLEST_INTERVAL_S)
    except ValueError:
        return DEFAULT_INTERVAL_S


@dataclass(frozen=True)
class Sample:
    """One child's tree at one moment, with the peak RSS of every sample before it."""

    cpu_s: float
    rss_bytes: int
    peak_rss_bytes: int
    open_files: int
    threads: int
    sampled_at_ms: int

    def document(self) -> dict[str, Any]:
        """As the control socket's ``resources`` reply carries it."""
        return {
            "cpu_s": round(self.cpu_s, 3),
            "rss_bytes": self.rss_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "open_files": self.open_files,
            "threads": self.threads,
            "sampled_at_ms": self.sampled_at_ms,
        }

    def used(self, counted: Usage | None = None) -> ResourceUse:
        """As the ledger keeps it once the run ended, with what the kernel ``counted`` at its
        reaping where there is that: the larger CPU time and peak of the two."""
        return ResourceUse(
            cpu_s=round(max(self.cpu_s, counted.cpu_s if counted else 0.0), 3),
            peak_rss_bytes=max(self.peak_rss_bytes, counted.peak_rss_bytes if counted else 0),
            open_files=self.open_files,
            threads=self.threads,
            sampled_at_ms=self.sampled_at_ms,
        )


def counted_only(counted: Usage, at_ms: int) -> ResourceUse:
    """A run never sampled (shorter than one interval): what the kernel counted, alone."""
    return ResourceUse(
        cpu_s=counted.cpu_s, peak_rss_bytes=counted.peak_rss_bytes, sampled_at_ms=at_ms
    )


class ResourceSampler:
    """The latest sample of each running child, by process id. One round at a time (the agent
    runs them one after another, in a worker thread); ``reaped`` may be called from any."""

    def __init__(self) -> None:
        self._latest: dict[str, Sample] = {}
        self._counted: dict[str, tuple[Usage, int]] = {}  # reaped, not yet handed back
        self._lock = threading.Lock()

    def reaped(self, process_id: str, usage: Usage) -> None:
        """(Any thread.) What the kernel counted for a run's child as it was reaped: joined to
        the run's last sample when the round after sees the run ended."""
        with self._lock:
            self._counted[process_id] = (usage, int(time.time() * 1000))

    def latest(self, process_ids: Iterable[str] | None = None) -> dict[str, Sample]:
        """The latest sample of each of ``process_ids`` that has one (all, with ``None``)."""
        latest = dict(self._latest)
        if process_ids is None:
            return latest
        return {pid: latest[pid] for pid in process_ids if pid in latest}

    def sample(self, children: Mapping[str, int]) -> dict[str, ResourceUse]:
        """A round over ``children`` (process id -> OS pid of the run's child); returns what
        each run no longer among ``children`` used (it ended): its last sample, with what the
        kernel counted when it was reaped. With no child, then or now, nothing is read: an
        idle agent costs nothing here."""
        counted = self._take_counted(children)
        ended = self._sample(children)
        used = {pid: sample.used(counted.pop(pid, (None, 0))[0]) for pid, sample in ended.items()}
        used.update({pid: counted_only(usage, at_ms) for pid, (usage, at_ms) in counted.items()})
        return used

    def _take_counted(self, children: Mapping[str, int]) -> dict[str, tuple[Usage, int]]:
        with self._lock:
            done = {pid: c for pid, c in self._counted.items() if pid not in children}
            for pid in done:
                del self._counted[pid]
        return done

    def _sample(self, children: Mapping[str, int]) -> dict[str, Sample]:
        if not children and not self._latest:
            return {}
        now_ms = int(time.time() * 1000)
        table = _process_table()
        latest: dict[str, Sample] = {}
        for process_id, pid in children.items():
            found = self._sampled(process_id, _tree(pid, table), now_ms)
            if found is not None:
                latest[process_id] = found
            elif process_id in self._latest:
                latest[process_id] = self._latest[process_id]
        ended = {pid: sample for pid, sample in self._latest.items() if pid not in children}
        self._latest = latest
        return ended

    def _sampled(self, process_id: str, tree: list[Counters], now_ms: int) -> Sample | None:
        """The tree's counters now; ``None`` when none of it can be read (it is gone). The CPU
        time shown never goes down, though a member that ended takes its own away."""
        if not tree:
            return None
        rss = sum(member.rss_bytes for member in tree)
        before = self._latest.get(process_id)
        return Sample(
            cpu_s=max(sum(m.cpu_s for m in tree), before.cpu_s if before is not None else 0.0),
            rss_bytes=rss,
            peak_rss_bytes=max(rss, before.peak_rss_bytes if before is not None else 0),
            open_files=sum(_open_files(member.pid) for member in tree),
            threads=sum(member.threads for member in tree),
            sampled_at_ms=now_ms,
        )


@dataclass(frozen=True)
class Counters:
    """One process's counters, as one read of the process table found them."""

    pid: int
    ppid: int
    cpu_s: float
    rss_bytes: int
    threads: int


@dataclass
class _Table:
    """Every process's counters and children, from one pass over the process table."""

    counters: dict[int, Counters] = field(default_factory=dict)
    below: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def add(self, counters: Counters) -> None:
        self.counters[counters.pid] = counters
        self.below[counters.ppid].append(counters.pid)


def _process_table() -> _Table:
    """Linux: one read of each ``/proc/PID/stat`` (parent, CPU times, threads, RSS); elsewhere
    psutil's, which reads the same facts its own way."""
    if not _PROC.is_dir():
        return _psutil_table()
    table = _Table()
    for entry in os.scandir(_PROC):
        if entry.name.isdigit():
            counters = _stat_counters(int(entry.name))
            if counters is not None:
                table.add(counters)
    return table


def _stat_counters(pid: int) -> Counters | None:
    """``/proc/PID/stat``'s fields after the command name (which may hold spaces and
    parentheses): state, ppid, ..., utime (14th field), stime, ..., num_threads (20th), ...,
    rss in pages (24th). ``None`` for a process gone meanwhile, or a zombie (it uses nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    if len(fields) < 22 or fields[0] in (b"Z", b"X"):
        return None
    return Counters(
        pid=pid,
        ppid=int(fields[1]),
        cpu_s=(int(fields[11]) + int(fields[12])) / _TICKS,
        rss_bytes=int(fields[21]) * _PAGE,
        threads=int(fields[17]),
    )


def _psutil_table() -> _Table:
    table = _Table()
    for process in psutil.process_iter(["ppid", "cpu_times", "memory_info", "num_threads"]):
        info = process.info
        times, memory = info.get("cpu_times"), info.get("memory_info")
        if times is None or memory is None or not isinstance(info.get("ppid"), int):
            continue
        table.add(
            Counters(
                pid=process.pid,
                ppid=info["ppid"],
                cpu_s=times.user + times.system,
                rss_bytes=memory.rss,
                threads=info.get("num_threads") or 0,
            )
        )
    return table


def _tree(root: int, table: _Table) -> list[Counters]:
    """The counters of ``root`` and its descendants that the table holds."""
    tree, queue, seen = [], [root], {root}
    while queue:
        pid = queue.pop()
        counters = table.counters.get(pid)
        if counters is not None:
            tree.append(counters)
        for child in table.below.get(pid, ()):
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return tree


def _open_files(pid: int) -> int:
    """Its open descriptors (0 when they cannot be read: gone, or not ours)."""
    if _PROC.is_dir():
        try:
            return len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            return 0
    try:
        return psutil.Process(pid).num_fds()
    except (psutil.Error, OSError):
        return 0
