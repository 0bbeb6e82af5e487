"""README.md stays true: its Quickstart runs, its test command is CI's, its lifecycle table and
Mermaid excerpt are the real ones, and its library example runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import psutil
import pytest

import procledger.testing
from _shared import run_cli
from procledger.domain.lifecycle import render_markdown, render_mermaid

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
RUN_PREFIX = ".venv/bin/procledger run -- "

pytestmark = pytest.mark.skipif(not README.is_file(), reason="not run from a source checkout")


def section(title: str) -> str:
    """The text of the ``## title`` section, up to the next ``## `` heading."""
    text = README.read_text(encoding="utf-8")
    assert f"\n## {title}\n" in text, f"README has no '## {title}' section"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def quickstart_commands() -> list[str]:
    found = blocks(section("Quickstart"), "sh")
    assert len(found) == 1, "Quickstart has exactly one shell block"
    return [line for line in found[0].splitlines() if line.strip()]


def test_readme_sections_come_in_order() -> None:
    headings = re.findall(r"^## (.+)$", README.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert headings == [
        "Quickstart",
        "CLI tour",
        "The host agent",
        "Logs",
        "Readiness, waits and restarts",
        "Services",
        "Interactive",
        "Web view",
        "The lifecycle table",
        "Library",
        "Async",
        "Property-testing your own code",
        "PostgreSQL",
        "Benchmarks",
        "Design",
    ]


def test_quickstart_has_exactly_two_commands() -> None:
    install_and_run, test = quickstart_commands()
    assert "pip install" in install_and_run
    assert RUN_PREFIX in install_and_run, "the main job is `procledger run -- <command>`"
    assert "pytest" in test


def test_the_quickstart_run_works(tmp_path: Path) -> None:
    install_and_run, _ = quickstart_commands()
    command = shlex.split(install_and_run.split(RUN_PREFIX, 1)[1])
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    ran = run_cli("run", "--", *command, url=ledger)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "hello from a supervised child\n"
    [change] = run_cli("feed", url=ledger).stdout.splitlines()
    assert change.split("\t")[2:] == ["exited", "exit 0"]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    _, test = quickstart_commands()
    ci_lines = [line.strip() for line in CI_RUN.read_text(encoding="utf-8").splitlines()]
    assert test in ci_lines


def test_readme_shows_the_real_lifecycle_table() -> None:
    assert render_markdown() in section("The lifecycle table")


def test_the_mermaid_excerpt_is_real() -> None:
    [excerpt] = [b for b in blocks(section("CLI tour"), "console") if "stateDiagram-v2" in b]
    real = set(render_mermaid().splitlines())
    shown = [line for line in excerpt.splitlines()[1:] if line.strip() != "…"]
    assert len(shown) > 5
    assert [line for line in shown if line not in real] == []


def test_the_library_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    [example] = blocks(section("Library"), "python")
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    exec(compile(example, f"{README}:Library", "exec"), {"__name__": "readme_example"})
    after = {child.pid for child in psutil.Process().children(recursive=True)}
    assert after <= before, "the example left a child process behind"
    assert (
        capsys.readouterr().out
        == "['registered', 'first_started', 'started', 'output_captured', 'completed']\n"
    )


def test_the_async_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The harness of the Async section, for real: a dev server started, followed until
    ready, asked for a page, stopped; nothing left behind."""
    [example] = blocks(section("Async"), "python")
    assert len(example.strip().splitlines()) <= 30
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    exec(compile(example, f"{README}:Async", "exec"), {"__name__": "readme_async"})
    after = {child.pid for child in psutil.Process().children(recursive=True)}
    assert after <= before, "the example left a child process behind"
    assert capsys.readouterr().out == "terminated cancelled\n"


def test_the_testing_snippet_names_real_helpers() -> None:
    [snippet] = blocks(section("Property-testing your own code"), "python")
    imported = re.search(r"from procledger\.testing import (.+)", snippet)
    assert imported is not None
    for name in imported.group(1).split(","):
        assert hasattr(procledger.testing, name.strip()), name
    for name in re.findall(r"`(\w+)\(\)`", section("Property-testing your own code")):
        assert hasattr(procledger.testing, name), name
