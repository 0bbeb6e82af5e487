"""``procledger table`` (docs/design.md §8) and the CLI's central error handling."""

from __future__ import annotations

import re

import pytest

from _design import DESIGN_ROWS, DESIGN_TRANSITIONS
from _shared import run_cli, run_python
from procledger import cli
from procledger.domain.errors import InvalidTransition, NotFound
from procledger.domain.lifecycle_table import render_markdown, render_mermaid

# docs/design.md §2.1 as `procledger table` prints it: "none" where there is no reason.
EXPECTED_MARKDOWN_ROWS = [(kind, state, reason or "none") for kind, state, reason in DESIGN_ROWS]

# docs/design.md §2.2: (from, to, kind), as Mermaid edges `from --> to: kind`.
EXPECTED_EDGES = {(source, target, kind) for source, kind, target in DESIGN_TRANSITIONS}


def markdown_rows(text: str) -> list[tuple[str, ...]]:
    lines = text.splitlines()
    assert lines[0] == "| kind | state | reason |"
    assert re.fullmatch(r"\|(-{3,}\|){3}", lines[1])
    rows = []
    for line in lines[2:]:
        assert line.startswith("| ")
        assert line.endswith(" |")
        rows.append(tuple(cell.strip() for cell in line.strip("|").split("|")))
    return rows


def test_table_prints_exactly_the_rows_of_the_design() -> None:
    result = run_cli("table", "--format", "markdown")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    rows = markdown_rows(result.stdout)
    assert len(rows) == len(set(rows)) == 24
    assert sorted(rows) == sorted(EXPECTED_MARKDOWN_ROWS)
    assert result.stdout == render_markdown()


def test_markdown_is_the_default_format() -> None:
    result = run_cli("table")
    assert result.returncode == 0, result.stderr
    assert result.stdout == render_markdown()


def test_mermaid_draws_every_transition_of_the_design() -> None:
    result = run_cli("table", "--format", "mermaid")
    assert result.returncode == 0, result.stderr
    assert result.stdout == render_mermaid()
    lines = result.stdout.splitlines()
    assert lines[0] == "stateDiagram-v2"
    edges = {
        (m["src"], m["dst"], m["kind"])
        for line in lines
        if (m := re.fullmatch(r"\s*(?P<src>\w+) --> (?P<dst>\w+): (?P<kind>\w+)", line))
    }
    assert edges == EXPECTED_EDGES
    assert "    [*] --> starting" in lines


# Start-up time: the CLI imports a command's heavy pieces in the command's body.
TABLE_AND_IMPORTS = """
import sys
from procledger import cli
try:
    cli.main(["table"])
except SystemExit:
    pass
heavy = ("psycopg", "eventsourcing", "rich", "psutil", "procledger.application.registry",
         "procledger.supervisor.supervisor", "procledger.recovery", "procledger.projections")
print(" ".join(sorted(name for name in heavy if name in sys.modules)) or "none", file=sys.stderr)
"""


def test_table_imports_neither_stores_nor_supervisor_nor_rich() -> None:
    done = run_python(TABLE_AND_IMPORTS)
    assert done.returncode == 0, done.stderr
    assert done.stdout == render_markdown()
    assert done.stderr.strip() == "none"


# The table is the plain data generated from the machine (domain/lifecycle_table.py); building
# it does not need python-statemachine, whose import alone costs ~23 ms (issue #14).
TABLE_WITHOUT_THE_MACHINE = """
import sys
from procledger import cli
try:
    cli.main(["table", "--format", "mermaid"])
except SystemExit:
    pass
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "statemachine")
print(" ".join(loaded) or "none", file=sys.stderr)
"""


def test_table_does_not_import_python_statemachine() -> None:
    done = run_python(TABLE_WITHOUT_THE_MACHINE)
    assert done.returncode == 0, done.stderr
    assert done.stdout == render_mermaid()
    assert done.stderr.strip() == "none"


def test_table_opens_no_store() -> None:
    result = run_cli("--url", "nosuchscheme://nowhere", "table")
    assert result.returncode == 0, result.stderr
    assert result.stdout == render_markdown()


@pytest.mark.parametrize(
    "args",
    [
        ("table", "--format", "yaml"),
        ("table", "--bogus"),
        ("no-such-command",),
        ("--url",),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


def test_an_unknown_format_is_named() -> None:
    result = run_cli("table", "--format", "yaml")
    assert result.returncode == 2
    assert "--format" in result.stderr


# The central error handler, in-process: any ProcledgerError or OSError raised by a command
# becomes one line on stderr naming the command and the cause, and exit code 1.
@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (NotFound("no process 'p-7'"), "procledger table: no process 'p-7'"),
        (
            InvalidTransition("exited", "completed", "failed", process_id="p-7"),
            "procledger table: process 'p-7': no 'completed' transition",
        ),
        (
            FileNotFoundError(2, "No such file or directory", "/nowhere/ledger.db"),
            "procledger table: '/nowhere/ledger.db': no such file or directory",
        ),
        (NotFound("first line\nsecond line"), "procledger table: first line second"),
        (TypeError("boom"), "procledger table: internal error (TypeError): boom"),
    ],
)
def test_errors_become_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: Exception,
    expected: str,
) -> None:
    def fail() -> str:
        raise error

    monkeypatch.setattr(cli, "render_markdown", fail)
    with pytest.raises(SystemExit) as caught:
        cli.main(["table"])
    assert caught.value.code == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n")
    assert err.count("\n") == 1
    assert err.startswith(expected)
    assert "Traceback" not in err


def test_main_exits_0_on_success(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["table", "--format", "mermaid"])
    assert caught.value.code in (0, None)
    assert capsys.readouterr().out == render_mermaid()


def test_global_options_are_kept_for_commands(capsys: pytest.CaptureFixture[str]) -> None:
    state = cli.CliState()
    with pytest.raises(SystemExit) as caught:
        cli.app(args=["--url", "memory://", "table"], obj=state, prog_name="procledger")
    assert caught.value.code in (0, None)
    assert (state.url, state.command) == ("memory://", "table")
    assert capsys.readouterr().out == render_markdown()
