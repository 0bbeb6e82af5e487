"""AsyncSupervisor: start, wait, stop, output, and what cancellation does and does not do
(docs/design.md §17), with real children and real signals, under asyncio and trio."""

from __future__ import annotations

import signal
import threading
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path

import anyio
import psutil
import pytest

from _shared import Processes, is_dead
from procledger import (
    LeaseOwner,
    NotFound,
    ProcessRegistry,
    Readiness,
    RestartPolicy,
    StopPolicy,
    SupervisorClosed,
    open_registry,
)
from procledger.aio import AsyncProcessHandle, AsyncSupervisor

pytestmark = pytest.mark.anyio

LONG = ["sleep", "600"]


async def child_of(handle: AsyncProcessHandle, procs: Processes) -> psutil.Process:
    """The running child, known to ``procs`` for cleanup by exact pid."""
    record = await handle.record()
    assert record.os is not None
    return procs.add(record.os.pid)


def alive(process: psutil.Process) -> bool:
    return not is_dead(process)


async def test_start_wait_and_output(registry: ProcessRegistry, owner: LeaseOwner) -> None:
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(["sh", "-c", "echo one; echo two >&2; exit 3"])
        async with aclosing(handle.output()) as output:
            chunks = [chunk async for chunk in output]
        record = await handle.wait()
    assert (record.state, record.exit_code, record.status) == ("exited", 3, "failed")
    assert {(c.stream, c.data) for c in chunks} == {("stdout", b"one\n"), ("stderr", b"two\n")}
    async with aclosing(handle.output(follow=False, stream="stdout")) as stdout:
        assert [c.data async for c in stdout] == [b"one\n"]


async def test_an_output_dir_that_does_not_exist_yet_is_made(
    registry: ProcessRegistry, owner: LeaseOwner, tmp_path: Path
) -> None:
    """As the default ``<state dir>/output`` is: capture used to stop at once (``ENOENT``),
    so nothing was kept and ``output()`` said the output was gone."""
    output_dir = tmp_path / "not" / "yet"
    async with AsyncSupervisor(registry, owner=owner, output_dir=output_dir) as sup:
        handle = await sup.start(["sh", "-c", "echo kept"], stdout=lambda chunk: None)
        record = await handle.wait()
        async with aclosing(handle.output(follow=False)) as output:
            assert [c.data async for c in output] == [b"kept\n"]
    assert record.output is not None
    assert (record.output.stopped, record.output.stdout.written) == (None, 5)
    assert output_dir.is_dir()


async def test_stop_records_the_request_and_the_signal(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(LONG)
        child = await child_of(handle, procs)
        record = await handle.stop("terminate", grace_s=5)
        assert (record.state, record.signal, record.stop_requested) == (
            "terminated",
            signal.SIGTERM,
            ["terminated"],
        )
        assert is_dead(child)
        assert await handle.wait() == record


async def cancel_a_waiter(handle: AsyncProcessHandle) -> None:
    waiting = anyio.Event()

    async def waiter() -> None:
        waiting.set()
        await handle.wait()

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await waiting.wait()
        group.cancel_scope.cancel()


async def time_out_a_waiter(handle: AsyncProcessHandle) -> None:
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.2):
            await handle.wait()


async def cancel_an_output_reader(handle: AsyncProcessHandle) -> None:
    with anyio.move_on_after(10) as scope:
        async with aclosing(handle.output()) as output:
            async for chunk in output:
                assert chunk.data == b"ready\n"
                scope.cancel()  # the reader stops; the child must not notice
    assert scope.cancelled_caught


@pytest.mark.parametrize("interrupt", [cancel_a_waiter, time_out_a_waiter, cancel_an_output_reader])
async def test_what_is_cancelled_around_a_child_leaves_it_running(
    interrupt: Callable[[AsyncProcessHandle], Awaitable[None]],
    registry: ProcessRegistry,
    owner: LeaseOwner,
    procs: Processes,
) -> None:
    """Cancelling a waiter, a timeout around ``wait``, or a cancelled output reader touches
    nothing: the child runs on, ``running`` in the ledger, still watched (a stop finds it)."""
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(["sh", "-c", "echo ready; exec sleep 600"])
        child = await child_of(handle, procs)
        await interrupt(handle)
        assert alive(child)
        assert (await handle.record()).state == "running"
        record = await handle.stop("kill")
    assert (record.state, record.signal) == ("killed", signal.SIGKILL)


