"""The command's surface (docs/design.md §8): ``--version``, help for every command in the order a
person uses them, ``| head`` ending quietly with 0, ``--url`` and ``$PROCLEDGER_URL`` meaning
the same, read-only commands never creating a ledger, ``keygen``, and PostgreSQL as an extra
named in the error when its driver is missing."""

from __future__ import annotations

import base64
import re
import signal
import subprocess
from pathlib import Path

import orjson
import pytest

import procledger
from _shared import CLI, Processes, child_env, run_cli

COMMANDS = [
    "run",
    "wait",
    "ps",
    "show",
    "logs",
    "stop",
    "send",
    "attach",
    "up",
    "down",
    "restart",
    "abandon",
    "ports",
    "feed",
    "serve",
    "restore",
    "sweep",
    "worker",
    "prune",
    "rebuild",
    "verify",
    "table",
    "keygen",
    "agent",
    "config",
]


def shell(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` in bash with ``pipefail``, ``procledger`` being the CLI under test."""
    command = " ".join(CLI)
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", script.replace("procledger", command)],
        capture_output=True,
        text=True,
        env=child_env(**env),
        timeout=60,
        check=False,
    )


def test_version() -> None:
    for option in ("--version", "-V"):
        ran = run_cli(option)
        assert (ran.returncode, ran.stdout) == (0, f"procledger {procledger.__version__}\n")


def test_the_version_is_the_distribution_s() -> None:
    from importlib.metadata import version

    assert procledger.__version__ == version("procledger")


def test_help_lists_the_commands_in_the_order_a_person_uses_them() -> None:
    ran = run_cli("--help")
    assert ran.returncode == 0
    listed = re.findall(r"^  (\w+)\s", ran.stdout.split("Commands:", 1)[1], flags=re.MULTILINE)
    assert [name for name in listed if name in COMMANDS] == [
        name for name in COMMANDS if name in listed
    ]
    assert set(listed) == set(COMMANDS)
    assert "..." not in ran.stdout.split("Commands:", 1)[1]  # summaries are whole sentences


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_readable_help(command: str) -> None:
    ran = run_cli(command, "--help")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"Usage: procledger {command} ")
    assert "<list[str]>" not in ran.stdout
    assert "{" not in ran.stdout.splitlines()[0]


def test_run_usage_is_clean() -> None:
    ran = run_cli("run", "--help")
    assert ran.stdout.splitlines()[0] == "Usage: procledger run [OPTIONS] [--] CMD [ARG]..."
    assert "--stdin" in ran.stdout


def test_a_closed_pipe_ends_quietly_with_0(ledger: str) -> None:
    for _ in range(3):
        assert run_cli("run", "--", "true", url=ledger).returncode == 0
    record = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"][0]
    for script in (
        f"procledger --url {ledger} show {record['id']} | head -1",
        f"procledger --url {ledger} ps --all | head -1",
        f"procledger --url {ledger} feed | head -1",
        "procledger table | head -1",
        "procledger --help | head -1",
    ):
        ran = shell(script)
        assert ran.returncode == 0, (script, ran.stderr)
        assert ran.stderr == "", script
        assert len(ran.stdout.splitlines()) == 1


def test_a_closed_stdout_or_stderr_is_no_traceback(ledger: str) -> None:
    # `run --json -- true >&-` once failed with AttributeError after recording the run.
    for script, code in (
        (f"procledger --url {ledger} run --json -- true >&-", 0),
        (f"procledger --url {ledger} ps --all 2>&-", 0),
        (f"procledger --url {ledger} show nosuch 2>&-", 1),
    ):
        ran = shell(script)
        assert ran.returncode == code, (script, ran.stderr)
        assert "Traceback" not in ran.stdout + ran.stderr, script


@pytest.mark.parametrize(("json", "redirect"), [("", ""), ("--json", "2>&1 >/dev/null")])
def test_a_run_whose_reader_goes_away_ends_as_its_command_would(
    ledger: str, procs: Processes, json: str, redirect: str
) -> None:
    # `yes | head -1` ends at once with SIGPIPE; under procledger (capturing, so the child
    # writes to procledger's pipe) it once ran forever, a core busy copying into the capture.
    # With --json the child's output goes to stderr: the same when that reader goes away.
    runner, child = procs.pidfile("runner.pid"), procs.pidfile("child.pid")
    script = (
        f"(echo $BASHPID > {runner}; exec procledger --url {ledger} run {json} -- "
        f"sh -c 'echo $$ > {child}; exec yes' {redirect}) | head -1"
    )
    ran = shell(script)
    assert (ran.returncode, ran.stdout, ran.stderr) == (128 + signal.SIGPIPE, "y\n", "")
    record = orjson.loads(run_cli("ps", "--all", "--json", url=ledger).stdout)["records"][0]
    assert (record["state"], record["signal"]) == ("signaled", signal.SIGPIPE)
    kept = run_cli("logs", record["id"], url=ledger)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.startswith("y\ny\n")


@pytest.mark.parametrize("folder_exists", [True, False])
def test_url_and_the_environment_mean_the_same(tmp_path: Path, folder_exists: bool) -> None:
    outcomes = []
    for name, how in (("a", "option"), ("b", "variable")):
        ledger = tmp_path / name / "ledger.db"
        if folder_exists:
            ledger.parent.mkdir()
        url = f"sqlite:///{ledger}"
        if how == "option":
            ran = run_cli("run", "--", "true", url=url)
        else:
            ran = run_cli("run", "--", "true", env=child_env(PROCLEDGER_URL=url))
        outcomes.append((ran.returncode, ran.stderr.replace(f"/{name}", "/X"), ledger.exists()))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][2] == folder_exists


@pytest.mark.parametrize("args", [("ps", "--url"), ("run", "--url=x", "--", "true")])
def test_url_after_the_command_says_where_it_goes(tmp_path: Path, args: tuple[str, ...]) -> None:
    # Not "No such option: --url (Possible options: --all)".
    ran = run_cli(*args, f"sqlite:///{tmp_path}/ledger.db")
    assert ran.returncode == 2
    assert ran.stderr == f"procledger {args[0]}: --url goes before the command: " + (
        f"procledger --url URL {args[0]} ...\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args", [("ps",), ("ps", "--all"), ("show", "some-id"), ("feed",), ("verify",)]
)
def test_read_only_commands_never_create_a_ledger(tmp_path: Path, args: tuple[str, ...]) -> None:
    missing = tmp_path / "mistyped.db"
    for ran in (
        run_cli(*args, url=f"sqlite:///{missing}"),
        run_cli(*args, env=child_env(PROCLEDGER_URL=f"sqlite:///{missing}")),
    ):
        assert ran.returncode == 1, ran.stderr
        assert ran.stderr.count("\n") == 1
        assert "mistyped.db" in ran.stderr
        assert "Traceback" not in ran.stderr
    assert list(tmp_path.iterdir()) == []


TOO_BIG = str(2**64)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("ps", "--limit", TOO_BIG), "--limit"),
        (("ps", "--status", "bogus"), "--status"),
        (("feed", "--since", TOO_BIG), "--since"),
        (("feed", "--limit", TOO_BIG), "--limit"),
        (("logs", "some-id", "--tail", TOO_BIG), "--tail"),
        (("prune", "--older-than", "1d", "--status", "bogus"), "--status"),
        (("worker", "--interval", "inf"), "--interval"),
        (("worker", "--interval", "1e308"), "--interval"),
        (("run", "--output-limit", TOO_BIG, "--", "true"), "--output-limit"),
        (("run", "--output-limit", "9999999999GiB", "--", "true"), "--output-limit"),
    ],
)
def test_a_value_out_of_range_is_a_usage_error(
    tmp_path: Path, args: tuple[str, ...], option: str
) -> None:
    # Found while parsing: no OverflowError from the store, no ledger opened, nothing recorded.
    ran = run_cli(*args, url=f"sqlite:///{tmp_path}/ledger.db")
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert option in ran.stderr
    assert list(tmp_path.iterdir()) == []


def test_keygen_prints_a_fresh_32_byte_key() -> None:
    keys = [run_cli("keygen").stdout for _ in range(2)]
    assert keys[0] != keys[1]
    for key in keys:
        assert key.endswith("\n")
        assert len(base64.urlsafe_b64decode(key.strip())) == 32


def test_without_psycopg_postgresql_names_the_extra(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "psycopg"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n"
    )
    env = child_env()
    env["PYTHONPATH"] = f"{shim.parent}:{env['PYTHONPATH']}"
    ran = run_cli("ps", url="postgresql://u@127.0.0.1:1/db", env=env)
    assert ran.returncode == 1
    assert ran.stderr.count("\n") == 1
    assert "pip install 'procledger[postgres]'" in ran.stderr
