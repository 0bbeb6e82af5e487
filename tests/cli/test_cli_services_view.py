"""A service followed as one (issue 30, docs/design.md §19.6): `logs`, `show` and `ps` of a
named service started by a real Supervisor, across its attempts.

The Supervisor runs in this test process on the test's ledger and is shut down at the end (its
children's trees stopped, every terminal recorded); the attempts' children, and every
``procledger logs -f`` left running, are killed by exact pid at teardown (``procs``). Nothing
sleeps to synchronise: each wait polls a condition, bounded.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import orjson

from _services import CRASH_LOOP, LONG_BACKOFF, Services
from _shared import CLI, Processes, child_env, run_cli, run_python, wait_until
from procledger import (
    LeaseOwner,
    ProcessRecord,
)


def cli(*args: str, url: str, fast: bool = True) -> subprocess.CompletedProcess[str]:
    env = child_env(PROCLEDGER_FAST="1" if fast else "0")
    env.pop("PROCLEDGER_URL", None)
    return run_cli(*args, url=url, env=env)


def both(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    """``procledger ARGS`` on the fast path, held equal to the full path's, byte for byte."""
    fast, full = cli(*args, url=url), cli(*args, url=url, fast=False)
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        full.returncode,
        full.stdout,
        full.stderr,
    ), args
    return fast


def header(record: ProcessRecord) -> str:
    return f"==> attempt {record.attempt} ({record.id}) <=="


class Follower:
    """``procledger logs -f ...`` left running, its stdout in a file (read as it grows)."""

    def __init__(self, url: str, procs: Processes, folder: Path, *args: str) -> None:
        self.out = folder / f"follow-{uuid.uuid4().hex[:6]}.out"
        env = child_env()
        env.pop("PROCLEDGER_URL", None)
        with self.out.open("wb") as sink:
            self.process = subprocess.Popen(
                [*CLI, "--url", url, "logs", "-f", *args],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.PIPE,
                env=env,
            )
        procs.add(self.process.pid)

    def text(self) -> str:
        return self.out.read_text()

    def wait(self, timeout: float = 60.0) -> tuple[int, str]:
        """Its exit code and stderr; it must end within ``timeout`` (never a hang)."""
        _, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, err.decode()


# -- logs ------------------------------------------------------------------------------------


def test_logs_of_a_service_prints_every_attempt_in_order(ledger: str, services: Services) -> None:
    first, second, third = services.crash_loop()
    whole = "\n\n".join(f"{header(a)}\nattempt" for a in (first, second, third)) + "\n"
    for name in ("svc", first.id, first.id.split("-", 1)[1][:8]):
        assert both("logs", name, url=ledger).stdout == whole, name
    # Each attempt's own id: that attempt alone, as plain output (ID.1 is the first alone).
    for alone in (f"{first.id}.1", second.id, "svc.3"):
        assert both("logs", alone, url=ledger).stdout == "attempt\n", alone
    # The last two lines of the whole service, each under its attempt's header.
    tail = both("logs", "svc", "--tail", "2", url=ledger).stdout
    assert tail == f"{header(second)}\nattempt\n\n{header(third)}\nattempt\n"
    lines = [
        orjson.loads(line) for line in both("logs", "svc", "--json", url=ledger).stdout.splitlines()
    ]
    assert [(c["attempt"], c["id"], c["data"]) for c in lines] == [
        (a.attempt, a.id, "attempt\n") for a in (first, second, third)
    ]
    assert [c["offset"] for c in lines] == [0, 0, 0]  # each attempt's own files
    alone = orjson.loads(cli("logs", second.id, "--json", url=ledger).stdout)
    assert (alone["id"], alone["attempt"]) == (second.id, 2)
    refused = cli("logs", "svc", "--since-offset", "3", url=ledger)
    assert refused.returncode == 2, refused.stderr
    assert "name the attempt (ID.N)" in refused.stderr
    assert cli("logs", second.id, "--since-offset", "3", url=ledger).stdout == "empt\n"


def test_logs_follow_follows_three_attempts_until_the_service_gives_up(
    ledger: str, services: Services, procs: Processes, tmp_path: Path
) -> None:
    """Attempt 1 waits for a gate; `logs -f svc` is following it when the gate opens; every
    attempt then fails at once, and `logs -f` ends (exit 0) once the service has given up."""
    gate = tmp_path / "gate"
    script = f'echo "attempt $$"; while [ ! -e "{gate}" ]; do sleep 0.05; done; exit 1'
    handle = services.start(script, "svc", CRASH_LOOP)
    follower = Follower(ledger, procs, tmp_path, "svc")
    wait_until(lambda: "attempt " in follower.text(), 30, "logs -f to print attempt 1's line")
    assert services.attempt(handle.process_id, 2) is None  # still on attempt 1: following
    gate.touch()
    code, err = follower.wait()
    assert (code, err) == (0, "")
    attempts = services.registry.attempts(handle.process_id)
    assert [a.attempt for a in attempts] == [1, 2, 3]
    assert attempts[-1].gave_up == "crash_loop"
    assert (
        follower.text()
        == "\n\n".join(f"{header(a)}\nattempt {a.os.pid}" for a in attempts if a.os is not None)
        + "\n"
    )


