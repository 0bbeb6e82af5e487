"""`run`'s options are one typed object (docs/design.md §8): each ``RunOptions`` field names its
flags, so ``run``'s parser (the table's, §8.1), its parsing and what the host agent receives
(its ``start`` order) come from one place."""

from __future__ import annotations

import signal
from dataclasses import fields
from pathlib import Path

import pytest

from procledger.agent.orders import OrderError, StartOrder, checked
from procledger.cli.hot import starting
from procledger.cli.parsing import parse
from procledger.cli.run_options import RunOptions
from procledger.cli.table import RUN

RAW = {
    "command": ["sleep", "1"], "background": True, "grace": "2.5", "stop_signal": "HUP",
    "stdin": None, "as_json": True, "no_capture": False, "output_limit": "1KiB",
    "ready_port": "8080", "ready_output": None, "ready_file": None, "ready_notify": False,
    "ready_timeout": "5s", "wait_ready": True, "restart": "on-failure", "max_restarts": "3",
    "restart_window": None, "backoff_initial": None, "backoff_max": None, "reset_after": None,
    "name": "web", "replace": False, "port": "auto", "pty": False, "no_pty": False,
}  # fmt: skip


def test_run_s_parser_reads_the_fields_flags() -> None:
    flags = [flag.dest for spec in fields(RunOptions) for flag in spec.metadata["flags"]]
    assert [param.dest for param in RUN.parameters()] == [*flags, "command"]
    assert set(flags) | {"command"} == set(RAW)
    parsed = vars(parse(RUN, ["--background", "--grace", "2.5", "--", "sleep", "1"]))
    assert set(parsed) == set(RAW)
    assert (parsed["command"], parsed["grace"], parsed["background"]) == (
        ["sleep", "1"],
        "2.5",
        True,
    )


def test_the_flags_parse_once_into_typed_values() -> None:
    options = RunOptions.parse(RAW)
    assert options.command == ("sleep", "1")
    assert (options.grace_s, options.stop_signal) == (2.5, signal.SIGHUP)
    assert (options.stdin, options.capture, options.output_limit) == ("null", True, 1024)
    assert options.ready is not None
    assert (options.ready.port, options.ready.timeout_s) == (8080, 5.0)
    assert options.restart is not None
    assert options.restart.max_restarts == 3
    assert (options.name, options.replace, options.port) == ("web", False, "auto")


def test_the_agent_receives_the_same_options_as_its_start_order(tmp_path: Path) -> None:
    source = tmp_path / "input"
    source.write_text("x")
    for options in (RunOptions.parse(RAW), RunOptions.parse(RAW | {"stdin": str(source)})):
        order = checked(StartOrder, starting.start_order(options, "1a2b-3c"))
        assert (tuple(order.argv), order.process_id) == (options.command, "1a2b-3c")
        assert (order.ready, order.restart) == (options.ready, options.restart)
        assert (order.stop_signal, order.grace_s) == (options.stop_signal, options.grace_s)
        assert (order.stdin, order.output_limit) == (str(options.stdin), options.output_limit)
        assert (order.name, order.port) == ("web", "auto")


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({}, "argv"),
        ({"argv": []}, "argv"),
        ({"argv": ["x"], "process_id": "p", "cwd": "/", "env": {}, "grace_s": -1}, "grace_s"),
        ({"argv": ["x"], "process_id": "p", "cwd": "/", "env": {}, "surprise": 1}, "surprise"),
    ],
)
def test_anything_but_a_start_order_is_refused_naming_the_field(
    document: dict[str, object], field: str
) -> None:
    with pytest.raises(OrderError, match=field):
        checked(StartOrder, {"op": "start", **document})
