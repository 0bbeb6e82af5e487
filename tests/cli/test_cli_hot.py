"""The hot commands (docs/design.md §8.1): what they import, that the fast path and the full
path print the same bytes, and what a new user ran into (short ids, prefixes of the random
part, ``ps --limit`` by creation)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from _shared import child_env

HEAVY = ("typer", "click", "pydantic", "eventsourcing", "rich", "psycopg", "cryptography", "psutil")


def cli(*args: str, url: str, fast: bool = True) -> subprocess.CompletedProcess[bytes]:
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    env["PROCLEDGER_FAST"] = "1" if fast else "0"
    return subprocess.run(
        [sys.executable, "-m", "procledger", "--url", url, *args],
        capture_output=True,
        timeout=60,
        env=env,
        check=False,
    )


def ran(url: str, *command: str) -> dict[str, object]:
    """``run --json [OPTIONS --] COMMAND``: its record."""
    words = command if "--" in command else ("--", *command)
    done = cli("run", "--json", *words, url=url)
    assert done.returncode in (0, 1, 3), done.stderr
    return orjson.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def fixture_ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    """A ledger with a success, a failure and a service that gave up."""
    folder = tmp_path_factory.mktemp("hot")
    url = f"sqlite:///{folder}/ledger.db"
    ids = [str(ran(url, "sh", "-c", "echo out; echo err >&2")["id"])]
    ids.append(str(ran(url, "sh", "-c", "exit 3")["id"]))
    service = cli(
        "run", "--restart", "on-failure", "--max-restarts", "1", "--backoff-initial", "0.05s",
        "--", "sh", "-c", "exit 2", url=url,
    )  # fmt: skip
    assert service.returncode != 0
    return url, ids


def imported(url: str, *args: str) -> set[str]:
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "procledger", "--url", url, *args],
        capture_output=True,
        timeout=60,
        env=env,
        check=False,
    )
    names = set()
    for line in done.stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_the_hot_commands_import_none_of_the_heavy_stack(
    fixture_ledger: tuple[str, list[str]],
) -> None:
    url, ids = fixture_ledger
    for args in (
        ("ps",),
        ("ps", "--all", "--json"),
        ("ps", "--resources"),
        ("show", ids[0]),
        ("show", ids[0], "--json"),
        ("logs", ids[0], "--tail", "20"),
        ("logs", ids[0], "-f"),
        ("logs", _first_of_service(url), "-f"),
        ("show", _first_of_service(url)),
        ("wait", ids[0], "--until", "exit"),
        ("stop", ids[0]),
        ("feed",),
        ("agent", "status"),
        ("run", "--background", "--", "true"),
        ("run", "--background", "--json", "--", "true"),
    ):
        heavy = imported(url, *args) & set(HEAVY)
        assert not heavy, (args, heavy)


CASES = [
    ("ps",),
    ("ps", "--all"),
    ("ps", "--all", "--json"),
    ("ps", "--all", "--attempts"),
    ("ps", "--all", "--limit", "2"),
    ("ps", "--state", "exited"),
    ("ps", "--status", "bogus"),
    ("ps", "--limit", "x"),
    ("ps", "--frobnicate"),
    ("show", "0"),
    ("show", "nosuchid"),
    ("show",),
    ("feed",),
    ("feed", "--json", "--since", "2", "--limit", "3"),
    ("wait", "{0}", "--until", "exit"),
    ("wait", "{1}", "--until", "exit", "--json"),
    ("wait", "{0}", "--timeout", "forever"),
    ("stop", "{0}"),
    ("stop", "{0}", "--json"),
    ("stop", "{0}", "--mode", "murder"),
    ("logs", "{0}"),
    ("logs", "{0}", "--json"),
    ("logs", "{0}", "--stream", "stderr"),
    ("logs", "{0}", "--tail", "1"),
    ("show", "{0}"),
    ("show", "{0}", "--json"),
    ("show", "{2}"),
    ("run", "--backgroud", "--", "true"),
    ("run",),
    ("run", "--restart", "always", "--max-restarts", "x", "--", "true"),
    ("run", "--wait-ready", "--", "true"),
    ("run", "--", ""),
    # A service as one (docs/notes-services-view.md): {3} is its first attempt's id.
    ("show", "{3}"),
    ("show", "{3}", "--json"),
    ("show", "{3}.1"),
    ("logs", "{3}"),
    ("logs", "{3}", "--json"),
    ("logs", "{3}", "--tail", "1"),
    ("logs", "{3}", "-f"),
    ("logs", "{3}.2", "--json"),
    ("logs", "{3}", "--since-offset", "1"),
    ("ps", "--all", "--name", "nosuch"),
]


def _first_of_service(url: str) -> str:
    """The fixture's service's first attempt's id: the id that names the whole service."""
    newest = orjson.loads(cli("ps", "--all", "--json", url=url).stdout)["records"][-1]
    return str(newest["attempt_of"])


