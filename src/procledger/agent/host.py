"""The host agent: one process that supervises every background process of one ledger on this
host (docs/design.md §18).

It is the async supervisor of §17 (``AsyncSupervisor``: one event loop, no thread per child)
run in ``output_files`` mode, so that no child holds a pipe to it, plus what a long-lived host
process needs around it:

- a **takeover** on start (``takeover``): the outbox, the anchor's exit journal, then adoption of
  every child an earlier agent left running (``held``: pidfd + journal);
- the **control socket** (``control_socket``): ``start`` (``run --background``), ``stop`` (look
  for a stop request just recorded), ``status``, ``shutdown``;
- one **follower** (``direct_output.Follower``, one inotify descriptor for every file) that keeps
  each run's output files within their bound and feeds output readiness probes;
- **wake-ups** instead of polls where it can: a `stop` on this host tells the socket; on
  PostgreSQL, a ``LISTEN`` connection tells of a request made from another host.

The ledger stays the truth: every fact the agent learns is written there as a ``Supervisor``
writes it. The agent's death costs no child anything: its children write to files, the anchor
journals their exits, and the next agent adopts them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import resource
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from procledger.adapters.direct_output import Follower, stream_paths
from procledger.adapters.input_waits import Waiting
from procledger.adapters.output_files import folder_for, output_root
from procledger.adapters.proc_facts import host_id
from procledger.agent.anchor import CANNOT_SERVE
from procledger.agent.bring_back import returns
from procledger.agent.control_client import START_REQUEST_BYTES
from procledger.agent.control_socket import ControlServer
from procledger.agent.fd_store import FdStore
from procledger.agent.held import (
    JOURNAL_WAIT_S,
    ExitWatch,
    HeldRun,
    Holder,
    anchor_alive,
    unknown_status,
)
from procledger.agent.launch import ALREADY_SERVED, ledger_key
from procledger.agent.orders import (
    KeysOrder,
    OrderError,
    ReadOrder,
    ResourcesOrder,
    SendOrder,
    ShutdownOrder,
    StartOrder,
    StopOrder,
    checked,
)
from procledger.agent.places import AgentPlaces
from procledger.agent.resources import ResourceSampler, interval_s
from procledger.agent.sessions import PTY_KEY, STDIN_KEY, Session, Sessions
from procledger.agent.takeover import Takeover, TakeoverReport
from procledger.aio.supervisor import AsyncProcessHandle, AsyncSupervisor
from procledger.application.bootstrap import open_registry
from procledger.application.document_reads import LedgerReads
from procledger.application.outbox import store_key
from procledger.domain.errors import (
    AgentSocketError,
    NameTaken,
    OptionError,
    ProcledgerError,
    SpawnError,
    StoreUnavailable,
)
from procledger.domain.leases import LeaseOwner, LeaseTimings
from procledger.domain.notification import ProcessInputNotification
from procledger.domain.records import ResourceUse
from procledger.notifications.notifier import Notifier
from procledger.supervisor.control import host_owner, owner_session
from procledger.supervisor.execution import StopPolicy
from procledger.supervisor.file_capture import FileCapture
from procledger.supervisor.input import PipeInput
from procledger.supervisor.minting import new_process_id
from procledger.supervisor.publishing import Publisher
from procledger.supervisor.terminal import TerminalSize
from procledger.supervisor.terminals import TerminalWriter
from procledger.supervisor.ticker import STOP_POLL_S

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

CACHED_RUNS: Final = 64
"""Runs whose state and registration the agent's registry keeps cached: it writes each of a
thousand runs twice in its life, so a cache entry per run (~12 KiB) would cost more memory
than its reuse saves time (``ProcessRegistry.keep_less``)."""

REPLY_GRACE_S: Final = 0.05
BRING_BACK_READY_S: Final = 120.0
"""How long a service brought back after a takeover waits for a dependency to be ready (then
it starts anyway, and says so in the log: ``up`` is where a person sees such a failure)."""
"""How long a ``shutdown`` waits before it begins: its reply must leave first."""

WAIT_NOTICES: Final = uuid.UUID("6f1d8c1e-3b0a-4f63-9a51-5f2d7e0c9b14")
"""The namespace of a wait's notification command id (uuid5 of the process and the wait)."""

