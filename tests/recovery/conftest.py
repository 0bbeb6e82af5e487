"""Every recovery test gets a state directory of its own (the outbox lives there)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$XDG_STATE_HOME`` in the test's folder: outbox entries never reach the user's."""
    home = tmp_path / "state-home"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home
