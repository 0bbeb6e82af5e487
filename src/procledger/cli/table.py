"""The hot commands, each defined once: its words, options, help and the function that runs it
(docs/design.md §8.1).

The commands people and harnesses run all the time (``ps``, ``show``, ``logs``, ``wait``,
``stop``, ``feed``, ``agent status``) must answer in a few tens of milliseconds, so they are
parsed by the standard library's ``argparse``, built from this table, whichever way they are
reached: the fast path (``procledger.cli.entry``) and the full CLI (typer, which lists them in
``procledger --help`` and hands their words over unparsed) use the same parser, so both accept
exactly the same arguments and refuse the same mistakes with the same words. Standard library
only: importing this module costs nothing the fast path does not already pay.
"""

from __future__ import annotations

from procledger.cli.specs import Argument, CommandSpec, Option
from procledger.cli.values import count, grace

__all__ = ["HOT", "Argument", "CommandSpec", "Option", "find"]


_ID = Argument("process_id", "ID", "A process id, or a unique prefix of one or of its random part.")
_JSON = Option(("--json",), "as_json", "Machine-readable output.")

PS = CommandSpec(
    ("ps",),
    "List processes (running ones by default).",
    "List processes (running ones by default).\n\nRunning ones unless --all, --state or "
    "--status; oldest first. On a terminal, short ids (the random part); into a pipe, "
    "tab-separated columns with full ids. Records that cannot be read are named on stderr and "
    "never hide the others.",
    (
        Option(("--all", "-a"), "show_all", "Every process, not only running ones."),
        Option(("--state",), "state", "Only this state (repeatable; a,b).", "STATE", repeat=True),
        Option(
            ("--status",),
            "status",
            "Only this status: running, completed, failed, cancelled, abandoned or any.",
            "STATUS",
        ),
        Option(("--label",), "label", "Only this identity label.", "TEXT"),
        Option(("--name",), "name", "Only the service(s) of this name (any status).", "NAME"),
        Option(("--since",), "since", "Only created in the last 90s/15m/2h/3d.", "DURATION"),
        Option(("--limit",), "limit", "Only the N newest (by creation).", "N", value=count),
        Option(("--attempts",), "attempts", "Every attempt of a service, not only its newest."),
        Option(
            ("--resources",),
            "resources",
            "CPU seconds, RSS, open files and threads of each running process's tree, as this "
            "host's agent last sampled them ('-' without one); with --json, \"resources\": "
            "{id: sample}.",
        ),
        Option(("--json",), "as_json", '{"records": [...], "damaged": [ids]}.'),
    ),
    "procledger.cli.hot.listing:ps",
)

SHOW = CommandSpec(
    ("show",),
    "Show one process's record and its whole event history.",
    "Show one process's record and its whole event history.\n\nThe record includes the "
    "child's OS pid and process group, and the signal that ended it.",
    (
        Argument(
            "process_id",
            "ID",
            "A process id or a unique prefix of one (or of its random part); a service's name "
            "or first id: its newest attempt, with every attempt's events; ID.N: attempt N.",
        ),
        _JSON,
    ),
    "procledger.cli.hot.showing:show",
)

LOGS = CommandSpec(
    ("logs",),
    "Print a process's captured output.",
    "Print a process's captured output: both streams in arrival order (stdout, then stderr, "
    "for a child that wrote its own files: they keep no order between the two).\n\nOn another "
    "host, prints the tail the ledger kept and says where the rest is; says on stderr when the "
    "head of the output was dropped by the output limit.",
    (
        Argument(
            "process_id",
            "ID",
            "A process id or a unique prefix of one (or of its random part); a service's name "
            "or first id: every attempt's output in turn; ID.N: attempt N alone.",
        ),
        Option(
            ("--stream",),
            "stream",
            "Only this stream (default: both, merged).",
            "[stdout|stderr]",
            choices=("stdout", "stderr"),
        ),
        Option(("--tail",), "tail", "Only the last N lines.", "N", value=count),
        Option(
            ("--since-offset",), "since_offset", "From byte K of each stream.", "K", 0, value=count
        ),
        Option(
            ("--follow", "-f"),
            "follow",
            "Wait for new output until the process ends (a service: until no attempt follows).",
        ),
        Option(
            ("--json",),
            "as_json",
            'One object per chunk: {"stream", "offset", "encoding", "data"} (a service\'s '
            'attempt\'s: and "id", "attempt").',
        ),
    ),
    "procledger.cli.hot.output:logs",
)

