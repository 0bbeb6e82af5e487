"""The system calls a process blocks in while it waits to read, by number, per architecture
(docs/design.md §20.3): ``/proc/<pid>/task/<tid>/syscall`` gives only a number and six raw
arguments, and the numbers differ between architectures. Only x86_64 and aarch64 are known;
on any other machine ``input_calls`` is empty, so nothing is ever taken for a wait on input
there -- a missed prompt is better than a false one.

Standard library only; Linux only, as the rest of /proc.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

__all__ = ["BlockedCall", "CallShape", "InputCall", "input_calls", "parse_syscall"]


class CallShape(Enum):
    """Where a call names the descriptors it waits on, which decides how they are read."""

    READ = "read"
    """The first argument is the descriptor (read, readv, pread64, preadv, preadv2)."""
    FD_SET = "fd_set"
    """``nfds`` first, then a pointer to the read ``fd_set`` (select, pselect6)."""
    POLLFD = "pollfd"
    """A pointer to an array of ``struct pollfd``, then its length (poll, ppoll)."""


@dataclass(frozen=True, slots=True)
class InputCall:
    """A call a process can block in while it waits for input: its name (for ``how``)."""

    name: str
    shape: CallShape


_READ, _FD_SET, _POLLFD = CallShape.READ, CallShape.FD_SET, CallShape.POLLFD

_X86_64: Mapping[int, InputCall] = {
    0: InputCall("read", _READ),
    7: InputCall("poll", _POLLFD),
    17: InputCall("pread64", _READ),
    19: InputCall("readv", _READ),
    23: InputCall("select", _FD_SET),
    270: InputCall("pselect6", _FD_SET),
    271: InputCall("ppoll", _POLLFD),
    295: InputCall("preadv", _READ),
    327: InputCall("preadv2", _READ),
}
"""arch/x86/entry/syscalls/syscall_64.tbl."""

_AARCH64: Mapping[int, InputCall] = {
    63: InputCall("read", _READ),
    65: InputCall("readv", _READ),
    67: InputCall("pread64", _READ),
    69: InputCall("preadv", _READ),
    72: InputCall("pselect6", _FD_SET),
    73: InputCall("ppoll", _POLLFD),
    286: InputCall("preadv2", _READ),
}
"""include/uapi/asm-generic/unistd.h (aarch64 has no select or poll of its own)."""

_TABLES: Mapping[str, Mapping[int, InputCall]] = {
    "x86_64": _X86_64,
    "amd64": _X86_64,
    "aarch64": _AARCH64,
    "arm64": _AARCH64,
}


def input_calls(machine: str | None = None, system: str | None = None) -> Mapping[int, InputCall]:
    """The input calls of ``machine`` (``platform.machine()``) under ``system``
    (``sys.platform``); empty for any other architecture or kernel than Linux's."""
    if (system or sys.platform) != "linux":
        return {}
    return _TABLES.get(machine or platform.machine(), {})


@dataclass(frozen=True, slots=True)
class BlockedCall:
    """One line of ``/proc/<pid>/task/<tid>/syscall``: the call a sleeping thread is in."""

    number: int
    args: tuple[int, int, int, int, int, int]


def parse_syscall(line: str | None) -> BlockedCall | None:
    """The call in a syscall line (``NR ARG1..ARG6 SP PC``); ``None`` for ``running``, ``-1``
    (blocked outside a system call) or anything that does not parse."""
    if not line:
        return None
    fields = line.split()
    if len(fields) < 7:
        return None
    try:
        number = int(fields[0])
        a, b, c, d, e, f = (int(field, 16) for field in fields[1:7])
    except ValueError:
        return None
    if number < 0:
        return None
    return BlockedCall(number, (a, b, c, d, e, f))
