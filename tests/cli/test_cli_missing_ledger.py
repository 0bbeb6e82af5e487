"""Commands that act on existing processes refuse a ledger that is not there, as `ps` does
(issue 29): a mistyped path must not become an empty ledger that then reports success."""

from __future__ import annotations

from pathlib import Path

import pytest

from _shared import run_cli


@pytest.mark.parametrize(
    "command", [("stop", "1a2b"), ("abandon", "1a2b"), ("restore",), ("sweep",), ("ps",)]
)
def test_a_mistyped_ledger_is_refused_and_nothing_is_created(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    typo = tmp_path / "ledgr.db"
    ran = run_cli(*command, url=f"sqlite:///{typo}")
    assert ran.returncode == 1, (ran.stdout, ran.stderr)
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert f"no ledger at {typo}" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert not typo.exists()
    assert list(tmp_path.iterdir()) == []
