"""One exception tree for everything procledger refuses or fails at.

Callers catch ``ProcledgerError`` to handle all of it, or one branch. Each message names the
process id, field, key or URL concerned, so a log line is enough to find the culprit::

    ProcledgerError
    ├── ProcessLifecycleValidationError   (.field; never a ValueError: pydantic must not wrap it)
    ├── RegistrationError                 (.field)
    ├── FilterError                       (.key; also ValueError)
    ├── OptionError                       (.option; also ValueError: a bad duration, port, regex)
    ├── ServiceFileError                  (.path, .line, .column: "PATH:LINE:COL: KEY: what")
    ├── InvalidTransition                 (.from_state, .kind, .to_state)
    │   └── AlreadyTerminal
    ├── ReplayConflict
    ├── RegistrationConflict              (.existing_hash, .new_hash)
    ├── UndeclaredEventType
    ├── NotFound                          (also LookupError)
    │   └── AmbiguousProcessId            (.prefix, .candidates)
    ├── NameTaken                         (.name, .process_id: the live holder's newest attempt)
    ├── PortTaken                         (.port, .process_id)
    ├── LeaseLost
    ├── AuthorityRejected
    ├── OwnerMismatch
    ├── IdempotencyCollision
    ├── DeliveryError
    │   ├── LoopNotFound
    │   ├── UnsupportedLoop
    │   └── DeliveryStopped
    ├── ExecutionError
    │   ├── SpawnError                    (also OSError)
    │   ├── StdinError                    (__cause__ is the BrokenPipeError)
    │   └── Interrupted
    ├── InputRefused                      (send/attach: no terminal or input pipe; ended)
    ├── SupervisorClosed
    ├── CipherError                       (env values: no key, a wrong or malformed key)
    └── StoreError                        (the store failed; never a driver exception)
        ├── StoreURLError                 (a URL that names no usable store)
        ├── StoreUnavailable              (retry later: connection lost, locked, disk full)
        ├── StoreCorrupt                  (.process_id, .file: stored data that cannot be decoded)
        ├── StoreReadOnly                 (the ledger's folder or file cannot be written here)
        ├── SchemaTooNew                  (.found, .known: a ledger a newer procledger wrote)
        └── WriteConflict                 (another writer appended first; retried inside)

The host agent's, not exported from the package root (the CLI reports them; a library
supervises in-process, §18): ``AgentSocketError`` (a socket folder with the wrong mode or owner,
a path too long, a second agent) and its subclasses ``AgentNotRunning``, ``AgentTimeout``,
``AgentStartError`` (it could not be started; its log named) and ``AgentError`` (an error
reply: ``.type``, ``.message``), raised by ``procledger.agent``.
"""

from __future__ import annotations


class ProcledgerError(Exception):
    """Root of every error procledger raises on purpose."""


class ProcessLifecycleValidationError(ProcledgerError):
    """A lifecycle tuple, notification or field rule was broken; ``field`` names the culprit.

    Deliberately not a ``ValueError``: pydantic wraps ``ValueError`` raised inside validators in
    its own ``ValidationError``, and the notification contract promises this error unwrapped.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class RegistrationError(ProcledgerError):
    """A registration that is well-formed but refused by the registry (e.g. env_ref unknown)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class FilterError(ProcledgerError, ValueError):
    """A list filter with an unknown key or a value of the wrong type."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"filter key {key!r}: {message}")
        self.key = key


class OptionError(ProcledgerError, ValueError):
    """A readiness, wait or restart option that cannot mean anything: a negative or malformed
    duration, a port out of range, a regex that does not compile (docs/design.md §15).
    ``option`` names it (``--ready-port``, ``backoff_initial_s``...); refused before anything is
    recorded."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


class ServiceFileError(ProcledgerError):
    """A service file (``procledger.toml``) that cannot be read or means nothing. Where a place
    in it is at fault the one-line message starts ``PATH:LINE:COL:`` (then the key and what is
    wrong), as a compiler's does, so an editor or a person goes straight there; ``line`` and
    ``column`` (from 1) are ``None`` only when the file as a whole is at fault (missing,
    unreadable), and the message then names it."""

    def __init__(
        self, path: str, message: str, *, line: int | None = None, column: int | None = None
    ) -> None:
        super().__init__(message if line is None else f"{path}:{line}:{column}: {message}")
        self.path = path
        self.line = line
        self.column = column


