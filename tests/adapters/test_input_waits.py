"""Knowing when a process waits for input (docs/design.md §20.3), on real pseudo-terminals and
pipes: a password prompt, a yes/no question, a REPL and a bare read are each found within a
second and told apart; ``sleep``, a busy loop, ``yes > /dev/null`` and a reader of another pipe
never are; one episode fires once, the next one again; a process that is gone or cannot be
looked into is simply not waiting."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import psutil
import pytest

from _shared import Processes, child_env, wait_until
from procledger.adapters.input_waits import (
    InputSource,
    InputWaitWatch,
    Waiting,
    blocked_reader,
    classify,
)
from procledger.adapters.syscalls import input_calls, parse_syscall
from procledger.domain.errors import ExecutionError
from procledger.domain.input import WaitKind

on_linux = pytest.mark.skipif(
    sys.platform != "linux" or not input_calls(),
    reason="reads /proc/<pid>/syscall: Linux on x86_64 or aarch64 only",
)
INTERVAL = 0.05
"""How often a test checks (the host agent checks every ~0.2 s; more often is harder)."""


@dataclass
class Session:
    """A child whose input is ``source``, its output drained into ``received`` (so that it
    never blocks writing), and the watch under test."""

    process: subprocess.Popen[bytes]
    source: InputSource
    watch: InputWaitWatch
    output_fd: int
    input_fd: int
    received: list[tuple[float, bytes]] = field(default_factory=list)

    def drain(self, timeout: float) -> None:
        """Read what the child wrote within ``timeout`` s, telling the watch."""
        ready, _, _ = select.select([self.output_fd], [], [], timeout)
        if not ready:
            return
        try:
            chunk = os.read(self.output_fd, 65536)
        except OSError:  # EIO: the slave side is closed everywhere
            chunk = b""
        if chunk:
            self.received.append((time.monotonic(), chunk))
            self.watch.note_output(chunk)

    def next_waiting(self, timeout: float = 10.0) -> Waiting:
        """Drain and check until the watch fires; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drain(INTERVAL)
            found = self.watch.check(time.monotonic())
            if found is not None:
                return found
        raise AssertionError(f"no wait for input seen in {timeout} s; output {self.text!r}")

    def waitings_for(self, seconds: float) -> list[Waiting]:
        """Every ``Waiting`` the watch gives while it is checked for ``seconds``."""
        found = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.drain(INTERVAL)
            if (waiting := self.watch.check(time.monotonic())) is not None:
                found.append(waiting)
        return found

    def shown_at(self, text: str) -> float:
        """When the output first held ``text``."""
        so_far = b""
        for at, chunk in self.received:
            so_far += chunk
            if text.encode() in so_far:
                return at
        raise AssertionError(f"{text!r} never shown; output {self.text!r}")

    def send(self, data: bytes) -> None:
        os.write(self.input_fd, data)
        self.watch.note_input()

    @property
    def text(self) -> str:
        return b"".join(chunk for _, chunk in self.received).decode(errors="replace")


class Sessions:
    """Starts sessions; at the end kills each child by its exact pid, reaps it and closes
    every descriptor the test opened."""

    def __init__(self, procs: Processes) -> None:
        self._procs = procs
        self._started: list[subprocess.Popen[bytes]] = []
        self._fds: list[int] = []

    def pipe(self) -> tuple[int, int]:
        read_end, write_end = os.pipe()
        self._fds += [read_end, write_end]
        return read_end, write_end

    def on_terminal(self, argv: Sequence[str], *, stdin: int | None = None) -> Session:
        """``argv`` in a new session whose controlling terminal is a fresh pseudo-terminal,
        which is its stdin (unless ``stdin`` names another descriptor), stdout and stderr."""
        master, slave = os.openpty()
        self._fds.append(master)
        try:
            process = self._start(
                argv,
                stdin=slave if stdin is None else stdin,
                stdout=slave,
                # fd 1, not 0: stdout is the terminal even where stdin is another pipe.
                preexec_fn=lambda: fcntl.ioctl(1, termios.TIOCSCTTY, 0),
            )
        finally:
            os.close(slave)
        source = InputSource.of_terminal(master)
        return Session(process, source, InputWaitWatch(source, process.pid), master, master)

    def on_pipe(self, argv: Sequence[str], *, holding: Sequence[int] = ()) -> Session:
        """``argv`` with a pipe for stdin and another for its stdout and stderr; ``holding``:
        descriptors it inherits besides (under the same numbers)."""
        stdin_read, stdin_write = self.pipe()
        output_read, output_write = self.pipe()
        process = self._start(argv, stdin=stdin_read, stdout=output_write, pass_fds=tuple(holding))
        source = InputSource.of_pipe(stdin_write)
        return Session(
            process, source, InputWaitWatch(source, process.pid), output_read, stdin_write
        )

    def _start(
        self,
        argv: Sequence[str],
        *,
        stdin: int,
        stdout: int,
        pass_fds: tuple[int, ...] = (),
        preexec_fn: Callable[[], object] | None = None,
    ) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=pass_fds,
            preexec_fn=preexec_fn,  # noqa: PLW1509 -- the controlling terminal is set there
        )
        self._procs.add(process.pid)
        self._started.append(process)
        return process

    def close(self) -> None:
        for process in self._started:
            if process.poll() is None:
                process.kill()
            process.wait(30)
        for fd in self._fds:
            with contextlib.suppress(OSError):  # closed by the test itself
                os.close(fd)


