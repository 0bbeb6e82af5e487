"""The ``envs`` table: environments kept outside the log (values never reach an event), by
their content reference."""

from __future__ import annotations

from procledger.adapters.sql.store import Tx


def insert(tx: Tx, env_ref: str, env_json: str) -> None:
    """Store an environment once (the reference is its content hash)."""
    tx.execute(
        f"INSERT INTO {tx.dialect.table('envs')} (env_ref, env) VALUES (?,?) "
        "ON CONFLICT (env_ref) DO NOTHING",
        (env_ref, env_json),
    )


def select(tx: Tx, env_ref: str) -> str | None:
    """The stored JSON of an environment, or ``None``."""
    row = tx.execute(
        f"SELECT env FROM {tx.dialect.table('envs')} WHERE env_ref=?", (env_ref,)
    ).one()
    return None if row is None else str(row["env"])
