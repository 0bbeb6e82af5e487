"""Write the golden ledger of procledger 0.1.0 and what 0.1.0 reads from it.

Run ONCE, against the 0.1.0 release, with PYTHONPATH pointing at that release's ``src``:

    PYTHONPATH=/path/to/procledger-0.1.0/src python tests/golden/make_ledger_0_1_0.py

and NEVER regenerate: ``ledger-0.1.0.db`` is what 0.1.0 wrote, and
``ledger-0.1.0.expected.json`` is what 0.1.0 read back from it; ``test_golden_0_1_0.py`` checks
that every later version still reads (a superset of) the same from the same bytes. Rewriting
them with newer code would make the test compare that code with itself. When event shapes
change, add a new ledger beside this one (``make_ledger_<version>.py``), never replace it.

Only the public API of 0.1.0 is used: ``open_registry`` and its commands, ``Notifier`` and
``LoopInbox``, ``FakeClock`` from ``procledger.testing`` (every timestamp is deterministic; only
lease tokens are random). The script refuses to overwrite an existing ledger.
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import uuid
from pathlib import Path
from typing import Any

import procledger
from procledger import (
    CompletionAuthority,
    EventType,
    ExternalRef,
    HandleDescriptor,
    LeaseOwner,
    LoopInbox,
    Notifier,
    Originator,
    ProcessCompletionNotification,
    ProcessInput,
    ProcessRegistration,
    ProcessRegistry,
    RecoveryDisposition,
    SessionScope,
    WaitState,
    open_registry,
)
from procledger.testing import FakeClock

VERSION = "0.1.0"
HERE = Path(__file__).resolve().parent
LEDGER = HERE / f"ledger-{VERSION}.db"
EXPECTED = HERE / f"ledger-{VERSION}.expected.json"

START_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z
FEED_PAGE = 7  # small, so the feed has several pages
D = RecoveryDisposition

# Sessions holding handles (grants); the notification session and loops are UUIDs.
ALPHA, BETA, GAMMA = "session-alpha", "session-beta", "session-gamma"
NOTIFY_SESSION = uuid.UUID("5e55107a-0000-4000-8000-000000000001")
LOOP_MAIN = uuid.UUID("100b0000-0000-4000-8000-000000000001")
LOOP_SIDE = uuid.UUID("100b0000-0000-4000-8000-000000000002")
COMMAND_IDS = [uuid.UUID(f"c0000000-0000-4000-8000-00000000000{n}") for n in range(1, 5)]

WORKER = LeaseOwner(owner_id="golden-worker", incarnation_id="golden-incarnation-1")
DEAD_WORKER = LeaseOwner.model_validate(
    {
        "owner_id": "golden-dead-worker",
        "incarnation_id": "golden-incarnation-0",
        "liveness": {
            "kind": "local_process",
            "host_id": "golden-host",
            "boot_id": "golden-boot",
            "pid": 4242,
            "process_start": "123456",
        },
    }
)
KEY = CompletionAuthority.workflow_key("golden-workflow")
EXTERNAL = CompletionAuthority.external_owner("golden-billing")
RECONCILED = CompletionAuthority.reconciled_abandon()


def check_release() -> None:
    """Refuse to run with anything but the 0.1.0 sources, or over an existing ledger."""
    pyproject = Path(procledger.__file__).resolve().parents[2] / "pyproject.toml"
    found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.MULTILINE)
    if found is None or found.group(1) != VERSION:
        sys.exit(f"{procledger.__file__} is not procledger {VERSION}: set PYTHONPATH to its src")
    for path in (LEDGER, EXPECTED, *wal_files()):
        if path.exists():
            sys.exit(f"{path} exists: golden ledgers are never regenerated")


def wal_files() -> list[Path]:
    return [LEDGER.with_name(LEDGER.name + suffix) for suffix in ("-wal", "-shm", "-journal")]


def url() -> str:
    return f"sqlite://{LEDGER}"  # LEDGER is absolute: sqlite:///abs/path/ledger-0.1.0.db


# -- writing ------------------------------------------------------------------------------------


class Writer:
    def __init__(self, registry: ProcessRegistry, clock: FakeClock) -> None:
        self.r = registry
        self.clock = clock
        self.env_ref = registry.store_env({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        self.env_ref_2 = registry.store_env({"HOME": "/home/golden", "PATH": "/usr/bin"})

    def tick(self, ms: int = 1_000) -> int:
        return self.clock.advance(ms)

    def command(self, pid: str, argv: list[str], cwd: str | None = None, **fields: Any) -> None:
        self.tick()
        fields.setdefault("disposition", D.owner_bound)
        fields.setdefault("originator", Originator.host())
        fields.setdefault("env_ref", self.env_ref)
        self.r.register(
            ProcessRegistration(id=pid, input=ProcessInput.command(argv, cwd), **fields)
        )

    def engine(self, pid: str, kind: str, payload: Any, **fields: Any) -> None:
        self.tick()
        fields.setdefault("disposition", D.rerunnable)
        fields.setdefault("originator", Originator.host("scheduler"))
        fields.setdefault("env_ref", self.env_ref_2)
        registration = ProcessRegistration(
            id=pid, input=ProcessInput.engine(kind, payload), **fields
        )
        self.r.register(registration)

    def external(self, pid: str, metadata: Any, **fields: Any) -> None:
        self.tick()
        fields.setdefault("disposition", D.externally_owned)
        fields.setdefault(
            "originator", Originator.session(SessionScope(session_id=ALPHA, agent_frame_id="f1"))
        )
        registration = ProcessRegistration(id=pid, input=ProcessInput.external(metadata), **fields)
        self.r.register(registration)

    def start(self, pid: str, *, first_started: bool = True) -> None:
        now = self.tick()
        if first_started:
            self.r.record_first_started(pid, WORKER, now)
        self.tick(10)
        self.r.record_started(pid, now, event_id=f"{pid}:started")

    def stop(self, pid: str, reason: str) -> None:
        self.tick()
        self.r.request_stop(pid, reason, event_id=f"{pid}:stop:{reason}")

    def complete(self, pid: str, state: str, reason: str, **fields: Any) -> None:
        self.tick()
        fields.setdefault("authority", KEY)
        self.r.record_completed(pid, state, reason, event_id=f"{pid}:done", **fields)


def write_ledger(w: Writer) -> None:
    r = w.r
    signals = [
        EventType(name="signal.ready"),
        EventType(
            name="signal.progress",
            payload_schema={"type": "object", "properties": {"percent": {"type": "integer"}}},
        ),
    ]

    # -- every completed row, from running ------------------------------------------------------
    w.command(
        "done-exited-0",
        ["/bin/sh", "-c", "echo ok"],
        descriptor=HandleDescriptor(kind="build", label="nightly build"),
        definition={"pipeline": "nightly", "step": 1},
        event_types=signals,
    )
    w.start("done-exited-0")
    w.tick()
    r.append_event("done-exited-0", "signal.ready", {"port": 8080}, replay_key="ready-1")
    w.complete("done-exited-0", "exited", "exited", exit_code=0, value={"artifacts": ["a.tar"]})

    w.command("done-exited-3", ["/usr/bin/make", "test"], cwd="/srv/golden")
    w.start("done-exited-3")
    w.complete("done-exited-3", "exited", "exited", exit_code=3)

    w.command("done-failed", ["/usr/bin/false"])
    w.start("done-failed")
    w.complete("done-failed", "failed", "failed", diagnostic="child crashed: SIGSEGV in libfoo")

    w.engine("done-timed-out", "golden.fetch", {"url": "https://example.invalid/x"})
    w.start("done-timed-out")
    w.complete("done-timed-out", "timed_out", "timed_out")

    w.command("done-interrupted", ["/bin/sleep", "600"])
    w.start("done-interrupted")
    w.stop("done-interrupted", "interrupted")
    w.complete("done-interrupted", "interrupted", "interrupted")

    for state, reason in [
        ("terminated", "terminated"),
        ("terminated", "runner_shutdown"),
        ("terminated", "output_limit"),
        ("killed", "killed"),
        ("killed", "runner_shutdown"),
        ("killed", "output_limit"),
    ]:
        pid = f"done-{state}-{reason}".replace("_", "-")
        w.command(pid, ["/bin/sleep", "600"], disposition=D.rerunnable)
        w.start(pid)
        if reason in ("terminated", "killed"):
            w.stop(pid, "interrupted")
            w.stop(pid, reason)
        w.complete(pid, state, reason)

    # -- completed from starting (never ran) ------------------------------------------------------
    w.command("starting-failed", ["/no/such/program"])
    w.complete("starting-failed", "failed", "failed", diagnostic="cannot start: ENOENT")
    w.command("starting-terminated", ["/bin/sleep", "1"])
    w.stop("starting-terminated", "terminated")
    w.complete("starting-terminated", "terminated", "terminated")
    w.command("starting-killed", ["/bin/sleep", "1"])
    w.complete("starting-killed", "killed", "killed")

    # -- lost, from running and from starting ---------------------------------------------------
    w.command("lost-running", ["/bin/sleep", "600"])
    w.start("lost-running")
    w.tick()
    r.record_lost(
        "lost-running",
        diagnostic="supervisor 'golden-worker' is gone; restored without signalling",
        event_id="lost-running:lost",
        authority=KEY,
    )
    w.command("lost-starting", ["/bin/sleep", "600"])
    w.tick()
    r.record_lost("lost-starting", authority=KEY)

    # -- abandoned: each reason ---------------------------------------------------------------
    w.command("abandoned-owner-drain", ["/bin/sleep", "600"])
    w.start("abandoned-owner-drain")
    w.tick()
    r.record_abandoned(
        "abandoned-owner-drain",
        "owner_drain",
        owner=WORKER,
        diagnostic="worker drained",
        authority=KEY,
    )
    w.command("abandoned-owner-dead", ["/bin/sleep", "600"], disposition=D.owner_bound)
    w.tick()
    r.record_first_started("abandoned-owner-dead", DEAD_WORKER, w.clock.now_ms)
    w.start("abandoned-owner-dead", first_started=False)
    evidence = w.tick()
    w.tick()
    r.record_abandoned(
        "abandoned-owner-dead",
        "owner_dead",
        owner=DEAD_WORKER,
        at_ms=evidence,
        event_id="abandoned-owner-dead:abandoned",
        authority=KEY,
    )
    w.external("abandoned-requested", {"label": "ticket GOLD-1", "queue": "ops"})
    w.start("abandoned-requested", first_started=False)
    w.tick()
    r.request_abandon("abandoned-requested", "operator@golden", reason="ticket closed")
    w.tick()
    r.record_abandoned("abandoned-requested", "abandon_requested", authority=RECONCILED)
    w.command("abandoned-starting", ["/bin/true"], disposition=D.rerunnable)
    w.tick()
    r.record_abandoned("abandoned-starting", "owner_drain", authority=KEY)

    # -- a terminal written with a lease (released by the write) -------------------------------
    w.command("done-with-lease", ["/bin/echo", "leased"])
    w.tick()
    leased = r.claim_lease("done-with-lease", WORKER, 60_000)
    w.start("done-with-lease")
    w.tick()
    lease = leased.lease  # type: ignore[union-attr]
    r.record_completed("done-with-lease", "exited", "exited", exit_code=0, lease=lease)

    # -- an externally owned completion ---------------------------------------------------------
    w.external("done-external", {"name": "payment 77"}, env_ref=None)
    w.start("done-external", first_started=False)
    w.tick()
    r.set_external_ref("done-external", ExternalRef(backend="billing", id="pay-77"))
    w.complete("done-external", "exited", "exited", exit_code=0, authority=EXTERNAL)

    # -- still running ------------------------------------------------------------------------
    w.command(
        "run-main",
        ["/usr/bin/python3", "-m", "http.server"],
        cwd="/srv/web",
        descriptor=HandleDescriptor(kind="server", label="web server"),
        event_types=signals,
        wake_target=SessionScope(session_id=ALPHA, agent_frame_id="frame-7"),
        definition={"service": "web", "replicas": 1},
    )
    w.tick()
    r.claim_lease("run-main", WORKER, 3_600_000)  # live, never released
    w.start("run-main")
    for n, percent in enumerate((10, 50, 90), start=1):
        w.tick()
        r.append_event("run-main", "signal.progress", {"percent": percent}, replay_key=f"p{n}")
    w.tick()
    r.append_event("run-main", "signal.ready", {"port": 8000, "tls": False}, replay_key="ready")
    w.tick()
    r.append_event("run-main", "signal.ready", {"port": 8000, "tls": False}, replay_key="ready")
    w.tick()
    r.set_wait(
        "run-main",
        WaitState(name="first", event_type="signal.ready", key="k1", since_ms=w.clock.now_ms),
    )
    w.tick()
    r.clear_wait("run-main")
    w.tick()
    r.set_wait(
        "run-main",
        WaitState(
            name="next progress", event_type="signal.progress", ordinal=4, since_ms=w.clock.now_ms
        ),
    )
    w.tick()
    r.set_external_ref(
        "run-main", ExternalRef(backend="k8s", id="pod/web-0", metadata={"ns": "golden"})
    )

    w.command("run-backgrounded", ["/usr/bin/tail", "-f", "/var/log/syslog"])
    w.start("run-backgrounded")
    w.tick()
    r.record_backgrounded("run-backgrounded", w.clock.now_ms, event_id="run-backgrounded:bg")

    w.command("run-backgrounded-at-start", ["/bin/sleep", "600"], disposition=D.rerunnable)
    w.tick()
    r.record_backgrounded("run-backgrounded-at-start", w.clock.now_ms)

    w.command("run-stop-requested", ["/bin/sleep", "600"])
    w.start("run-stop-requested")
    w.stop("run-stop-requested", "terminated")

    w.external(
        "run-abandon-requested",
        {"title": "vendor job"},
        originator=Originator.host(),
        wake_target=SessionScope(session_id=GAMMA),
    )
    w.start("run-abandon-requested", first_started=False)
    w.tick()
    r.request_abandon("run-abandon-requested", "operator@golden")

    w.engine("run-engine", "golden.train", {"epochs": 3}, event_types=signals)
    w.start("run-engine")
    w.tick()
    r.set_wait(
        "run-engine",
        WaitState(kind="signal", name="epoch", event_type="signal.progress", since_ms=1),
    )
    w.tick()
    lease2 = r.claim_lease("run-engine", WORKER, 60_000).lease  # type: ignore[union-attr]
    w.tick()
    r.release_lease(lease2)

    # -- never started --------------------------------------------------------------------------
    w.engine("starting-queued", "golden.report", {"day": "2023-11-14"})
    w.command("starting-command", ["/bin/echo", "later"], originator=Originator.host("cron"))

    # -- a process pruned away (leaves a Retention.Pruned event and revoked grants) ---------------
    w.command("pruned-old", ["/bin/true"])
    w.start("pruned-old")
    w.complete("pruned-old", "exited", "exited", exit_code=0)
    w.tick()
    r.grant_handle(BETA, "pruned-old")
    w.tick()
    report = r.prune_terminal(w.clock.now_ms, {"status": "completed", "identity_label": "true"})
    assert report.processes == ["pruned-old"], report

    # -- grants: two sessions, a transfer, a revoke, a session deleted --------------------------
    w.tick()
    r.grant_handle(ALPHA, "run-main")
    w.tick()
    r.grant_handle(ALPHA, "run-backgrounded", {"kind": "tail", "label": "syslog"})
    w.tick()
    r.grant_handle(ALPHA, "done-exited-0")
    w.tick()
    r.grant_handle(ALPHA, "done-failed", HandleDescriptor(kind="check", label=None))
    w.tick()
    r.grant_handle(BETA, "run-main", HandleDescriptor(kind="server", label="shared web"))
    w.tick()
    r.grant_handle(BETA, "run-engine")
    w.tick()
    r.grant_handle(BETA, "abandoned-requested")
    w.tick()
    r.transfer_handles(ALPHA, BETA, ["done-failed"])
    w.tick()
    r.revoke_handle(BETA, "run-engine")
    w.tick()
    r.grant_handle(GAMMA, "run-stop-requested")
    w.tick()
    r.delete_session(GAMMA)  # revokes its grant, clears run-abandon-requested's wake target

    # -- completion notifications, journalled by a Notifier -----------------------------------
    notifier = Notifier(r, NOTIFY_SESSION)
    inbox = notifier.add_loop(LOOP_MAIN, LoopInbox(capacity=8))
    notifier.add_loop(LOOP_SIDE, LoopInbox(capacity=8))

    def notify(command: int, loop: uuid.UUID, handle: str, state: str, reason: str) -> None:
        notification = ProcessCompletionNotification(
            command_id=COMMAND_IDS[command],
            session_id=NOTIFY_SESSION,
            loop_id=loop,
            process_handle=handle,
            state=state,
            reason=reason,
        )
        delivery = notifier.notify_process_completion(notification)
        assert delivery.disposition.value == "accepted", delivery

    notify(0, LOOP_MAIN, "done-exited-0", "exited", "exited")
    notify(1, LOOP_MAIN, "lost-running", "lost_on_restore", "lost_on_restore")
    notify(2, LOOP_SIDE, "done-killed-output-limit", "killed", "output_limit")
    notify(3, LOOP_MAIN, "done-terminated-runner-shutdown", "terminated", "runner_shutdown")
    inbox.consume(COMMAND_IDS[0])  # consumed; the other three stay undelivered


# -- reading back -------------------------------------------------------------------------------


def dump(r: ProcessRegistry) -> dict[str, Any]:
    """Everything 0.1.0 reads from the ledger, as JSON."""
    every = r.list_processes({"status": "any"})
    ids = [record.id for record in every]
    processes: dict[str, dict[str, Any]] = {}
    for pid in ids:
        lease = r.get_lease(pid)
        processes[pid] = {
            "record": r.get(pid).model_dump(mode="json"),
            "events": [event.model_dump(mode="json") for event in r.events(pid)],
            "lease": None if lease is None else lease.model_dump(mode="json"),
            "handle_sessions": r.handle_sessions(pid),
        }
    pages: list[dict[str, Any]] = []
    cursor: Any = 0
    while True:
        records, cursor = r.changes_since(cursor, FEED_PAGE)
        if not records:
            break
        pages.append(
            {"records": [x.model_dump(mode="json") for x in records], "cursor": int(cursor)}
        )
    handles = {
        session: {
            "running": [h.model_dump(mode="json") for h in r.handles(session)],
            "any": [h.model_dump(mode="json") for h in r.handles(session, {"status": "any"})],
        }
        for session in (ALPHA, BETA, GAMMA)
    }
    notifier = Notifier(r, NOTIFY_SESSION)
    journal = {
        "session_id": str(NOTIFY_SESSION),
        "entries": [
            {
                "seq": entry.seq,
                "notification": entry.notification.model_dump(mode="json"),
                "consumed": entry.consumed,
            }
            for entry in r.journal_entries()
        ],
        "undelivered": {
            str(loop): [n.model_dump(mode="json") for n in notifier.undelivered(loop)]
            for loop in (LOOP_MAIN, LOOP_SIDE)
        },
    }
    env_refs = sorted({p["record"]["env_ref"] for p in processes.values()} - {None})
    return {
        "version": VERSION,
        "store_url_form": "sqlite:///<absolute path>",
        "processes": processes,
        "pruned": ["pruned-old"],
        "list_processes": {
            "default": [x.id for x in r.list_processes()],
            "any": ids,
            "waiting": [x.id for x in r.list_processes({"status": "any", "waiting": True})],
            "completed": [x.id for x in r.list_processes({"status": "completed"})],
            "cancelled": [x.id for x in r.list_processes({"status": "cancelled"})],
            "failed": [x.id for x in r.list_processes({"status": "failed"})],
            "abandoned": [x.id for x in r.list_processes({"status": "abandoned"})],
        },
        "feed": {"page_limit": FEED_PAGE, "pages": pages, "final_cursor": int(cursor)},
        "handles": handles,
        "journal": journal,
        "envs": {ref: r.load_env(ref) for ref in env_refs},
    }


def checkpoint() -> None:
    """Fold the WAL into the file and leave it in rollback-journal mode: one self-contained
    file (a registry that opens it, or a copy, turns WAL on again by itself)."""
    connection = sqlite3.connect(LEDGER)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.execute("PRAGMA journal_mode=DELETE")
    finally:
        connection.close()
    left = [path for path in wal_files() if path.exists()]
    if left:
        sys.exit(f"left behind after the checkpoint: {left}")


def main() -> None:
    check_release()
    clock = FakeClock(START_MS)
    registry = open_registry(url(), clock=clock)
    try:
        write_ledger(Writer(registry, clock))
    except BaseException:
        registry.close()
        for path in (LEDGER, *wal_files()):
            path.unlink(missing_ok=True)  # a half-written ledger is no golden ledger
        raise
    registry.close()
    checkpoint()
    registry = open_registry(url())  # read back what is on disk, as a fresh reader would
    try:
        expected = dump(registry)
    finally:
        registry.close()
    checkpoint()
    EXPECTED.write_text(json.dumps(expected, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    states: dict[str, int] = {}
    for process in expected["processes"].values():
        state = process["record"]["state"]
        states[state] = states.get(state, 0) + 1
    print(f"wrote {LEDGER.name} and {EXPECTED.name}: {len(expected['processes'])} processes")
    for state, count in sorted(states.items()):
        print(f"  {state:16} {count}")


if __name__ == "__main__":
    main()
