"""``ps`` and ``show`` as a person reads them (docs/design.md §8): full ids on any terminal
(the command line is what gets cut), plain columns into a pipe, filters, a word for an empty
list, one line per argv, id prefixes, the child's OS facts and signal, and damaged records named
without hiding the others."""

from __future__ import annotations

import re
import signal
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import orjson
import pytest

from _shared import run_cli
from procledger.cli._format import short_time

from .conftest import Terminal


def ok(*args: str, url: str) -> str:
    ran = run_cli(*args, url=url)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def ran_json(*command: str, url: str) -> dict:
    ran = run_cli("run", "--json", "--", *command, url=url)
    return orjson.loads(ran.stdout)


def test_on_an_80_column_terminal_ids_are_short_and_the_command_is_cut(
    ledger: str, terminal: Callable[..., Terminal]
) -> None:
    long_word = "x" * 200
    record = ran_json("echo", long_word, url=ledger)
    term = terminal("--url", ledger, "ps", "--all")
    assert term.wait() == 0
    short = record["id"].split("-", 1)[1]  # the random part, as docker shows 12 characters
    term.expect(short)
    assert record["id"] not in term.output
    lines = [line for line in term.output.splitlines() if line.strip()]
    assert lines[0].split() == ["ID", "STATE", "STATUS", "OUTCOME", "UPDATED", "COMMAND"]
    assert all(len(line.rstrip("\r")) <= 80 for line in lines), lines
    assert lines[1].rstrip("\r").endswith("…")
    # Today's time alone (the full date took 11 more of the 80 columns): room for the command.
    assert re.search(r"  \d\d:\d\d:\d\d  echo x{12}", lines[1]), lines[1]


def test_a_terminal_shows_today_s_time_this_year_s_day_and_older_dates() -> None:
    now = datetime(2026, 12, 2, 15, 0)
    at = lambda *parts: int(datetime(*parts).timestamp() * 1000)  # noqa: E731 -- local time
    assert short_time(at(2026, 12, 2, 9, 5, 7), now) == "09:05:07"
    assert short_time(at(2026, 11, 30, 23, 59, 1), now) == "11-30 23:59"
    assert short_time(at(2025, 12, 2, 9, 5, 7), now) == "2025-12-02"
    assert short_time(None, now) == ""