@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_the_fast_path_and_the_full_path_agree(
    fixture_ledger: tuple[str, list[str]], case: tuple[str, ...]
) -> None:
    url, ids = fixture_ledger
    service = orjson.loads(cli("ps", "--all", "--json", url=url).stdout)["records"][-1]["id"]
    args = [word.format(*ids, service, _first_of_service(url)) for word in case]
    fast, full = cli(*args, url=url), cli(*args, url=url, fast=False)
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        full.returncode,
        full.stdout,
        full.stderr,
    )


def test_json_of_a_record_is_the_stored_document_as_the_model_dumps_it(
    fixture_ledger: tuple[str, list[str]],
) -> None:
    from procledger import open_registry

    url, ids = fixture_ledger
    shown = orjson.loads(cli("show", ids[0], "--json", url=url).stdout)
    listed = orjson.loads(cli("ps", "--all", "--json", url=url).stdout)["records"]
    registry = open_registry(url)
    try:
        model = registry.get(ids[0]).model_dump(mode="json")
    finally:
        registry.close()
    assert shown["record"] == model
    assert next(r for r in listed if r["id"] == ids[0]) == model


def test_a_prefix_of_the_random_part_names_the_process(
    fixture_ledger: tuple[str, list[str]],
) -> None:
    url, ids = fixture_ledger
    short = ids[0].split("-", 1)[1]
    assert len(short) == 12
    shown = cli("logs", short[:6], url=url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == b"out\nerr\n"
    whole = cli("show", ids[0][:14], "--json", url=url)
    assert orjson.loads(whole.stdout)["record"]["id"] == ids[0]


def test_ps_limit_takes_the_newest_by_creation_whatever_the_ids(tmp_path: Path) -> None:
    """An id that is not time-based (``zzz``) sorts after every minted one, but was created
    first: ``--limit 1`` is the one created last."""
    from procledger import ProcessInput, ProcessRegistration, RecoveryDisposition, open_registry
    from procledger.domain.registration import Originator, env_ref_for

    url = f"sqlite:///{tmp_path}/ledger.db"
    registry = open_registry(url)
    try:
        registry.register(
            ProcessRegistration(
                id="zzz-not-minted",
                input=ProcessInput.command(["true"]),
                disposition=RecoveryDisposition.owner_bound,
                originator=Originator.host(),
                env_ref=env_ref_for({}),
            )
        )
    finally:
        registry.close()
    time.sleep(0.01)  # a later millisecond of creation, not a synchronisation
    newest = ran(url, "true")["id"]
    listed = orjson.loads(cli("ps", "--all", "--limit", "1", "--json", url=url).stdout)
    assert [record["id"] for record in listed["records"]] == [newest]
    both = orjson.loads(cli("ps", "--all", "--json", url=url).stdout)["records"]
    assert [record["id"] for record in both] == ["zzz-not-minted", newest]


def test_the_tables_of_states_and_statuses_are_the_domain_s() -> None:
    from procledger.cli.hot import listing
    from procledger.domain.vocabulary import ProcessState
    from procledger.projections.filters import STATUS_VALUES

    assert tuple(state.value for state in ProcessState) == listing._STATES
    assert listing._STATUSES == STATUS_VALUES


def test_the_event_kinds_table_holds_the_classes_versions() -> None:
    from procledger.domain.event_kinds import EVENT_CLASSES
    from procledger.domain.process import Process

    for name, (_, version) in EVENT_CLASSES.items():
        assert getattr(getattr(Process, name), "class_version", 1) == version, name


def test_on_postgresql_the_hot_commands_ask_the_agent(postgres_schema_url: str) -> None:
    """With an agent serving the ledger, a hot command loads neither psycopg nor pydantic and
    prints what the full path prints; without one, it takes the full path."""
    url = postgres_schema_url
    process_id = str(ran(url, "sh", "-c", "echo pg")["id"])
    without = cli("ps", "--all", "--json", url=url)
    assert cli("agent", "start", url=url).returncode == 0
    try:
        for args in (("ps", "--all", "--json"), ("show", process_id), ("show", "nosuch")):
            fast, full = cli(*args, url=url), cli(*args, url=url, fast=False)
            assert (fast.returncode, fast.stdout, fast.stderr) == (
                full.returncode,
                full.stdout,
                full.stderr,
            )
        assert not imported(url, "show", process_id) & set(HEAVY)
        assert cli("ps", "--all", "--json", url=url).stdout == without.stdout
    finally:
        cli("agent", "stop", url=url)


def test_stop_wait_returns_once_the_process_has_ended_and_says_how(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    started = cli("run", "--background", "--", "sleep", "600", url=url)
    assert started.returncode == 0, started.stderr
    process_id = started.stdout.decode().strip()
    stopped = cli("stop", process_id, "--wait", url=url)
    assert stopped.returncode == 0, stopped.stderr
    asked, ended = stopped.stdout.decode().splitlines()
    assert asked == f"stop requested (interrupted) for process {process_id}"
    assert ended == f"process {process_id} ended: interrupted (signal 2)"
    record = orjson.loads(cli("show", process_id, "--json", url=url).stdout)["record"]
    assert record["state"] == "interrupted"  # ended when stop returned, not later


def test_logs_says_when_the_output_limit_dropped_the_head(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    record = ran(url, "--output-limit", "64KiB", "--", "seq", "1", "200000")
    shown = cli("logs", str(record["id"]), url=url)
    assert shown.returncode == 0
    assert shown.stdout.endswith(b"199999\n200000\n")
    assert len(shown.stdout) <= 64 * 1024
    dropped = record["output"]["stdout"]["dropped"]  # type: ignore[index]
    assert dropped > 0
    assert shown.stderr.decode() == (
        f"procledger: the first {dropped} bytes of stdout of process {record['id']} were "
        "dropped by its output limit of 65536 bytes (across both streams)\n"
    )
    assert cli("logs", str(record["id"]), "--since-offset", str(dropped), url=url).stderr == b""


def test_a_tampered_log_is_refused_alike_on_both_paths(tmp_path: Path) -> None:
    """An exit code edited in a process's last stored event: ``show`` names the process as
    damaged on the fast path as on the full one (its log does not verify), serving nothing."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/ledger.db"
    process_id = str(ran(url, "sh", "-c", "exit 3")["id"])
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        db.execute(
            "UPDATE stored_events SET state=CAST(replace(CAST(state AS TEXT), "
            "'\"exit_code\":3', '\"exit_code\":0') AS BLOB) "
            "WHERE originator_version=(SELECT MAX(originator_version) FROM stored_events)"
        )
    for args in (("show", process_id), ("show", process_id, "--json"), ("logs", process_id)):
        fast, full = cli(*args, url=url), cli(*args, url=url, fast=False)
        assert (fast.returncode, fast.stdout, fast.stderr) == (
            full.returncode,
            full.stdout,
            full.stderr,
        )
    shown = cli("show", process_id, url=url)
    assert shown.returncode == 1
    assert shown.stdout == b""
    assert b"does not verify" in shown.stderr