async def test_leaving_the_block_stops_and_records_every_child(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handles = [await sup.start(LONG) for _ in range(3)]
        children = [await child_of(h, procs) for h in handles]
    for handle, child in zip(handles, children, strict=True):
        record = registry.get(handle.process_id)
        assert (record.state, record.reason) == ("terminated", "runner_shutdown")
        assert is_dead(child)


class _Boom(Exception):
    pass


async def test_an_exception_leaves_the_block_unwrapped_and_the_children_are_stopped(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    """The block's own exception is what the caller catches, not an ``ExceptionGroup`` of
    the watchers' task group, and the children are still stopped and recorded."""
    started: list[tuple[AsyncProcessHandle, psutil.Process]] = []

    async def harness() -> None:
        async with AsyncSupervisor(registry, owner=owner) as sup:
            handle = await sup.start(LONG)
            started.append((handle, await child_of(handle, procs)))
            raise _Boom("the harness failed")

    with pytest.raises(_Boom, match="the harness failed"):
        await harness()
    [(handle, child)] = started
    record = registry.get(handle.process_id)
    assert (record.state, record.reason) == ("terminated", "runner_shutdown")
    assert is_dead(child)


async def test_a_service_restarts_and_wait_returns_its_last_attempt(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    """Attempts after the first are started by the Supervisor's service thread, not by an
    awaited ``start``: each must still be owned (its terminal recorded) -- they used to be
    handed to nobody, so the service and every ``wait`` on it hung. A timeout around that
    ``wait`` ends the waiting, nothing else."""
    policy = RestartPolicy(mode="on-failure", max_restarts=2, backoff_initial_s=0.01)
    async with AsyncSupervisor(registry, owner=owner) as sup:
        failing = await sup.start(["sh", "-c", "exit 3"], restart=policy)
        with anyio.fail_after(60):
            record = await failing.wait()
        assert (record.id, record.state, record.exit_code) == (
            f"{failing.process_id}.3",
            "exited",
            3,
        )
        assert [r.exit_code for r in registry.attempts(failing.process_id)] == [3, 3, 3]
        service = await sup.start(LONG, restart=RestartPolicy(mode="always"))
        child = await child_of(service, procs)
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.2):
                await service.wait()
        assert alive(child)
        assert (await service.record()).state == "running"
        with anyio.fail_after(60):
            stopped = await service.stop("kill")
        assert stopped.state == "killed"


async def test_on_exit_leave_keeps_children_supervised(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    async with AsyncSupervisor(registry, owner=owner, on_exit="leave") as sup:
        handle = await sup.start(LONG)
        child = await child_of(handle, procs)
    assert alive(child)
    assert registry.get(handle.process_id).state == "running"
    await anyio.to_thread.run_sync(sup.supervisor.shutdown)  # an owner thread records it
    record = registry.get(handle.process_id)
    assert (record.state, record.reason) == ("terminated", "runner_shutdown")
    assert is_dead(child)


THREAD_BUDGET = 10
"""Threads an ``AsyncSupervisor`` may add: 6 of its own, and room for the pool's workers
started while others finish (seen at 8 under load); a thread per child would be 20 or more."""


async def test_many_children_few_threads(registry: ProcessRegistry, owner: LeaseOwner) -> None:
    """The loop's thread, the lease ticker, 3 workers and 2 settlers -- and, on a loaded
    machine, a few workers the pool starts before others are idle again: far fewer than one
    per child, however many (idle workers of earlier tests' loops linger: not counted)."""
    before = threading.active_count()
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handles = [await sup.start(["sleep", "0.3"], capture=False) for _ in range(30)]
        most = threading.active_count()
        async with anyio.create_task_group() as group:
            for handle in handles:
                group.start_soon(handle.wait)
                most = max(most, threading.active_count())
    assert all(registry.get(h.process_id).state == "exited" for h in handles)
    assert most - before <= THREAD_BUDGET, [t.name for t in threading.enumerate()]


async def test_bad_arguments(registry: ProcessRegistry, owner: LeaseOwner) -> None:
    with pytest.raises(ValueError, match="on_exit"):
        AsyncSupervisor(registry, owner=owner, on_exit="linger")  # type: ignore[arg-type]
    async with AsyncSupervisor(registry, owner=owner) as sup:
        with pytest.raises(TypeError, match="argv"):
            await sup.start("sleep 1")
        handle = await sup.start(["true"])
        with pytest.raises(ValueError, match=r"pause"):
            await handle.stop("pause")
        other = AsyncSupervisor(registry, owner=owner)
        with pytest.raises(NotFound):
            await other.wait(handle)
        with pytest.raises(SupervisorClosed, match="async with"):
            await other.start(["true"])
        await handle.wait()
    with pytest.raises(SupervisorClosed):
        await sup.start(["true"])


@pytest.mark.postgres
async def test_on_postgresql(postgres_schema_url: str, owner: LeaseOwner, procs: Processes) -> None:
    registry = open_registry(postgres_schema_url)
    try:
        async with AsyncSupervisor(registry, owner=owner) as sup:
            done = await sup.start(["sh", "-c", "exit 0"])
            running = await sup.start(LONG)
            child = await child_of(running, procs)
            assert (await done.wait()).state == "exited"
        record = registry.get(running.process_id)
        assert (record.state, record.reason) == ("terminated", "runner_shutdown")
        assert is_dead(child)
    finally:
        registry.close()


async def test_a_failing_output_consumer_fails_the_run(
    registry: ProcessRegistry, owner: LeaseOwner
) -> None:
    """A consumer's exception, met by the loop, goes through the one cleanup path: the tree
    is stopped and the run recorded ``failed`` with the error."""

    def refuse(chunk: bytes) -> None:
        raise RuntimeError("no more, thanks")

    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(["sh", "-c", "echo hi; exec sleep 600"], stdout=refuse)
        record = await handle.wait()
    assert (record.state, record.reason) == ("failed", "failed")
    assert record.diagnostic is not None
    assert "no more, thanks" in record.diagnostic  # and the fixture finds no child left


async def test_a_run_failing_as_the_block_ends_does_not_hold_the_block(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    """The loop stops watching a child whose consumer failed (its settle stops the tree); a
    shutdown stopping that tree meanwhile used to wait for an exit the loop would never see
    again, and the block never ended."""
    met: list[bytes] = []

    def refuse(chunk: bytes) -> None:
        met.append(chunk)
        raise RuntimeError("no more, thanks")

    stubborn = ["sh", "-c", "trap '' TERM; echo hi; exec sleep 600"]  # the settle takes a grace
    with anyio.fail_after(60):
        async with AsyncSupervisor(registry, owner=owner, stop=StopPolicy(grace_s=0.5)) as sup:
            handle = await sup.start(stubborn, stdout=refuse)
            child = await child_of(handle, procs)
            while not met:
                await anyio.sleep(0.01)
    record = registry.get(handle.process_id)
    assert (record.state, record.reason) == ("failed", "failed")
    assert is_dead(child)


async def test_leaving_the_block_stops_many_children_without_a_thread_each(
    registry: ProcessRegistry, owner: LeaseOwner, procs: Processes
) -> None:
    """Each tree's stop steps run in the pool and its waits on the loop: 21 trees stopped,
    one of them ignoring SIGTERM until SIGKILL after the grace, within the thread budget."""
    before = threading.active_count()
    most = before

    names: list[str] = []

    async def sample() -> None:
        nonlocal most, names
        while True:
            if threading.active_count() > most:
                most, names = threading.active_count(), [t.name for t in threading.enumerate()]
            await anyio.sleep(0.005)

    async with anyio.create_task_group() as outer:
        outer.start_soon(sample)
        policy = StopPolicy(grace_s=0.5)
        async with AsyncSupervisor(registry, owner=owner, stop=policy) as sup:
            stubborn = await sup.start(["sh", "-c", "trap '' TERM; exec sleep 600"])
            handles = [await sup.start(LONG, capture=False) for _ in range(20)]
            children = [await child_of(h, procs) for h in [stubborn, *handles]]
        outer.cancel_scope.cancel()
    assert most - before <= THREAD_BUDGET, names
    record = registry.get(stubborn.process_id)
    assert (record.state, record.reason, record.signal) == ("killed", "runner_shutdown", 9)
    for handle in handles:
        record = registry.get(handle.process_id)
        assert (record.state, record.reason) == ("terminated", "runner_shutdown")
    assert all(is_dead(child) for child in children)


async def test_wait_ready_on_an_output_probe_and_on_a_ready_timeout(
    registry: ProcessRegistry, owner: LeaseOwner, tmp_path: Path
) -> None:
    """Readiness (docs/design.md §15) awaited on the loop: ready once the line comes; a child
    that never gets ready ends ``failed``/``ready_timeout`` and ``wait_ready`` returns that."""
    flag = tmp_path / "go"
    says_ready = [
        "sh",
        "-c",
        f"while [ ! -e {flag} ]; do sleep 0.01; done; echo listening; sleep 5",
    ]
    async with AsyncSupervisor(registry, owner=owner) as sup:
        server = await sup.start(says_ready, ready=Readiness(output="^listening$"))
        with pytest.raises(TimeoutError):
            await server.wait_ready(timeout=0.2)  # not yet: the child waits for the flag
        flag.touch()
        ready = await server.wait_ready(timeout=30)
        assert ready.ready_at_ms is not None
        assert ready.state == "running"
        await server.stop("kill")
        never = await sup.start(
            ["sleep", "30"], ready=Readiness(file=str(tmp_path / "no"), timeout_s=0.3)
        )
        ended = await never.wait_ready(timeout=30)
        assert (ended.state, ended.reason, ended.ready_at_ms) == ("failed", "ready_timeout", None)
        plain = await sup.start(["sleep", "30"])
        assert (await plain.wait_ready(timeout=30)).state == "running"  # no probes: it runs
        await plain.stop("kill")


async def test_a_finished_child_is_not_kept_and_still_answers(
    registry: ProcessRegistry, owner: LeaseOwner
) -> None:
    """The loop forgets a child once its terminal is recorded (a loop that supervises for
    weeks must not keep every child it watched); waiting on its handle later still gives
    the terminal record."""
    async with AsyncSupervisor(registry, owner=owner) as sup:
        handle = await sup.start(["sh", "-c", "exit 4"])
        first = await handle.wait()
        assert sup._watched == {}
        assert await handle.wait() == first
    assert (first.state, first.exit_code) == ("exited", 4)
