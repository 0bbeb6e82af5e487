"""The anchor's descriptor store (docs/design.md §18.9): a PTY's master the agent keeps there
outlives the agent, so its terminal's child gets no SIGHUP when the agent dies; each agent the
anchor starts gets it back, and writing to it reaches the child. Stopping the anchor hangs the
terminal up.

Real processes (``store_agent.py`` under a real anchor) for the life of a descriptor; the
store's server and client in this process, over a real socket pair, for the protocol's edges.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _shared import Processes, child_env, is_dead, run_python, wait_until
from procledger.agent.anchor import (
    MAX_KEY_BYTES,
    STORE_FD,
    STORE_VARIABLE,
    DescriptorStore,
    receive_message,
)
from procledger.agent.fd_store import FdStore, FdStoreError
from procledger.domain.errors import AgentSocketError

from .conftest import AnchorRun, ppid_of

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the anchor is Linux's")

STORE_AGENT = Path(__file__).with_name("store_agent.py")
DEADLINE = 30.0


class StoreAnchor(AnchorRun):
    """An anchor whose agent is ``store_agent.py``, answering on an abstract socket of its own
    (no path: a temporary folder's would not fit ``sun_path``)."""

    def __init__(self, directory: Path, procs: Processes) -> None:
        super().__init__(directory, procs)
        self.address = f"procledger-test-fd-store-{uuid.uuid4().hex}"

    def start(self, *wrapper: str, anchor_args: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """Start the anchor, under ``wrapper`` (a command that execs the rest) if given."""
        self.marker.touch()
        argv = [
            *wrapper,
            *(sys.executable, "-m", "procledger.agent.anchor", "--journal", str(self.journal)),
            *("--backoff-max", "0.2", *anchor_args),
            *("--", sys.executable, str(STORE_AGENT), str(self.marker), self.address),
        ]
        with open(self.stderr, "wb") as stderr:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                env=child_env(),
            )  # fmt: skip
        return self.process

    def ask(self, command: str, **fields: Any) -> dict[str, Any]:
        """One command to whichever agent answers; its reply."""
        line = json.dumps({"cmd": command, **fields}).encode() + b"\n"

        def answered() -> dict[str, Any] | None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(DEADLINE)
                try:
                    connection.connect("\0" + self.address)
                except (ConnectionRefusedError, FileNotFoundError):
                    return None  # between two agents
                connection.sendall(line)
                with connection.makefile("rb") as stream:
                    reply: dict[str, Any] = json.loads(stream.readline())
                    return reply

        reply = wait_until(answered, DEADLINE, f"the agent to answer {command}")
        assert reply is not None
        assert "error" not in reply, reply
        return reply

    def agent(self, number: int) -> int:
        """The pid of the agent's ``number``-th start, once it answers."""
        pid = self.await_starts(number)[number - 1][0]
        wait_until(lambda: self.ask("held")["pid"] == pid, DEADLINE, f"agent {number} to answer")
        return pid

    def kill_agent(self, pid: int) -> None:
        """SIGKILL the agent; returns once the anchor has journaled its end."""
        os.kill(pid, signal.SIGKILL)
        self.await_record(pid, agent=True)

    def held_by_anchor(self) -> list[str]:
        """What the anchor's descriptors are (``pipe:[ino]``, ``/dev/ptmx``...), from /proc."""
        found = []
        for entry in Path(f"/proc/{self.pid}/fd").iterdir():
            with contextlib.suppress(FileNotFoundError):  # closed since listed
                found.append(os.readlink(entry))
        return found


@pytest.fixture
def store_anchor(tmp_path: Path, procs: Processes) -> Iterator[StoreAnchor]:
    """An anchor with the store agent, killed with its agents by exact pid after the test."""
    run = StoreAnchor(tmp_path, procs)
    started = time.time()
    yield run
    run.cleanup(started)


class Terminal:
    """A child on a pseudo-terminal the agent made (``pty``): its files and its process."""

    def __init__(self, anchor: StoreAnchor, procs: Processes, tmp_path: Path, key: str) -> None:
        self.key = key
        self.out = tmp_path / f"{key}.out"
        self.hup = tmp_path / f"{key}.hup"
        pidfile = procs.pidfile(f"{key}.pid")
        fields = {"out": str(self.out), "pidfile": str(pidfile), "hupfile": str(self.hup)}
        anchor.ask("pty", key=key, **fields)
        self.process = procs.await_pid(pidfile)

    def round_trip(self, anchor: StoreAnchor, text: str) -> None:
        """``text`` written to the master by the agent reaches the child, and the child's
        answer comes back through the master to the agent."""
        anchor.ask("write", key=self.key, text=f"{text}\n")
        reply = anchor.ask("read", key=self.key, until=f"got: {text}")
        assert f"got: {text}" in reply["text"]
        wait_until(lambda: text in self.out.read_text().split(), DEADLINE, f"{text!r} in out")

    def assert_alive_and_not_hung_up(self) -> None:
        assert not is_dead(self.process)
        assert not self.hup.exists()

    def assert_hung_up(self) -> None:
        wait_until(self.hup.exists, DEADLINE, "the child's SIGHUP")
        assert self.hup.read_text() == "SIGHUP"
        wait_until(lambda: is_dead(self.process), DEADLINE, "the child to end")


# -- a PTY's master outlives the agent ---------------------------------------------------------


def test_a_kept_master_outlives_the_agent_and_reaches_the_child_through_the_next(
    store_anchor: StoreAnchor, procs: Processes, tmp_path: Path
) -> None:
    store_anchor.start()
    first = store_anchor.agent(1)
    assert store_anchor.ask("held") == {"pid": first, "store": True, "keys": {}}
    terminal = Terminal(store_anchor, procs, tmp_path, "shell")
    terminal.round_trip(store_anchor, "before")
    assert "/dev/ptmx" in store_anchor.held_by_anchor()  # the anchor's duplicate of the master

    store_anchor.kill_agent(first)
    second = store_anchor.agent(2)
    assert set(store_anchor.ask("held")["keys"]) == {"shell"}
    terminal.assert_alive_and_not_hung_up()
    assert ppid_of(terminal.process.pid) == store_anchor.pid  # an orphan of the dead agent
    terminal.round_trip(store_anchor, "after")
    assert terminal.out.read_text() == "before\nafter\n"
    assert second != first


def test_the_master_goes_to_every_next_agent_until_it_is_dropped(
    store_anchor: StoreAnchor, procs: Processes, tmp_path: Path
) -> None:
    store_anchor.start()
    agent = store_anchor.agent(1)
    terminal = Terminal(store_anchor, procs, tmp_path, "shell")
    kept = store_anchor.ask("held")["keys"]["shell"]
    for number in range(2, 7):  # five kills in a row
        store_anchor.kill_agent(agent)
        agent = store_anchor.agent(number)
        assert store_anchor.ask("held")["keys"] == {"shell": kept}  # the same master each time
        terminal.assert_alive_and_not_hung_up()
        terminal.round_trip(store_anchor, f"line-{number}")

    store_anchor.ask("drop", key="shell")  # the agent closes its copy too
    terminal.assert_hung_up()  # no descriptor of the master is left anywhere
    assert "/dev/ptmx" not in store_anchor.held_by_anchor()
    store_anchor.kill_agent(agent)
    store_anchor.agent(7)
    assert store_anchor.ask("held")["keys"] == {}


def test_stopping_the_anchor_hangs_the_terminal_up(
    store_anchor: StoreAnchor, procs: Processes, tmp_path: Path
) -> None:
    """Documented (§18.9): the anchor holds the last descriptor of the master once the agent
    is gone, as a tmux server does; stopping it ends the terminal's sessions."""
    store_anchor.start()
    terminal = Terminal(store_anchor, procs, tmp_path, "shell")
    store_anchor.kill_agent(store_anchor.agent(1))
    store_anchor.agent(2)
    terminal.round_trip(store_anchor, "hello")
    terminal.assert_alive_and_not_hung_up()
    assert store_anchor.stop() == 0
    terminal.assert_hung_up()


def test_keep_replaces_drop_forgets_and_bad_requests_get_error_replies(
    store_anchor: StoreAnchor,
) -> None:
    store_anchor.start()
    agent = store_anchor.agent(1)
    first = store_anchor.ask("keep_pipe", key="pipe")["pipe"]
    second = store_anchor.ask("keep_pipe", key="pipe")["pipe"]
    held = store_anchor.held_by_anchor()
    assert pipe_link(second) in held
    assert pipe_link(first) not in held  # the replaced descriptor is closed
    store_anchor.ask("drop", key="nobody-kept-this")

    null_before = store_anchor.held_by_anchor().count(os.devnull)  # its stdin and stdout
    for data, fds, error in [
        ("not json", 0, "not JSON"),
        ('{"op":"keep","key":"k"}', 0, "exactly one descriptor, not 0"),
        ('{"op":"keep","key":"k"}', 2, "exactly one descriptor, not 2"),
        ('{"op":"keep","key":"k"}', 5, "descriptors were cut off"),
        (json.dumps({"op": "keep", "key": "k" * 257}), 1, "at most 256 bytes"),
        ('{"op":"drop","key":"k"}', 1, "carries no descriptor"),
        ('{"op":"take"}', 0, "unknown op"),
        ("x" * 5000, 0, "at most 4096 bytes"),
        ("", 0, "empty message"),
    ]:
        reply = json.loads(store_anchor.ask("raw", data=data, fds=fds)["reply"])
        assert reply["ok"] is False
        assert error in reply["error"], (data[:40], reply)
    assert store_anchor.ask("raw", data='{"op":"drop","key":"k"}', fds=0)["reply"] == '{"ok":true}'

    store_anchor.kill_agent(agent)
    store_anchor.agent(2)
    assert store_anchor.ask("held")["keys"] == {"pipe": second}
    assert store_anchor.held_by_anchor().count(os.devnull) == null_before  # refused: closed
    store_anchor.ask("drop", key="pipe")
    assert pipe_link(second) not in store_anchor.held_by_anchor()


def pipe_link(identity: str) -> str:
    return f"pipe:[{identity.split(':')[1]}]"


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="starts the anchor under prlimit")
def test_the_anchor_raises_its_descriptor_limit_for_itself_and_the_agent(
    store_anchor: StoreAnchor,
) -> None:
    hard = psutil.Process().rlimit(psutil.RLIMIT_NOFILE)[1]
    store_anchor.start("prlimit", f"--nofile={min(hard, 256)}:")
    agent = store_anchor.agent(1)
    assert psutil.Process(store_anchor.pid).rlimit(psutil.RLIMIT_NOFILE) == (hard, hard)
    assert psutil.Process(agent).rlimit(psutil.RLIMIT_NOFILE) == (hard, hard)


