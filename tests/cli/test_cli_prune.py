"""`prune --dry-run` (docs/design.md §8, §5.5): it lists what a prune with the same options would
delete -- id, state, when it was last updated, the command -- deletes nothing and says so; the
prune that follows deletes exactly those."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from _shared import run_cli
from procledger.domain.wording import local_time


def ran(url: str, *command: str) -> dict:
    done = run_cli("run", "--json", "--", *command, url=url)
    assert done.stdout, done.stderr
    record: dict = orjson.loads(done.stdout)
    return record


def every_record(url: str) -> dict[str, dict]:
    listed = orjson.loads(run_cli("ps", "--all", "--json", url=url).stdout)["records"]
    return {record["id"]: record for record in listed}


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_dry_run_lists_what_a_prune_deletes_and_deletes_nothing(
    request: pytest.FixtureRequest, store: str
) -> None:
    ledger = request.getfixturevalue("ledger" if store == "sqlite" else "postgres_ledger")
    done = ran(ledger, "true")
    failed = ran(ledger, "sh", "-c", "exit 3")
    before = every_record(ledger)
    assert set(before) == {done["id"], failed["id"]}

    preview = run_cli("prune", "--older-than", "0s", "--dry-run", url=ledger)
    assert preview.returncode == 0, preview.stderr
    assert preview.stderr == "procledger: dry run: would prune 2 processes; nothing was deleted\n"
    header, *rows = preview.stdout.splitlines()  # into a pipe: tab-separated, times in full
    assert header.split("\t") == ["ID", "STATE", "UPDATED", "COMMAND"]
    assert sorted(rows) == sorted(
        "\t".join((r["id"], r["state"], local_time(r["updated_at_ms"]), command))
        for r, command in ((done, "true"), (failed, "sh -c 'exit 3'"))
    )
    assert every_record(ledger) == before  # nothing deleted, nothing changed

    only_failed = run_cli(
        "prune", "--older-than", "0s", "--status", "failed", "--dry-run", url=ledger
    )
    assert [row.split("\t")[0] for row in only_failed.stdout.splitlines()[1:]] == [failed["id"]]
    assert "would prune 1 processes" in only_failed.stderr

    nothing = run_cli("prune", "--older-than", "1d", "--dry-run", url=ledger)
    assert (nothing.returncode, nothing.stdout) == (0, "")
    assert "would prune 0 processes; nothing was deleted" in nothing.stderr

    pruned = run_cli("prune", "--older-than", "0s", url=ledger)
    assert (pruned.returncode, pruned.stderr) == (0, "")
    assert pruned.stdout.startswith("pruned 2 processes (")
    assert every_record(ledger) == {}


def test_a_dry_run_never_creates_a_ledger(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/mistyped.db"
    preview = run_cli("prune", "--older-than", "0s", "--dry-run", url=url)
    assert preview.returncode == 1
    assert "no ledger at" in preview.stderr
    assert not (tmp_path / "mistyped.db").exists()
