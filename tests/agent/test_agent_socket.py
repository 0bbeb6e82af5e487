"""The live agent's socket (docs/design.md §18.3, issue 28): private (folder ``0700``, socket
``0600``, another uid kept out by the folder and, past it, by the peer check), and no request
stops it -- random bytes, oversized lines, wrong types, unknown ops, orders with bad fields
each get an error reply or a closed connection, and the agent then still answers ``ping`` and
still starts a process. The socket server alone is fuzzed in ``test_control_socket.py``; here
the agent's own handlers are, with the ledger behind them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _shared import Processes, as_nobody, is_dead, wait_until
from procledger import ProcessState
from procledger.agent.control_client import START_REQUEST_BYTES
from procledger.agent.launch import ping

from .live_agent import DEADLINE, LiveAgent, sleeper
from .socket_server import exchange

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_PEERCRED is Linux's")

NO_PROGRAM = "/no/such/program"
"""The only program a fuzzed ``start`` may name: every order that passes is a spawn error."""


def start_order(process_id: str = "fuzzed", **fields: Any) -> dict[str, Any]:
    return {"op": "start", "argv": [NO_PROGRAM], "process_id": process_id, "cwd": "/",
            "env": {"PATH": "/usr/bin"}, **fields}  # fmt: skip


def replies(raw: bytes) -> list[dict[str, Any]]:
    """Each reply line, checked to be a well-formed reply."""
    found = []
    for line in raw.splitlines():
        reply = json.loads(line)
        assert isinstance(reply, dict), reply
        assert isinstance(reply["ok"], bool), reply
        if reply["ok"]:
            assert set(reply) == {"ok", "result"}, reply
        else:
            assert set(reply["error"]) == {"type", "message"}, reply
        found.append(reply)
    return found


def send(agent: LiveAgent, payload: bytes) -> list[dict[str, Any]]:
    return replies(exchange(agent.places.socket, payload))


def line(doc: Any) -> bytes:
    return json.dumps(doc).encode() + b"\n"


def still_serves(agent: LiveAgent, pid: int) -> None:
    (reply,) = send(agent, line({"op": "ping"}))
    assert reply["ok"]
    assert reply["result"]["pid"] == pid


@pytest.fixture
def agent(tmp_path: Path, procs: Processes) -> LiveAgent:
    return LiveAgent(f"sqlite:///{tmp_path}/ledger.db")


# -- private ------------------------------------------------------------------------------


def test_the_socket_is_0600_in_a_0700_folder_of_ours(agent: LiveAgent) -> None:
    agent.start()
    folder = Path(agent.places.socket_folder)
    for path in (folder, folder.parent):
        info = os.lstat(path)
        assert stat.S_ISDIR(info.st_mode), path
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o700, os.geteuid()), path
    info = os.lstat(agent.places.socket)
    assert stat.S_ISSOCK(info.st_mode)
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, os.geteuid())


def _as_nobody(path: str) -> str:
    """What a client of uid 65534 gets from ``path`` (a forked child; bounded by its socket
    timeout, waited for by its pid): the reply line, or ``connect failed: <error>``."""

    def ask(write_end: int) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            try:
                sock.connect(path)
                with contextlib.suppress(OSError):
                    sock.sendall(line({"op": "status"}))
                said = sock.recv(65536)
            except OSError as error:
                said = f"connect failed: {type(error).__name__}".encode()
        os.write(write_end, said)

    with as_nobody(ask) as read_end, os.fdopen(read_end, "rb") as pipe:
        heard = pipe.read().decode()
    return heard.strip()


@pytest.fixture
def open_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A runtime dir another uid may traverse (pytest's own folders are ``0700``), short
    enough for ``sun_path``; removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="pl-", dir="/tmp"))
    path.chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="a client of another uid needs root")
def test_another_uid_is_kept_out_by_the_folder_and_then_by_the_peer_check(
    open_runtime_dir: Path, tmp_path: Path, procs: Processes
) -> None:
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    status = agent.start()
    folder = Path(agent.places.socket_folder)
    assert folder.parent.parent == open_runtime_dir
    assert _as_nobody(agent.places.socket) == "connect failed: PermissionError"
    for path in (folder.parent, folder):
        path.chmod(0o777)
    os.chmod(agent.places.socket, 0o666)  # only SO_PEERCRED stands in the way now
    reply = json.loads(_as_nobody(agent.places.socket))
    assert reply == {
        "ok": False,
        "error": {"type": "PermissionDenied", "message": "uid 65534 may not use this agent"},
    }
    still_serves(agent, status["pid"])


# -- no request stops it ------------------------------------------------------------------

BAD = [
    (b"\xff\xfe{}\n", "BadUtf8"),
    (b"{nope\n", "BadJson"),
    (b'{"op":' * 5000 + b"\n", "BadJson"),
    (b"[1, 2]\n", "NotAnObject"),
    (b"null\n", "NotAnObject"),
    (line({"op": "explode"}), "UnknownOp"),
    (line({"op": 5}), "UnknownOp"),
    (line({}), "UnknownOp"),
    (line(start_order(argv="sleep 60")), "OrderError"),
    (line(start_order(argv=[])), "OrderError"),
    (line(start_order(argv=["sleep", 60])), "OrderError"),
    (line(start_order(process_id="")), "OrderError"),
    (line(start_order(process_id="x" * 201)), "OrderError"),
    (line(start_order(env=["PATH=/usr/bin"])), "OrderError"),
    (line(start_order(stop_signal=0)), "OrderError"),
    (line(start_order(grace_s=-1)), "OrderError"),
    (line(start_order(output_limit=-1)), "OrderError"),
    (line(start_order(restart="always")), "OrderError"),
    (line(start_order(ready=7)), "OrderError"),
    (line(start_order(detach=True)), "OrderError"),
    (line({k: v for k, v in start_order().items() if k != "cwd"}), "OrderError"),
    (line({"op": "stop"}), "OrderError"),
    (line({"op": "stop", "process_id": 7}), "OrderError"),
    (line({"op": "shutdown", "stop_children": "maybe"}), "OrderError"),
    (line({"op": "shutdown", "now": True}), "OrderError"),
]  # fmt: skip


def test_each_bad_request_gets_an_error_reply_and_the_agent_goes_on(
    agent: LiveAgent, procs: Processes, tmp_path: Path
) -> None:
    pid = agent.start()["pid"]
    for payload, kind in BAD:
        got = send(agent, payload)
        assert [(r["ok"], r["error"]["type"]) for r in got] == [(False, kind)], (payload[:80], got)
        still_serves(agent, pid)

    oversized = b'{"op": "ping", "pad": "' + b"x" * START_REQUEST_BYTES + b'"}\n'
    got = send(agent, oversized)
    assert [(r["ok"], r["error"]["type"]) for r in got] == [(False, "RequestTooLarge")]
    assert send(agent, b'{"op": "ping"') == []  # half a line, then the end: closed unanswered
    (spawn,) = send(agent, line(start_order("cannot-spawn")))
    assert spawn["ok"], spawn
    assert spawn["result"]["spawn_error"]["errno"] == 2, spawn
    assert agent.record("cannot-spawn").state is ProcessState.failed
    still_serves(agent, pid)
    starts_and_stops_a_process(agent, procs)


def starts_and_stops_a_process(agent: LiveAgent, procs: Processes) -> None:
    pidfile = procs.pidfile("after-the-fuzz")
    ran = agent.run_background(*sleeper(pidfile))
    assert ran.returncode == 0, ran.stderr
    child = procs.await_pid(pidfile)
    process_id = ran.stdout.strip()
    assert agent.record(process_id).state is ProcessState.running
    assert agent.cli("stop", process_id).returncode == 0
    assert agent.await_terminal(process_id).state is ProcessState.interrupted
    wait_until(lambda: is_dead(child), DEADLINE, "the child to be gone")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)
not_a_policy = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
"""A ``ready`` or ``restart`` that is never a valid policy (a valid ``restart`` would keep
restarting the program that cannot be spawned)."""
not_an_argv: st.SearchStrategy[Any] = (
    st.none() | st.booleans() | st.integers() | st.text(max_size=10) | st.just([])
    | st.lists(st.none() | st.integers() | st.booleans(), min_size=1, max_size=3)
)  # fmt: skip
"""An ``argv`` that is never a list of strings: a fuzzed order never runs a program."""
OTHER_FIELDS = [
    "process_id",
    "cwd",
    "env",
    "stdin",
    "capture",
    "output_limit",
    "stop_signal",
    "grace_s",
    "op",
]
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "argv": not_an_argv,
    "ready": not_a_policy,
    "restart": not_a_policy,
    **dict.fromkeys(OTHER_FIELDS, json_values),
}


@st.composite
def bad_orders(draw: Callable[..., Any]) -> bytes:
    """A ``start`` or ``stop`` order with fields replaced, removed or added."""
    order = draw(st.sampled_from([start_order(), {"op": "stop", "process_id": "fuzzed"}]))
    order = dict(order)
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=3)):
        order[name] = draw(FIELDS[name])
    for name in draw(st.lists(st.sampled_from(sorted(order)), max_size=2)):
        order.pop(name, None)
    if order.get("op") == "shutdown" or ("op" not in order and draw(st.booleans())):
        order["op"] = "start"
    order.update(draw(st.dictionaries(st.sampled_from(["x", "detach", "uid"]), json_values,
                                      max_size=1)))  # fmt: skip
    return line(order)


HOSTILE = st.one_of(
    st.binary(max_size=300).map(lambda b: b + b"\n"),
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")),
    json_values.map(line),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"\n"),
    bad_orders(),
)


_FUZZED: dict[int, int] = {}
"""The pid of the agent each fuzz run started (by its ``agent`` fixture's id): an agent the
fuzz crashed would be started again by its anchor, and must not pass for the same one."""


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=HOSTILE)
def test_no_request_stops_the_live_agent(
    agent: LiveAgent, procs: Processes, payload: bytes
) -> None:
    if id(agent) not in _FUZZED:  # hypothesis runs every example with the same fixtures
        _FUZZED.clear()
        _FUZZED[id(agent)] = agent.start()["pid"]
    started = _FUZZED[id(agent)]
    for reply in send(agent, payload):
        if reply["ok"]:  # only a start of the program that is not there, or a stop look
            assert set(reply["result"]) in ({"spawn_error"}, {"looking"}), reply
    still_serves(agent, started)


def test_after_a_fuzz_the_agent_still_starts_a_process(agent: LiveAgent, procs: Processes) -> None:
    pid = agent.start()["pid"]
    for payload in [b"\xff" * 100 + b"\n", b"{" * 4000 + b"\n", line([1]), *(p for p, _ in BAD)]:
        send(agent, payload)
    still_serves(agent, pid)
    starts_and_stops_a_process(agent, procs)


def _accept_and_close(listener: socket.socket) -> None:
    connection, _ = listener.accept()
    connection.close()


def test_a_socket_that_accepts_and_closes_unanswered_is_no_agent(tmp_path: Path) -> None:
    # What a client meets when it connects as the agent dies (a SIGKILL, or `agent stop`
    # closing its socket) with the connection in the backlog: `ping` says none runs, so that
    # `agent stop` waiting for it to go, and `run --background` finding the anchor's next
    # agent, carry on instead of failing with ConnectionClosed.
    places = LiveAgent(f"sqlite:///{tmp_path}/ledger.db").places
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dying:
        dying.bind(places.socket)
        dying.listen()
        closer = threading.Thread(target=_accept_and_close, args=(dying,))
        closer.start()
        try:
            assert ping(places, timeout=5.0) is None
        finally:
            closer.join(10)
    os.unlink(places.socket)
