"""The named services' side of a ledger (docs/design.md §19): who holds each name and leased
port, and the desired state ``up`` and ``down`` record. ``ProcessRegistry.services`` is one.

Claims are made where processes are registered (``service_claims``); this is what reads them,
reserves a port before a start registers, and keeps the desired state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from procledger.adapters.sql import service_rows
from procledger.adapters.sql.store import Store, Tx
from procledger.application import service_claims
from procledger.domain.records import ProcessRecord
from procledger.domain.registration import ProcessRegistration

__all__ = ["DesiredService", "NamedService", "PortLease", "ServiceBook", "claims"]


@dataclass(frozen=True)
class NamedService:
    """A name and the service it was last given to: its first attempt's id, its newest
    attempt, and whether it still holds the name (``live``)."""

    name: str
    first_id: str
    newest: ProcessRecord | None
    live: bool


@dataclass(frozen=True)
class PortLease:
    """A port of a host leased to a service: ``process_id`` its newest attempt (its first
    attempt's id while a start has reserved the port but not registered); ``live`` whether
    the lease still holds."""

    host_id: str
    port: int
    process_id: str
    claimed_at_ms: int
    live: bool


@dataclass(frozen=True)
class DesiredService:
    """What ``up`` or ``down`` last asked of a name on a host: ``desired`` ``up`` or ``down``,
    the definition ``up`` ran (its JSON form) and its digest, and the environment's ref."""

    name: str
    host_id: str
    desired: str
    digest: str
    definition: dict[str, Any]
    env_ref: str | None
    updated_at_ms: int


def claims(
    registrations: Sequence[ProcessRegistration], now_ms: int
) -> Callable[[Tx], None] | None:
    """The registering transaction's name and port claims, or ``None`` when there are none."""
    if not any(r.name is not None or r.port is not None for r in registrations):
        return None
    return lambda tx: service_claims.claim_registered(tx, registrations, now_ms)


class ServiceBook:
    """Names, leased ports and desired state of one ledger's store."""

    def __init__(self, store: Store, now_ms: Callable[[], int]) -> None:
        self._store = store
        self._now_ms = now_ms

    # -- names ----------------------------------------------------------------------------

    def named(self, name: str) -> NamedService | None:
        """The service ``name`` was last given to, or ``None`` (never given)."""
        return self._store.attempt(lambda tx: _named(tx, name))

    def names(self) -> list[NamedService]:
        """Every name ever given, by name."""
        return self._store.attempt(
            lambda tx: [_named_row(tx, row) for row in service_rows.name_rows(tx)]
        )

    # -- ports ----------------------------------------------------------------------------

    def reserve_port(self, host_id: str, first_id: str, port_range: tuple[int, int]) -> int:
        """A free port of ``port_range`` on ``host_id`` (this host: bindability is checked
        here), leased to the start that will register ``first_id``.

        Raises:
            PortTaken: none is free.
        """
        now = self._now_ms()
        return self._store.attempt(
            lambda tx: service_claims.reserve_port(tx, host_id, first_id, port_range, now),
            write=True,
        )

    def ports(self, host_id: str | None = None, port: int | None = None) -> list[PortLease]:
        """The leases of every host (or of one; of one port), live or not, by host and port."""
        now = self._now_ms()
        return self._store.attempt(
            lambda tx: [_lease(tx, row, now) for row in service_rows.port_rows(tx, host_id, port)]
        )

    # -- desired state ----------------------------------------------------------------------

    def want_up(
        self,
        name: str,
        *,
        host_id: str,
        digest: str,
        definition: dict[str, Any],
        env_ref: str | None,
    ) -> None:
        """Record that ``name`` is to run on ``host_id`` as ``definition``: the agent of that
        host brings it back after a reboot."""
        text = orjson.dumps(definition, option=orjson.OPT_SORT_KEYS).decode()
        now = self._now_ms()
        self._store.attempt(
            lambda tx: service_rows.set_desired(
                tx, name, host_id=host_id, desired="up", digest=digest, definition=text,
                env_ref=env_ref, now_ms=now,
            ),
            write=True,
        )  # fmt: skip

    def want_down(self, name: str) -> bool:
        """Record that ``name`` is not to run (kept with its last definition); whether it had
        a desired state before."""
        now = self._now_ms()
        return bool(
            self._store.attempt(lambda tx: service_rows.set_down(tx, name, now), write=True)
        )

    def desired(self, host_id: str | None = None) -> list[DesiredService]:
        """The desired state of every name (on one host), by name."""
        rows = self._store.attempt(lambda tx: service_rows.desired_rows(tx, host_id))
        return [
            DesiredService(
                name=str(row["name"]),
                host_id=str(row["host_id"]),
                desired=str(row["desired"]),
                digest=str(row["digest"]),
                definition=orjson.loads(row["definition"]),
                env_ref=None if row["env_ref"] is None else str(row["env_ref"]),
                updated_at_ms=int(row["updated_at_ms"]),
            )
            for row in rows
        ]


def _named(tx: Tx, name: str) -> NamedService | None:
    first_id = service_rows.held_name(tx, name)
    if first_id is None:
        return None
    return _named_row(tx, {"name": name, "process_id": first_id})


def _named_row(tx: Tx, row: Any) -> NamedService:
    first_id = str(row["process_id"])
    first, newest = service_claims.newest_attempt_in(tx, first_id)  # read once
    return NamedService(str(row["name"]), first_id, newest, service_claims.holds_on(first, newest))


def _lease(tx: Tx, row: Any, now_ms: int) -> PortLease:
    holder = str(row["process_id"])
    live = service_claims.holds(tx, row, now_ms)
    newest = service_claims.newest_attempt_in(tx, holder)[1]
    return PortLease(
        host_id=str(row["host_id"]),
        port=int(row["port"]),
        process_id=holder if newest is None else newest.id,
        claimed_at_ms=int(row["claimed_at_ms"]),
        live=live,
    )