@pytest.fixture
def sessions(procs: Processes) -> Iterator[Sessions]:
    made = Sessions(procs)
    try:
        yield made
    finally:
        made.close()


PYTHON_READS_IN_A_THREAD = (
    "import sys, threading\n"
    "reader = threading.Thread(target=sys.stdin.readline)\n"
    "reader.start()\n"
    "reader.join()\n"
)
PYTHON_POLLS = (
    "import select, sys\n"
    "watch = select.poll()\n"
    "watch.register(sys.stdin, select.POLLIN)\n"
    "watch.poll()\n"
)
PYTHON_SELECTS = (
    "import os, select, sys\n"
    "others = [os.pipe()[0] for _ in range(3)]\n"
    "print('> ', end='', flush=True)\n"
    "select.select([*others, {}], [], [])\n"
)
"""Waits on three pipes of its own and, if {} is 0, its terminal too (fd 0 is not the last)."""
ON_A_TERMINAL = {
    "read -s": (["bash", "-c", "read -s -p 'Password: ' x"], WaitKind.password, "Password: "),
    "getpass on /dev/tty": (
        [sys.executable, "-c", "import getpass; getpass.getpass('Passphrase: ')"],
        WaitKind.password,
        "Passphrase: ",
    ),
    "y/n": (
        ["bash", "-c", "read -p 'Overwrite? [y/N] ' x"],
        WaitKind.question,
        "Overwrite? [y/N] ",
    ),
    "python REPL": ([sys.executable, "-I", "-q", "-i"], WaitKind.prompt, ">>> "),
    "head -c1": (["head", "-c1"], WaitKind.input, ""),
    "a reader thread": ([sys.executable, "-c", PYTHON_READS_IN_A_THREAD], WaitKind.input, ""),
    "poll": ([sys.executable, "-c", PYTHON_POLLS], WaitKind.input, ""),
    "select of several": (
        [sys.executable, "-c", PYTHON_SELECTS.format("0")],
        WaitKind.prompt,
        "> ",
    ),
}


@on_linux
@pytest.mark.parametrize("case", ON_A_TERMINAL)
def test_a_process_waiting_on_its_terminal_is_found_and_told(case: str, sessions: Sessions) -> None:
    argv, kind, last_line = ON_A_TERMINAL[case]
    session = sessions.on_terminal(argv)

    waiting = session.next_waiting()

    assert (waiting.pid, waiting.kind, waiting.last_line) == (session.process.pid, kind, last_line)
    assert waiting.how.endswith(("(fd 0)", "(fd 3)"))  # getpass reads /dev/tty, opened as 3
    if last_line:
        assert time.monotonic() - session.shown_at(last_line) < 1.0


@on_linux
def test_cat_reading_a_pipe_is_found_waiting_for_input(sessions: Sessions) -> None:
    session = sessions.on_pipe(["cat"])

    waiting = session.next_waiting()

    assert waiting == Waiting(session.process.pid, WaitKind.input, "", "read(fd 0)")


@on_linux
def test_two_prompts_in_a_row_are_each_found_once(sessions: Sessions) -> None:
    session = sessions.on_terminal(["bash", "-c", "read -p 'First: ' a; read -p 'Second: ' b"])

    first = session.next_waiting()
    again = session.waitings_for(1.0)
    session.send(b"one\n")
    second = session.next_waiting()

    assert (first.kind, first.last_line) == (WaitKind.prompt, "First: ")
    assert again == []
    assert (second.kind, second.last_line) == (WaitKind.prompt, "Second: ")
    assert second.pid == first.pid