def test_the_agent_has_the_store_as_fd_3_and_its_children_do_not(
    store_anchor: StoreAnchor, procs: Processes, tmp_path: Path
) -> None:
    store_anchor.start()
    agent = store_anchor.agent(1)
    assert os.readlink(f"/proc/{agent}/fd/{STORE_FD}").startswith("socket:")
    environ = Path(f"/proc/{agent}/environ").read_bytes().split(b"\0")
    assert f"{STORE_VARIABLE}={STORE_FD}".encode() in environ  # as the anchor gave it
    child = Terminal(store_anchor, procs, tmp_path, "shell").process
    links = [
        os.readlink(f"/proc/{child.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{child.pid}/fd")
    ]
    assert not [link for link in links if link.startswith("socket:")]
    assert STORE_VARIABLE.encode() not in Path(f"/proc/{child.pid}/environ").read_bytes()


# -- the protocol, in this process --------------------------------------------------------------


class Served:
    """A store served over a real socket pair by a thread, as the anchor serves an agent."""

    def __init__(self, store: DescriptorStore) -> None:
        self._anchor_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._thread = threading.Thread(target=store.serve, args=(self._anchor_end,), daemon=True)
        self._thread.start()
        self.client = FdStore(agent_end)

    def close(self) -> None:
        self.client.close()
        self._thread.join(DEADLINE)
        assert not self._thread.is_alive()
        self._anchor_end.close()


