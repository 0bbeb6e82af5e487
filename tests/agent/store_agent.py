"""A stand-in for the agent that uses the anchor's descriptor store (``test_fd_store.py``).

``store_agent.py MARKER ADDRESS``

Each start appends ``start <pid> <monotonic time>`` to MARKER (as ``fake_agent.py`` does, so
``AnchorRun`` counts and cleans up its starts), opens the store (``FdStore.from_environment``),
takes what the anchor holds, and then answers the test's commands on the abstract Unix socket
``\\0ADDRESS``: one JSON line in, one JSON line out, one connection each. Every reply carries
the agent's ``pid``, so the test knows which agent answered. Commands (``cmd``):

- ``held``: whether a store was given, and each key taken with its descriptor's identity;
- ``pty`` (``key``, ``out``, ``pidfile``, ``hupfile``): a child on a new pseudo-terminal, in a
  session of its own whose controlling terminal it is; it appends each line it reads to
  ``out``, answers ``got: LINE`` on the terminal, and writes ``hupfile`` once its terminal hung
  up with SIGHUP. The master is kept in the store and here;
- ``write`` (``key``, ``text``) and ``read`` (``key``, ``until``): the terminal's master;
- ``keep_pipe`` (``key``): a new pipe's read end kept, its identity returned;
- ``drop`` (``key``); ``raw`` (``data`` in Latin-1, ``fds``): bytes and that many descriptors
  of ``/dev/null`` sent as one message on the store's socket, the reply returned as text.

SIGTERM ends it (the default action).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from typing import Any

from procledger.agent.anchor import STORE_VARIABLE, receive_message
from procledger.agent.fd_store import FdStore, FdStoreError

PTY_CHILD = """
import fcntl, os, signal, sys, termios
out, pidfile, hupfile = sys.argv[1:]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})  # taken below, when stdin ends
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
with open(pidfile + ".tmp", "w") as file:
    file.write(str(os.getpid()))
os.rename(pidfile + ".tmp", pidfile)
try:
    for line in sys.stdin:
        with open(out, "a") as file:
            file.write(line)
        sys.stdout.write("got: " + line)
        sys.stdout.flush()
except OSError:
    pass  # EIO: the terminal hung up
if signal.sigtimedwait({signal.SIGHUP}, 60) is None:
    sys.exit(1)
with open(hupfile, "w") as file:
    file.write("SIGHUP")
sys.exit(129)
"""
"""The child on the terminal. SIGHUP is blocked and taken once its terminal is gone (a read
fails): a handler could run after the last check before ``pause`` and never be seen."""


def identity(fd: int) -> str:
    status = os.fstat(fd)
    return f"{status.st_dev}:{status.st_ino}"


class StoreAgent:
    def __init__(self) -> None:
        given = os.environ.get(STORE_VARIABLE)
        self.raw = None if given is None else socket.socket(fileno=os.dup(int(given)))
        if self.raw is not None:
            self.raw.settimeout(20)  # the store's timeouts make the shared socket non-blocking
        self.store = FdStore.from_environment()
        self.held: dict[str, int] = {} if self.store is None else self.store.take_all()

    def run(self, command: dict[str, Any]) -> dict[str, Any]:
        handler = getattr(self, f"do_{command['cmd']}")
        try:
            result: dict[str, Any] = handler(command)
        except FdStoreError as error:
            result = {"error": str(error)}
        return {"pid": os.getpid(), **result}

    def do_held(self, command: dict[str, Any]) -> dict[str, Any]:
        keys = {key: identity(fd) for key, fd in self.held.items()}
        return {"store": self.store is not None, "keys": keys}

    def do_pty(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.store is not None
        master, slave = os.openpty()
        args = [command["out"], command["pidfile"], command["hupfile"]]
        child = subprocess.Popen(
            [sys.executable, "-c", PTY_CHILD, *args],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.store.keep(command["key"], master)
        self.held[command["key"]] = master
        return {"child": child.pid, "master": identity(master)}

    def do_write(self, command: dict[str, Any]) -> dict[str, Any]:
        os.write(self.held[command["key"]], command["text"].encode())
        return {}

    def do_read(self, command: dict[str, Any]) -> dict[str, Any]:
        fd, text, deadline = self.held[command["key"]], b"", time.monotonic() + 20
        while command["until"].encode() not in text and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                text += os.read(fd, 4096)
        return {"text": text.decode(errors="replace")}

    def do_keep_pipe(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.store is not None
        read_end, write_end = os.pipe()
        try:
            self.store.keep(command["key"], read_end)
            return {"pipe": identity(read_end)}
        finally:
            os.close(read_end)
            os.close(write_end)

    def do_drop(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.store is not None
        self.store.drop(command["key"])
        if command["key"] in self.held:
            os.close(self.held.pop(command["key"]))
        return {}

    def do_raw(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.raw is not None
        fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range(command["fds"])]
        try:
            socket.send_fds(self.raw, [command["data"].encode("latin-1")], fds)
        finally:
            for fd in fds:
                os.close(fd)
        data, received, _ = receive_message(self.raw, 1)
        for fd in received:
            os.close(fd)
        return {"reply": data.decode()}


def serve(agent: StoreAgent, address: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind("\0" + address)
        listener.listen()
        while True:
            connection, _ = listener.accept()
            with connection, connection.makefile("rw") as stream:
                reply = agent.run(json.loads(stream.readline()))
                stream.write(json.dumps(reply) + "\n")


def main() -> int:
    marker, address = sys.argv[1:3]
    with open(marker, "a") as file:
        file.write(f"start {os.getpid()} {time.monotonic()!r}\n")
    serve(StoreAgent(), address)
    return 0


if __name__ == "__main__":
    sys.exit(main())
