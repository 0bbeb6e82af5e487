"""``procledger.domain`` is the pure core (docs/design.md §1): it imports nothing from the other
procledger packages, touches no files, sockets, processes or threads, and reads no clock.

Two checks: a static scan of every domain source file's imports and calls, and a subprocess
that imports every domain module (without running ``procledger/__init__.py``, which re-exports
the whole library) under an audit hook that reports I/O started from domain code.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import procledger.domain
from _shared import run_python

DOMAIN_DIR = Path(procledger.domain.__file__).parent
DOMAIN_FILES = sorted(DOMAIN_DIR.glob("*.py"))

# Modules whose import alone means I/O, concurrency or a clock.
FORBIDDEN_MODULES = frozenset(
    {
        "_thread", "asyncio", "concurrent", "ctypes", "fcntl", "glob", "http", "io", "mmap",
        "multiprocessing", "os", "psutil", "psycopg", "psycopg_pool", "requests", "select",
        "selectors", "shutil", "signal", "socket", "sqlite3", "ssl", "subprocess", "tempfile",
        "threading", "time", "urllib",
    }
)  # fmt: skip
# eventsourcing's pure parts (aggregates and events) are fine; its persistence is not.
ALLOWED_EVENTSOURCING = frozenset({"eventsourcing.domain", "eventsourcing.utils"})
ALLOWED_PATHLIB_NAMES = frozenset({"PurePath", "PurePosixPath", "PureWindowsPath"})
FORBIDDEN_CALLS = frozenset({"open", "input", "print", "breakpoint", "exec", "eval", "__import__"})
CLOCK_READS = frozenset({"now", "utcnow", "today", "time", "time_ns", "monotonic"})
CLOCK_OWNERS = frozenset({"datetime", "date", "time"})


def _module_name(path: Path) -> str:
    return "procledger.domain" + ("" if path.stem == "__init__" else f".{path.stem}")


def _imported(tree: ast.Module, module: str, is_package: bool) -> list[tuple[int, str, str]]:
    """(line, module, name) for every import; ``name`` is "" for ``import x``."""
    found: list[tuple[int, str, str]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            found.extend((node.lineno, base, alias.name) for alias in node.names)
    return found


def _import_problem(module: str, name: str) -> str | None:
    top = module.split(".", maxsplit=1)[0]
    if top in FORBIDDEN_MODULES:
        return f"imports {module}"
    if top == "procledger" and not f"{module}.".startswith("procledger.domain."):
        target = f"{module}.{name}" if module == "procledger" and name else module
        return f"imports {target} (outside procledger.domain)"
    if top == "eventsourcing" and module not in ALLOWED_EVENTSOURCING:
        return f"imports {module} (only {sorted(ALLOWED_EVENTSOURCING)} are pure)"
    if top == "pathlib" and name not in ALLOWED_PATHLIB_NAMES:
        return f"imports pathlib{'.' + name if name else ''} (only the Pure* paths)"
    return None


def _call_problem(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
        return f"calls {func.id}()"
    if isinstance(func, ast.Attribute) and func.attr in CLOCK_READS:
        owner = func.value
        owner_name = (
            owner.id
            if isinstance(owner, ast.Name)
            else owner.attr
            if isinstance(owner, ast.Attribute)
            else ""
        )
        if owner_name in CLOCK_OWNERS:
            return f"reads the clock ({owner_name}.{func.attr}())"
    return None


def test_domain_has_source_files() -> None:
    assert {p.name for p in DOMAIN_FILES} >= {"errors.py", "lifecycle.py", "vocabulary.py"}


@pytest.mark.parametrize("path", DOMAIN_FILES, ids=lambda p: p.name)
def test_domain_source_imports_and_calls_nothing_impure(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module = _module_name(path)
    problems = [
        f"{path.name}:{line}: {problem}"
        for line, imported, name in _imported(tree, module, path.stem == "__init__")
        if (problem := _import_problem(imported, name))
    ]
    problems += [
        f"{path.name}:{node.lineno}: {problem}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (problem := _call_problem(node))
    ]
    assert problems == []


def test_the_scan_catches_what_it_should() -> None:
    source = (
        "import os\nfrom time import monotonic\nfrom .. import registry\n"
        "from procledger.adapters import x\nfrom eventsourcing.persistence import y\n"
        "from pathlib import Path\nfrom pathlib import PurePosixPath\nfrom . import errors\n"
        "open('f')\nimport datetime\ndatetime.datetime.now()\n"
    )
    tree = ast.parse(source)
    imports = _imported(tree, "procledger.domain.sample", is_package=False)
    problems = [p for _, m, n in imports if (p := _import_problem(m, n))]
    assert problems == [
        "imports os",
        "imports time",
        "imports procledger.registry (outside procledger.domain)",
        "imports procledger.adapters (outside procledger.domain)",
        "imports eventsourcing.persistence (only ['eventsourcing.domain', "
        "'eventsourcing.utils'] are pure)",
        "imports pathlib.Path (only the Pure* paths)",
    ]
    calls = [p for n in ast.walk(tree) if isinstance(n, ast.Call) and (p := _call_problem(n))]
    assert calls == ["calls open()", "reads the clock (datetime.now())"]


# Runs in a fresh interpreter. Installs an audit hook, then imports every domain module with a
# stub ``procledger`` parent so the top-level re-exports never run. An audit event is blamed
# on the domain when the first frame outside the standard library is a domain file and no
# import machinery sits in between (reading a module's source is the importer's I/O).
_PROBE = r"""
import importlib, importlib.util, json, pkgutil, sys, sysconfig, types