@pytest.fixture
def store() -> Iterator[DescriptorStore]:
    made = DescriptorStore(max_held=4)
    yield made
    for key in take_keys(made):
        made.answer(json.dumps({"op": "drop", "key": key}).encode(), [], 0)


def take_keys(store: DescriptorStore) -> list[str]:
    """What ``store`` holds, as an agent would get it (the descriptors closed again)."""
    served = Served(store)
    try:
        held = served.client.take_all()
        for fd in held.values():
            os.close(fd)
        return sorted(held)
    finally:
        served.close()


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    ends = os.pipe()
    yield ends
    for fd in ends:
        os.close(fd)


def test_descriptors_come_back_close_on_exec_and_working(
    store: DescriptorStore, pipe: tuple[int, int]
) -> None:
    served = Served(store)
    assert served.client.take_all() == {}
    served.client.keep("pipe", pipe[1])
    served.close()
    again = Served(store)
    held = again.client.take_all()
    again.close()
    assert list(held) == ["pipe"]
    assert not os.get_inheritable(held["pipe"])
    os.write(held["pipe"], b"through the store")
    os.close(held["pipe"])
    assert os.read(pipe[0], 100) == b"through the store"


def test_the_store_is_bounded_and_refusals_name_the_key(
    store: DescriptorStore, pipe: tuple[int, int]
) -> None:
    served = Served(store)
    served.client.take_all()
    for index in range(4):
        served.client.keep(f"k{index}", pipe[0])
    with pytest.raises(FdStoreError, match=re.escape("full (4 descriptors): 'k4' is not kept")):
        served.client.keep("k4", pipe[0])
    served.client.keep("k3", pipe[1])  # replacing needs no room
    too_long = r"'x{76}\.{3}: a key is at most 256 bytes of UTF-8, not 257"
    with pytest.raises(FdStoreError, match=too_long):
        served.client.keep("x" * 257, pipe[0])
    with pytest.raises(FdStoreError, match="'': a key is a non-empty string"):
        served.client.drop("")
    with pytest.raises(FdStoreError, match=re.escape("descriptor 99999 ('k') over")):
        served.client.keep("k", 99999)
    served.close()
    assert take_keys(store) == ["k0", "k1", "k2", "k3"]
    assert MAX_KEY_BYTES == 256


