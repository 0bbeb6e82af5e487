"""Output capture end to end (issue 15, docs/design.md §14): `run` keeps stdout and stderr,
`logs` reads them back byte for byte, the cap drops the oldest, a killed supervisor leaves an
exact prefix, `logs -f` follows to the end, and a full disk never costs the child its outcome."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _shared import CLI, Processes, child_env, end_process, run_cli, wait_until

MB = 1_000_000

# Writes N seeded random bytes to stdout and N others to stderr, interleaved in 64 KiB pieces.
RANDOM_WRITER = """
import os, random, sys
n = int(sys.argv[1])
out, err = random.Random(1).randbytes(n), random.Random(2).randbytes(n)
for at in range(0, n, 65536):
    sys.stdout.buffer.write(out[at:at + 65536])
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(err[at:at + 65536])
    sys.stderr.buffer.flush()
"""


def expected_sha(seed: int, n: int) -> str:
    import random

    return hashlib.sha256(random.Random(seed).randbytes(n)).hexdigest()


def cli(*args: str, url: str) -> subprocess.CompletedProcess[bytes]:
    """``procledger`` with binary output (`run_cli` decodes text)."""
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    return subprocess.run(
        [*CLI, "--url", url, *args], capture_output=True, timeout=300, env=env, check=False
    )


def only_id(url: str) -> str:
    records = json.loads(run_cli("ps", "--all", "--json", url=url).stdout)["records"]
    assert len(records) == 1
    return str(records[0]["id"])


def record_of(url: str, process_id: str) -> dict[str, object]:
    shown = run_cli("show", process_id, "--json", url=url)
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout))


@pytest.fixture(params=["sqlite", "postgres"])
def any_ledger(request: pytest.FixtureRequest) -> str:
    name = "ledger" if request.param == "sqlite" else "postgres_ledger"
    return str(request.getfixturevalue(name))


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_50_mb_of_random_bytes_are_kept_byte_for_byte(any_ledger: str, background: bool) -> None:
    n = 50 * MB
    mode = ["--background"] if background else []
    argv = ["run", *mode, "--output-limit", "128MiB", "--", sys.executable, "-c", RANDOM_WRITER]
    ran = cli(*argv, str(n), url=any_ledger)
    assert ran.returncode == 0, ran.stderr[-500:]
    process_id = only_id(any_ledger)
    if background:
        wait_until(
            lambda: record_of(any_ledger, process_id)["record"]["state"] == "exited"  # type: ignore[index], 120, "the run to end"
        )
    else:  # the foreground streamed it live as well
        assert hashlib.sha256(ran.stdout).hexdigest() == expected_sha(1, n)
    for stream, seed in (("stdout", 1), ("stderr", 2)):
        read = cli("logs", process_id, "--stream", stream, url=any_ledger)
        assert read.returncode == 0, read.stderr
        assert hashlib.sha256(read.stdout).hexdigest() == expected_sha(seed, n)
    output = record_of(any_ledger, process_id)["record"]["output"]  # type: ignore[index]
    assert output["stdout"] == {"written": n, "kept": n, "dropped": 0}
    assert output["stderr"] == {"written": n, "kept": n, "dropped": 0}


def test_a_small_cap_keeps_at_most_cap_plus_one_segment_and_records_the_drop(
    ledger: str,
) -> None:
    cap = 1024 * 1024
    ran = cli(
        "run", "--output-limit", "1MiB", "--", "sh", "-c", "yes | head -c 20000000", url=ledger
    )
    assert ran.returncode == 0
    process_id = only_id(ledger)
    shown = record_of(ledger, process_id)
    output = shown["record"]["output"]  # type: ignore[index]
    folder = Path(output["folder"])
    on_disk = sum(path.stat().st_size for path in folder.iterdir() if path.name != "order")
    assert on_disk <= cap + cap // 4  # the cap plus one segment at most
    stdout = output["stdout"]
    assert stdout["written"] == 20_000_000
    assert stdout["dropped"] == stdout["written"] - stdout["kept"] > 0
    kinds = [event["kind"] for event in shown["events"]]  # type: ignore[attr-defined]
    assert "output_truncated" in kinds
    read = cli("logs", process_id, url=ledger)
    assert read.stdout == b"y\n" * (len(read.stdout) // 2)  # what is kept is the newest, whole


@pytest.mark.slow
def test_5_gib_under_the_default_cap_keeps_at_most_cap_plus_one_segment(ledger: str) -> None:
    cap, segment, n = 64 * 1024 * 1024, 8 * 1024 * 1024, 5 * 1024**3
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    ran = subprocess.run(  # the live copy goes to /dev/null: 5 GiB must not reach this process
        [*CLI, "--url", ledger, "run", "--", "sh", "-c", f"yes | head -c {n}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=600,
        env=env,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-500:]
    process_id = only_id(ledger)
    shown = record_of(ledger, process_id)
    output = shown["record"]["output"]  # type: ignore[index]
    assert output["limit"] == cap
    folder = Path(output["folder"])
    on_disk = sum(path.stat().st_size for path in folder.iterdir() if path.name != "order")
    assert cap - segment <= on_disk <= cap + segment
    stdout = output["stdout"]
    assert stdout["written"] == n
    assert stdout["kept"] == on_disk
    assert stdout["dropped"] == n - on_disk
    truncated = [event for event in shown["events"] if event["kind"] == "output_truncated"]  # type: ignore[attr-defined]
    assert len(truncated) == 1
    assert (truncated[0]["payload"]["start"], truncated[0]["payload"]["end"]) == (0, n - on_disk)
    tail = cli("logs", process_id, "--tail", "2", url=ledger).stdout
    assert tail == b"y\ny\n"


PRINTER = """
import os, sys, time
for i in range(1000):
    print(f"line {i}", flush=True)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
