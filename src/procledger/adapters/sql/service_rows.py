"""The side tables of named services (docs/design.md §19): ``names``, ``ports`` and
``services``.

``names`` says which service holds each name: the id of its first attempt. ``ports`` says which
service holds each leased port of a host. Both are claims made in the transaction that
registers the service, so two starts of one name (or two leases of one port) are decided by the
database, across processes and hosts; whether a claim still holds is read from the holder's
records, not stored here, so a service that ended releases its name and ports without a write.
``services`` is the desired state ``up`` and ``down`` record: what a host's agent brings back
after a reboot. Unlike the records it is not a projection of the log (it is what was asked,
not what happened), so a rebuild keeps it.
"""

from __future__ import annotations

from typing import Any

from procledger.adapters.sql.store import Store, Tx

__all__ = [
    "create_statements",
    "desired_rows",
    "held_name",
    "lock_name",
    "lock_port",
    "name_rows",
    "port_rows",
    "set_desired",
    "take_name",
    "take_port",
]


def create_statements(store: Store) -> list[str]:
    big, t = store.dialect.big_integer, store.table
    return [
        f"""CREATE TABLE IF NOT EXISTS {t("names")} (
            name TEXT PRIMARY KEY,
            process_id TEXT NOT NULL,
            claimed_at_ms {big} NOT NULL){store.dialect.keyed_only}""",
        f"""CREATE TABLE IF NOT EXISTS {t("ports")} (
            host_id TEXT NOT NULL,
            port INTEGER NOT NULL,
            process_id TEXT NOT NULL,
            claimed_at_ms {big} NOT NULL,
            PRIMARY KEY (host_id, port)){store.dialect.keyed_only}""",
        f"""CREATE TABLE IF NOT EXISTS {t("services")} (
            name TEXT PRIMARY KEY,
            host_id TEXT NOT NULL,
            desired TEXT NOT NULL,
            digest TEXT NOT NULL,
            definition TEXT NOT NULL,
            env_ref TEXT,
            updated_at_ms {big} NOT NULL){store.dialect.keyed_only}""",
    ]


def _missing(tx: Tx, table: str) -> bool:
    """A ledger of schema version 1, opened read-only (no step ran), has none of these tables:
    its reads find no names, ports or desired state rather than fail."""
    return tx.execute(*tx.dialect.table_exists(table)).one() is None


def lock_name(tx: Tx, name: str) -> str:
    """The id holding ``name`` (``""``: none yet), its row created if missing and locked until
    commit -- one statement, as ``lease_rows.ensure_locked``: two starts of one name queue here
    on PostgreSQL, and the second reads what the first committed."""
    row = tx.execute(
        f"INSERT INTO {tx.dialect.table('names')} (name, process_id, claimed_at_ms) "
        "VALUES (?, '', 0) ON CONFLICT (name) DO UPDATE SET name=excluded.name "
        "RETURNING process_id",
        (name,),
    ).one()
    return str(row["process_id"])


def take_name(tx: Tx, name: str, process_id: str, now_ms: int) -> None:
    tx.execute(
        f"UPDATE {tx.dialect.table('names')} SET process_id=?, claimed_at_ms=? WHERE name=?",
        (process_id, now_ms, name),
    )


def held_name(tx: Tx, name: str) -> str | None:
    """The id ``name`` was last given to, while its record is kept (a pruned service names
    nothing), or ``None``; without a lock (a reader's). A ledger from before names (no table)
    has none."""
    if _missing(tx, "names"):
        return None
    row = tx.execute(
        f"SELECT n.process_id FROM {tx.dialect.table('names')} n "
        f"JOIN {tx.dialect.table('records')} r ON r.process_id=n.process_id WHERE n.name=?",
        (name,),
    ).one()
    return None if row is None else str(row["process_id"])