def test_take_all_comes_first_and_once(store: DescriptorStore, pipe: tuple[int, int]) -> None:
    served = Served(store)
    with pytest.raises(FdStoreError, match="take_all"):
        served.client.keep("k", pipe[0])
    served.client.take_all()
    with pytest.raises(FdStoreError, match="already"):
        served.client.take_all()
    served.close()
    with pytest.raises(FdStoreError, match="closed"):
        served.client.drop("k")


def test_threads_keep_at_once(pipe: tuple[int, int]) -> None:
    big = DescriptorStore()
    served = Served(big)
    served.client.take_all()
    errors: list[BaseException] = []

    def keep_many(prefix: str) -> None:
        try:
            for index in range(50):
                served.client.keep(f"{prefix}-{index % 10}", pipe[index % 2])
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=keep_many, args=(f"t{n}",)) for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(DEADLINE)
    served.close()
    assert errors == []
    keys = take_keys(big)
    assert len(keys) == 40
    for key in keys:
        big.answer(json.dumps({"op": "drop", "key": key}).encode(), [], 0)


def test_a_late_reply_is_read_before_the_next_one(pipe: tuple[int, int]) -> None:
    """The test plays the anchor: a reply that misses its timeout is not taken for the next
    request's."""
    anchor_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with anchor_end, FdStore(agent_end) as client:
        anchor_end.send(b'{"op":"end"}')
        client.take_all()
        with pytest.raises(FdStoreError, match=re.escape("did not answer within 0.2 s (keep 'a')")):
            client.keep("a", pipe[0], timeout=0.2)
        data, fds, _ = receive_message(anchor_end, 1)
        assert json.loads(data) == {"op": "keep", "key": "a"}
        anchor_end.send(b'{"ok":false,"error":"late"}')  # keep a's reply, arriving late
        anchor_end.send(b'{"ok":true}')  # drop b's
        client.drop("b")
        assert json.loads(anchor_end.recv(4096)) == {"op": "drop", "key": "b"}
        for fd in fds:
            os.close(fd)


def test_close_wakes_a_request_blocked_in_another_thread(pipe: tuple[int, int]) -> None:
    anchor_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    client = FdStore(agent_end)
    anchor_end.send(b'{"op":"end"}')
    client.take_all()
    failed: list[BaseException] = []

    def drop() -> None:
        try:
            client.drop("k", timeout=DEADLINE)
        except FdStoreError as error:
            failed.append(error)

    worker = threading.Thread(target=drop)
    worker.start()
    wait_until(lambda: anchor_end.recv(4096, socket.MSG_PEEK), DEADLINE, "the request")
    client.close()
    worker.join(DEADLINE)
    anchor_end.close()
    assert not worker.is_alive()
    assert len(failed) == 1


def test_take_all_skips_what_it_does_not_know(pipe: tuple[int, int]) -> None:
    anchor_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with anchor_end, FdStore(agent_end) as client:
        socket.send_fds(anchor_end, [b'{"op":"held","key":"a"}'], [pipe[0]])
        socket.send_fds(anchor_end, [b'{"op":"novel","key":"b"}'], [pipe[0]])
        socket.send_fds(anchor_end, [b'{"op":"held"}'], [pipe[0]])
        anchor_end.send(b'{"op":"end","more":1}')
        held = client.take_all()
        assert list(held) == ["a"]
        os.close(held["a"])


