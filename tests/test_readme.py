"""README.md stays true: its lifecycle table is the real one, its test command is CI's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from procledger.domain.lifecycle import render_markdown

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"

pytestmark = pytest.mark.skipif(not README.is_file(), reason="not run from a source checkout")


def quickstart_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "Quickstart has exactly one shell block"
    return [line for line in blocks[0].splitlines() if line.strip()]


def test_quickstart_has_exactly_two_commands() -> None:
    install_and_run, test = quickstart_commands()
    assert "procledger" in install_and_run
    assert "pytest" in test


def test_ci_runs_exactly_the_readme_test_command() -> None:
    _, test = quickstart_commands()
    ci_lines = [line.strip() for line in CI_RUN.read_text(encoding="utf-8").splitlines()]
    assert test in ci_lines


def test_readme_shows_the_real_lifecycle_table() -> None:
    assert render_markdown() in README.read_text(encoding="utf-8")
