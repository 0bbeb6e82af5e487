"""An archived ledger in a folder nobody may write (docs/design.md §7.3, "Read-only folders"):
the read commands read it, the writers are refused with ``StoreReadOnly`` naming the folder,
and a ledger SQLite cannot read there (a write-ahead log not checkpointed, without its index)
is refused saying why -- never "unable to open database file".

The folder is made read-only for real: as a user, by ``chmod`` (0555 folder, 0444 files); as
root, whom permissions do not stop, by mounting a small tmpfs and remounting it read-only, and
the ``chmod`` cases run in a child forked as uid 65534.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _shared import as_nobody, run_cli, small_tmpfs
from procledger import ProcessRegistry, StoreReadOnly, open_registry
from procledger.adapters.sql.sqlite_files import connect_read_only, why_not_writable
from registry.conformance import registration

ROOT = os.geteuid() == 0


def ledger_with_processes(path: Path, *, keep_log: bool = False, index: bool = True) -> None:
    """A ledger at ``path`` holding processes ``a`` and ``b``. With ``keep_log`` its files are
    copied while the writer still holds commits in its write-ahead log (as a crash leaves
    them), without the ``-shm`` index unless ``index``; otherwise closed cleanly (no -wal)."""
    source = path.parent / "source" / path.name if keep_log else path
    source.parent.mkdir(exist_ok=True)
    registry = open_registry(f"sqlite:///{source}")
    try:
        registry.register(registration("a"))
        registry.register(registration("b"))
        registry.record_started("b", 1)
        if keep_log:
            assert Path(f"{source}-wal").stat().st_size > 0
            for suffix in ("", "-wal", "-shm") if index else ("", "-wal"):
                shutil.copyfile(f"{source}{suffix}", f"{path}{suffix}")
                os.chmod(f"{path}{suffix}", 0o600)
    finally:
        registry.close()
    if keep_log:
        shutil.rmtree(source.parent)


@contextlib.contextmanager
def chmod_folder(file_mode: int = 0o400) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A folder under /tmp (which uid 65534 can reach) and the function that makes it and its
    files read-only (0555, and ``file_mode``: 0444 for another user to read them); writable
    again afterwards, so it can be removed."""
    folder = Path(tempfile.mkdtemp(prefix="procledger-ro-"))
    folder.chmod(0o755)

    def freeze() -> None:
        for each in folder.iterdir():
            each.chmod(file_mode)
        folder.chmod(0o555)

    try:
        yield folder, freeze
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)


