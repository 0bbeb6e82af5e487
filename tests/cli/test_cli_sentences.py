"""Error lines are sentences naming the thing at fault, never Python class names (docs/design.md
§8): ``error_sentence`` on the errors procledger raises, and the lines `procledger` prints for a
program that cannot run (in the foreground and through the host agent), for an option typer
checks with pydantic, and for a number too large for the ledger (a usage error, exit 2, nothing
recorded)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from _shared import run_cli
from procledger import NotFound, SpawnError, StoreURLError
from procledger.cli import sentences
from procledger.cli.sentences import error_sentence
from procledger.domain.errors import AgentError, LeaseLost
from procledger.supervisor.os_seam import spawn

from .test_cli_commands import CLASS_NAME


def spawn_error(argv: list[str], cwd: Path | str) -> SpawnError:
    """The ``SpawnError`` the OS seam raises for ``argv`` in ``cwd`` (nothing starts)."""
    with pytest.raises(SpawnError) as raised:
        spawn(argv, cwd=cwd, env=None, stdin_pipe=False, stdout_pipe=False, stderr_pipe=False)
    return raised.value


def test_the_module_imports_the_standard_library_only() -> None:
    # A command path that loads neither typer nor pydantic calls it (docs/design.md §8).
    tree = ast.parse(Path(sentences.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}  # fmt: skip
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported.discard("__future__")
    assert imported
    assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names)


def test_a_program_that_cannot_run_is_named_with_the_reason(tmp_path: Path) -> None:
    missing = spawn_error(["no-such-program-anywhere", "--flag"], tmp_path)
    assert error_sentence(missing) == (
        "cannot run 'no-such-program-anywhere': no such file or directory"
    )
    plain_file = tmp_path / "notes.txt"
    plain_file.write_text("not a program")
    denied = spawn_error([str(plain_file)], tmp_path)
    assert error_sentence(denied) == f"cannot run {str(plain_file)!r}: permission denied"
    # A relative path is looked up in the directory, so the directory is named.
    relative = spawn_error(["./nothing-here"], tmp_path)
    assert error_sentence(relative) == (
        f"cannot run './nothing-here' in {str(tmp_path)!r}: no such file or directory"
    )
    gone = str(tmp_path / "deleted")  # the directory is what is missing
    for cwd in (gone, Path(gone)):
        assert error_sentence(spawn_error(["true"], cwd)) == (
            f"cannot run 'true' in {gone!r}: no such file or directory"
        )


def test_a_script_whose_interpreter_is_missing_names_the_interpreter(tmp_path: Path) -> None:
    # exec says "no such file or directory" for a script a person can see: a #! line written
    # on Windows ends in \r, and names no file.
    script = tmp_path / "crlf.sh"
    script.write_bytes(b"#!/bin/sh\r\necho hello\r\n")
    script.chmod(0o755)
    assert error_sentence(spawn_error(["./crlf.sh"], tmp_path)) == (
        f"cannot run './crlf.sh' in {str(tmp_path)!r}: "
        "its interpreter '/bin/sh\\r' (the #! line) is not there"
    )


@pytest.mark.parametrize(
    ("error", "sentence"),
    [
        (NotFound("process 'p-7' not found"), "process 'p-7' not found"),
        (StoreURLError("store URL 'x://': unknown scheme"), "store URL 'x://': unknown scheme"),
        (LeaseLost(), "lease lost"),
        (
            PermissionError(13, "Permission denied", "/etc/shadow"),
            "'/etc/shadow': permission denied",
        ),
        (FileNotFoundError(2, "No such file or directory"), "no such file or directory"),
        (OSError("disk on fire"), "disk on fire"),
        (AgentError("UnknownOp", "no op 'dance'"), "the host agent answered: no op 'dance'"),
        (
            AgentError("SpawnError", "[Errno 2] cannot start command 'x y': No such file: 'x'"),
            "cannot run 'x': no such file",
        ),
        (KeyboardInterrupt(), "interrupted"),
        (
            TypeError("Integer exceeds 64-bit range"),
            "internal error (TypeError): Integer exceeds 64-bit range",
        ),
        (KeyError("x"), "internal error (KeyError): 'x'"),
        (NotFound("first line\n  second line"), "first line second line"),
    ],
)
def test_error_sentences(error: BaseException, sentence: str) -> None:
    assert error_sentence(error) == sentence


def test_pydantic_is_said_plainly() -> None:
    class Port(BaseModel):
        port: int

    with pytest.raises(ValidationError) as raised:
        Port(port="eighty")  # type: ignore[arg-type]
    assert error_sentence(raised.value) == "invalid port: must be a whole number"
    assert (
        sentences.plain("Value error, 'x' is not one of 'a', 'b'") == "'x' is not one of 'a', 'b'"
    )
    assert sentences.plain("Input should be less than or equal to 65535") == "must be at most 65535"


def one_line(ran: subprocess.CompletedProcess[str], code: int) -> str:
    assert ran.returncode == code, (ran.stdout, ran.stderr)
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert "Traceback" not in ran.stderr
    assert CLASS_NAME.search(ran.stderr) is None, ran.stderr
    return ran.stderr


def test_a_missing_program_reads_the_same_in_the_foreground_and_through_the_agent(
    ledger: str,
) -> None:
    expected = "procledger run: cannot run 'no-such-program-anywhere': no such file or directory\n"
    here = run_cli("run", "--", "no-such-program-anywhere", "arg", url=ledger)
    assert one_line(here, 127) == expected
    there = run_cli("run", "--background", "--", "no-such-program-anywhere", "arg", url=ledger)
    assert one_line(there, 127) == expected
    assert there.stdout == ""


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["stop", "--mode", "murder", "some-id"], "--mode: 'murder' is not one of"),
        (["wait", "some-id", "--until", "soon"], "--until: 'soon' is not one of"),
        (["table", "--format", "yaml"], "'--format': 'yaml' is not one of"),
        (["serve", "--port", "eighty"], "'--port': must be a whole number"),
        (["serve", "--port", "99999"], "'--port': must be at most 65535"),
        (["worker", "--interval", "1e400"], "'--interval': must be at most 86400"),
    ],
)
def test_options_typer_checks_are_said_without_pydantic_words(
    tmp_path: Path, args: list[str], named: str
) -> None:
    ran = run_cli(*args, url=f"sqlite:///{tmp_path}/never.db")
    said = one_line(ran, 2)
    assert named in said
    assert "Value error" not in said
    assert "Input should" not in said
    assert not (tmp_path / "never.db").exists()


HUGE = "9" * 5000
"""More digits than ``int`` converts (4300): a ``ValueError`` unless refused first."""


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--restart", "always", "--max-restarts", "99999999999999999999"], "--max-restarts"),
        (["--restart", "always", "--max-restarts", HUGE], "--max-restarts"),
        (["--restart", "always", "--max-restarts", "²"], "--max-restarts"),
        (["--ready-port", "²"], "--ready-port"),
        (["--ready-port", HUGE], "--ready-port"),
        (["--output-limit", HUGE], "--output-limit"),
        (["--output-limit", "١٢"], "--output-limit"),
    ],
)
def test_numbers_run_cannot_keep_are_usage_errors(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    ran = run_cli("run", *flags, "--", "true", url=f"sqlite:///{tmp_path}/never.db")
    assert named in one_line(ran, 2)
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    "args", [["ps", "--since", "99999999999w"], ["prune", "--older-than", "99999999999w"]]
)
def test_an_age_beyond_what_the_ledger_counts_is_a_usage_error(
    ledger: str, args: list[str]
) -> None:
    assert run_cli("run", "--", "true", url=ledger).returncode == 0
    said = one_line(run_cli(*args, url=ledger), 2)
    assert args[1] in said
    assert "'99999999999w' is longer than the ledger can count back" in said


def test_the_largest_max_restarts_the_ledger_keeps_is_taken(ledger: str) -> None:
    # A service that exits 0 under on-failure is not restarted: one attempt, recorded with the
    # policy that names the largest count.
    ran = run_cli(
        "run", "--restart", "on-failure", "--max-restarts", str(2**63 - 1), "--json", "--", "true",
        url=ledger,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert '"max_restarts":9223372036854775807' in ran.stdout
