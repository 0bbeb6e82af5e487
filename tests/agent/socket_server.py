"""A ``ControlServer`` on an event loop of its own thread, so that a test can talk to it with
the blocking client as the CLI will: started and stopped by the ``control_server`` fixture."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from procledger.agent.control_socket import ControlServer, Handler


class ServerThread:
    """One server, one loop, one thread; ``stop`` closes the server and cancels what is left
    (a handler that hangs on purpose), so the thread always ends."""

    def __init__(self, folder: str, handlers: Mapping[str, Handler] | None, **options: Any) -> None:
        self.server = ControlServer(folder, handlers, **options)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def path(self) -> str:
        return self.server.path

    def start(self) -> ServerThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def call(self, coro: Any) -> Any:
        """Run ``coro`` on the server's loop and wait for it (bounded)."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(10)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.call(self.server.close())
        self.call(_cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        assert not self._thread.is_alive()
        self.loop.close()


async def _cancel_the_rest() -> None:
    me = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not me]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


def exchange(path: str, payload: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection, end the sending side, read everything until the
    server closes: what a hostile client sees."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first (an oversize line): its reply is still readable
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
