"""`show`: one process's record, its service's attempts and its whole event history
(docs/design.md §8, §8.1, §15.4).

Of a service (its name, its first attempt's id, a prefix naming it: ``scoped``), the newest
attempt's record and every attempt's events, since that is the service's history; of one
attempt's id (``ID.3``, ``NAME.3``; ``ID.1`` for the first alone), that attempt's.
"""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from typing import Any

from procledger.application.document_reads import Document, LedgerReads
from procledger.cli._format import command_text, local_time, outcome, write_table
from procledger.cli.hot import marks as marking
from procledger.cli.hot.opening import reading
from procledger.cli.lines import write_json
from procledger.domain.wording import event_details, resources_line, service_lines, shell_word

__all__ = ["resolve", "scoped", "show"]


def resolve(reads: LedgerReads, text: str) -> str:
    """The process id ``text`` names. Text that is not valid UTF-8 -- a shell can pass any
    bytes -- names no process."""
    _check_utf8(text)
    return reads.resolve(text)


def _check_utf8(text: str) -> None:
    from procledger.cli.lines import is_utf8
    from procledger.domain.errors import NotFound

    if not is_utf8(text):
        import os

        raise NotFound(f"no process {os.fsencode(text)!r}: a process id is UTF-8 text")


def scoped(reads: LedgerReads, text: str) -> tuple[Document, bool]:
    """The record ``text`` names, and whether it stands for its whole service
    (``LedgerReads.scoped``); text that is not UTF-8 names no process."""
    _check_utf8(text)
    return reads.scoped(text)


def show(options: Namespace, url: str | None, *, fast: bool) -> int:
    with reading(url, fast=fast) as reads:
        record, whole = scoped(reads, options.process_id)
        attempts = reads.attempts(record["id"]) if record.get("attempt") is not None else []
        record = attempts[-1] if whole else record
        shown = attempts if whole else [record]
        events = [event for each in shown for event in reads.events(each["id"])]
        marks, gone = ({}, {}) if options.as_json else marking.marks(reads, [record])
    if options.as_json:
        document = {"record": record, "events": events}
        write_json(document | ({"attempts": attempts} if attempts else {}))
        return 0
    mark = marks.get(record["id"])
    hint = None if mark is None else _hint(record, mark, gone.get(record["id"]))
    _print_summary(record, mark, attempts, hint)
    sys.stdout.write("\n")
    if attempts:
        _print_attempts(attempts)
    numbers = {a["id"]: str(a["attempt"]) for a in attempts} if whole else None
    _print_events(events, numbers)
    return 0


def _print_events(events: list[Document], numbers: dict[str, str] | None) -> None:
    """The event history; a whole service's (``numbers``: each attempt's number by its id)
    names each event's attempt."""
    rows = [
        (str(e["sequence"]), local_time(e["occurred_at_ms"]), e["kind"], event_details(e))
        for e in events
    ]
    if numbers is None:
        write_table(("SEQ", "AT", "KIND", "DETAILS"), rows)
        return
    numbered = [(numbers[e["process_id"]], *row) for e, row in zip(events, rows, strict=True)]
    write_table(("ATTEMPT", "SEQ", "AT", "KIND", "DETAILS"), numbered)


def _print_attempts(attempts: list[Document]) -> None:
    """Every attempt of the service, with its exit code or signal (docs/design.md §15)."""
    rows = [
        (
            str(a.get("attempt") or 1),
            a["id"],
            a["state"],
            outcome(a),
            local_time(a["updated_at_ms"]),
        )
        for a in attempts
    ]
    write_table(("ATTEMPT", "ID", "STATE", "OUTCOME", "UPDATED"), rows)
    sys.stdout.write("\n")


