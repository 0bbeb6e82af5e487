"""The structure of docs/design.md §1.2, checked by tools rather than by memory: the
import-linter contracts in pyproject.toml, and the house rules a linter does not know (SQL only
in ``adapters/sql``, no private name imported from another module, short functions)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "procledger"
SQL_HOME = SOURCE / "adapters" / "sql"
SQL_TEXT = re.compile(
    r"\b(SELECT\s+\S|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|CREATE\s+(TABLE|INDEX))"
)
LONGEST_FUNCTION = 50
MOST_METHODS = 40
"""Per class; the ``ProcessRegistry`` façade alone is larger (each public method a short
forward, docs/design.md §1.2)."""
FACADE = SOURCE / "application" / "registry.py"
LONGEST_SUPERVISOR_CLASS = 400
LONGEST_SUPERVISOR_MODULE = 600
APPLICATION = SOURCE / "application"


def sources() -> Iterator[Path]:
    yield from sorted(SOURCE.rglob("*.py"))


def outside_sql_home() -> Iterator[Path]:
    for path in sources():
        if SQL_HOME not in path.parents:
            yield path


def test_the_import_linter_contracts_hold() -> None:
    """In a child process: import-linter reconfigures logging in the process that runs it."""
    linted = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_sql_text_is_written_only_in_adapters_sql() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in outside_sql_home()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SQL_TEXT.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []


def test_only_adapters_sql_asks_which_database_it_is() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in outside_sql_home()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"dialect\s*[!=]=", line)
    ]
    assert found == []


def test_no_module_imports_a_private_name_of_another_module() -> None:
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                if private and node.module.startswith("procledger"):
                    found.append(f"{path.relative_to(ROOT)}: {node.module} {private}")
    assert found == []


def test_functions_stay_short() -> None:
    found = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONGEST_FUNCTION:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length})")
    assert found == []


def test_sources_cite_the_design_in_the_repository() -> None:
    assert (ROOT / "docs" / "design.md").is_file()
    outside = "DESIGN" + ".md"  # the old contract's name, which lives outside the repository
    found = [str(path.relative_to(ROOT)) for path in sources() if outside in path.read_text()]
    assert found == []


def classes() -> Iterator[tuple[Path, ast.ClassDef]]:
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                yield path, node


def test_classes_stay_small() -> None:
    found = []
    for path, node in classes():
        methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        if len(methods) > MOST_METHODS and path != FACADE:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({len(methods)})")
    assert found == []


def test_the_supervisor_is_built_from_small_parts() -> None:
    """docs/design.md §1.3: the ``Supervisor`` keeps the public methods and the table of runs;
    each of its parts is a module of one job."""
    supervisor = SOURCE / "supervisor"
    long_modules = [
        f"{path.name} ({length})"
        for path in sorted(supervisor.glob("*.py"))
        if (length := len(path.read_text().splitlines())) > LONGEST_SUPERVISOR_MODULE
    ]
    assert long_modules == []
    (node,) = [n for p, n in classes() if n.name == "Supervisor" and p.parent == supervisor]
    assert (node.end_lineno or node.lineno) - node.lineno + 1 <= LONGEST_SUPERVISOR_CLASS


def test_only_the_application_layer_reaches_the_store_and_the_table_functions() -> None:
    """What import-linter cannot see: ``registry._store`` (or ``_store``) used outside
    ``application/``, or a table function of ``adapters/sql`` called from a layer that must
    go through the façade (docs/design.md §1.2)."""
    outside = (SOURCE / name for name in ("supervisor", "recovery", "aio", "web", "cli"))
    found = []
    for folder in outside:
        for path in (
            sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
        ):
            if not path.is_file():
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"registry\._?store\b|\.store\.attempt\(|adapters\.sql\b", line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