WAIT = CommandSpec(
    ("wait",),
    "Wait until a process is ready, or has ended.",
    "Wait until a process is ready, or has ended.\n\nExits 0 when reached; 1 when it ended "
    "before it was ready (or, with --until exit, ended unsuccessfully); 124 on --timeout. A "
    "service is waited for through its attempts.",
    (
        _ID,
        Option(
            ("--until",),
            "until",
            "ready: its readiness probes held; exit: it ended.",
            "[ready|exit]",
            "ready",
            choices=("ready", "exit"),
        ),
        Option(
            ("--timeout",),
            "timeout",
            "Give up after this long (0.2s, 60s, 5m, 1h): exit 124.",
            "DURATION",
        ),
        _JSON,
    ),
    "procledger.cli.hot.waiting:wait",
)

STOP = CommandSpec(
    ("stop",),
    "Stop a process or a whole service, or say why nobody can.",
    "Stop a process or a whole service, or say why nobody can.\n\nAsks its live supervisor "
    "(exit 0 once the request is recorded; with --wait, once it has ended), or -- when the "
    "supervisor is gone and the child still runs on this host -- stops the tree here and "
    "records how it ended. With neither, nothing is recorded and it exits 1 (see abandon). Any "
    "attempt's id stops its service: no attempt starts after the stop is recorded. A lost "
    "process whose child still runs here (restore --keep-orphans) has that child stopped. "
    "ID may be :PORT: the process holding that port on this host (its lease, else its "
    "listener), only if procledger started it.",
    (
        _ID,
        Option(
            ("--mode",),
            "mode",
            "interrupt: SIGINT first; terminate: SIGTERM first; kill: SIGKILL now.",
            "[interrupt|terminate|kill]",
            "interrupt",
            choices=("interrupt", "terminate", "kill"),
        ),
        Option(
            ("--grace",),
            "grace",
            "When its owner is gone and this command stops the tree itself: seconds before "
            "SIGKILL (finite, 0 to 86400).  [default: 10]",
            "S",
            10.0,
            value=grace,
        ),
        Option(
            ("--wait",),
            "wait",
            "Return once the process has ended (as supervisorctl stop does), saying how.",
        ),
        _JSON,
    ),
    "procledger.cli.hot.stopping:stop",
)

FEED = CommandSpec(
    ("feed",),
    "Print what changed after a cursor.",
    "Print what changed after a cursor.\n\nOne line per changed process, with its cursor; "
    "--follow keeps printing.",
    (
        Option(("--since",), "since", "Print changes after cursor N.", "N", 0, value=count),
        Option(("--limit",), "limit", "Print at most N changes, then exit.", "N", value=count),
        Option(("--follow", "-f"), "follow", "Keep printing changes as they happen."),
        Option(("--json",), "as_json", 'JSON lines: {"record": ..., "cursor": N}.'),
    ),
    "procledger.cli.hot.listing:feed",
)

AGENT_STATUS = CommandSpec(
    ("agent", "status"),
    "Whether the agent runs, and what it supervises.",
    "Whether the agent runs, and what it supervises. Exit 1 when it does not run.",
    (_JSON,),
    "procledger.cli.hot.agent_status:status",
)


def _run_params() -> tuple[Option | Argument, ...]:
    """``run``'s options, declared on ``RunOptions``' fields (imported only for ``run``)."""
    from procledger.cli.run_options import RUN_PARAMS

    return RUN_PARAMS


