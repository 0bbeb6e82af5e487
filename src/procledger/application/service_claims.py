"""Names and leased ports, claimed in the ledger's transactions (docs/design.md §19).

A name or a port belongs to a *service*: its first attempt's id, so every later attempt keeps
it. Whether a claim still holds is decided from the holder's records in the same transaction
(``live_attempt``): a service holds on while its newest attempt has not ended, or has ended and
its policy may still start another. Nothing is written when a service ends, so no crash can
leave a name held by a service that is over -- and the claim that decides which of twenty
concurrent ``run --name dev`` starts is the database's row lock, on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence
from typing import Any

from procledger.adapters.proc_facts import host_id
from procledger.adapters.sql import record_rows, service_rows
from procledger.adapters.sql.store import Tx
from procledger.domain.attempts import attempt_id, restart_may_follow
from procledger.domain.errors import NameTaken, PortTaken
from procledger.domain.records import ProcessRecord
from procledger.domain.registration import ProcessRegistration
from procledger.projections.records import read_record

__all__ = [
    "DEFAULT_PORT_RANGE",
    "RESERVATION_MS",
    "claim_registered",
    "holds",
    "holds_on",
    "is_bindable",
    "live_attempt",
    "newest_attempt_in",
    "reserve_port",
]

DEFAULT_PORT_RANGE = (20000, 29999)
"""Where ``--port auto`` looks: above the usual development servers' ports (3000, 5173, 8000,
8080) and below Linux's ephemeral range (32768-60999), so an outgoing connection never takes
a leased port first."""

RESERVATION_MS = 60_000
"""A port reserved for a start that has not registered yet (``reserve_port``) is kept this
long; a start that died before registering gives it back by this lapse."""


def newest_attempt_in(tx: Tx, first_id: str) -> tuple[ProcessRecord | None, ProcessRecord | None]:
    """``(first, newest)`` attempts of the service ``first_id`` names (the same record for a
    process that is not a service); ``(None, None)`` when it has no record (pruned, or a
    reservation not yet registered)."""
    first = read_record(tx, first_id)
    if first is None or first.attempt is None:
        return first, first
    prefix = f"{first_id}."
    numbers = [
        int(suffix)
        for pid in record_rows.ids_from(tx, prefix, 1_000_000)
        if (suffix := pid[len(prefix) :]).isdigit() and suffix[0] != "0"
    ]
    for number in sorted(numbers, reverse=True):
        later = read_record(tx, attempt_id(first_id, number))
        if later is not None and later.attempt_of == first_id:
            return first, later
    return first, first


def live_attempt(tx: Tx, first_id: str) -> ProcessRecord | None:
    """The newest attempt of the service ``first_id`` while the service is not over, else
    ``None``.

    Raises:
        StoreCorrupt: one of its records cannot be decoded: procledger cannot tell whether it
            is over, and a claim fails rather than guess (``rebuild`` restores the record).
    """
    first, newest = newest_attempt_in(tx, first_id)
    return newest if holds_on(first, newest) else None


def holds_on(first: ProcessRecord | None, newest: ProcessRecord | None) -> bool:
    """Whether a service whose first and newest attempts are these is not over: its newest
    has not ended, or has ended and its policy may still start another."""
    if newest is None:
        return False
    return not newest.is_terminal or restart_may_follow(newest, first=first)


def claim_registered(tx: Tx, registrations: Sequence[ProcessRegistration], now_ms: int) -> None:
    """Inside the registering transaction: each named registration takes its name, and each
    with a port takes that port of this host, unless a live service other than its own holds
    it (``NameTaken``, ``PortTaken``: the transaction is rolled back, nothing written)."""
    for registration in registrations:
        first_id = registration.attempt_of or registration.id
        if registration.name is not None:
            _claim_name(tx, registration.name, first_id, now_ms)
        if registration.port is not None:
            _claim_port(tx, host_id(), registration.port, first_id, now_ms)


def _claim_name(tx: Tx, name: str, first_id: str, now_ms: int) -> None:
    holder = service_rows.lock_name(tx, name)
    if holder and holder != first_id:
        live = live_attempt(tx, holder)
        if live is not None:
            raise NameTaken(name, live.id)
    if holder != first_id:
        service_rows.take_name(tx, name, first_id, now_ms)


def _claim_port(tx: Tx, host_id: str, port: int, first_id: str, now_ms: int) -> None:
    holder = service_rows.lock_port(tx, host_id, port)
    other = holder["process_id"]
    if other and other != first_id and holds(tx, holder, now_ms):
        live = live_attempt(tx, other)
        named = other if live is None else live.id
        raise PortTaken(f"port {port} is leased to process {named!r}", port, named)
    if other != first_id:
        service_rows.take_port(tx, host_id, port, first_id, now_ms)


def holds(tx: Tx, row: Any, now_ms: int) -> bool:
    """Whether the holder of a ``ports`` row still holds it: its service is live, or it has no
    record yet and its reservation is recent."""
    holder = str(row["process_id"])
    if not holder:
        return False
    terminal = record_rows.is_terminal(tx, holder)
    if terminal is None:
        return now_ms - int(row["claimed_at_ms"]) < RESERVATION_MS
    # An unended first attempt is a live service (its later attempts come after it ends).
    return not terminal or live_attempt(tx, holder) is not None


def reserve_port(
    tx: Tx, host_id: str, first_id: str, port_range: tuple[int, int], now_ms: int
) -> int:
    """Lease the lowest port of ``port_range`` that no live process of the ledger holds and
    nothing on this host is bound to, for the start that will register ``first_id``.

    The range's rows are read once and a held one is stepped over without a lock; a port that
    looks free is locked (its row created if missing) and looked at again, so concurrent
    reservations queue on it rather than both taking it, and -- locks being taken in ascending
    order -- never deadlock. A port found taken under its lock was taken by a transaction that
    committed meanwhile: the rows are read again, so the next look skips all it and the others
    took (docs/design.md §19).

    Raises:
        PortTaken: every port of the range is leased or bound.
    """
    low, high = port_range
    held = _HeldPorts(tx, host_id, port_range, now_ms)
    port = low
    while port <= high:
        if held.holds(port) or not is_bindable(port):
            port += 1
        elif holds(tx, service_rows.lock_port(tx, host_id, port), now_ms):
            held = _HeldPorts(tx, host_id, port_range, now_ms)
            port += 1
        else:
            service_rows.take_port(tx, host_id, port, first_id, now_ms)
            return port
    raise PortTaken(f"no free port in {low}-{high}: every one is leased or in use")


_MANY_LEASES = 16
"""From this many leases in a range on, ``_HeldPorts`` reads the ids of the ledger's unended
processes in one query, so a lease whose holder runs is judged without a lookup of its own."""


class _HeldPorts:
    """The leases of a range of one host's ports as read at one moment, each judged
    (``holds``) when the scan comes to its port -- at once when its holder is among the
    unended processes read with them."""

    def __init__(self, tx: Tx, host_id: str, port_range: tuple[int, int], now_ms: int) -> None:
        low, high = port_range
        self._tx, self._now_ms = tx, now_ms
        self._rows = {
            int(row["port"]): row
            for row in service_rows.port_rows(tx, host_id)
            if low <= int(row["port"]) <= high
        }
        many = len(self._rows) >= _MANY_LEASES
        self._running = frozenset(record_rows.non_terminal_ids(tx) if many else ())

    def holds(self, port: int) -> bool:
        row = self._rows.get(port)
        if row is None:
            return False
        # An unended first attempt holds (as ``holds`` would say, reading its record).
        return str(row["process_id"]) in self._running or holds(self._tx, row, self._now_ms)


def is_bindable(port: int, *, listening_only: bool = False) -> bool:
    """Whether a TCP listener could bind ``port`` on every address of this host now: the IPv4
    wildcard, and the IPv6 one where the host has IPv6 -- a program listening on ``[::1]``
    alone takes the port from a server that binds ``[::]`` as surely as one on ``0.0.0.0``.
    A port in ``TIME_WAIT`` counts as taken (the probe does not set ``SO_REUSEADDR``): a
    server started there might fail to bind. ``listening_only`` (a port named outright, not
    chosen): only a socket bound there counts -- the probe sets ``SO_REUSEADDR``, as servers
    do, so the connections a service just stopped left in ``TIME_WAIT`` do not refuse its
    restart on its own port."""
    return _bindable(socket.AF_INET, ("0.0.0.0", port), listening_only) and _bindable(
        socket.AF_INET6, ("::", port), listening_only
    )


_NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EADDRNOTAVAIL})
"""What binding ``[::]`` fails with on a host (or a container) without IPv6."""


def _bindable(family: socket.AddressFamily, address: tuple[str, int], reuse: bool) -> bool:
    six = family is socket.AF_INET6
    try:
        probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:
        if six and error.errno in _NO_IPV6:
            return True
        raise
    with probe:
        try:
            if six:  # IPv6 only: the IPv4 side was probed on its own
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if reuse:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            if six and error.errno in _NO_IPV6:
                return True
            raise
    return True
