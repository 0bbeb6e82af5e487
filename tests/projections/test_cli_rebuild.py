"""``procledger rebuild`` (docs/design.md §8): rebuilds the read models and shows progress."""

from __future__ import annotations

from pathlib import Path

import pytest

from _shared import child_env, run_cli
from procledger import cli, open_registry

from ._support import finish, registration, snapshot


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    registry = open_registry(url)
    try:
        for index in range(5):
            registry.register(registration(f"p{index}"))
            registry.grant_handle("s", f"p{index}")
        finish(registry, "p2")
    finally:
        registry.close()
    return url


def test_rebuild_command_rebuilds_and_reports(
    ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = open_registry(ledger)
    try:
        live = snapshot(registry)
        store = registry._store
        with store.write() as tx:
            tx.execute(f"DELETE FROM {store.table('records')}")
    finally:
        registry.close()

    with pytest.raises(SystemExit) as caught:
        cli.main(["--url", ledger, "rebuild"])

    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert out == "rebuilt the read models from 13 events\n"
    registry = open_registry(ledger)
    try:
        assert snapshot(registry) == live
    finally:
        registry.close()


def test_rebuild_command_draws_a_progress_bar_on_stderr(ledger: str) -> None:
    done = run_cli("rebuild", url=ledger, env=child_env(COLUMNS="100"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "rebuilt the read models from 13 events\n"
    assert "rebuilding read models" in done.stderr
    assert "13/13" in done.stderr


def test_rebuild_command_failure_is_one_line(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}"
    done = run_cli("rebuild", url=missing, timeout=120)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1
    assert "rebuild" in done.stderr
    assert done.stderr.startswith(f"procledger rebuild: store URL {missing!r}: no ledger at ")