@contextlib.contextmanager
def read_only_mount(tmp_path: Path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A small tmpfs and the function that remounts it read-only (root only: it skips
    otherwise)."""
    with small_tmpfs(tmp_path / "archive", "8m") as mount:

        def freeze() -> None:
            subprocess.run(
                ["mount", "-o", "remount,ro", str(mount)], check=True, capture_output=True
            )

        yield mount, freeze


@pytest.fixture
def frozen(tmp_path: Path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A folder that ``freeze()`` makes read-only for this process: by chmod as a user, by
    a read-only remount as root."""
    place = read_only_mount(tmp_path) if ROOT else chmod_folder()
    with place as found:
        yield found


def as_user_without_rights(work: Callable[[], str]) -> str:
    """``work()``: here when not root, else in a child forked as uid 65534 (whom a 0555
    folder stops); its result string either way, or ``raised <Class>: <message>``."""

    def outcome() -> str:
        try:
            return work()
        except Exception as error:
            return f"raised {type(error).__name__}: {error}"

    if not ROOT:
        return outcome()

    def tell(out: int) -> None:
        os.write(out, outcome().encode())

    with as_nobody(tell) as read_end, os.fdopen(read_end, "rb") as pipe:
        return pipe.read().decode()


def listed(registry: ProcessRegistry) -> list[str]:
    return [record.id for record in registry.list_processes({"status": "any"})]


# -- the library ---------------------------------------------------------------------------------


def test_a_cleanly_closed_ledger_in_a_read_only_folder_is_read(
    frozen: tuple[Path, Callable[[], None]],
) -> None:
    folder, freeze = frozen
    ledger_with_processes(folder / "ledger.db")
    freeze()
    before = sorted(p.name for p in folder.iterdir())
    assert before == ["ledger.db"]
    registry = open_registry(f"sqlite:///{folder / 'ledger.db'}", read_only=True)
    try:
        assert listed(registry) == ["a", "b"]
        assert registry.get("b").state.value == "running"
        assert [e.kind for e in registry.events("b")] == ["registered", "started"]
    finally:
        registry.close()
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_ledger_whose_log_holds_commits_is_read_through_its_index(
    frozen: tuple[Path, Callable[[], None]],
) -> None:
    folder, freeze = frozen
    ledger_with_processes(folder / "ledger.db", keep_log=True)
    freeze()
    registry = open_registry(f"sqlite:///{folder / 'ledger.db'}", read_only=True)
    try:
        assert listed(registry) == ["a", "b"]  # the commits in the -wal are read too
    finally:
        registry.close()


def test_a_log_not_checkpointed_without_its_index_is_refused_saying_why(
    frozen: tuple[Path, Callable[[], None]],
) -> None:
    folder, freeze = frozen
    ledger_with_processes(folder / "ledger.db", keep_log=True, index=False)
    freeze()
    with pytest.raises(StoreReadOnly) as refused:
        open_registry(f"sqlite:///{folder / 'ledger.db'}", read_only=True)
    message = str(refused.value)
    assert str(folder) in message
    assert "write-ahead log that was not checkpointed" in message
    assert "ledger.db-wal" in message
    assert "wal_checkpoint" in message  # the way forward


def test_a_writer_is_refused_naming_the_folder(frozen: tuple[Path, Callable[[], None]]) -> None:
    folder, freeze = frozen
    ledger_with_processes(folder / "ledger.db")
    freeze()
    for create in (True, False):
        with pytest.raises(StoreReadOnly, match=str(folder)) as refused:
            open_registry(f"sqlite:///{folder / 'ledger.db'}", create=create)
        assert "read commands" in str(refused.value)
    assert why_not_writable(folder / "ledger.db") is not None


# -- the command line ----------------------------------------------------------------------------


def test_read_commands_work_and_writers_fail_in_one_line(
    frozen: tuple[Path, Callable[[], None]],
) -> None:
    folder, freeze = frozen
    ledger_with_processes(folder / "ledger.db")
    freeze()
    url = f"sqlite:///{folder / 'ledger.db'}"
    listing = run_cli("ps", "--all", url=url)
    assert listing.returncode == 0, listing.stderr
    assert "running" in listing.stdout
    shown = run_cli("show", "b", url=url)
    assert shown.returncode == 0, shown.stderr
    verified = run_cli("verify", url=url)
    assert verified.returncode == 0, verified.stderr
    assert "ok: the ledger verifies" in verified.stdout
    for argv in (["run", "--", "true"], ["stop", "b"]):
        refused = run_cli(*argv, url=url)
        assert refused.returncode == 1, refused
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "cannot be written here" in refused.stderr
        assert str(folder) in refused.stderr
        assert "unable to open database file" not in refused.stderr


def test_the_cli_names_a_log_it_cannot_read_here(frozen: tuple[Path, Callable[[], None]]) -> None:
    folder, freeze = frozen
    ledger_with_processes(folder / "ledger.db", keep_log=True, index=False)
    freeze()
    result = run_cli("ps", "--all", url=f"sqlite:///{folder / 'ledger.db'}")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "read-only" in result.stderr or "cannot be read" in result.stderr
    assert "not checkpointed" in result.stderr


# -- the connect function alone, in a folder chmod-ed 0555 (uid 65534 when root) -----------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("clean", "read 2"),
        ("log and index", "read 2"),
        ("log without index", "raised StoreReadOnly"),
    ],
)
def test_connect_read_only_in_a_chmod_folder(state: str, expected: str) -> None:
    with chmod_folder(0o444) as (folder, freeze):
        path = folder / "ledger.db"
        ledger_with_processes(path, keep_log=state != "clean", index=state == "log and index")
        freeze()

        def read() -> str:
            connection = connect_read_only(path)
            try:
                (count,) = connection.execute("SELECT COUNT(*) FROM procledger_records").fetchone()
            finally:
                connection.close()
            return f"read {count}"

        answer = as_user_without_rights(read)
        assert answer.startswith(expected), answer
        assert not Path(f"{path}-shm").exists() or state == "log and index"


def test_connect_read_only_leaves_a_writable_folder_as_it_found_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger_with_processes(path)
    connection = connect_read_only(path)
    try:
        assert connection.execute("SELECT COUNT(*) FROM procledger_records").fetchone() == (2,)
        with pytest.raises(Exception, match="readonly"):
            connection.execute("DELETE FROM procledger_records")
    finally:
        connection.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.db"]