@on_linux
def test_each_line_cat_echoes_starts_a_new_episode(sessions: Sessions) -> None:
    session = sessions.on_pipe(["cat"])

    session.next_waiting()
    session.send(b"hello\n")
    after_hello = session.next_waiting()
    session.send(b"world\n")
    after_world = session.next_waiting()

    assert (after_hello.last_line, after_world.last_line) == ("hello", "world")


def yes_to_dev_null(session: Session, procs: Processes) -> None:
    """Record the ``yes`` that ``sh`` starts (or becomes), so that it is killed by pid."""

    def found_yes() -> list[psutil.Process]:
        root = psutil.Process(session.process.pid)
        return [p for p in [root, *root.children(recursive=True)] if p.name() == "yes"]

    for process in wait_until(found_yes, 10, "yes to start"):
        procs.add(process.pid)


def reading(fd: int) -> list[str]:
    """``cat`` reading descriptor ``fd`` while it keeps its stdin (the source) open as fd 9."""
    return ["bash", "-c", f"exec cat 9<&0 <&{fd}"]


NEVER_WAITING = {
    "sleep": ["sleep", "1000"],
    "busy loop": [sys.executable, "-c", "while True: pass"],
    "yes > /dev/null": ["sh", "-c", "yes > /dev/null"],
    "reads another pipe": ["cat"],
}


@on_linux
@pytest.mark.slow
@pytest.mark.parametrize("case", NEVER_WAITING)
def test_a_process_sleeping_computing_writing_or_reading_elsewhere_is_never_waiting(
    case: str, sessions: Sessions, procs: Processes
) -> None:
    argv = NEVER_WAITING[case]
    if case == "reads another pipe":
        elsewhere, _ = sessions.pipe()  # its write end stays open: cat never sees an end
        watched = [
            sessions.on_terminal(argv, stdin=elsewhere),
            sessions.on_pipe(reading(elsewhere), holding=[elsewhere]),
        ]
    else:
        watched = [sessions.on_terminal(argv), sessions.on_pipe(argv)]
    if case == "yes > /dev/null":
        for session in watched:
            yes_to_dev_null(session, procs)

    # 2 s here; benchmarks/interactive.py (d) holds the same for ten minutes.
    deadline, samples = time.monotonic() + 2.0, 0
    while time.monotonic() < deadline:
        for session in watched:
            session.drain(INTERVAL / len(watched))
            assert blocked_reader(session.source, session.process.pid) is None, session.text
            assert session.watch.check(time.monotonic()) is None, session.text
        samples += 1

    assert samples >= 20
    assert all(session.process.poll() is None for session in watched)


@on_linux
def test_a_reader_of_another_pipe_holding_the_source_is_not_waiting(
    sessions: Sessions,
) -> None:
    """The source is among its descriptors, but it reads another: control for the above."""
    elsewhere, feed = sessions.pipe()
    session = sessions.on_pipe(reading(elsewhere), holding=[elsewhere])
    wait_until(lambda: psutil.Process(session.process.pid).name() == "cat", 10, "cat")
    wait_until(lambda: psutil.Process(session.process.pid).status() == "sleeping", 10, "a read")

    assert session.waitings_for(1.0) == []
    os.write(feed, b"fed\n")
    assert wait_until(lambda: session.drain(INTERVAL) or "fed" in session.text, 10, "cat's echo")


@on_linux
def test_a_select_of_other_descriptors_only_is_not_waiting(sessions: Sessions) -> None:
    session = sessions.on_terminal([sys.executable, "-c", PYTHON_SELECTS.format("*others")])
    wait_until(lambda: session.drain(INTERVAL) or "> " in session.text, 10, "its prompt")
    wait_until(lambda: psutil.Process(session.process.pid).status() == "sleeping", 10, "select")

    assert session.waitings_for(1.0) == []


@on_linux
def test_a_vanished_or_zombie_process_and_a_closed_terminal_are_not_waiting(
    sessions: Sessions,
) -> None:
    session = sessions.on_terminal(["bash", "-c", "read -p 'Name: ' x"])
    session.next_waiting()
    zombie = sessions.on_terminal(["true"])
    wait_until(lambda: psutil.Process(zombie.process.pid).status() == "zombie", 10, "a zombie")

    session.process.kill()
    session.process.wait(30)

    assert blocked_reader(session.source, session.process.pid) is None
    assert session.watch.check(time.monotonic()) is None
    assert blocked_reader(zombie.source, zombie.process.pid) is None
    assert zombie.watch.check(time.monotonic()) is None
    assert blocked_reader(session.source, 2**22 + 1) is None  # above any pid_max
    assert blocked_reader(InputSource(terminal=(136, 999_999), master_fd=-1), 1) is None


