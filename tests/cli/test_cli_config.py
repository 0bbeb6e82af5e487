"""`procledger config check|show` (docs/design.md §19.2), run as a person runs it: the file is
found in the working directory or named with --file; success is one line, a mistake exactly
one line on stderr starting PATH:LINE:COL: and exit 1, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import orjson
import pytest

from _shared import CLI, child_env

THREE = """\
# db first, then web, then the worker
[services.worker]
command = "python -m worker"
depends_on = ["web", "db"]

[services.web]
command = ["python", "-m", "http.server", "8000"]
cwd = "site"
env = { DEBUG = true }
ready = { port = 8000, timeout = "30s" }
restart = "always"
depends_on = ["db"]

[services.db]
command = "postgres -D data"
stop_signal = "SIGINT"
"""


def config(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    return subprocess.run(
        [*CLI, "config", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def only_line(ran: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed check writes: on stderr, nothing on stdout, exit 1."""
    assert (ran.returncode, ran.stdout) == (1, ""), ran
    assert "Traceback" not in ran.stderr
    assert ran.stderr.endswith("\n")
    assert ran.stderr.count("\n") == 1, ran.stderr
    return ran.stderr.removesuffix("\n")


def test_check_says_how_many_services_in_which_order(tmp_path: Path) -> None:
    (tmp_path / "procledger.toml").write_text(THREE)
    ran = config("check", cwd=tmp_path)
    assert (ran.returncode, ran.stderr) == (0, "")
    assert ran.stdout == "procledger.toml: 3 services, in order: db, web, worker\n"


def test_check_reads_the_file_named(tmp_path: Path) -> None:
    (tmp_path / "other.toml").write_text('[services.solo]\ncommand = "true"\n')
    for option in ("--file", "-f"):
        ran = config("check", option, "other.toml", cwd=tmp_path)
        assert ran.stdout == "other.toml: 1 service, in order: solo\n", ran.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = config("check", "--file", str(tmp_path / "other.toml"), cwd=elsewhere)
    assert ran.stdout == f"{tmp_path / 'other.toml'}: 1 service, in order: solo\n"


def test_check_json_is_the_normalized_services_with_their_digests(tmp_path: Path) -> None:
    (tmp_path / "procledger.toml").write_text(THREE)
    ran = config("check", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    document = orjson.loads(ran.stdout)
    assert document["path"] == "procledger.toml"
    assert document["order"] == ["db", "web", "worker"]
    assert list(document["services"]) == ["worker", "web", "db"]  # file order
    web = document["services"]["web"]
    assert web["command"] == ["python", "-m", "http.server", "8000"]
    assert web["cwd"] == str(tmp_path / "site")
    assert web["env"] == {"DEBUG": "true"}
    assert web["ready"]["port"] == 8000
    assert web["ready"]["timeout_s"] == 30.0
    assert web["restart"]["mode"] == "always"
    assert document["services"]["worker"]["restart"]["mode"] == "on-failure"
    assert document["services"]["db"]["stop_signal"] == 2
    assert web["grace_s"] == 10.0
    assert all(
        re.fullmatch(r"sha256:[0-9a-f]{64}", s["digest"]) for s in document["services"].values()
    )


def test_show_prints_what_up_would_run(tmp_path: Path) -> None:
    (tmp_path / "procledger.toml").write_text(THREE)
    shown = config("show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("{\n")  # for people: indented
    checked = config("check", "--json", cwd=tmp_path)
    assert orjson.loads(shown.stdout) == orjson.loads(checked.stdout)


def test_a_malformed_file_is_one_line_naming_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "procledger.toml").write_text(THREE.replace('"always"', '"sometimes"'))
    for command in ("check", "show"):
        line = only_line(config(command, cwd=tmp_path))
        assert line == (
            "procledger.toml:11:1: services.web.restart: 'sometimes' is not a restart policy "
            "(never, on-failure, always)"
        )


@pytest.mark.parametrize(
    ("text", "place"),
    [
        ('[services.web]\ncommand = "x\n', "procledger.toml:2:13: invalid TOML: "),
        ("[services]\nweb = { command = 3 }\n", "procledger.toml:2:9: services.web.command: "),
        ("", "procledger.toml:1:1: services: no services"),
        ('[services.web]\ncommand = "x"\nstop_signal = "USR3"\n', "procledger.toml:3:1: "),
    ],
)
def test_every_mistake_is_placed(tmp_path: Path, text: str, place: str) -> None:
    (tmp_path / "procledger.toml").write_text(text)
    assert only_line(config("check", cwd=tmp_path)).startswith(place)


def test_a_missing_file_says_where_it_was_looked_for(tmp_path: Path) -> None:
    assert only_line(config("check", cwd=tmp_path)) == (
        f"no procledger.toml in {tmp_path} (or give --file PATH)"
    )
    assert only_line(config("check", "--file", "nope.toml", cwd=tmp_path)) == (
        "nope.toml: no such file"
    )
    assert only_line(config("check", "--file", ".", cwd=tmp_path)) == (
        ".: is a folder, not a service file"
    )
    (tmp_path / "a-file").write_text("")
    assert only_line(config("check", "--file", "a-file/x.toml", cwd=tmp_path)) == (
        "a-file/x.toml: cannot be read (not a directory)"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "procledger.toml"
    path.write_text(THREE)
    path.chmod(0)
    assert only_line(config("check", cwd=tmp_path)) == (
        "procledger.toml: cannot be read (permission denied)"
    )


def test_a_file_that_is_not_utf8_is_placed_at_its_first_bad_byte(tmp_path: Path) -> None:
    (tmp_path / "procledger.toml").write_bytes(b'[services.web]\ncommand = "caf\xe9"\n')
    assert only_line(config("check", cwd=tmp_path)) == (
        "procledger.toml:2:15: encoding: byte 0xe9 is not UTF-8 (a TOML file is UTF-8)"
    )


def test_a_byte_order_mark_is_not_a_mistake(tmp_path: Path) -> None:
    (tmp_path / "procledger.toml").write_bytes(b'\xef\xbb\xbf[services.web]\ncommand = "x"\n')
    assert config("check", cwd=tmp_path).returncode == 0


def test_signals_are_this_host_s(tmp_path: Path) -> None:
    import signal

    (tmp_path / "procledger.toml").write_text('[services.w]\ncommand = "x"\nstop_signal = "USR1"\n')
    ran = config("check", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert orjson.loads(ran.stdout)["services"]["w"]["stop_signal"] == signal.SIGUSR1


def test_config_alone_shows_its_commands(tmp_path: Path) -> None:
    ran = config(cwd=tmp_path)
    assert ran.returncode == 2
    assert "check" in ran.stdout + ran.stderr
    assert "show" in ran.stdout + ran.stderr


def test_other_commands_say_the_error_unchanged_after_their_name() -> None:
    """``up`` and the like report a ``ServiceFileError`` through the CLI's one error line:
    ``error_sentence`` must keep the message whole, its place first."""
    from procledger.cli.sentences import error_sentence
    from procledger.domain.errors import ServiceFileError
    from procledger.domain.service_file import parse_service_file

    text = '[services.web]\ncommand = "x"\nready = { output = "(", timeout = "1  s" }\n'
    with pytest.raises(ServiceFileError) as caught:
        parse_service_file(text, path="procledger.toml", base_dir="/srv")
    assert str(caught.value).startswith("procledger.toml:3:11: services.web.ready.output: ")
    assert error_sentence(caught.value) == str(caught.value)