__all__ = ["AGENT_ROLE", "AGENT_TIMINGS", "AgentHost"]

log = logging.getLogger("procledger.agent")

AGENT_ROLE: Final = "procledger-agent"
"""The agent's owner id is ``procledger-agent@<host id>``: every agent of this host has it, so
the next one knows which leases an earlier one held."""

AGENT_TIMINGS: Final = LeaseTimings(ttl_ms=1_200_000, renew_ms=400_000)
"""The agent's leases last 20 minutes, renewed every 400 s. Its children outlive it, so a lease
need not lapse soon for another holder to take over: on this host a dead agent is provably dead
at once, and its successor takes over within a second. Only another host waits out the ttl, for
a host that died whole. A thousand children then cost 2.5 renewals a second (~0.25% of a core
here), not a hundred."""


class AgentHost:
    """The agent for ``registry`` (one per user, host and ledger: the socket's lock says so)."""

    def __init__(self, registry: ProcessRegistry, places: AgentPlaces) -> None:
        self.registry, self.places = registry, places
        self.owner: LeaseOwner = host_owner(AGENT_ROLE)
        self.anchor_pid = os.getppid() if os.environ.get("PROCLEDGER_EXIT_JOURNAL") else None
        self._stopping = asyncio.Event()
        self._stop_children = False
        self._follower = Follower()
        self._files: dict[Path, FileCapture] = {}
        self._held: dict[int, HeldRun] = {}  # by pidfd
        self._poked = asyncio.Event()
        self._ready = asyncio.Event()  # the takeover is done: orders may be carried out
        self._ending: set[asyncio.Future[None]] = set()
        self._started = time.monotonic()
        self._report = TakeoverReport()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._notifier, self._loop_id = _cli_notifier(registry)
        self._writer = TerminalWriter(registry, self.owner, AGENT_TIMINGS, None, None)
        self._publisher = Publisher(registry, self._notifier)
        exits = ExitWatch(places.journal)
        self._holder = Holder(registry, self._writer, self._publisher, exits)
        key = store_key(registry.location) or ""
        self._reads = LedgerReads(
            registry.run_read, store_key=key, close=_nothing, registry=registry
        )
        self._store = FdStore.from_environment()
        self.sessions = Sessions(registry, self._store, told=self._tell_waiting)
        self._sampler = ResourceSampler()

    # -- the whole life ---------------------------------------------------------------------

    async def serve(self) -> int:
        """Take over, serve until told to stop, then leave the children running (or stop them,
        as ``agent stop --stop-children`` asked). The exit status: 0."""
        self._loop = asyncio.get_running_loop()
        _raise_open_files_limit()
        supervisor = AsyncSupervisor(
            self.registry,
            owner=self.owner,
            on_exit="leave",
            notifier=self._notifier,
            timings=AGENT_TIMINGS,
            output_files=True,
            on_files=self._files_from_thread,
            on_reaped=self._sampler.reaped,
        )
        server = ControlServer(
            self.places.socket_folder, self._handlers(), max_request_bytes=START_REQUEST_BYTES
        )
        async with server, supervisor:  # the socket's lock first: one agent per ledger
            self._supervisor = supervisor
            self._watch_signals()
            await self._take_over(supervisor)
            self._ready.set()
            # once the socket's lock says this agent is the one
            serve_metrics(self.registry, self._sampler)
            bringing = asyncio.ensure_future(self._bring_back())
            self._loop.add_reader(self._follower.fileno(), self._on_output)
            ticking = asyncio.ensure_future(self._tick_held())
            watching = asyncio.ensure_future(self.sessions.watch_waits())
            sampling = asyncio.ensure_future(self._sample_resources(interval_s()))
            listening = self._listen()
            log.info("serving %s on %s", self.places.key, server.path)
            await self._stopping.wait()
            ticking.cancel()
            watching.cancel()
            sampling.cancel()
            bringing.cancel()
            if listening is not None:
                listening.close()
            await server.close()
            if not self._stop_children:
                log.info("stopped; children left running for the next agent")
                logging.shutdown()
                os._exit(0)  # nothing of ours to tidy: the children hold no pipe to us
            supervisor.on_exit = "stop"
            await self._stop_held()
        log.info("stopped, with the children stopped and recorded")
        return 0

    async def _take_over(self, supervisor: AsyncSupervisor) -> None:
        takeover = Takeover(
            self.registry,
            self.owner,
            AGENT_TIMINGS,
            (self._writer, self._publisher, self._holder),
            self._folder_of,
        )
        anchor_gone = not anchor_alive(self.anchor_pid)
        run = functools.partial(takeover.run, anchor_gone=anchor_gone)
        self._report = await supervisor.run_sync(run)
        handed = await asyncio.to_thread(self._store.take_all) if self._store else {}
        for held in self._report.held:
            self._hold(held)
            assert held.child is not None
            self.sessions.adopt(
                held.process_id, held.child.pid, handed, self._stdout_of(held.process_id)
            )
        self.sessions.forget_unheld(handed)
        report = self._report
        log.info(
            "took over in %.3f s: %d outcomes delivered, %d exits journaled, %d held, %d lost",
            report.seconds, report.delivered, report.journaled, len(report.held), report.lost,
        )  # fmt: skip

    async def _bring_back(self) -> None:
        """Start again what ``up`` left desired here and ended while no agent could restart
        it (``bring_back``), each service's dependencies ready first."""
        found = await asyncio.to_thread(returns, self.registry, host_id(), self._mint)
        started: dict[str, str] = {}
        for back in found:
            for dependency in back.depends_on:
                if dependency in started:
                    await self._until_ready(started[dependency])
            try:
                answer = await self._launch(checked(StartOrder, back.order))
            except Exception as error:
                log.warning("service %s: bringing it back failed: %s", back.name, error)
                continue
            started[back.name] = answer.get("process_id") or back.order["process_id"]
            log.info("service %s brought back: %s", back.name, answer)

    def _mint(self) -> str:
        return new_process_id(self.registry.now_ms())

    async def _until_ready(self, process_id: str) -> None:
        try:
            await asyncio.to_thread(
                self.registry.await_ready, process_id, timeout=BRING_BACK_READY_S
            )
        except (TimeoutError, ProcledgerError) as error:
            log.warning(
                "process %s not ready: %s; starting its dependents anyway", process_id, error
            )

    def _stdout_of(self, process_id: str) -> Path | None:
        """The run's stdout file, where a session's terminal output is relayed (§20.2)."""
        folder = self._folder_of(process_id)
        return None if folder is None else stream_paths(folder)[0]

    def _folder_of(self, process_id: str) -> Path | None:
        key = store_key(self.registry.location)
        return None if key is None else folder_for(output_root(), key, process_id)

    # -- requests ---------------------------------------------------------------------------

    def _handlers(self) -> dict[str, Any]:
        return {
            "start": self._start,
            "stop": self._stop,
            "status": self._status,
            "shutdown": self._shutdown,
            "read": self._read,
            "send": self._send,
            "keys": self._keys,
            "resources": self._resources,
        }

    async def _start(self, request: dict[str, Any]) -> dict[str, Any]:
        """``run --background``: start the order's command here; the reply comes once it runs
        and that is recorded. A program that cannot be started is the reply's ``spawn_error``
        (with its errno, so the CLI exits as a shell would)."""
        order = checked(StartOrder, request)
        await self._ready.wait()
        return await self._launch(order)

    async def _launch(self, order: StartOrder) -> dict[str, Any]:
        if order.restart is not None and (order.pty is not None or order.stdin == "pipe"):
            raise OrderError("restart: a service that restarts cannot hold a session (pty, pipe)")
        with input_for(order) as (stdin, pipe):
            answer = await self._spawn(order, stdin)
            if isinstance(answer, AsyncProcessHandle):
                if order.pty is not None or pipe is not None:
                    await self._keep_session(answer, pipe)
                return {"process_id": answer.process_id}
        return answer

    async def _spawn(self, order: StartOrder, stdin: Any) -> dict[str, Any] | AsyncProcessHandle:
        session_id, _ = owner_session(_cli_owner_id())
        try:
            handle = await self._supervisor.start(
                order.argv,
                process_id=order.process_id,
                cwd=order.cwd,
                env=order.env,
                stdin=stdin,
                pty=False if order.pty is None else TerminalSize(*order.pty),
                background=True,
                session_id=session_id,
                loop_id=self._loop_id,
                capture=order.capture,
                output_limit=order.output_limit,
                ready=order.ready,
                restart=order.restart,
                stop=StopPolicy((signal.Signals(order.stop_signal),), order.grace_s),
                name=order.name,
                digest=order.digest,
                port=order.port,
                port_range=order.port_range,
                attempt_of=order.attempt_of,
            )
        except SpawnError as error:
            return {"spawn_error": {"message": str(error), "errno": error.errno}}
        except NameTaken as taken:  # not an error: the caller is told which one runs
            return {"name_taken": {"name": taken.name, "process_id": taken.process_id}}
        return handle

    async def _keep_session(self, handle: AsyncProcessHandle, pipe: int | None) -> None:
        """Hold a new run's input (its terminal, or its stdin pipe's write end, taken from
        ``input_for``) as a session, let go when the run ends."""
        process_id = handle.process_id
        record = await handle.record()
        terminal = self._supervisor.supervisor.terminal(handle.sync)
        if pipe is not None:
            target: Any = PipeInput(pipe)
            key = STDIN_KEY.format(process_id)
        elif terminal is not None:
            target, key = terminal, PTY_KEY.format(process_id)
        else:
            return  # it ended already
        output = self._stdout_of(process_id)
        session = Session(process_id, target, record.os_pid or 0, key, output, owned=pipe is None)
        self.sessions.add(session)
        ending = asyncio.ensure_future(self._end_session(handle))
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)

    async def _end_session(self, handle: AsyncProcessHandle) -> None:
        with contextlib.suppress(Exception):  # however its end went, its input is over
            await handle.wait()
        self.sessions.end(handle.process_id)

    def _tell_waiting(self, process_id: str, waiting: Waiting) -> None:
        """(A worker thread, the wait on record.) The process's loop is told, as of its
        completion: a command journalled before dispatch, its id derived from the wait, so
        telling it again -- a retry, the next agent -- is a duplicate (docs/design.md §20.3)."""
        row = self.registry.handle_row(process_id)
        wait = self.registry.get(process_id).waiting_for_input
        if row is None or row.session_id is None or row.loop_id is None or wait is None:
            return
        notification = ProcessInputNotification(
            command_id=uuid.uuid5(WAIT_NOTICES, f"{process_id}:{wait.since_ms}"),
            session_id=row.session_id,
            loop_id=row.loop_id,
            process_handle=row.handle,
            kind=waiting.kind,
        )
        delivery = self._notifier.notify_input_wait(notification)
        log.info("process %s waits for input (%s): %s", process_id, waiting.kind, delivery)

    async def _send(self, request: dict[str, Any]) -> dict[str, Any]:
        """``send``: journalled, then written (``Sessions.send``)."""
        order = checked(SendOrder, request)
        await self._ready.wait()
        data = base64.b64decode(order.data, validate=True)
        applied = await self.sessions.send(
            order.process_id, data, command_id=order.command_id, eof=order.eof,
            redact=order.redact,
        )  # fmt: skip
        return {"applied": applied}

    async def _keys(self, request: dict[str, Any]) -> dict[str, Any]:
        """``attach``: keystrokes and the window size, written as they come."""
        order = checked(KeysOrder, request)
        await self._ready.wait()
        size = None if order.size is None else TerminalSize(*order.size)
        data = base64.b64decode(order.data, validate=True)
        return {"written": self.sessions.keys(order.process_id, data, size)}

    async def _stop(self, request: dict[str, Any]) -> dict[str, Any]:
        """A stop request was just recorded: look for it now, not at the next poll."""
        checked(StopOrder, request)
        await self._ready.wait()
        self._look_for_requests()
        return {"looking": True}

    async def _read(self, request: dict[str, Any]) -> dict[str, Any]:
        """A hot command's read, from this agent's warm store (docs/design.md §8.1), in a
        thread: a query must not hold up the children's events. A ``ProcledgerError`` is the
        error reply, its class named, for the CLI to raise again."""
        order = checked(ReadOrder, request)
        await self._ready.wait()
        method = getattr(self._reads, order.method)
        return {"value": await asyncio.to_thread(method, *order.args)}

    async def _resources(self, request: dict[str, Any]) -> dict[str, Any]:
        """``ps --resources``: the latest sample of each running child asked of, from memory."""
        order = checked(ResourcesOrder, request)
        latest = self._sampler.latest(order.process_ids)
        return {"samples": {pid: sample.document() for pid, sample in latest.items()}}

    async def _sample_resources(self, every_s: float) -> None:
        """Sample every child's tree each ``every_s`` (in a thread: a round reads /proc), and
        record the last sample of each run that ended since on its record."""
        while True:
            children = {**self._supervisor.children(), **self._held_children()}
            try:
                ended = await asyncio.to_thread(self._sampler.sample, children)
                if ended:
                    await self._supervisor.run_sync(self._record_resources, ended)
            except Exception:
                log.exception("resources: a sampling round failed")
            await asyncio.sleep(every_s)

    def _held_children(self) -> dict[str, int]:
        return {
            held.process_id: held.child.pid
            for held in self._held.values()
            if held.child is not None
        }

    def _record_resources(self, ended: dict[str, ResourceUse]) -> None:
        """(A worker thread.) What each ended run used, on its record; a write that fails
        costs that fact only, said in the log."""
        for process_id, used in ended.items():
            try:
                self.registry.record_resources(process_id, used)
            except ProcledgerError as error:
                log.warning("process %s: resources not recorded: %s", process_id, error)

    async def _status(self, request: dict[str, Any]) -> dict[str, Any]:
        """Who it is and what it holds, once its takeover is done (so a client that asks
        after a crash reads a ledger the takeover has settled)."""
        await self._ready.wait()
        report = self._report
        return {
            "pid": os.getpid(),
            "anchor_pid": self.anchor_pid if anchor_alive(self.anchor_pid) else None,
            "ledger": self.places.key,
            "uptime_s": round(time.monotonic() - self._started, 3),
            "children": self._supervisor.watching + len(self._held),
            "held": len(self._held),
            "rss_bytes": _rss_bytes(),
            "takeover": {
                "seconds": round(report.seconds, 3),
                "delivered": report.delivered,
                "journaled": report.journaled,
                "held": len(report.held),
                "lost": report.lost,
            },
        }

    async def _shutdown(self, request: dict[str, Any]) -> dict[str, Any]:
        """``agent stop``: through the anchor when there is one (else it would start us
        again), which sends us SIGTERM -- once this reply is on its way."""
        order = checked(ShutdownOrder, request)
        await self._ready.wait()
        self._stop_children = order.stop_children
        assert self._loop is not None
        self._loop.call_later(REPLY_GRACE_S, self._stop_through_anchor)
        return {"stopping": True, "pid": os.getpid(), "stop_children": order.stop_children}

    def _stop_through_anchor(self) -> None:
        if anchor_alive(self.anchor_pid):
            assert self.anchor_pid is not None
            os.kill(self.anchor_pid, signal.SIGTERM)
        else:
            self._stopping.set()

    def _watch_signals(self) -> None:
        assert self._loop is not None
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._loop.add_signal_handler(signum, self._stopping.set)

    # -- stop requests made elsewhere ---------------------------------------------------------

    def _look_for_requests(self) -> None:
        self._supervisor.supervisor.look_for_requests()
        self._poked.set()

    def _listen(self) -> Any:
        """PostgreSQL: a ``LISTEN`` connection that wakes the stop poll at every commit of
        another connection (a `stop` from another host); ``None`` elsewhere."""
        try:
            listener = self.registry.open_change_listener()
        except Exception as error:
            log.warning(
                "no LISTEN connection (stops from other hosts wait for the poll): %s", error
            )
            return None
        if listener is None:
            return None
        assert self._loop is not None

        def on_notified() -> None:
            if listener.drain():
                self._look_for_requests()

        self._loop.add_reader(listener.fileno(), on_notified)
        return listener

    # -- held (adopted) runs ---------------------------------------------------------------

    def _hold(self, held: HeldRun) -> None:
        assert self._loop is not None
        assert held.child is not None
        fd = held.child.fileno()
        self._held[fd] = held
        self._loop.add_reader(fd, functools.partial(self._held_ended, fd))
        capture = held.ticket.capture
        if isinstance(capture, FileCapture) and capture.folder is not None:
            self._follow(capture)

    def _held_ended(self, fd: int) -> None:
        assert self._loop is not None
        self._loop.remove_reader(fd)
        held = self._held.pop(fd)
        ending = asyncio.ensure_future(self._record_held_end(held))
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)

    async def _record_held_end(self, held: HeldRun) -> None:
        """Its exit from the journal (the anchor writes it before it reaps: within
        milliseconds), or, past ``JOURNAL_WAIT_S`` or with the anchor gone, unknown."""
        assert held.child is not None
        pid, start = held.child.pid, held.child.start_time
        deadline = time.monotonic() + JOURNAL_WAIT_S
        pause = 0.005
        while True:
            exit = await self._supervisor.run_sync(self._journaled, pid, start)
            if exit is not None or time.monotonic() >= deadline:
                break
            if not held.anchored or not anchor_alive(self.anchor_pid):
                break  # nobody will journal it
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.1)
        why = unknown_status(not anchor_alive(self.anchor_pid) or not held.anchored)
        self._unfollow(held.ticket.capture)
        self.sessions.end(held.process_id)
        try:
            await self._supervisor.run_sync(self._holder.terminal, held, exit, why)
        except Exception:  # left running on record: the next agent's takeover settles it
            log.exception("process %r: its end could not be recorded", held.process_id)

    def _journaled(self, pid: int, start: int) -> Any:
        self._holder.exits.read()
        return self._holder.exits.take(pid, start)

    async def _tick_held(self) -> None:
        """Renew the held runs' leases and carry out stop requests made for them: at once when
        told of one, else at the Supervisor's poll interval (and not at all with none held)."""
        while True:
            try:
                timeout = STOP_POLL_S if self._held else None
                await asyncio.wait_for(self._poked.wait(), timeout)
            except TimeoutError:
                pass
            self._poked.clear()
            if self._held:
                await self._supervisor.run_sync(self._held_round)

    def _held_round(self) -> None:
        now = time.monotonic()
        held_runs = list(self._held.values())
        seqs = self.registry.change_seqs([h.process_id for h in held_runs])
        for held in held_runs:
            if not self._holder.renew(held, now):
                log.warning("process %r: lease lost: left to its new holder", held.process_id)
                continue
            seq = seqs.get(held.process_id, 0)
            if seq > held.seen_change_seq:
                held.seen_change_seq = seq
                self._holder.stop_found(held)

    async def _stop_held(self) -> None:
        """``--stop-children``: each held run's tree stopped (SIGTERM, SIGKILL after its
        grace) and its end recorded as a shutdown's, as the Supervisor records its own."""
        for held in list(self._held.values()):
            held.shutdown = True
            stop = functools.partial(held.stop_tree, held.policy.signals, held.policy.grace_s)
            await self._supervisor.run_sync(stop)
        while self._held or self._ending:
            await asyncio.sleep(0.01)

    # -- output files ------------------------------------------------------------------------

    def _files_from_thread(self, process_id: str, capture: FileCapture) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._follow, capture)

    def _follow(self, capture: FileCapture) -> None:
        """Follow a run's two files: for the bound, and for its output probe if it has one
        (only then are the bytes read)."""
        if capture.folder is None or capture.files() is None:
            return
        for path in stream_paths(capture.folder):
            try:
                self._follower.watch(path, data=capture.feeds is not None)
            except (OSError, ValueError) as error:
                log.warning("not following %s: %s", path, error)
                continue
            self._files[path] = capture
        self._on_output()  # what it wrote before it was followed: no file event will say so

    def _unfollow(self, capture: Any) -> None:
        if isinstance(capture, FileCapture) and capture.folder is not None:
            for path in stream_paths(capture.folder):
                self._follower.unwatch(path)
                self._files.pop(path, None)

    def _on_output(self) -> None:
        """What the followed files gained; again soon while reads are pending (a file that
        gained more than one read's worth, or one just followed), as no event will come."""
        touched: set[int] = set()
        for update in self._follower.read_ready():
            capture = self._files.get(update.path)
            if capture is None:
                continue
            if capture.feeds is not None and update.data:
                stream = 0 if update.path == stream_paths(update.path.parent)[0] else 1
                capture.feeds[stream](update.data)
            if id(capture) not in touched:
                touched.add(id(capture))
                files = capture.files()
                if files is not None:
                    files.enforce_bound()
        if self._follower.timeout() == 0.0:
            assert self._loop is not None
            self._loop.call_soon(self._on_output)


