"""A writer OS process for the feed tests and benchmarks/async_supervise.py (run as a script).

``python _writer.py URL PREFIX COUNT PAUSE_S`` registers COUNT external processes
``PREFIX-0000``… one write each, ``PAUSE_S`` apart; each carries ``{"t": time.time()}``
taken just before its write, so a follower can tell how long the change took to reach it.
"""

from __future__ import annotations

import sys
import time

from procledger import (
    Originator,
    ProcessInput,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)


def write(url: str, prefix: str, count: int, pause_s: float) -> None:
    registry = open_registry(url)
    try:
        for index in range(count):
            registry.register(
                ProcessRegistration(
                    id=f"{prefix}-{index:04d}",
                    input=ProcessInput.external({"t": time.time()}),
                    disposition=RecoveryDisposition.externally_owned,
                    originator=Originator.host(),
                )
            )
            if pause_s:
                time.sleep(pause_s)  # pacing the writes, not synchronising with anyone
    finally:
        registry.close()


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