DROP_TO_NOBODY = """
import os, sys
from procledger.adapters.input_waits import InputSource, blocked_reader
source = InputSource.of_terminal(int(sys.argv[1]))
os.setgroups([])
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
print(blocked_reader(source, int(sys.argv[2])))
"""


@on_linux
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to look as another user (nobody)")
def test_a_process_whose_proc_entries_cannot_be_read_is_not_waiting(
    sessions: Sessions,
) -> None:
    """Root's password prompt, looked at by ``nobody``: its ``/proc/<pid>/syscall`` and fd
    links refuse (EACCES), so it is not waiting, and nothing is raised."""
    session = sessions.on_terminal(["bash", "-c", "read -s -p 'Password: ' x"])
    session.next_waiting()
    master = session.output_fd

    looked = subprocess.run(
        [sys.executable, "-c", DROP_TO_NOBODY, str(master), str(session.process.pid)],
        pass_fds=(master,),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert (looked.returncode, looked.stdout, looked.stderr) == (0, "None\n", "")
    assert blocked_reader(session.source, session.process.pid) == (
        session.process.pid,
        "read(fd 0)",
    )


@on_linux
def test_an_input_source_is_a_terminal_master_or_a_pipe() -> None:
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(ExecutionError, match=f"fd {read_end} is not the master"):
            InputSource.of_terminal(read_end)
        with open(__file__, "rb") as plain, pytest.raises(ExecutionError, match="not a pipe"):
            InputSource.of_pipe(plain.fileno())
        assert InputSource.of_pipe(read_end) == InputSource.of_pipe(write_end)
    finally:
        os.close(read_end)
        os.close(write_end)


# --- Without processes: the call table, the last line, the kinds -------------------------------


def test_only_known_architectures_of_linux_have_input_calls() -> None:
    assert input_calls("x86_64", "linux")[0].name == "read"
    assert input_calls("aarch64", "linux")[63].name == "read"
    assert input_calls("riscv64", "linux") == {}
    assert input_calls("x86_64", "darwin") == {}


def test_a_syscall_line_parses_or_is_none() -> None:
    blocked = parse_syscall("270 0x1 0x7ffd7af803a0 0x0 0x0 0x0 0x0 0x7ffd7af80310 0x7ff8")
    assert blocked is not None
    assert (blocked.number, blocked.args[:2]) == (270, (1, 0x7FFD7AF803A0))
    assert parse_syscall("running") is None
    assert parse_syscall("-1 0x7ffd7af80310 0x7ff8") is None
    assert parse_syscall(None) is None


PIPE = InputSource(pipe=(1, 2))


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("[sudo] password for root: ", WaitKind.password),
        ("Enter passphrase for key '/root/.ssh/id_ed25519': ", WaitKind.password),
        ("Enter PIN:", WaitKind.password),
        ("Save password? [y/N] ", WaitKind.question),
        (
            "Are you sure you want to continue connecting (yes/no/[fingerprint])? ",
            WaitKind.question,
        ),
        ("Do you want to continue? [Y/n] ", WaitKind.question),
        ("What is your name? ", WaitKind.question),
        (">>> ", WaitKind.prompt),
        ("... ", WaitKind.prompt),
        ("root@host:~# ", WaitKind.prompt),
        ("Name: ", WaitKind.prompt),
        ("spinning up", WaitKind.input),
        ("Loading...", WaitKind.input),
        ("", WaitKind.input),
    ],
)
def test_the_last_line_tells_the_kind(line: str, kind: WaitKind) -> None:
    assert classify(PIPE, line) is kind


def test_the_last_line_is_what_a_terminal_shows_of_chunks_split_anywhere() -> None:
    watch = InputWaitWatch(PIPE, root_pid=1)
    for chunk in [b"Welcome\r\n\x1b[1;3", b"2mPass", "wörd".encode()[:2], "wörd".encode()[2:]]:
        watch.note_output(chunk)
    watch.note_output("\x1b[0m: ")
    assert watch.last_line == "Passwörd: "
    watch.note_output("\r\n")
    assert watch.last_line == "Passwörd: "  # a blank line leaves the last one shown
    watch.note_output("10%\r50%\r100%\x1b]0;title\x07")
    assert watch.last_line == "100%"
    watch.note_output("x" * 1000)
    assert watch.last_line == "x" * 200
