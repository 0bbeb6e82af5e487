"""Shared pieces of the projection tests: registrations and snapshots of every read model (to
compare incremental maintenance with a rebuild). The store bases are in ``tests/_stores.py``."""

from __future__ import annotations

from typing import Any

from procledger import (
    CompletionAuthority,
    EventType,
    Originator,
    ProcessInput,
    ProcessRecord,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
    SessionScope,
)
from procledger.domain.registration import env_ref_for
from procledger.projections import ChangeCursor

ENV_REF = env_ref_for({"PATH": "/usr/bin"})
KEY = CompletionAuthority.workflow_key("projection-tests")


def registration(
    process_id: str,
    *,
    argv0: str = "/usr/bin/make",
    originator: Originator | None = None,
    wake: SessionScope | None = None,
    **overrides: Any,
) -> ProcessRegistration:
    """An owner_bound command process that declares ``signal.ready``."""
    fields: dict[str, Any] = {
        "id": process_id,
        "input": ProcessInput.command([argv0, "all"]),
        "disposition": RecoveryDisposition.owner_bound,
        "originator": originator or Originator.host(),
        "wake_target": wake,
        "env_ref": ENV_REF,
        "event_types": [EventType(name="signal.ready")],
        **overrides,
    }
    return ProcessRegistration(**fields)


def finish(registry: ProcessRegistry, process_id: str, exit_code: int = 0) -> ProcessRecord:
    """Start (if needed) and complete with ``exited``."""
    if registry.get(process_id).state == "starting":
        registry.record_started(process_id, 1)
    return registry.record_completed(
        process_id, "exited", "exited", exit_code=exit_code, authority=KEY
    )


def drain_feed(
    registry: ProcessRegistry, cursor: ChangeCursor | None = None, limit: int = 3
) -> tuple[list[list[ProcessRecord]], ChangeCursor]:
    """Every page after ``cursor`` until an empty one; returns the pages and the last cursor."""
    cursor = cursor or ChangeCursor.initial()
    pages: list[list[ProcessRecord]] = []
    while True:
        page, following = registry.changes_since(cursor, limit)
        if not page:
            assert following == cursor
            return pages, cursor
        assert following > cursor
        pages.append(page)
        cursor = following


def snapshot(registry: ProcessRegistry) -> dict[str, Any]:
    """Everything the read models answer, in comparable form."""
    store = registry._store
    with store.read() as tx:
        grants = [
            (row["session_id"], row["process_id"], row["descriptor"])
            for row in tx.execute(
                f"SELECT session_id, process_id, descriptor FROM {store.table('grants')}"
            ).all()
        ]
        position = tx.execute(
            f"SELECT position FROM {store.table('tracking')} WHERE name='records'"
        ).one()["position"]
    pages, tip = drain_feed(registry, limit=3)
    return {
        "records": [r.model_dump(mode="json") for r in registry.list_processes({"status": "any"})],
        "grants": sorted(grants),
        "feed": [[(r.id, r.change_seq) for r in page] for page in pages],
        "tip": tip.value,
        "tracking": int(position),
    }