@contextlib.contextmanager
def input_for(order: StartOrder) -> Iterator[tuple[Any, int | None]]:
    """What the child reads, and the write end this agent keeps when that is a pipe (``send``
    writes it); the child's end is closed here once it has its own."""
    if order.stdin == "pipe":
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            yield read_end, write_end
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        return
    yield ("null" if order.stdin == "null" else Path(order.stdin)), None


def _cli_owner_id() -> str:
    return f"procledger-cli@{host_id()}"


def _cli_notifier(registry: ProcessRegistry) -> tuple[Notifier, Any]:
    """The CLI's notification session of this host (its runs' completions went there when a
    detached `procledger` supervised them; they still do)."""
    session_id, loop_id = owner_session(_cli_owner_id())
    notifier = Notifier(registry, session_id)
    notifier.add_loop(loop_id)
    return notifier, loop_id


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _raise_open_files_limit() -> None:
    """Each child's two followed files and its pidfd hold descriptors: a thousand children
    need more than the usual soft limit of 1,024. Raised to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve_ledger(url: str | None) -> int:
    """``python -m procledger.agent``: be the agent of ``url``'s ledger until told to stop. Its
    exit status: 0 after a stop; ``ALREADY_SERVED`` when another agent serves the ledger and
    ``CANNOT_SERVE`` when it cannot be served at all (the anchor then stops rather than start it
    again); 1 when the store is unreachable now (the anchor tries again, with backoff)."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s procledger-agent[%(process)d]: %(message)s",
        stream=sys.stderr,
    )
    try:
        registry = open_registry(url)
        registry.keep_less(CACHED_RUNS)
        places = AgentPlaces.of(ledger_key(url))
    except StoreUnavailable as error:
        log.error("cannot serve now: %s", error)
        return 1
    except ProcledgerError as error:
        log.error("cannot serve: %s", error)
        return CANNOT_SERVE
    try:
        return asyncio.run(AgentHost(registry, places).serve())
    except AgentSocketError as error:
        log.error("not serving: %s", error)
        return ALREADY_SERVED


