"""`agent status`: whether this ledger's agent runs, and what it supervises -- asked over its
socket (docs/design.md §18.5)."""

from __future__ import annotations

from argparse import Namespace

from procledger.agent.launch import ask, ledger_key, ping
from procledger.agent.places import AgentPlaces
from procledger.cli.lines import write_json, write_line

__all__ = ["status"]


def status(options: Namespace, url: str | None, *, fast: bool) -> int:
    places = AgentPlaces.of(ledger_key(url), create=False)
    if ping(places) is None:
        if options.as_json:
            write_json({"running": False, "socket": places.socket})
        else:
            write_line("agent not running")
        return 1
    found = {"running": True, "socket": places.socket, **ask(places, {"op": "status"})}
    if options.as_json:
        write_json(found)
        return 0
    anchor = found["anchor_pid"]
    write_line(
        f"agent running: pid {found['pid']}"
        f"{f', anchor pid {anchor}' if anchor else ', no anchor'}, up {found['uptime_s']:.0f} s\n"
        f"processes: {found['children']} ({found['held']} adopted)\n"
        f"memory: {found['rss_bytes'] / 2**20:.1f} MiB RSS\n"
        f"ledger: {found['ledger']}\nsocket: {places.socket}"
    )
    return 0