def test_take_all_fails_when_the_anchor_goes(pipe: tuple[int, int]) -> None:
    anchor_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with FdStore(agent_end) as client:
        socket.send_fds(anchor_end, [b'{"op":"held","key":"a"}'], [pipe[0]])
        anchor_end.close()
        with pytest.raises(FdStoreError, match="closed the descriptor store"):
            client.take_all()  # and "a", received, is closed again (no_leaked_fds)


# -- from_environment ---------------------------------------------------------------------------


def test_no_variable_no_store() -> None:
    assert FdStore.from_environment({}) is None
    assert FdStore.from_environment({"PATH": "/bin"}) is None


def test_the_variable_is_taken_and_the_descriptor_made_close_on_exec() -> None:
    anchor_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fd = agent_end.detach()
    os.set_inheritable(fd, True)
    environ = {STORE_VARIABLE: str(fd), "OTHER": "kept"}
    with anchor_end, FdStore.from_environment(environ) as client:  # type: ignore[union-attr]
        assert environ == {"OTHER": "kept"}
        assert not os.get_inheritable(fd)
        anchor_end.send(b'{"op":"end"}')
        assert client.take_all() == {}


@pytest.mark.parametrize("kind", ["text", "closed", "pipe", "stream"])
def test_a_variable_that_names_no_store_is_an_error(kind: str) -> None:
    opened: list[int] = []
    if kind == "text":
        value = "three"
    elif kind == "closed":
        value = "99999"
    elif kind == "pipe":
        opened.extend(os.pipe())
        value = str(opened[0])
    else:
        pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        opened.extend(end.detach() for end in pair)
        value = str(opened[0])
    try:
        with pytest.raises(FdStoreError, match=STORE_VARIABLE) as raised:
            FdStore.from_environment({STORE_VARIABLE: value})
        assert isinstance(raised.value, AgentSocketError)
    finally:
        for fd in opened:
            os.close(fd)


# -- nothing an agent sends stops the store ------------------------------------------------------

HOSTILE = st.one_of(
    st.binary(max_size=300),
    st.binary(min_size=4090, max_size=4200),
    st.integers(1, 3000).map(lambda depth: b"[" * depth),
    st.fixed_dictionaries(
        {"op": st.sampled_from(["keep", "drop", "held", "end", 7, None])},
        optional={"key": st.one_of(st.text(max_size=300), st.integers(), st.none())},
    ).map(lambda doc: json.dumps(doc).encode()),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=HOSTILE, fds=st.integers(0, 3))
def test_no_request_stops_the_store(payload: bytes, fds: int, pipe: tuple[int, int]) -> None:
    """Every descriptor a refused request carried is closed (``no_leaked_fds``), every reply
    is a well-formed answer, and the store answers a good request after it."""
    store = DescriptorStore()
    anchor_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = threading.Thread(target=store.serve, args=(anchor_end,), daemon=True)
    worker.start()
    with agent_end:
        assert agent_end.recv(4096) == b'{"op":"end"}'
        socket.send_fds(agent_end, [payload], [pipe[0]] * fds)
        reply = json.loads(agent_end.recv(4096))
        assert set(reply) in ({"ok"}, {"ok", "error"})
        assert reply["ok"] is (set(reply) == {"ok"})
        socket.send_fds(agent_end, [b'{"op":"keep","key":"after"}'], [pipe[1]])
        assert json.loads(agent_end.recv(4096)) == {"ok": True}
        agent_end.send(b'{"op":"drop","key":"after"}')
        assert json.loads(agent_end.recv(4096)) == {"ok": True}
    worker.join(DEADLINE)
    anchor_end.close()
    assert not worker.is_alive()
    for key in take_keys(store):  # what the fuzz kept: closed again
        store.answer(json.dumps({"op": "drop", "key": key}).encode(), [], 0)


LINK_ON_FD_3 = """
import os
os.close(0)  # the socket pair takes 0 and 3: the agent's end is already the number it must get
from procledger.agent import anchor
link = anchor._AgentLink(anchor.DescriptorStore())
action = link.spawn_action()
pid = os.posix_spawn("/bin/sh", ["sh", "-c", "readlink /proc/$$/fd/3"], {}, file_actions=[action])
link.serve()
print(action[1], os.waitpid(pid, 0)[1])
link.close()
"""


def test_an_agent_end_that_is_already_fd_3_still_reaches_the_agent() -> None:
    """``dup2`` of a descriptor onto itself would leave it close-on-exec (before POSIX 2024)."""
    done = run_python(LINK_ON_FD_3)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0].startswith("socket:[")  # the agent's fd 3
    assert int(lines[1]) != STORE_FD
    assert lines[2] == "0"
