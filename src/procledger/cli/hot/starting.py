"""`procledger run`: ``--background`` hands the command to the ledger's host agent and prints
its id -- a hot command, answered without the full stack (docs/design.md §8.1, §18); in the
foreground (``cli.running``) or with ``--wait-ready`` the full stack supervises or waits.
"""

from __future__ import annotations

import os
import time
from argparse import Namespace
from typing import Any

from procledger.cli.dispatch import fail
from procledger.cli.hot.opening import reading
from procledger.cli.lines import (
    EXIT_STOPPED,
    one_line,
    spawn_exit_code,
    write_json,
    write_line,
)
from procledger.cli.run_options import RunOptions
from procledger.cli.values import UsageError
from procledger.domain.errors import NameTaken, ProcledgerError, SpawnError

__all__ = [
    "BackgroundStartError",
    "NotReady",
    "StartInterrupted",
    "run",
    "start_order",
    "started_id",
]

START_WAIT_S = 120.0
"""How long `run --background` waits for the agent's answer: a start writes twice to the
ledger, which may ride through a database restart first."""


class BackgroundStartError(ProcledgerError):
    """`run --background` could not start its command through the host agent."""


class StartInterrupted(ProcledgerError):
    """Ctrl-C while `run --background` waited for the agent's answer or for readiness: the
    process is left to the agent, which owns it (docs/design.md §8)."""


def run(options: Namespace, url: str | None, *, fast: bool) -> int:
    parsed = RunOptions.parse(vars(options))
    if not parsed.background:
        from procledger.cli.running import run_foreground

        return run_foreground(url, parsed)
    if parsed.restart is not None and (parsed.stdin == "pipe" or parsed.pty):
        message = "a service that restarts (--restart) cannot hold a session (--pty, --stdin pipe)"
        raise UsageError(message, "--restart")
    if parsed.replace and parsed.name is not None:
        _replace(url, parsed)
    try:
        process_id = _start_in_agent(url, parsed)
    except NameTaken as taken:
        return _answer_taken(url, parsed, taken, fast=fast)
    if parsed.wait_ready:
        _wait_ready(url, parsed, process_id)
    print_started(url, parsed, process_id, fast=fast)
    return 0


def _wait_ready(url: str | None, options: RunOptions, process_id: str) -> None:
    """``--wait-ready``: return once it is ready; if it ended first, say how and why and exit 1
    (docs/design.md §15). Ctrl-C while it starts leaves it starting under the agent: its id is
    printed all the same, with a line on stderr saying so and how to stop it, exit 130."""
    from procledger.cli.running import await_ready

    try:
        how = await_ready(url, process_id)
    except KeyboardInterrupt:
        print_started(url, options, process_id, fast=False)
        message = (
            f"interrupted while waiting for process {process_id} to be ready: it keeps "
            f"starting under the host agent (procledger stop {process_id} stops it)"
        )
        fail("run", StartInterrupted(message), EXIT_STOPPED)
    if how is not None:
        fail("run", NotReady(f"process {process_id} ended before it was ready: {how}"))


def _answer_taken(url: str | None, options: RunOptions, taken: NameTaken, *, fast: bool) -> int:
    from procledger.cli.naming import answer_taken

    record = None
    if options.as_json:
        with reading(url, fast=fast) as reads:
            record = reads.record(taken.process_id)
    return answer_taken(taken, record)


def _replace(url: str | None, options: RunOptions) -> None:
    """``--replace``: the living service named so is stopped and has ended (full path)."""
    from procledger.cli._app import open_ledger
    from procledger.cli.naming import stop_named

    assert options.name is not None
    with open_ledger(url, create=False) as registry:
        stop_named(registry, options.name, options.grace_s)


class NotReady(ProcledgerError):
    """A process (or every attempt of a service) ended before it was ready."""


def print_started(url: str | None, options: RunOptions, process_id: str, *, fast: bool) -> None:
    """The id of the process the agent runs (``--json``: its record, as stored)."""
    if not options.as_json:
        write_line(process_id)
        return
    with reading(url, fast=fast) as reads:
        write_json(reads.record(process_id))


def _start_in_agent(url: str | None, options: RunOptions) -> str:
    """The host agent of this ledger (started if need be) supervises the command; its id,
    once it runs and that is recorded (docs/design.md §8, §18)."""
    from procledger.agent.launch import ask, ensure_agent
    from procledger.domain.errors import AgentError
    from procledger.supervisor.minting import new_process_id

    process_id = new_process_id(int(time.time() * 1000))
    places, _ = ensure_agent(url)
    try:
        answer = ask(places, start_order(options, process_id), timeout=START_WAIT_S)
    except KeyboardInterrupt:  # the order may have reached the agent: say which id it has
        if not options.as_json:
            write_line(process_id)
        message = (
            f"interrupted before the host agent answered: process {process_id} may be starting "
            f"under it (procledger show {process_id} says; procledger stop {process_id} stops it)"
        )
        fail("run", StartInterrupted(message), EXIT_STOPPED)
    except AgentError as error:
        if error.type != "ConnectionClosed":
            fail("run", BackgroundStartError(error.message))
        from procledger.cli.running import start_after_agent_died

        how = start_after_agent_died(url, process_id, START_WAIT_S)
        if how is not None:
            message = f"the agent died while starting process {process_id}: {how}"
            fail("run", BackgroundStartError(message))
        return process_id
    try:
        return started_id(answer)
    except SpawnError as exc:  # said as a foreground run says it (sentences.spawn_sentence)
        fail("run", exc, spawn_exit_code(exc.errno))


def started_id(answer: dict[str, Any]) -> str:
    """The id of the process the agent's ``start`` reply says it runs.

    Raises:
        NameTaken: a live service holds the order's name (nothing was started).
        SpawnError: the program could not be started (recorded ``failed``).
    """
    taken = answer.get("name_taken")
    if taken is not None:
        raise NameTaken(taken["name"], taken["process_id"])
    spawn_error = answer.get("spawn_error")
    if spawn_error is not None:
        raise SpawnError(spawn_error["errno"], one_line(spawn_error["message"]))
    return str(answer["process_id"])


def start_order(options: RunOptions, process_id: str) -> dict[str, Any]:
    """The agent's ``start`` order for ``options`` (``agent.orders.StartOrder``): the command
    runs where and with what it would have run had this process spawned it."""
    return {
        "op": "start",
        "argv": list(options.command),
        "process_id": process_id,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "stdin": str(options.stdin),
        "capture": options.capture,
        "output_limit": options.output_limit,
        "ready": None if options.ready is None else options.ready.model_dump(mode="json"),
        "restart": None if options.restart is None else options.restart.model_dump(mode="json"),
        "stop_signal": int(options.stop_signal),
        "grace_s": options.grace_s,
        "name": options.name,
        "port": options.port,
        "pty": _terminal_size() if options.pty else None,
    }


def _terminal_size() -> list[int]:
    """A background terminal's first size: this terminal's, else 24x80 (``attach`` sets
    the attaching terminal's)."""
    from procledger.cli.terminal_relay import window_size

    size = window_size((1, 0, 2))
    return [size.rows, size.cols]