print("after", flush=True)
"""


def test_kill_9_of_the_supervisor_leaves_the_exact_prefix(
    ledger: str, procs: Processes, tmp_path: Path
) -> None:
    pidfile, go = procs.pidfile("printer"), tmp_path / "go"
    argv = [
        *CLI,
        "--url",
        ledger,
        "run",
        "--",
        sys.executable,
        "-c",
        PRINTER,
        str(pidfile),
        str(go),
    ]
    supervisor = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=child_env())
    try:
        procs.add(supervisor.pid)
        procs.await_pid(pidfile)  # every line is written (and drained or in the pipe)
        process_id = only_id(ledger)
        expected = "".join(f"line {i}\n" for i in range(1000)).encode()
        wait_until(lambda: cli("logs", process_id, url=ledger).stdout == expected, 30)
        supervisor.kill()
        supervisor.wait()
        assert cli("logs", process_id, url=ledger).stdout == expected
        restored = run_cli("restore", url=ledger)  # stops the orphaned child, records its end
        assert restored.returncode == 0, restored.stderr
        shown = record_of(ledger, process_id)
        assert shown["record"]["state"] == "lost_on_restore"  # type: ignore[index]
        assert cli("logs", process_id, url=ledger).stdout == expected  # restore keeps it
        # and puts what the files say in the ledger, as the dead supervisor would have
        output = shown["record"]["output"]  # type: ignore[index]
        assert output["stdout"] == {"written": len(expected), "kept": len(expected), "dropped": 0}
        assert output["stderr"] == {"written": 0, "kept": 0, "dropped": 0}
        assert output["limit"] is None  # not in the ledger: said unknown, not guessed
        assert "supervisor died" in output["stopped"]
        captured = [e for e in shown["events"] if e["kind"] == "output_captured"]  # type: ignore[attr-defined]
        tail = base64.b64decode(captured[0]["payload"]["tails"]["stdout"])
        assert tail == expected[-8192:]
    finally:
        end_process(supervisor)


FOLLOWED = """
import os, sys, time
print("first", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
print("second", flush=True)
"""


def test_logs_follow_prints_lines_as_they_come_and_exits_0_at_the_end(
    ledger: str, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    started = run_cli(
        "run", "--background", "--", sys.executable, "-c", FOLLOWED, str(go), url=ledger
    )
    assert started.returncode == 0, started.stderr
    process_id = started.stdout.strip()
    follower = subprocess.Popen(
        [*CLI, "--url", ledger, "logs", "-f", process_id],
        stdout=subprocess.PIPE,
        env=child_env(),
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == b"first\n"
        go.write_text("")
        assert follower.stdout.readline() == b"second\n"
        assert follower.wait(timeout=30) == 0
    finally:
        end_process(follower)


# Writes a line to stdout, then one to stderr, three times, each only once the file named after
# the line before it exists: the test creates it after seeing that line captured, so the
# arrival order is the order of the writes.
ORDERED = """
import os, sys, time
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
for i in range(3):
    for stream, name in ((sys.stdout, "out"), (sys.stderr, "err")):
        stream.write(f"{name} {i}\\n")
        stream.flush()
        while not os.path.exists(os.path.join(sys.argv[2], f"{name}{i}")):
            time.sleep(0.005)
"""


def test_merged_logs_keep_the_order_in_which_the_streams_were_written(
    ledger: str, procs: Processes, tmp_path: Path
) -> None:
    # A foreground run reads both pipes, so it sees the order between the streams; a
    # background child writes its own files, which keep each stream's bytes but not that
    # order (docs/design.md §14.1): both are read whole.
    from procledger import open_registry
    from procledger.application.output import read_output

    pidfile = procs.pidfile("ordered")
    argv = [*CLI, "--url", ledger, "run", "--", sys.executable, "-c", ORDERED, str(pidfile)]
    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    foreground = subprocess.Popen(
        [*argv, str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    try:
        procs.await_pid(pidfile)
        process_id = wait_until(lambda: _only_running(ledger), 30, "the run to be recorded")
        registry = open_registry(ledger)
        try:
            expected = b""
            for i in range(3):
                for name in ("out", "err"):
                    expected += f"{name} {i}\n".encode()
                    wait_until(
                        lambda want=expected: (
                            b"".join(c.data for c in read_output(registry, process_id)) == want
                        ),
                        60,
                    )
                    (tmp_path / f"{name}{i}").write_text("")
            wait_until(lambda: registry.get(process_id).is_terminal, 60, "the run to end")
        finally:
            registry.close()
        assert foreground.wait(timeout=30) == 0
    finally:
        end_process(foreground)
    assert cli("logs", process_id, url=ledger).stdout == expected
    read = run_cli("logs", process_id, "--json", url=ledger)
    streams = [json.loads(line)["stream"] for line in read.stdout.splitlines()]
    assert streams == ["stdout", "stderr"] * 3


def _only_running(ledger: str) -> str | None:
    listed = json.loads(run_cli("ps", "--json", url=ledger).stdout)["records"]
    return listed[0]["id"] if listed else None


def test_json_chunks_name_stream_offset_and_encoding(ledger: str) -> None:
    script = (
        "import sys; sys.stdout.buffer.write(b'ok\\n'); sys.stdout.flush(); "
        "sys.stderr.buffer.write(b'\\xff\\xfe')"
    )
    assert cli("run", "--", sys.executable, "-c", script, url=ledger).returncode == 0
    read = run_cli("logs", only_id(ledger), "--json", url=ledger)
    chunks = [json.loads(line) for line in read.stdout.splitlines()]
    assert {"stream": "stdout", "offset": 0, "encoding": "utf-8", "data": "ok\n"} in chunks
    assert {"stream": "stderr", "offset": 0, "encoding": "base64", "data": "//4="} in chunks


def test_tail_and_since_offset(ledger: str) -> None:
    assert cli("run", "--", "sh", "-c", "seq 1 100", url=ledger).returncode == 0
    process_id = only_id(ledger)
    assert run_cli("logs", process_id, "--tail", "3", url=ledger).stdout == "98\n99\n100\n"
    assert run_cli("logs", process_id, "--since-offset", "285", url=ledger).stdout == "99\n100\n"


def test_unknown_pruned_and_uncaptured_are_one_line_errors(ledger: str) -> None:
    assert run_cli("run", "--no-capture", "--", "true", url=ledger).returncode == 0
    uncaptured = only_id(ledger)
    ran = run_cli("logs", uncaptured, url=ledger)
    assert ran.returncode == 1
    assert len(ran.stderr.splitlines()) == 1
    assert uncaptured in ran.stderr
    assert "without capture" in ran.stderr
    unknown = run_cli("logs", "no-such-process", url=ledger)
    assert unknown.returncode == 1
    assert len(unknown.stderr.splitlines()) == 1
    assert "no-such-process" in unknown.stderr
    assert run_cli("prune", "--older-than", "0s", url=ledger).returncode == 0
    pruned = run_cli("logs", uncaptured, url=ledger)
    assert pruned.returncode == 1
    assert len(pruned.stderr.splitlines()) == 1
    assert uncaptured in pruned.stderr


def test_an_output_limit_of_0_keeps_nothing_not_even_the_tail(ledger: str) -> None:
    ran = cli("run", "--output-limit", "0", "--", "sh", "-c", "echo hi; echo oh >&2", url=ledger)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, b"hi\n", b"oh\n")  # still streamed
    process_id = only_id(ledger)
    shown = record_of(ledger, process_id)
    output = shown["record"]["output"]  # type: ignore[index]
    assert (output["limit"], output["folder"]) == (0, None)
    assert output["stdout"] == {"written": 3, "kept": 0, "dropped": 3}
    assert output["stderr"] == {"written": 3, "kept": 0, "dropped": 3}
    captured = [e for e in shown["events"] if e["kind"] == "output_captured"]  # type: ignore[attr-defined]
    assert captured[0]["payload"]["tails"] == {"stdout": "", "stderr": ""}
    logs = run_cli("logs", process_id, url=ledger)
    assert (logs.returncode, logs.stdout) == (1, "")
    assert len(logs.stderr.splitlines()) == 1
    assert process_id in logs.stderr
    assert "output limit 0" in logs.stderr


def test_prune_removes_the_output_folder(ledger: str) -> None:
    assert cli("run", "--", "echo", "hi", url=ledger).returncode == 0
    process_id = only_id(ledger)
    folder = Path(record_of(ledger, process_id)["record"]["output"]["folder"])  # type: ignore[index]
    assert folder.is_dir()
    ran = run_cli("prune", "--older-than", "0s", url=ledger)
    assert ran.returncode == 0, ran.stderr
    assert not folder.exists()


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="mounts a tmpfs")
def test_a_full_disk_stops_capture_and_the_child_finishes(ledger: str, tmp_path: Path) -> None:
    state = tmp_path / "small"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(state)], check=True)
    try:
        env = child_env(XDG_STATE_HOME=str(state))
        env.pop("PROCLEDGER_URL", None)
        script = "head -c 5000000 /dev/zero; echo done >&2; exit 3"
        ran = subprocess.run(
            [*CLI, "--url", ledger, "run", "--", "sh", "-c", script],
            capture_output=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert ran.returncode == 3
        assert len(ran.stdout) == 5_000_000  # the terminal still got every byte
        record = record_of(ledger, only_id(ledger))["record"]
        assert record["exit_code"] == 3  # type: ignore[index]
        output = record["output"]  # type: ignore[index]
        assert output["stopped"]
        assert "ENOSPC" in output["stopped"]
        assert output["stdout"]["written"] == 5_000_000
        events = record_of(ledger, only_id(ledger))["events"]
        stopped = [e for e in events if e["kind"] == "output_stopped"]  # type: ignore[attr-defined]
        assert len(stopped) == 1
        assert "ENOSPC" in stopped[0]["payload"]["reason"]
    finally:
        subprocess.run(["umount", str(state)], check=True)


# `procledger ARGS...` as a reader on another host would run it: the host id the read API
# compares the record's with is replaced; nothing in the store or on disk is touched.
ON_ANOTHER_HOST = (
    "import sys; import procledger.cli.hot.marks as marks; "
    "marks.host_id_or_none = lambda: 'another-machine:4026531836'; "
    "from procledger.__main__ import main; main(sys.argv[1:])"
)


def test_logs_on_another_host_prints_the_stored_tail_and_where_the_rest_is(
    any_ledger: str,
) -> None:
    ran = cli("run", "--", "sh", "-c", "seq 1 5000; echo oops >&2", url=any_ledger)
    assert ran.returncode == 0, ran.stderr
    process_id = only_id(any_ledger)
    output = record_of(any_ledger, process_id)["record"]["output"]  # type: ignore[index]
    everything = "".join(f"{i}\n" for i in range(1, 5001)).encode()
    assert output["stdout"]["written"] == len(everything) > 8192

    env = child_env()
    env.pop("PROCLEDGER_URL", None)
    elsewhere = subprocess.run(
        [sys.executable, "-c", ON_ANOTHER_HOST, "--url", any_ledger, "logs", process_id],
        capture_output=True,
        timeout=60,
        env=env,
        check=False,
    )

    assert elsewhere.returncode == 0, elsewhere.stderr
    assert elsewhere.stdout == everything[-8192:] + b"oops\n"  # the tails the ledger kept
    [line] = elsewhere.stderr.decode().splitlines()
    assert process_id in line
    assert output["host_id"] in line
    assert output["folder"] in line
    here = cli("logs", process_id, url=any_ledger)  # the host that holds it reads it all
    assert here.stdout.count(b"\n") == 5001
