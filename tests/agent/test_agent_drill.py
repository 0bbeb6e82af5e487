"""The agent kill drill, small (issue 28's acceptance: 20 children, 5 agent kills).

Twenty children each print a numbered line every 100 ms to their stdout (a file they write
themselves) and append the same line to a copy of their own; half end with exit 7 after a
number of lines that differs from child to child, so that exits come while agents live, while
they are dead and while they take over. The agent is killed with SIGKILL five times at random
moments, each time once the agent before it has taken over. Then:

- no child was killed by the kills: the long-lived ones still run, with the pid and start time
  their record names;
- no line is missing: ``procledger logs ID`` holds every line of each child's own copy;
- every exit 7 is recorded exactly once, with its code (one ``completed`` event, no ``lost``);
- every takeover held every live child and took under 2 s.

The anchor lives throughout, so every child stays in its tree, which the suite's autouse
fixture kills by exact pid at the end. Bounded: the waits are on state (the agent's ``status``,
the ledger, the files), with deadlines only as fail-fast nets; the kills' moments are random
(the seed is in every failure message).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import psutil
import pytest

from procledger import ProcessState

from .live_agent import DEADLINE, TERMINAL_KINDS, LiveAgent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the anchor and /proc: Linux")

CHILDREN = 20
KILLS = 5
TAKEOVER_BOUND_S = 2.0

CHATTY = """
import os, sys, time
name, copy, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(copy, "ab", buffering=0) as kept:
    number = 0
    while True:
        number += 1
        line = f"{name} line {number}\\n".encode()
        os.write(1, line)  # the output file first: every line of the copy is in it
        kept.write(line)
        if number == last:
            sys.exit(7)
        time.sleep(0.1)
"""
"""``python -c CHATTY NAME COPY LAST``: a numbered line every 100 ms; exit 7 after line LAST
(never, with 0)."""


ON_RESTART = """
import os, sys, time
socket, delay = sys.argv[1], float(sys.argv[2])
def bound():
    try:
        found = os.stat(socket)
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_ctime_ns
first = bound()
while bound() in (first, None):
    time.sleep(0.001)
time.sleep(delay)
sys.exit(7)
"""
"""``python -c ON_RESTART SOCKET DELAY``: exit 7 DELAY seconds after a new agent bound SOCKET
(the socket file made again: another inode, or another change time)."""


def test_children_that_end_while_a_new_agent_takes_over_are_recorded_with_their_code(
    tmp_path: Path,
) -> None:
    # The takeover reads the anchor's journal, then adopts each child in turn: a child that
    # ends in between is gone (or a zombie) when its turn comes, and its exit is in the journal
    # by then -- the anchor writes it before it reaps. Staggered over 0-190 ms after the new
    # agent binds its socket, some of the twenty end before, some during and some after it.
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    first = agent.start()
    socket = agent.places.socket
    ids = [
        agent.start_child([sys.executable, "-c", ON_RESTART, socket, f"{n * 0.01:.2f}"], tmp_path)
        for n in range(CHILDREN)
    ]
    agent.kill(first["pid"])
    takeover = agent.await_serving(other_than=first["pid"])["takeover"]
    for process_id in ids:
        final = agent.await_terminal(process_id)
        assert (final.state, final.exit_code) == (ProcessState.exited, 7), (
            process_id, final.state, final.diagnostic, takeover,
        )  # fmt: skip
        kinds = [kind for kind in agent.event_kinds(process_id) if kind in TERMINAL_KINDS]
        assert kinds == ["completed"], (process_id, kinds)
    assert takeover["lost"] == 0, takeover
    assert takeover["seconds"] < TAKEOVER_BOUND_S, takeover


def test_twenty_children_survive_five_agent_kills_with_every_line_and_exit_recorded(
    tmp_path: Path,
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    why = f"(drill seed {seed})"
    agent = LiveAgent(f"sqlite:///{tmp_path}/ledger.db")
    first = agent.start()

    lasts = [0] * (CHILDREN // 2) + [rng.randint(10, 70) for _ in range(CHILDREN // 2)]
    rng.shuffle(lasts)
    copies = [tmp_path / f"copy-{n}" for n in range(CHILDREN)]
    ids = [
        agent.start_child(
            [sys.executable, "-c", CHATTY, f"child-{n}", str(copies[n]), str(last)], tmp_path
        )
        for n, last in enumerate(lasts)
    ]
    started = {process_id: agent.record(process_id) for process_id in ids}

    takeovers = []
    killed = first["pid"]
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.0, 0.8))  # a random moment, not a synchronisation
        agent.kill(killed)
        status = agent.await_serving(other_than=killed)
        takeovers.append(status["takeover"])
        killed = status["pid"]

    long_lived = [process_id for process_id, last in zip(ids, lasts, strict=True) if not last]
    ending = [process_id for process_id, last in zip(ids, lasts, strict=True) if last]
    for process_id in ending:
        final = agent.await_terminal(process_id, timeout=DEADLINE)
        assert (final.state, final.exit_code) == (ProcessState.exited, 7), (
            process_id, final.state, final.diagnostic, why,
        )  # fmt: skip
        kinds = [kind for kind in agent.event_kinds(process_id) if kind in TERMINAL_KINDS]
        assert kinds == ["completed"], (process_id, kinds, why)

    for process_id in long_lived:
        record = agent.record(process_id)
        assert record.state is ProcessState.running, (process_id, record.diagnostic, why)
        assert record.os == started[process_id].os, why  # the same child, never restarted
        assert record.os is not None
        child = psutil.Process(record.os.pid)
        assert child.status() != psutil.STATUS_ZOMBIE, why
        assert child.ppid() == first["anchor_pid"], why

    for takeover in takeovers:
        assert takeover["seconds"] < TAKEOVER_BOUND_S, (takeovers, why)
        assert takeover["lost"] == 0, (takeovers, why)
        assert takeover["held"] >= len(long_lived), (takeovers, why)

    copied = [copy.read_text().splitlines() for copy in copies]  # first: the files are ahead
    logged = agent.logs_of_each(ids, tmp_path / "logs", "--stream", "stdout")
    for n, (copy, log) in enumerate(zip(copied, logged, strict=True)):
        lines = log.splitlines()
        assert lines == [f"child-{n} line {k}" for k in range(1, len(lines) + 1)], (ids[n], why)
        assert lines[: len(copy)] == copy, (ids[n], len(copy), len(lines), why)
        if lasts[n]:
            assert len(lines) == len(copy) == lasts[n], (ids[n], why)