METRICS_ENV: Final = "PROCLEDGER_AGENT_METRICS"
"""Where ``agent run|start --metrics ADDR`` asks the agent to serve ``/metrics``: the
environment, because the anchor starts the agent with a fixed command line."""


def serve_metrics(registry: ProcessRegistry, sampler: ResourceSampler) -> None:
    """Serve ``/metrics`` where ``$PROCLEDGER_AGENT_METRICS`` says, on a thread of its own
    (docs/design.md §18.5): the ledger's, and what each running child uses (``sampler``).
    An address that cannot be served is logged, not fatal: the processes the agent
    supervises matter more than their metrics."""
    where = os.environ.get(METRICS_ENV)
    if not where:
        return
    # Only an agent asked for metrics carries prometheus_client (the agent lives for days).
    from prometheus_client import start_http_server  # noqa: PLC0415

    from procledger.agent.child_metrics import ChildResourcesCollector  # noqa: PLC0415
    from procledger.application.metrics import metrics_address, metrics_registry  # noqa: PLC0415

    try:
        host, port = metrics_address(where)
        collectors = metrics_registry(registry)
        collectors.register(ChildResourcesCollector(sampler, registry))
        start_http_server(port, host, registry=collectors)
    except (OptionError, OSError) as error:
        log.error("not serving metrics on %s: %s", where, error)
        return
    log.info("metrics on http://%s/metrics", where)


def _nothing() -> None:
    """What closing the agent's reads does: the registry is the agent's, closed with it."""