def _print_summary(
    record: Document, mark: str | None, attempts: list[Document], hint: str | None
) -> None:
    """`show`'s header: one ``name  value`` line for each thing that happened; ``mark`` what
    this host sees of it beyond the record and ``hint`` what to do about it, ``attempts`` its
    service's attempts (none for a process that is not a service)."""
    status = record["status"] + (f"; {mark}" if mark else "")
    rows = [("id", record["id"])]
    if record.get("name"):
        rows.append(("name", record["name"]))
    rows += [
        ("command", command_text(record)),
        ("state", f"{record['state']} ({status})"),
        ("outcome", outcome(record)),
        ("disposition", record["disposition"]),
    ]
    facts = record.get("os")
    if facts is not None:
        where = f"(process group {facts['pgid']}, host {facts['host_id']})"
        rows.append(("os pid", f"{facts['pid']} {where}"))
    if record.get("survivors"):
        rows.append(("survivors", " ".join(str(pid) for pid in record["survivors"])))
    if record.get("stop_requested"):
        rows.append(("stop requested", ", ".join(record["stop_requested"])))
    if record.get("first_started") is not None:
        rows.append(("first started by", record["first_started"]["owner"]["owner_id"]))
    if record.get("diagnostic"):
        rows.append(("diagnostic", " ".join(record["diagnostic"].split())))
    if record.get("pty"):
        rows.append(("terminal", "a pseudo-terminal (its output one stream: stdout)"))
    waiting = record.get("waiting_for_input")
    if waiting is not None:
        since = local_time(waiting["since_ms"])
        rows.append(("waiting", f"for input ({waiting['kind']}) since {since}: "
                                f"{shell_word(waiting['last_line'])}"))  # fmt: skip
    if record.get("output") is not None:
        rows.append(("output", output_line(record["output"])))
    if record.get("resources") is not None:
        rows.append(("resources", resources_line(record["resources"])))
    first = attempts[0] if attempts else None
    rows += service_lines(record, first, len(attempts), int(time.time() * 1000))
    if hint is not None:
        rows.append(("hint", hint))
    width = max(len(name) for name, _ in rows)
    sys.stdout.write("".join(f"{name.ljust(width)}  {value}\n" for name, value in rows))


def _hint(record: Document, mark: str, holder: Any) -> str:
    """What to do about a marked process (docs/design.md §8): stop a kept orphan; have the
    gone holder's successor account for the process -- a new agent for an agent's run,
    `restore` for a `procledger run`'s -- or else stop or abandon it."""
    from procledger.adapters.proc_facts import host_id, runs_here

    facts = record.get("os")
    pid = facts["pid"] if facts is not None else None
    if mark == marking.ORPHAN_RUNNING:
        what = f"procledger stop {record['id']} stops its tree and records how it ended"
        return f"its child (OS pid {pid}) still runs unsupervised on this host: {what}"
    runs = facts is not None and runs_here(facts["pid"], facts["start_time"], facts["host_id"])
    holder_id = holder.get("owner_id", "") if holder is not None else ""
    if holder_id == f"{marking.AGENT_ROLE}@{host_id()}":
        what = "procledger agent start: a new agent takes it over"
    elif holder_id == f"{marking.CLI_ROLE}@{host_id()}":
        what = "procledger restore accounts for it"
    elif runs:
        what = f"procledger stop {record['id']} stops its child (OS pid {pid}) and records it"
    else:
        what = f"its child is gone too: procledger abandon {record['id']} records it given up"
    return f"its supervisor is gone, so nothing will record how it ends: {what}"


def output_line(output: Document) -> str:
    """`show`'s output summary: bytes per stream, what was dropped, where the rest lives."""
    if not output["capture"]:
        return "not captured (--no-capture)"
    streams = ", ".join(
        f"{name} {s['written']} bytes ({s['kept']} kept, {s['dropped']} dropped)"
        for name, s in (("stdout", output["stdout"]), ("stderr", output["stderr"]))
    )
    where = f" on host {output['host_id']} in {output['folder']}" if output.get("folder") else ""
    stopped = f"; capture stopped: {output['stopped']}" if output.get("stopped") else ""
    return f"{streams}{where}{stopped}"
