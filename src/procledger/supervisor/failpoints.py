"""Crash points for fault-injection tests (docs/design.md §18.7).

``PROCLEDGER_FAILPOINT=NAME:PATH`` in a supervising process's environment kills it with SIGKILL
the first time it reaches the point ``NAME`` -- as a crash at that instant would -- and creates
``PATH`` first, so that the process started again in its place passes the point. Without the
variable nothing happens, at the cost of one dictionary lookup. The points are those between
which a start's durable facts differ: ``after_register`` (``starting`` on record, no child),
``after_spawn`` (a child, not on record), ``before_backgrounded`` (the write about to be made).
"""

from __future__ import annotations

import os
import signal
from typing import Final

__all__ = ["VARIABLE", "reached"]

VARIABLE: Final = "PROCLEDGER_FAILPOINT"


def reached(name: str) -> None:
    """Die here if the environment names this point and it has not fired yet."""
    spec = os.environ.get(VARIABLE)
    if spec is None:
        return
    point, _, flag = spec.partition(":")
    if point != name or not flag:
        return
    try:
        os.close(os.open(flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)