class InvalidTransition(ProcledgerError):
    """The lifecycle table has no transition ``from_state --kind--> to_state``."""

    def __init__(
        self, from_state: str, kind: str, to_state: str, *, process_id: str | None = None
    ) -> None:
        where = f"process {process_id!r}: " if process_id is not None else ""
        super().__init__(
            f"{where}no {kind!r} transition from {from_state!r} to {to_state!r} "
            "(see `procledger table`)"
        )
        self.from_state = from_state
        self.kind = kind
        self.to_state = to_state
        self.process_id = process_id


class AlreadyTerminal(InvalidTransition):
    """The process already ended; only an identical repeat of its terminal is accepted.

    A subclass of ``InvalidTransition``: a terminal state accepts no transition at all, and a
    caller that only handles the general case still catches this one. Its message says so
    plainly (a stop of an ended process is not a puzzle about the state table).
    """

    def __init__(
        self, from_state: str, kind: str, to_state: str, *, process_id: str | None = None
    ) -> None:
        super().__init__(from_state, kind, to_state, process_id=process_id)
        who = f"process {process_id!r}" if process_id is not None else "the process"
        self.args = (f"{who} has already ended ({from_state}): {kind!r} is refused",)


class ReplayConflict(ProcledgerError):
    """An idempotency key (event id, replay key, external ref) was reused with other content."""


class RegistrationConflict(ProcledgerError):
    """The id is registered already, with a different registration."""

    def __init__(self, process_id: str, existing_hash: str, new_hash: str) -> None:
        super().__init__(
            f"process {process_id!r} is registered with hash {existing_hash}; "
            f"the new registration hashes to {new_hash}: use another id"
        )
        self.process_id = process_id
        self.existing_hash = existing_hash
        self.new_hash = new_hash


class UndeclaredEventType(ProcledgerError):
    """A producer event whose type the registration did not declare."""


class NotFound(ProcledgerError, LookupError):
    """No such process, handle, env_ref or loop (or not visible to the asker)."""


class OutputUnavailable(NotFound):
    """A process whose output cannot be read here: run without capture, kept on another host,
    or deleted (docs/design.md §14). ``tail`` holds the stored last bytes per stream, if any."""

    def __init__(self, message: str, tail: dict[str, bytes] | None = None) -> None:
        super().__init__(message)
        self.tail = tail or {}


class AmbiguousProcessId(NotFound):
    """An id prefix that matches more than one process; ``candidates`` lists some of them
    (``more``: and there are others, which the message says)."""

    def __init__(self, prefix: str, candidates: list[str], *, more: bool = False) -> None:
        shown = ", ".join(candidates) + (" and more" if more else "")
        super().__init__(f"process id prefix {prefix!r} is ambiguous: it matches {shown}")
        self.prefix = prefix
        self.candidates = candidates


class NameTaken(ProcledgerError):
    """A service name another live service holds (docs/design.md §19): ``process_id`` is the
    newest attempt of the holder, which a second ``run --name`` answers with instead of
    starting another. Nothing was written."""

    def __init__(self, name: str, process_id: str) -> None:
        super().__init__(f"service {name!r} is running as process {process_id!r}")
        self.name = name
        self.process_id = process_id


class PortTaken(ProcledgerError):
    """A port that cannot be leased: another live process of the ledger holds it
    (``process_id``), something else on this host is bound to it, or (``auto``) every port of
    the range is; nothing was written."""

    def __init__(self, message: str, port: int | None = None, process_id: str | None = None):
        super().__init__(message)
        self.port = port
        self.process_id = process_id


class LeaseLost(ProcledgerError):
    """The lease is missing, expired or superseded: this writer no longer owns the process."""


class AuthorityRejected(ProcledgerError):
    """A terminal write without a lease whose authority is missing or not allowed."""


class OwnerMismatch(ProcledgerError):
    """A notification addressed to another session than the notifier's."""


class IdempotencyCollision(ProcledgerError):
    """A command id already journalled with a different payload."""


