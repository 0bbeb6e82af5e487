"""The public names of ``procledger`` are exactly those of docs/design.md §10 and §9's error tree.

They are written once, in ``procledger/__init__.py`` (one ``from M import N as N`` per name),
and ``__all__`` is derived from those statements; this test reads the names from the design,
not from a copy of its own.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import procledger
from _shared import run_python

DESIGN = (Path(__file__).parents[1] / "docs" / "design.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    start = DESIGN.index(f"\n## {title}")
    return DESIGN[start : DESIGN.index("\n## ", start + 1)]


def _error_tree() -> list[tuple[str, str | None]]:
    """§9's drawing: each class with its parent (the root's is ``None``)."""
    drawing = _section("§9 Errors").split("```")[1]
    parents: list[tuple[int, str]] = []
    tree: list[tuple[str, str | None]] = []
    for line in drawing.strip().splitlines():
        found = re.match(r"^([│├└─\s]*)(\w+)", line)
        assert found is not None, line
        depth = len(found.group(1))
        while parents and parents[-1][0] >= depth:
            parents.pop()
        tree.append((found.group(2), parents[-1][1] if parents else None))
        parents.append((depth, found.group(2)))
    return tree


def _listed() -> dict[str, list[str]]:
    """§10's groups: each bullet's backquoted names."""
    text = _section("§10 Public names").split("`procledger.aio` (§17)")[0]
    groups: dict[str, list[str]] = {}
    for bullet in re.findall(r"^- (.+?)(?=^- |^\n|\Z)", text, flags=re.MULTILINE | re.DOTALL):
        group, names = bullet.split(":", 1)
        groups[group] = re.findall(r"`([A-Za-z_]\w*)`", names)
    return groups


TREE = _error_tree()
GROUPS = _listed()
ERRORS = [name for name, _ in TREE] + GROUPS["errors"]
DESIGNED = [name for group in GROUPS.values() for name in group] + [name for name, _ in TREE]
EAGER = {*ERRORS, "ProcessState", "TerminalReason", "LifecycleKind", "RecoveryDisposition"}
EAGER |= {"ProcessStatus"}
"""What ``import procledger`` loads at once (docs/design.md §1.2): the errors and the
vocabulary's enums; every other name is imported on first use."""


def test_the_design_is_read() -> None:
    assert len(TREE) >= 30
    assert ("SpawnError", "ExecutionError") in TREE
    assert set(GROUPS) >= {"vocabulary", "registry", "supervisor", "errors"}
    assert len(DESIGNED) == len(set(DESIGNED)), "a name is listed twice in §9/§10"


def test_all_is_exactly_the_names_of_the_design() -> None:
    exported = procledger.__all__
    assert len(exported) == len(set(exported)), "a name is exported twice"
    missing = sorted(set(DESIGNED) - set(exported))
    extra = sorted(set(exported) - set(DESIGNED))
    assert (missing, extra) == ([], [])


@pytest.mark.parametrize("name", procledger.__all__)
def test_every_public_name_is_importable_from_the_package(name: str) -> None:
    module = importlib.import_module("procledger")
    assert getattr(module, name) is not None


def test_every_name_in_all_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec("from procledger import *", namespace)  # the star import is the subject
    namespace.pop("__builtins__", None)
    assert set(namespace) == set(procledger.__all__)


def test_only_the_errors_and_the_vocabulary_load_at_once() -> None:
    """In a fresh interpreter: the eager names are bound by the import itself, the others
    not yet, and the import statement is the interpreter's own again afterwards."""
    code = (
        "import builtins; before = builtins.__import__\n"
        "import procledger\n"
        "assert builtins.__import__ is before\n"
        "print(' '.join(sorted(set(vars(procledger)) & set(procledger.__all__))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == EAGER


@pytest.mark.parametrize(("name", "parent"), TREE)
def test_every_drawn_error_has_its_drawn_parent(name: str, parent: str | None) -> None:
    error = getattr(procledger, name)
    assert isinstance(error, type)
    assert issubclass(error, procledger.ProcledgerError)
    if parent is not None:
        assert issubclass(error, getattr(procledger, parent))


@pytest.mark.parametrize("name", GROUPS["errors"])
def test_every_listed_error_is_a_procledger_error(name: str) -> None:
    assert issubclass(getattr(procledger, name), procledger.ProcledgerError)


def test_not_found_is_also_a_lookup_error() -> None:
    assert issubclass(procledger.NotFound, LookupError)
    with pytest.raises(LookupError):
        raise procledger.NotFound("process 'x' not found")


def test_the_lifecycle_validation_error_is_not_a_value_error() -> None:
    # pydantic wraps ValueError raised in validators; the notification contract promises this
    # error unwrapped.
    assert not issubclass(procledger.ProcessLifecycleValidationError, ValueError)
    error = procledger.ProcessLifecycleValidationError("process_handle", "too long")
    assert error.field == "process_handle"
    assert "process_handle" in str(error)


def test_the_byte_limits_are_the_designed_values() -> None:
    assert procledger.MAX_PROCESS_HANDLE_BYTES == 128
    assert procledger.MAX_DIAGNOSTIC_BYTES == 512


def test_the_property_test_kit_is_importable_without_pytest() -> None:
    code = (
        "import sys; sys.modules['pytest'] = None; sys.modules['_pytest'] = None\n"
        "import procledger.testing as t\n"
        "assert issubclass(t.ProcessMachine, __import__('hypothesis').stateful"
        ".RuleBasedStateMachine)\n"
        "assert 'pytest' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
    )
    done = run_python(code, timeout=120)
    assert done.returncode == 0, done.stderr
