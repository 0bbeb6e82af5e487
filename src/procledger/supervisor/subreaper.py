"""This process's child-subreaper mark (Linux), shared by the supervisors that asked for it:
orphaned descendants re-parent to a subreaper, so a stop can reap them (docs/design.md §6.1).
"""

from __future__ import annotations

import sys
import threading
from typing import Final

__all__ = ["Subreaper", "is_child_subreaper", "set_child_subreaper"]


class Subreaper:
    """The mark, counted over the supervisors that asked for it: set by the first, cleared by
    the last (unless it was set before any of them)."""

    _lock = threading.Lock()
    _count = 0
    _was_set = False

    @classmethod
    def acquire(cls) -> bool:
        with cls._lock:
            if cls._count == 0:
                cls._was_set = is_child_subreaper()
                if not (cls._was_set or set_child_subreaper(True)):
                    return False
            cls._count += 1
            return True

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._count -= 1
            if cls._count == 0 and not cls._was_set:
                set_child_subreaper(False)


def set_child_subreaper(enabled: bool) -> bool:
    """Mark this process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), or unmark it:
    orphaned descendants then re-parent to us instead of init, so a stop can still reap them.
    False where the platform has no such thing or refuses."""
    if sys.platform != "linux":
        return False
    import ctypes  # noqa: PLC0415 -- only on Linux, only when a supervisor asks

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def is_child_subreaper() -> bool:
    """Whether this process is a child subreaper now (Linux; False elsewhere)."""
    if sys.platform != "linux":
        return False
    import ctypes  # noqa: PLC0415 -- only on Linux, only when a supervisor asks

    value = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return bool(value.value)


_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_GET_CHILD_SUBREAPER: Final = 37