def test_logs_follow_ends_when_the_service_is_stopped_during_its_backoff(
    ledger: str, services: Services, procs: Processes, tmp_path: Path
) -> None:
    handle = services.start("echo once; exit 1", "svc", LONG_BACKOFF)
    wait_until(lambda: services.attempt(handle.process_id, 2), 30, "attempt 2 to be registered")
    follower = Follower(ledger, procs, tmp_path, "svc", "--json")
    wait_until(lambda: "once" in follower.text(), 30, "logs -f to print attempt 1's output")
    stopped = cli("stop", "svc", url=ledger)
    assert stopped.returncode == 0, stopped.stderr
    code, err = follower.wait()
    assert (code, err) == (0, "")
    (chunk,) = [orjson.loads(line) for line in follower.text().splitlines()]
    assert (chunk["attempt"], chunk["id"], chunk["data"]) == (1, handle.process_id, "once\n")


# -- show ------------------------------------------------------------------------------------


def test_show_of_a_service_is_its_newest_attempt_with_its_history(
    ledger: str, services: Services
) -> None:
    first, second, third = services.crash_loop()
    text = both("show", "svc", url=ledger).stdout
    lines = dict(re.findall(r"^(\S+(?: \S+)?)\s{2,}(.*)$", text.split("\n\n")[0], re.M))
    assert lines["id"] == third.id
    assert lines["name"] == "svc"
    assert lines["attempt"] == "3 of 3"
    assert lines["gave up"] == "crash_loop"
    assert lines["restart"] == "on-failure, at most 2 per 60 s"
    assert "backoff" not in lines
    assert "ATTEMPT\tSEQ\tAT\tKIND\tDETAILS" in text  # every attempt's events, numbered
    assert re.search(r"^3\t\d+\t[^\t]+\tcrash_loop\t", text, re.M)
    assert re.search(r"^1\t1\t[^\t]+\tregistered\t", text, re.M)
    shown = orjson.loads(both("show", first.id, "--json", url=ledger).stdout)
    assert shown["record"] == third.model_dump(mode="json")
    assert [a["id"] for a in shown["attempts"]] == [first.id, second.id, third.id]
    assert {e["process_id"] for e in shown["events"]} == {first.id, second.id, third.id}
    alone = orjson.loads(both("show", "svc.2", "--json", url=ledger).stdout)
    assert alone["record"]["id"] == second.id
    assert {e["process_id"] for e in alone["events"]} == {second.id}
    text = both("show", f"{first.id}.1", url=ledger).stdout
    assert re.search(rf"^id\s+{re.escape(first.id)}$", text, re.M)
    assert re.search(r"^attempt\s+1 of 3$", text, re.M)
    assert "SEQ\tAT\tKIND\tDETAILS" in text.replace("ATTEMPT\t", "")


# -- ps --------------------------------------------------------------------------------------


def test_ps_shows_a_service_as_one_row_with_its_name(ledger: str, services: Services) -> None:
    *_, third = services.crash_loop()
    assert cli("run", "--", "true", url=ledger).returncode == 0
    listed = both("ps", "--all", url=ledger).stdout.splitlines()
    assert listed[0] == "ID\tNAME\tSTATE\tSTATUS\tOUTCOME\tUPDATED\tCOMMAND"
    row = listed[1].split("\t")
    assert row[:5] == [
        third.id,
        "svc",
        "exited",
        "failed",
        "exit 1 · attempt 3, gave up (crash_loop)",
    ]
    assert listed[2].split("\t")[1:3] == ["", "exited"]  # a process without a name
    stored = orjson.loads(both("ps", "--all", "--json", url=ledger).stdout)
    assert stored["records"][0] == third.model_dump(mode="json")  # the stored document
    named = both("ps", "--name", "svc", url=ledger).stdout.splitlines()  # any status
    assert [line.split("\t")[0] for line in named[1:]] == [third.id]
    nothing = both("ps", "--name", "other", url=ledger)
    assert (nothing.stdout, nothing.stderr) == ("", "procledger: no processes match\n")