STDLIB = sysconfig.get_path("stdlib")

def is_stdlib(filename):
    return filename.startswith(STDLIB) and "-packages" not in filename
IO_EVENTS = ("open", "os.", "socket.", "subprocess.", "shutil.", "sqlite3.", "time.sleep",
             "urllib.", "http.", "ctypes.", "mmap.", "fcntl.", "signal.", "glob.")
spec = importlib.util.find_spec("procledger")
stub = types.ModuleType("procledger")
stub.__path__ = list(spec.submodule_search_locations)
sys.modules["procledger"] = stub
domain_dir = stub.__path__[0].rstrip("/") + "/domain/"
blamed = []

def hook(event, args):
    if not event.startswith(IO_EVENTS):
        return
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith("<frozen importlib"):
            return
        if not is_stdlib(filename) or filename.startswith(domain_dir):
            break
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename.startswith(domain_dir):
        blamed.append(f"{event} {args!r:.120} at {frame.f_code.co_filename}:{frame.f_lineno}")

sys.addaudithook(hook)
import procledger.domain
names = [f"procledger.domain.{m.name}" for m in pkgutil.iter_modules(procledger.domain.__path__)]
for name in names:
    importlib.import_module(name)
sys.stdout.write(json.dumps({"modules": sorted(sys.modules), "imported": names, "io": blamed}))
"""

FORBIDDEN_LOADED = (
    "sqlite3",
    "psycopg",
    "psycopg_pool",
    "psutil",
    "eventsourcing.application",
    "eventsourcing.persistence",
    "eventsourcing.postgres",
    "eventsourcing.sqlite",
    "eventsourcing.popo",
    "eventsourcing.system",
)


def test_importing_the_domain_loads_no_other_layer_and_does_no_io() -> None:
    result = run_python(_PROBE)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "procledger.domain.lifecycle" in report["imported"]
    layers = [
        m for m in report["modules"] if m.startswith("procledger.") and m.split(".")[1] != "domain"
    ]
    assert layers == []
    assert [
        m for m in report["modules"] if m in FORBIDDEN_LOADED or m.split(".")[0] in FORBIDDEN_LOADED
    ] == []
    assert report["io"] == []
