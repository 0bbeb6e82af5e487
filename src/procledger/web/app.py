"""The web view's application and the server that runs it (docs/design.md §16).

``create_app`` composes the routes behind the token gate; the registry is opened when the
server starts (its lifespan) and closed when it stops, and one ``FeedHub`` polls the change
feed for every stream. ``serve`` binds the socket first -- so the URL it prints is already
accepting connections -- and runs uvicorn on it until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from procledger.application.bootstrap import mask_url
from procledger.domain.errors import NotFound, ProcledgerError, StoreError
from procledger.web import api, metrics, pages, streams
from procledger.web.actions import Actions, BadAction
from procledger.web.auth import Keys, TokenGate
from procledger.web.hub import FeedHub
from procledger.web.views import QueryError

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry


class LoopbackOnly(ValueError):
    """A non-loopback address without an explicit token: refused before anything binds."""


def create_app(url: str | None, token: str, registry: ProcessRegistry | None = None) -> Any:
    """The ASGI app for the ledger at ``url`` (``None``: the default ledger), behind
    ``token``; ``registry``, if given, is that ledger opened already (the app closes it)."""
    app = Starlette(routes=_routes(), lifespan=_lifespan(url, registry))
    app.state.ledger_name = mask_url(url) if url else "the default ledger"  # no password shown
    for kind in (NotFound, ProcledgerError, QueryError, BadAction, HTTPException, ValueError):
        app.add_exception_handler(kind, _failure)
    return TokenGate(app, Keys(token))


def _routes() -> list[Any]:
    static = StaticFiles(directory=Path(__file__).with_name("static"))
    return [
        Route("/", pages.processes),
        Route("/timeline", pages.timeline),
        Route("/processes/{pid}", pages.process),
        Route("/processes/{pid}/stop", pages.stop, methods=["POST"]),
        Route("/processes/{pid}/abandon", pages.abandon, methods=["POST"]),
        Route("/processes/{pid}/output/stream", _output_stream),
        Route("/stream/changes", streams.changes),
        Route("/api/processes", api.processes),
        Route("/api/feed", api.feed),
        Route("/api/timeline", api.timeline),
        Route("/api/processes/{pid}", api.process),
        Route("/api/processes/{pid}/output", api.output),
        Route("/api/processes/{pid}/stop", api.stop, methods=["POST"]),
        Route("/api/processes/{pid}/abandon", api.abandon, methods=["POST"]),
        Route("/metrics", metrics.metrics),
        Mount("/static", static),
    ]


async def _output_stream(request: Request) -> Response:
    from anyio import to_thread

    registry = request.app.state.registry
    found = await to_thread.run_sync(registry.resolve_process_id, request.path_params["pid"])
    return streams.output(request, found)


def _lifespan(url: str | None, opened: ProcessRegistry | None) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from procledger import open_registry

        registry: ProcessRegistry = opened if opened is not None else open_registry(url)
        app.state.registry = registry
        app.state.actions = Actions(registry)
        app.state.hub = hub = FeedHub(registry)
        poller = asyncio.create_task(hub.run())
        try:
            yield
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            registry.close()

    return lifespan


async def _failure(request: Request, exc: Exception) -> Response:
    """An error as a status: 404 for an unknown process, 400 for a bad parameter, 409 for a
    refused action, 503 when the store fails; JSON under ``/api/``, else a page."""
    status, message = _status(exc)
    if request.url.path.startswith("/api/"):
        document = {"error": type(exc).__name__, "message": message}
        if isinstance(exc, BadAction) and exc.field:  # which field of the body was at fault
            document["field"] = exc.field
        return JSONResponse(document, status)
    if not hasattr(request.state, "csrf"):
        return PlainTextResponse(message, status)
    return pages.html(request, "error.html", status, status=status, message=message)


def _status(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, HTTPException):
        return exc.status_code, str(exc.detail)
    if isinstance(exc, NotFound):
        return 404, str(exc)
    if isinstance(exc, StoreError):
        return 503, f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ProcledgerError):
        return 409, f"{type(exc).__name__}: {exc}"
    return 400, str(exc)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class CannotListen(ProcledgerError):
    """The address or port cannot be listened on (no such address here, a port in use)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (reusable address: a restarted server gets its port back).

    Raises:
        CannotListen: naming the address and port, and why.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        why = error.strerror or str(error)
        raise CannotListen(f"cannot listen on {host} port {port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def serve(
    url: str | None, host: str, port: int, token: str | None, out: TextIO = sys.stdout
) -> None:
    """Run the web view until stopped. Without ``token`` a random one is made and printed in
    the URL; a non-loopback ``host`` needs an explicit token (``LoopbackOnly``) and is warned
    about on stderr. The ledger is opened before anything is printed or bound.

    Raises:
        LoopbackOnly: a non-loopback ``host`` without ``token``.
        CannotListen: ``host`` and ``port`` cannot be listened on.
        StoreError: the ledger cannot be opened (as ``open_registry``).
    """
    import uvicorn

    from procledger import open_registry
    from procledger.web.auth import new_token

    loopback = is_loopback(host)
    if not loopback and token is None:
        raise LoopbackOnly(f"serving on {host} (not loopback) needs an explicit --token")
    token = token or new_token()
    registry = open_registry(url)  # a ledger that cannot be opened is one error line, not a URL
    try:
        sock = bind(host, port)
    except BaseException:
        registry.close()
        raise
    if not loopback:
        sys.stderr.write(
            f"procledger serve: warning: {host} is reachable from other machines; "
            "anyone with the token can stop processes\n"
        )
    where = f"[{host}]" if ":" in host else host
    out.write(f"procledger serve: http://{where}:{sock.getsockname()[1]}/?token={token}\n")
    out.flush()
    app = create_app(url, token, registry)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    quiet_server(config).run(sockets=[sock])


def quiet_server(config: Any) -> Any:
    """A uvicorn server that sleeps while idle: uvicorn's own loop wakes ten times a second to
    see whether a signal asked it to stop, which alone cost serve ~0.2 % of a core. This one
    wakes once a second (the ``Date`` header's resolution) and at once when a signal comes
    (docs/design.md §16.2)."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        _exit_news: asyncio.Event | None = None
        _loop: asyncio.AbstractEventLoop

        async def main_loop(self) -> None:
            loop, news = asyncio.get_running_loop(), asyncio.Event()
            self._exit_news, self._loop = news, loop
            ticks = 0
            while not await self.on_tick(ticks):  # a multiple of 10: the date is renewed
                ticks = (ticks + 10) % 864_000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(news.wait(), 1.0)

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if self._exit_news is not None:
                self._loop.call_soon_threadsafe(self._exit_news.set)

    return QuietServer(config)
