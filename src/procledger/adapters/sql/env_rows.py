"""The ``envs`` table: environments kept outside the log (values never reach an event), by
their content reference. A row holds the sorted JSON of the values, or their ciphertext when a
cipher key is configured (``procledger.application.cipher``); this module stores text and does
not know which."""

from __future__ import annotations

from collections.abc import Iterable

from procledger.adapters.sql.store import Tx

__all__ = ["delete_unreferenced", "insert", "referenced_by", "select"]


def insert(tx: Tx, env_ref: str, env_text: str, *, replace_plain: bool = False) -> None:
    """Store an environment once (the reference is its content hash). ``replace_plain``: a
    row stored as plain JSON (its text begins with ``{``) is replaced by ``env_text`` — how an
    environment stored before a key was set becomes encrypted when stored again."""
    table = tx.dialect.table("envs")
    conflict = "DO NOTHING"
    if replace_plain:
        conflict = f"DO UPDATE SET env=excluded.env WHERE substr({table}.env, 1, 1)='{{'"
    tx.execute(
        f"INSERT INTO {table} (env_ref, env) VALUES (?,?) ON CONFLICT (env_ref) {conflict}",
        (env_ref, env_text),
    )


def select(tx: Tx, env_ref: str) -> str | None:
    """The stored text of an environment, or ``None``."""
    row = tx.execute(
        f"SELECT env FROM {tx.dialect.table('envs')} WHERE env_ref=?", (env_ref,)
    ).one()
    return None if row is None else str(row["env"])


def referenced_by(tx: Tx, process_ids: Iterable[str]) -> set[str]:
    """The env refs that the records of ``process_ids`` name."""
    column = tx.dialect.json_text("record", "env_ref")
    refs: set[str] = set()
    for process_id in process_ids:
        row = tx.execute(
            f"SELECT {column} AS env_ref FROM {tx.dialect.table('records')} WHERE process_id=?",
            (process_id,),
        ).one()
        if row is not None and row["env_ref"] is not None:
            refs.add(str(row["env_ref"]))
    return refs


def delete_unreferenced(tx: Tx, env_refs: Iterable[str]) -> int:
    """Delete the rows of ``env_refs`` that no remaining record names, nor a service's desired
    state (what its agent starts it with after a reboot, docs/design.md §19); returns how
    many."""
    column = tx.dialect.json_text("record", "env_ref")
    deleted = 0
    for env_ref in sorted(env_refs):
        tx.execute(
            f"DELETE FROM {tx.dialect.table('envs')} WHERE env_ref=? AND NOT EXISTS "
            f"(SELECT 1 FROM {tx.dialect.table('records')} WHERE {column}=?) AND NOT EXISTS "
            f"(SELECT 1 FROM {tx.dialect.table('services')} WHERE env_ref=?)",
            (env_ref, env_ref, env_ref),
        )
        deleted += tx.rowcount
    return deleted
