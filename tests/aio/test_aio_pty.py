"""AsyncSupervisor with a pseudo-terminal (docs/design.md §17, §20): ``start(..., pty=True)``,
``handle.send`` journalled once per command id, ``handle.resize``, and ``handle.output()``
yielding the terminal's one merged stream -- with real children, under asyncio and trio."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import aclosing

import anyio
import psutil
import pytest

from _shared import Processes
from procledger import InputRefused, LeaseOwner, ProcessRegistry
from procledger.adapters.output_files import Chunk
from procledger.aio import AsyncProcessHandle, AsyncSupervisor

pytestmark = pytest.mark.anyio

TIMEOUT_S = 30
REPL = ["python3", "-q", "-i"]


class Screen:
    """What a handle's ``output()`` has yielded so far, read on until a pattern shows."""

    def __init__(self, chunks: AsyncIterator[Chunk]) -> None:
        self._chunks = chunks
        self.seen = bytearray()
        self.streams: set[str] = set()

    async def until(self, pattern: bytes) -> None:
        start = len(self.seen)
        with anyio.fail_after(TIMEOUT_S):
            while pattern not in self.seen[max(0, start - len(pattern)) :]:
                chunk = await self._chunks.__anext__()
                self.seen += chunk.data
                self.streams.add(chunk.stream)


async def child_of(handle: AsyncProcessHandle, procs: Processes) -> psutil.Process:
    record = await handle.record()
    assert record.os is not None
    return procs.add(record.os.pid)


async def sent_events(registry: ProcessRegistry, handle: AsyncProcessHandle) -> list[dict]:
    events = await anyio.to_thread.run_sync(registry.events, handle.process_id)
    return [dict(event.payload) for event in events if event.kind == "input_sent"]


async def test_a_repl_answers_what_is_sent(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(REPL, pty=True)
        await child_of(handle, procs)
        async with aclosing(handle.output()) as output:
            screen = Screen(output)
            await screen.until(b">>> ")
            assert await handle.send("print(6*7)\n") is True
            await screen.until(b"\r\n42\r\n")
            assert await handle.send(b"", eof=True) is True  # Ctrl-D: the REPL ends
            record = await handle.wait()
            rest = [chunk async for chunk in output]  # following ends once it has ended
    assert b"".join(c.data for c in rest).strip() in (b"", b">>>")
    assert (record.state, record.exit_code, record.pty) == ("exited", 0, True)
    assert screen.streams == {"stdout"}  # one merged stream, kept as stdout
    sent = await sent_events(registry, handle)
    assert [(s["size"], s["eof"], s["redacted"]) for s in sent] == [
        (11, False, False),
        (0, True, False),
    ]
    assert base64.b64decode(sent[0]["data"]) == b"print(6*7)\n"


async def test_a_send_retried_with_its_command_id_is_applied_once(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(REPL, pty=True)
        await child_of(handle, procs)
        async with aclosing(handle.output()) as output:
            screen = Screen(output)
            await screen.until(b">>> ")
            first = await handle.send("print(6*7)\n", command_id="answer-1")
            again = await handle.send("print(6*7)\n", command_id="answer-1")
            assert (first, again) == (True, False)
            await handle.send("print('done')\n", command_id="done-1")
            await screen.until(b"\r\ndone\r\n")
        assert screen.seen.count(b"\r\n42\r\n") == 1  # printed once
        sent = await sent_events(registry, handle)
        assert [s["command_id"] for s in sent] == ["answer-1", "done-1"]
        await handle.stop("kill", 0)


async def test_a_password_sent_while_echo_is_off_is_redacted(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    script = 'read -s -p "Password: " p; echo; echo "got ${#p}"'
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(["bash", "-c", script], pty=True)
        await child_of(handle, procs)
        terminal = sup.supervisor.terminal(handle.sync)
        assert terminal is not None
        async with aclosing(handle.output()) as output:
            screen = Screen(output)
            await screen.until(b"Password: ")
            with anyio.fail_after(TIMEOUT_S):  # bash turns echo off around its prompt
                while not terminal.hides_input():
                    await anyio.sleep(0.01)
            assert await handle.send("hunter2\n", command_id="secret-1") is True
            await screen.until(b"got 7")
        record = await handle.wait()
    assert record.state == "exited"
    assert b"hunter2" not in screen.seen  # the terminal did not echo it
    (sent,) = await sent_events(registry, handle)
    assert (sent["data"], sent["redacted"], sent["size"]) == (None, True, 8)


RESIZE = """
import os, signal
def show(*_):
    size = os.get_terminal_size(0)
    print(f"size {size.lines}x{size.columns}", flush=True)
signal.signal(signal.SIGWINCH, show)
show()
while True:
    signal.pause()
"""


async def test_resize_reaches_the_child_and_needs_a_terminal(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(["python3", "-c", RESIZE], pty=True)
        await child_of(handle, procs)
        async with aclosing(handle.output()) as output:
            screen = Screen(output)
            await screen.until(b"size 24x80")
            await handle.resize(40, 100)
            await screen.until(b"size 40x100")
        with pytest.raises(ValueError, match="rows"):
            await handle.resize(0, 100)
        piped = await sup.start(["sleep", "60"])
        await child_of(piped, procs)
        with pytest.raises(InputRefused, match=piped.process_id):
            await piped.resize(40, 100)
        with pytest.raises(InputRefused, match=piped.process_id):
            await piped.send("x")
        await handle.stop("kill", 0)
        await piped.stop("kill", 0)
    with pytest.raises(InputRefused, match=handle.process_id):
        await handle.resize(40, 100)  # it has ended
