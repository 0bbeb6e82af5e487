"""The local durable outbox: an outcome the Supervisor knows, kept on this host's disk until the
store has accepted it (docs/design.md §6.3).

One small JSON file per process, named by a hash of the store and the process id, so a retried
put replaces its own entry and entries of two ledgers never collide. A put is crash-safe: the
entry is written to a temporary file in the same folder, fsynced, renamed over the final name
and the folder fsynced, so after a crash the file is either the whole entry or absent (a
removal is not fsynced: an entry that comes back is delivered as a no-op). Files are
``0600`` in a ``0700`` folder (``adapters/state_dir.py``).

The outbox only stores; ``application/outbox.py`` decides when an entry is delivered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from procledger.adapters import state_dir
from procledger.domain.leases import LeaseOwner
from procledger.domain.outcome import Outcome
from procledger.domain.records import OutputSummary

if TYPE_CHECKING:
    pass

__all__ = ["Outbox", "OutboxEntry", "default_outbox"]

FORMAT: Final = 1
"""The entry format; an entry of another format is left alone (a newer procledger's)."""

_COPIED: Final = ("exit_code", "diagnostic", "signal")
"""The outcome's fields an entry keeps as they are; the others change form (members to their
words, the output summary to its JSON)."""

_SUFFIX: Final = ".json"
_log = logging.getLogger("procledger.outbox")


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One terminal the store has not accepted yet: everything needed to record it later with
    the same event id, and to take over the lease of the owner that could not.

    ``store`` names the ledger (``application.outbox.store_key``), ``host_id`` the PID
    namespace whose processes it describes; ``owner`` is the lease holder that wrote it."""

    store: str
    host_id: str
    process_id: str
    registration_hash: str
    event_id: str
    state: str
    reason: str
    owner: dict[str, Any]
    written_at_ms: int
    exit_code: int | None = None
    diagnostic: str | None = None
    signal: int | None = None
    survivors: list[int] = field(default_factory=list)
    output: dict[str, Any] | None = None
    tails: dict[str, str] | None = None
    format: int = FORMAT

    @classmethod
    def of(
        cls,
        outcome: Outcome,
        *,
        store: str,
        host_id: str,
        process_id: str,
        registration_hash: str,
        event_id: str,
        owner: dict[str, Any],
        written_at_ms: int,
    ) -> OutboxEntry:
        """The entry that saves ``outcome``: its fields in the stored JSON form entries have
        always had (files an older version left must still load, docs/design.md §6.3).

        Raises:
            ValueError: ``outcome`` has a ``value``: an entry has no field for one (a
                supervised run never has one; a runner's is recorded directly).
        """
        if outcome.value is not None:
            raise ValueError("an outbox entry cannot carry an outcome's value")
        output = outcome.output
        return cls(
            store=store,
            host_id=host_id,
            process_id=process_id,
            registration_hash=registration_hash,
            event_id=event_id,
            state=outcome.state.value,
            reason=outcome.reason.value,
            owner=owner,
            written_at_ms=written_at_ms,
            survivors=list(outcome.survivors),
            output=None if output is None else output.model_dump(mode="json"),
            tails=None if outcome.tails is None else dict(outcome.tails),
            **{name: getattr(outcome, name) for name in _COPIED},
        )

    def outcome(self) -> Outcome:
        """The outcome this entry saved, checked again (a file may be damaged or edited).

        Raises:
            ProcessLifecycleValidationError: the entry's fields are not a valid completion.
        """
        output = None if self.output is None else OutputSummary.model_validate(self.output)
        return Outcome.of(
            self.state,
            self.reason,
            survivors=self.survivors,
            output=output,
            tails=self.tails,
            **{name: getattr(self, name) for name in _COPIED},
        )

    @property
    def lease_owner(self) -> LeaseOwner:
        """The owner that held the process's lease when the outcome was known."""
        return LeaseOwner.model_validate(self.owner)

    def to_json(self) -> bytes:
        """The file's bytes. The fields are already JSON values, so they are encoded as they
        are: ``asdict`` deep-copied every list and dict first, for nothing, on every run."""
        return orjson.dumps(
            {name: getattr(self, name) for name in _FIELDS}, option=orjson.OPT_SORT_KEYS
        )

    @classmethod
    def from_json(cls, data: bytes) -> OutboxEntry:
        """Raises ``ValueError``/``TypeError``/``KeyError`` for a damaged file."""
        fields = orjson.loads(data)
        if not isinstance(fields, dict):
            raise ValueError("an outbox entry is a JSON object")
        return cls(**fields)


_FIELDS: Final = tuple(entry_field.name for entry_field in dataclasses.fields(OutboxEntry))


class Outbox:
    """A folder of outbox entries. Safe to share between threads and processes: every change
    is one rename or one unlink."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"Outbox({str(self.directory)!r})"

    def path_of(self, store: str, process_id: str) -> Path:
        """Where the entry of ``process_id`` in ``store`` lives."""
        digest = hashlib.sha256(f"{store}\x00{process_id}".encode()).hexdigest()[:40]
        return self.directory / f"{digest}{_SUFFIX}"

    def put(self, entry: OutboxEntry) -> Path:
        """Write ``entry`` durably (temp file, fsync, rename, fsync of the folder).

        Raises:
            OSError: the entry could not be made durable (nothing half-written is left).
        """
        final = self.path_of(entry.store, entry.process_id)
        temp = final.with_name(f".{final.stem}.{os.getpid()}.{id(entry):x}.tmp")
        data = entry.to_json()
        fd = self._create(temp)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        _fsync_folder(self.directory)
        return final

    def _create(self, temp: Path) -> int:
        """A new private file; the folder is made only when it is missing (not asked of the
        file system before every put: a put is on every supervised run's path)."""
        flags, mode = os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
        try:
            return os.open(temp, flags, mode)
        except FileNotFoundError:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            return os.open(temp, flags, mode)

    def remove(self, entry: OutboxEntry) -> None:
        """Delete ``entry`` once the store has accepted it (or no longer wants it); missing
        is fine. A failure is logged: a stale entry is only delivered again, idempotently.

        The unlink is not fsynced: an entry a power loss brings back names a process whose
        terminal the store already holds, and a delivery deletes such an entry without
        writing anything (``application/outbox.py``). The folder fsync cost as much as one
        store commit, on every supervised run."""
        try:
            self.path_of(entry.store, entry.process_id).unlink(missing_ok=True)
        except OSError as error:
            _log.warning(
                "outbox %s: could not delete the entry of %r: %s",
                self.directory,
                entry.process_id,
                error,
            )

    def entries(self, store: str | None = None) -> list[OutboxEntry]:
        """The readable entries (of ``store`` if given), oldest first. A damaged file is
        logged and skipped, never deleted: it may be the only copy of an outcome."""
        found = []
        for path in self._files():
            try:
                entry = OutboxEntry.from_json(path.read_bytes())
            except FileNotFoundError:
                continue  # delivered meanwhile
            except (OSError, ValueError, TypeError, KeyError) as error:
                _log.warning(
                    "outbox %s: skipping damaged entry %s: %s", self.directory, path.name, error
                )
                continue
            if entry.format == FORMAT and (store is None or entry.store == store):
                found.append(entry)
        return sorted(found, key=lambda e: (e.written_at_ms, e.process_id))

    def _files(self) -> Iterator[Path]:
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(_SUFFIX) and not name.startswith("."):
                yield self.directory / name


def default_outbox() -> Outbox:
    """The user's outbox: ``<state dir>/outbox`` (created ``0700``).

    Raises:
        OSError: the state directory cannot be created.
    """
    return Outbox(state_dir.subdirectory("outbox"))


def _write_all(fd: int, data: bytes) -> None:
    """``data`` to ``fd`` whole: one ``os.write`` may write less."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_folder(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable (a no-op where folders cannot be
    opened, as on some platforms)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
