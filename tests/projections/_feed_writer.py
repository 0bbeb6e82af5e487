"""A writer OS process for ``test_concurrent_feed.py`` (run as a script, never imported).

``python _feed_writer.py URL PROCESS_ID`` opens the registry, prints ``ready``, waits for a
line on stdin (so every writer starts at once), then registers the process, appends one
producer event, completes it, and prints ``done``.
"""

from __future__ import annotations

import sys

from procledger import (
    CompletionAuthority,
    EventType,
    Originator,
    ProcessInput,
    ProcessRegistration,
    RecoveryDisposition,
    open_registry,
)


def write(url: str, process_id: str) -> None:
    registry = open_registry(url)
    try:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.readline()
        registry.register(
            ProcessRegistration(
                id=process_id,
                input=ProcessInput.external({"label": "writer"}),
                disposition=RecoveryDisposition.externally_owned,
                originator=Originator.host(),
                event_types=[EventType(name="signal.ready")],
            )
        )
        registry.append_event(process_id, "signal.ready", {"by": process_id}, replay_key="r")
        registry.record_started(process_id, 1)
        registry.record_completed(
            process_id,
            "exited",
            "exited",
            exit_code=0,
            authority=CompletionAuthority.external_owner("feed-test"),
        )
    finally:
        registry.close()
    sys.stdout.write("done\n")
    sys.stdout.flush()


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2])