RUN = CommandSpec(
    ("run",),
    "Run a command under supervision and record its whole lifecycle.",
    "Run a command under supervision and record its whole lifecycle.\n\nIts output streams "
    "through and is kept (see `logs`). On a terminal it runs on a pseudo-terminal this one "
    "relays (--pty): keys, Ctrl-C, Ctrl-Z and resizes are its own, as without procledger. "
    "Otherwise its stdin is this one's, and the first Ctrl-C stops its whole tree (SIGINT, "
    "then --stop-signal, then SIGKILL, --grace apart); a second kills it at once. Exits with "
    "the command's code; 130 if it was stopped "
    "on request; 128+N if signal N ended it; 127 if the command was not found, 126 if it could "
    "not be executed.\n\n--ready-* probes (all must hold) record when it is ready; --restart "
    "starts it again as new attempts of one service, with backoff, until --max-restarts per "
    "--restart-window. Options go before -- or the command's first word.",
    _run_params,
    "procledger.cli.hot.starting:run",
    usage="procledger run [OPTIONS] [--] CMD [ARG]...",
)

SEND = CommandSpec(
    ("send",),
    "Write input to a background process's terminal or stdin.",
    "Write input to a background process's terminal or stdin.\n\nFor a process started with "
    "run --background --pty (or --stdin pipe). TEXT is sent as given -- add \\n yourself, or "
    "use --line -- or --file PATH's bytes, or standard input's when neither is given and it is "
    "not a terminal. Each send is recorded (an input_sent fact) before it is written, under "
    "--command-id (one is made when omitted): sent again with the same id, nothing more is "
    "written. The bytes are kept in the ledger unless the terminal hides what is typed (a "
    "password prompt) or --redact. Exit 0 once written; 3 when the id was used already.",
    (
        Argument(
            "process_id",
            "ID|NAME",
            "A process id (or a unique prefix), or a service's name: its newest attempt.",
        ),
        Argument("text", "TEXT", "What to send (bytes of this UTF-8 text).", optional=True),
        Option(("--line", "-l"), "line", "Add a newline (Enter) after TEXT."),
        Option(("--file", "-f"), "file", "Send this file's bytes (at most 64 KiB).", "PATH"),
        Option(("--eof",), "eof", "End the input after it (Ctrl-D on a terminal; a pipe closes)."),
        Option(
            ("--command-id",),
            "command_id",
            "The send's id: a retry with the same id writes nothing more.",
            "ID",
        ),
        Option(("--redact",), "redact", "Keep only the byte count in the ledger, not the bytes."),
        _JSON,
    ),
    "procledger.cli.hot.sending:send",
)

ATTACH = CommandSpec(
    ("attach",),
    "Join a background process's terminal (detach: Ctrl-P Ctrl-Q).",
    "Join a background process's terminal; detach and leave it running.\n\nFor a process "
    "started with run --background --pty. What you type goes to it (not recorded: send is); "
    "its output is shown as it comes, the last screenful first; the window size follows "
    "yours. Detach with Ctrl-P then Ctrl-Q (--detach-keys to change): the process runs on. "
    "Exits 0 on detach, or with a line saying how it ended.",
    (
        Argument(
            "process_id",
            "ID|NAME",
            "A process id (or a unique prefix), or a service's name: its newest attempt.",
        ),
        Option(
            ("--detach-keys",),
            "detach_keys",
            "The key sequence that detaches, as docker writes it.  [default: ctrl-p,ctrl-q]",
            "KEYS",
            "ctrl-p,ctrl-q",
        ),
    ),
    "procledger.cli.hot.attaching:attach",
)

HOT: tuple[CommandSpec, ...] = (
    RUN, WAIT, PS, SHOW, LOGS, STOP, SEND, ATTACH, FEED, AGENT_STATUS,
)  # fmt: skip
"""In the order of ``procledger --help``."""


def find(words: list[str]) -> tuple[CommandSpec, list[str]] | None:
    """The hot command ``words`` begin with, and the words after it; ``None`` for any other."""
    for spec in HOT:
        if tuple(words[: len(spec.words)]) == spec.words:
            return spec, words[len(spec.words) :]
    return None
