"""What ``ps`` and ``show`` add to a record for people, from this host's /proc: ``supervisor
gone`` where its lease holder is provably dead here, ``orphan running`` where a ``lost``
record's child still runs here (docs/design.md §8). The JSON stays the stored record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from procledger.adapters.proc_facts import (
    holder_dead,
    live_process_start,
    own_identity,
    runs_here,
    this_host_id,
)
from procledger.application.document_reads import Document, LedgerReads

SUPERVISOR_GONE = "supervisor gone"
ORPHAN_RUNNING = "orphan running"
AGENT_ROLE = "procledger-agent"  # agent.host.AGENT_ROLE, without importing the agent
CLI_ROLE = "procledger-cli"  # cli._owner's role


def host_id_or_none() -> str | None:
    """This host as output folders name it, or ``None`` (``proc_facts.this_host_id``: a
    name of its own here, which a test replaces to play another host)."""
    return this_host_id()


def _me() -> dict[str, Any]:
    identity = own_identity()
    if identity is None:
        return {"kind": "opaque"}
    return {
        "kind": "local_process",
        "host_id": identity.host_id,
        "boot_id": identity.boot_id,
        "pid": identity.pid,
        "process_start": identity.process_start,
    }


def is_terminal(record: Document) -> bool:
    """Whether it has ended: every state that has not ended has the status ``running``."""
    return bool(record["status"] != "running")


def restart_may_follow(record: Document, first: Document | None) -> bool:
    """``domain.attempts.restart_may_follow`` over stored documents (a test holds the two
    equal): whether another attempt of ``record``'s service may still start after it --
    ended, not given up, stopped (itself or, on ``first``, the whole service), shut down or
    lost, and its policy restarts such an end. What tells `logs -f` a service is over."""
    policy = record.get("restart")
    if policy is None or not is_terminal(record) or record.get("gave_up") is not None:
        return False
    if record.get("stop_requested") or record.get("reason") == "runner_shutdown":
        return False
    if record.get("service_stop_requested") or (first or {}).get("service_stop_requested"):
        return False
    if record["state"] in ("lost_on_restore", "abandoned") or policy["mode"] == "never":
        return False
    return bool(policy["mode"] == "always" or record["status"] == "failed")


def starter_gone(record: Document) -> bool:
    """Whether the supervisor that started ``record`` is provably dead on this host: a
    service's next attempt is registered by that supervisor alone, so none will come
    (a dead supervisor's backoff schedule is not resumed, docs/design.md §15.4)."""
    started = record.get("first_started")
    if started is None:
        return False
    liveness = started["owner"].get("liveness") or {}
    return holder_dead(liveness, _me(), live_process_start)


def orphan_running(record: Document) -> bool:
    """Whether ``record`` is ``lost`` while its recorded child still runs on this host."""
    facts = record.get("os")
    if record["state"] != "lost_on_restore" or not facts:
        return False
    return runs_here(facts["pid"], facts["start_time"], facts["host_id"])


def marks(reads: LedgerReads, records: Iterable[Document]) -> tuple[dict[str, str], dict[str, Any]]:
    """The marks of ``records`` by id, and the gone holders' owner documents by id."""
    listed = list(records)
    going = [record["id"] for record in listed if not is_terminal(record)]
    holders = reads.holders(going)
    me, dead = _me(), {}
    gone: dict[str, Any] = {}
    for process_id, lease in holders.items():
        owner = lease["owner"]
        key = (owner.get("owner_id"), owner.get("incarnation_id"))
        if key not in dead:
            dead[key] = holder_dead(owner.get("liveness") or {}, me, live_process_start)
        if dead[key]:
            gone[process_id] = owner
    found = dict.fromkeys(gone, SUPERVISOR_GONE)
    found |= {record["id"]: ORPHAN_RUNNING for record in listed if orphan_running(record)}
    return found, gone


def warn_if_unowned(reads: LedgerReads, record: Document) -> None:
    """Before waiting on a process: if it was started but nobody live holds it now (its
    supervisor was killed, say), say that nothing will record its end by itself -- a wait
    would otherwise hang without a word. The wait goes on (``restore`` or a recovery worker
    may still record it)."""
    import time

    from procledger.cli.lines import warn

    if is_terminal(record) or record.get("first_started") is None:
        return
    lease = reads.holders([record["id"]]).get(record["id"])
    now_ms = int(time.time() * 1000)
    if lease is not None and lease["expires_at_ms"] > now_ms:
        liveness = lease["owner"].get("liveness") or {}
        if not holder_dead(liveness, _me(), live_process_start):
            return
    process_id = record["id"]
    warn(
        f"process {process_id} has no live supervisor, so nothing will record how it ends "
        f"until 'procledger restore' runs on its host (or: procledger abandon "
        f"{process_id}); waiting anyway"
    )