def name_rows(tx: Tx) -> list[Any]:
    """Every ``(name, process_id, claimed_at_ms)``, by name."""
    return tx.execute(
        f"SELECT name, process_id, claimed_at_ms FROM {tx.dialect.table('names')} "
        f"WHERE process_id<>'' ORDER BY name{tx.dialect.by_code_point}"
    ).all()


def lock_port(tx: Tx, host_id: str, port: int) -> Any:
    """As ``lock_name``, for a host's port: its row's ``process_id`` (``""``: none yet) and
    ``claimed_at_ms``."""
    return tx.execute(
        f"INSERT INTO {tx.dialect.table('ports')} (host_id, port, process_id, claimed_at_ms) "
        "VALUES (?, ?, '', 0) ON CONFLICT (host_id, port) DO UPDATE SET port=excluded.port "
        "RETURNING process_id, claimed_at_ms",
        (host_id, port),
    ).one()


def take_port(tx: Tx, host_id: str, port: int, process_id: str, now_ms: int) -> None:
    tx.execute(
        f"UPDATE {tx.dialect.table('ports')} SET process_id=?, claimed_at_ms=? "
        "WHERE host_id=? AND port=?",
        (process_id, now_ms, host_id, port),
    )


def port_rows(tx: Tx, host_id: str | None = None, port: int | None = None) -> list[Any]:
    """``(host_id, port, process_id, claimed_at_ms)`` rows ever claimed, by host and port;
    narrowed to one host, or one host's port. A ledger from before ports has none."""
    if _missing(tx, "ports"):
        return []
    where, params = ["process_id<>''"], list[object]()
    if host_id is not None:
        where.append("host_id=?")
        params.append(host_id)
    if port is not None:
        where.append("port=?")
        params.append(port)
    return tx.execute(
        f"SELECT host_id, port, process_id, claimed_at_ms FROM {tx.dialect.table('ports')} "
        f"WHERE {' AND '.join(where)} ORDER BY host_id, port",
        params,
    ).all()


def set_desired(
    tx: Tx,
    name: str,
    *,
    host_id: str,
    desired: str,
    digest: str,
    definition: str,
    env_ref: str | None,
    now_ms: int,
) -> None:
    """Record what ``up`` (``desired='up'``) or ``down`` (``'down'``) asked of ``name``."""
    tx.execute(
        f"INSERT INTO {tx.dialect.table('services')} "
        "(name, host_id, desired, digest, definition, env_ref, updated_at_ms) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
        "host_id=excluded.host_id, desired=excluded.desired, digest=excluded.digest, "
        "definition=excluded.definition, env_ref=excluded.env_ref, "
        "updated_at_ms=excluded.updated_at_ms",
        (name, host_id, desired, digest, definition, env_ref, now_ms),
    )


def set_down(tx: Tx, name: str, now_ms: int) -> bool:
    """Mark ``name`` down, keeping its last definition; whether it had a row."""
    return (
        tx.execute(
            f"UPDATE {tx.dialect.table('services')} SET desired='down', updated_at_ms=? "
            "WHERE name=?",
            (now_ms, name),
        ).rowcount
        > 0
    )


def wanted_up(tx: Tx, name: str) -> bool:
    """Whether ``up`` left ``name`` desired (an agent brings it back after its own end)."""
    if _missing(tx, "services"):
        return False
    row = tx.execute(
        f"SELECT desired FROM {tx.dialect.table('services')} WHERE name=?", (name,)
    ).one()
    return row is not None and row["desired"] == "up"


def desired_rows(tx: Tx, host_id: str | None = None) -> list[Any]:
    """Every row of ``services`` (of one host), by name. A ledger from before has none."""
    if _missing(tx, "services"):
        return []
    where, params = ("WHERE host_id=? ", [host_id]) if host_id is not None else ("", [])
    return tx.execute(
        "SELECT name, host_id, desired, digest, definition, env_ref, updated_at_ms "
        f"FROM {tx.dialect.table('services')} {where}ORDER BY name{tx.dialect.by_code_point}",
        params,
    ).all()