def test_into_a_pipe_columns_are_tab_separated_and_nothing_is_cut(ledger: str) -> None:
    long_word = "y" * 300
    record = ran_json("echo", long_word, url=ledger)
    header, row = ok("ps", "--all", url=ledger).splitlines()
    assert header == "ID\tSTATE\tSTATUS\tOUTCOME\tUPDATED\tCOMMAND"
    fields = row.split("\t")
    assert fields[:4] == [record["id"], "exited", "completed", "exit 0"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", fields[4])  # whole, for scripts
    assert fields[5] == f"echo {long_word}"
    assert "  " not in row  # no padding


def test_an_argv_with_newlines_is_shown_on_one_line(ledger: str) -> None:
    ran_json("printf", "%s", "two\nlines", url=ledger)
    out = ok("ps", "--all", url=ledger)
    assert len(out.splitlines()) == 2
    assert "printf %s $'two\\nlines'" in out


def test_an_empty_list_says_so(ledger: str) -> None:
    ran_json("true", url=ledger)
    empty = run_cli("ps", url=ledger)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert "no running processes" in empty.stderr
    assert orjson.loads(ok("ps", "--json", url=ledger)) == {"records": [], "damaged": []}


def test_filters(ledger: str) -> None:
    good = ran_json("true", url=ledger)
    bad = ran_json("sh", "-c", "exit 3", url=ledger)
    killed = ran_json("sh", "-c", "kill -KILL $$", url=ledger)

    def ids(*options: str) -> list[str]:
        listed = orjson.loads(ok("ps", *options, "--json", url=ledger))
        return [record["id"] for record in listed["records"]]

    assert ids() == []
    assert ids("--all") == [good["id"], bad["id"], killed["id"]]
    assert ids("--status", "failed") == [bad["id"], killed["id"]]
    assert ids("--state", "exited") == [good["id"], bad["id"]]
    assert ids("--state", "exited,signaled") == [good["id"], bad["id"], killed["id"]]
    assert ids("--state", "signaled", "--status", "failed") == [killed["id"]]
    assert ids("--all", "--label", "sh") == [bad["id"], killed["id"]]
    assert ids("--all", "--limit", "2") == [bad["id"], killed["id"]]  # the newest two
    assert ids("--all", "--limit", "0") == []
    assert ids("--all", "--since", "1h") == [good["id"], bad["id"], killed["id"]]
    assert ids("--all", "--since", "0s") == []
    for bad_option in (("--state", "sleeping"), ("--since", "yesterday"), ("--status", "x")):
        ran = run_cli("ps", *bad_option, url=ledger)
        assert ran.returncode in (1, 2), ran.stderr
        assert ran.stderr.count("\n") == 1
        assert bad_option[1] in ran.stderr


def test_any_unique_prefix_names_a_process(ledger: str) -> None:
    first = ran_json("true", url=ledger)
    second = ran_json("true", url=ledger)
    common = 0
    while first["id"][common] == second["id"][common]:
        common += 1
    unique = first["id"][: common + 1]
    assert orjson.loads(ok("show", unique, "--json", url=ledger))["record"]["id"] == first["id"]
    prefix = first["id"][:common]
    ambiguous = run_cli("show", prefix, url=ledger)
    assert ambiguous.returncode == 1
    assert ambiguous.stderr.count("\n") == 1
    assert ambiguous.stderr.startswith(f"procledger show: process id prefix {prefix!r} is ambig")
    assert first["id"] in ambiguous.stderr
    assert second["id"] in ambiguous.stderr


def test_show_tells_the_os_facts_and_the_signal(ledger: str) -> None:
    ran = run_cli("run", "--", "sh", "-c", "kill -SEGV $$", url=ledger)
    assert ran.returncode == 128 + signal.SIGSEGV
    (record,) = orjson.loads(ok("ps", "--all", "--json", url=ledger))["records"]
    assert (record["state"], record["signal"], record["status"]) == ("signaled", 11, "failed")
    human = ok("show", record["id"], url=ledger)
    assert f"os pid            {record['os']['pid']}" in human
    assert f"process group {record['os']['pgid']}" in human
    assert "signal 11" in human


@pytest.mark.parametrize("garbage", [b"{not json", b"\xff\xfe not utf-8"])
def test_a_damaged_record_is_named_and_hides_no_other(
    ledger: str, tmp_path: Path, garbage: bytes
) -> None:
    healthy = ran_json("true", url=ledger)
    damaged = ran_json("false", url=ledger)
    with sqlite3.connect(str(tmp_path / "ledger.db")) as db:
        db.execute(
            "UPDATE procledger_records SET record = ? WHERE process_id = ?",
            (garbage, damaged["id"]),
        )
    listed = run_cli("ps", "--all", url=ledger)
    assert listed.returncode == 0, listed.stderr
    assert healthy["id"] in listed.stdout
    assert damaged["id"] not in listed.stdout
    assert listed.stderr.count("\n") == 1
    assert damaged["id"] in listed.stderr
    as_json = orjson.loads(ok("ps", "--all", "--json", url=ledger))
    assert [r["id"] for r in as_json["records"]] == [healthy["id"]]
    assert as_json["damaged"] == [damaged["id"]]
    shown = run_cli("show", damaged["id"], url=ledger)
    assert shown.returncode == 1
    assert shown.stderr.count("\n") == 1
    assert shown.stderr.startswith("procledger show: ")
    assert damaged["id"] in shown.stderr
    assert "StoreCorrupt" not in shown.stderr