def test_a_service_in_its_backoff_says_when_its_next_attempt_starts(
    ledger: str, services: Services
) -> None:
    handle = services.start("exit 1", "slow", LONG_BACKOFF)
    pending = wait_until(
        lambda: services.attempt(handle.process_id, 2), 30, "attempt 2 to be registered"
    )
    assert pending.state.value == "starting"
    assert pending.starts_at_ms is not None
    (row,) = cli("ps", url=ledger).stdout.splitlines()[1:]
    cells = row.split("\t")
    assert cells[:4] == [pending.id, "slow", "backoff", "running"]
    assert re.fullmatch(r"next in (2\d|3[0-3])s · attempt 2", cells[4]), cells[4]
    text = cli("show", "slow", url=ledger).stdout
    assert re.search(r"^state\s+starting \(running\)$", text, re.M)
    assert re.search(r"^attempt\s+2 of 2$", text, re.M)
    found = re.search(r"^backoff\s+next attempt at (\S+) \(in (2\d|3[0-3])s\)$", text, re.M)
    assert found, text
    assert re.fullmatch(r"\d\d:\d\d:\d\d|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", found[1])
    (stored,) = orjson.loads(cli("ps", "--json", url=ledger).stdout)["records"]
    assert stored["state"] == "starting"  # the stored document, as it is stored


# -- the rules themselves --------------------------------------------------------------------


def test_the_document_rule_of_restart_may_follow_is_the_models(
    ledger: str, services: Services
) -> None:
    """`logs -f` decides on stored documents (no pydantic on the hot path) what `wait`
    decides on models: held equal over every case the rule names."""
    from procledger.cli.hot.marks import restart_may_follow as on_documents
    from procledger.domain.attempts import restart_may_follow as on_models

    first, _, third = services.crash_loop()
    policy = third.model_dump(mode="json")["restart"]
    variants: list[dict[str, Any]] = [
        {},
        {"gave_up": None},
        {"gave_up": None, "stop_requested": ["terminated"]},
        {"gave_up": None, "reason": "runner_shutdown"},
        {"gave_up": None, "service_stop_requested": ["killed"]},
        {"gave_up": None, "state": "lost_on_restore", "status": "abandoned"},
        {"gave_up": None, "state": "abandoned", "status": "abandoned"},
        {"gave_up": None, "state": "running", "status": "running"},
        {"gave_up": None, "restart": None},
        {"gave_up": None, "status": "completed", "exit_code": 0},
        {"gave_up": None, "status": "completed", "restart": policy | {"mode": "always"}},
        {"gave_up": None, "restart": policy | {"mode": "never"}},
    ]
    stopped = {"service_stop_requested": ["terminated"]}
    firsts = [first.model_dump(mode="json"), first.model_dump(mode="json") | stopped, None]
    for update in variants:
        document = third.model_dump(mode="json") | update
        record = ProcessRecord.model_validate(document)
        for given in firsts:
            model = None if given is None else ProcessRecord.model_validate(given)
            assert on_documents(document, given) == on_models(record, first=model), (
                update,
                given is None,
            )


def test_a_supervisor_provably_gone_starts_no_attempt(tmp_path: Path) -> None:
    """`logs -f` stops waiting for a next attempt once the supervisor that would start it is
    provably dead here (a dead supervisor's backoff schedule is not resumed)."""
    from procledger.cli.hot.marks import starter_gone

    ran = run_python(
        "from procledger import LeaseOwner; "
        "print(LeaseOwner.local_process('gone').model_dump_json())"
    )
    assert ran.returncode == 0, ran.stderr
    dead = orjson.loads(ran.stdout)  # its process has exited
    alive = LeaseOwner.local_process("here").model_dump(mode="json")
    assert starter_gone({"first_started": {"owner": dead}})
    assert not starter_gone({"first_started": {"owner": alive}})
    assert not starter_gone({"first_started": None})


def test_on_postgresql_a_service_reads_alike_through_the_agent(
    postgres_schema_url: str, procs: Processes
) -> None:
    """The hot commands ask this host's agent for a PostgreSQL ledger's reads (docs/design.md
    §8.1): a service's views, composed of those reads, print what the full path prints."""
    url = postgres_schema_url
    services = Services(url, procs)
    try:
        services.crash_loop()
    finally:
        services.close()
    assert cli("agent", "start", url=url).returncode == 0
    try:
        for args in (
            ("show", "svc"),
            ("show", "svc.2", "--json"),
            ("logs", "svc"),
            ("logs", "svc", "--tail", "2", "--json"),
            ("logs", "svc", "-f"),
            ("ps", "--all"),
            ("ps", "--name", "svc", "--json"),
        ):
            assert both(*args, url=url).returncode == 0, args
    finally:
        cli("agent", "stop", url=url)