class DeliveryError(ProcledgerError):
    """Why a notification was not dispatched to a loop (carried in ``Delivery.error``)."""


class LoopNotFound(DeliveryError):
    """No loop with that id is attached to the session."""


class UnsupportedLoop(DeliveryError):
    """The loop does not accept process notifications (a foreign engine)."""


class DeliveryStopped(DeliveryError):
    """The loop's inbox is full; the journal keeps the command for a retry with the same id."""


class ExecutionError(ProcledgerError):
    """Running a child process failed."""


class SpawnError(ExecutionError, OSError):
    """The command could not be started; nothing runs."""


class StdinError(ExecutionError):
    """The input could not be written whole; ``__cause__`` is the ``BrokenPipeError``."""


class InputRefused(ProcledgerError):
    """The process takes no input from ``send``/``attach``: it was started without a terminal
    or an input pipe, it ended, or no agent here holds it (docs/design.md §20.2)."""


class Interrupted(ExecutionError):
    """Cancelled: the tree was stopped, the child reaped and every worker joined."""


class SupervisorClosed(ProcledgerError):
    """The supervisor is shutting down and admits no new process."""


class StoreError(ProcledgerError):
    """The store failed. Its subclasses say what the caller can do about it; no exception of
    sqlite3, psycopg or eventsourcing's persistence layer escapes a public method."""


class StoreURLError(StoreError, ValueError):
    """A store URL that is malformed or names nothing that can be opened; fix the URL."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or written right now (connection lost, server restarting,
    database locked past its wait, disk full): the same call may succeed later."""


class StoreCorrupt(StoreError):
    """Stored data that cannot be decoded; ``process_id`` names its process when known, and
    the message names the row. Other processes stay readable. ``file`` names a SQLite file
    that is itself damaged (a malformed page), when that is what was found."""

    def __init__(
        self, message: str, *, process_id: str | None = None, file: str | None = None
    ) -> None:
        super().__init__(message)
        self.process_id = process_id
        self.file = file


class StoreReadOnly(StoreError):
    """The ledger cannot be used here because its folder or a file of it cannot be written (a
    folder of mode 0555, a read-only mount): a writer's open, or a read-only open of a ledger
    whose write-ahead log SQLite could read only by making a file there. Waiting will not
    help; the message names the folder or file and the way forward."""


class SchemaTooNew(StoreError):
    """The ledger's tables are of a newer schema version than this procledger knows
    (``found`` > ``known``): a newer release migrated them, and this code might misread or
    damage what it does not know. Neither reading nor writing is attempted; upgrade procledger.
    The message names the ledger and both versions."""

    def __init__(self, message: str, *, found: int, known: int) -> None:
        super().__init__(message)
        self.found = found
        self.known = known


class WriteConflict(StoreError):
    """Another writer appended to the same log first. Commands retry these themselves (see
    ``procledger.application.retry``); a caller only sees one when retries ran out."""


class CipherError(ProcledgerError):
    """An environment cannot be encrypted or decrypted: no key, a wrong key, or a malformed
    ``PROCLEDGER_CIPHER_KEY``. The message names the env ref, never the key."""


class AgentSocketError(ProcledgerError):
    """The host agent's control socket cannot be used: its folder has the wrong mode or owner,
    its path is too long for ``sun_path``, or another agent already answers on it
    (docs/design.md §18.3)."""


class AgentNotRunning(AgentSocketError):
    """No agent answers on the socket: the file is missing, or nobody accepts on it (a stale
    file left by an agent that died). The caller falls back to the ledger."""


class AgentTimeout(AgentSocketError):
    """The agent accepted the connection but did not answer in time: it may be busy or hung,
    so the caller must not assume the request was or was not carried out."""


class AgentStartError(AgentSocketError):
    """The agent could not be started, or cannot serve this ledger (an in-memory one): the
    message says why and where its log is."""


class AgentError(AgentSocketError):
    """The agent answered with an error reply: ``.type`` names its kind (``BadJson``,
    ``UnknownOp``, a handler's exception class, ...) and ``.message`` says what went wrong."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(f"{type_}: {message}")
        self.type = type_
        self.message = message
