"""`run --name`: a name a live service already holds, and ``--replace`` (docs/design.md §19).

A second ``run --name dev`` while ``dev`` lives starts nothing and answers as the first did:
the living one's id on stdout (its record with ``--json``), so a script that captures the id
goes on with the service that runs, and one line on stderr saying so. ``--replace`` stops the
living service first -- no attempt follows -- and waits for its end before starting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from procledger.cli.lines import warn, write_json, write_line

if TYPE_CHECKING:
    from procledger import ProcessRegistry
    from procledger.domain.errors import NameTaken

__all__ = ["REPLACE_WAIT_S", "answer_taken", "stop_named"]

REPLACE_WAIT_S = 60.0
"""How long ``--replace`` waits, past the stop's grace, for the old service to end."""


def answer_taken(taken: NameTaken, record: dict[str, object] | None) -> int:
    """Exit 0 with the living service's id (``record``: its stored document, for ``--json``)."""
    if record is None:
        write_line(taken.process_id)
    else:
        write_json(record)
    warn(
        f"service {taken.name} is already running as process {taken.process_id}: "
        "nothing started (--replace stops it and starts the command)"
    )
    return 0


def stop_named(registry: ProcessRegistry, name: str, grace_s: float) -> str | None:
    """Stop the live service ``name`` (the whole service: no attempt follows) and wait for its
    end; the id of the attempt that ended, or ``None`` when none was live.

    Raises:
        TimeoutError: it did not end within its grace and ``REPLACE_WAIT_S``.
    """
    from procledger.cli._owner import cli_owner
    from procledger.cli.control import tell_agent
    from procledger.supervisor.control import stop_target
    from procledger.supervisor.modes import StopMode

    named = registry.services.named(name)
    if named is None or not named.live or named.newest is None:
        return None
    done = stop_target(registry, named.newest.id, StopMode.terminate, grace_s, cli_owner())
    if done.how == "asked":
        tell_agent(registry, done.record.id)
    ended = registry.await_end(done.record.id, timeout=grace_s * 2 + REPLACE_WAIT_S)
    return ended.id
