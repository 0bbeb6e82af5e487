"""This process's child-subreaper mark (Linux), shared by the supervisors that asked for it:
orphaned descendants re-parent to a subreaper, so a stop can reap them (docs/design.md §6.1).
"""

from __future__ import annotations

import threading

from procledger.supervisor import os_seam

__all__ = ["Subreaper"]


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
                cls._was_set = os_seam.is_child_subreaper()
                if not (cls._was_set or os_seam.set_child_subreaper(True)):
                    return False
            cls._count += 1
            return True

    @classmethod
    def release(cls) -> None:
        with cls._lock:
            cls._count -= 1
            if cls._count == 0 and not cls._was_set:
                os_seam.set_child_subreaper(False)
