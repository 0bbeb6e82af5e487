"""Output capture by files the child writes itself (docs/design.md §14.1, §18).

A ``Capture`` reads the child's pipes; when the reader dies, a chatty child meets ``SIGPIPE`` on
its next write and dies with it. A host agent must never be its children's single point of
failure, so its children get two files instead (``adapters.direct_output``): opened here,
handed to the child as its fd 1 and 2, and closed on our side at once. Nothing sits between
the child and the disk. Whoever keeps the run follows the files (``Follower``) for ``logs -f``,
an output readiness probe and the bound on kept bytes; at the end the summary is read back from
the files, so a restarted agent that adopts the child summarises it the same way.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from procledger.adapters.direct_output import OutputFiles, open_output_files
from procledger.application.outbox import this_host_id
from procledger.domain.records import OutputSummary
from procledger.supervisor.capture import capture_folder

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["FileCapture", "close_descriptors", "open_file_capture", "recorded_limit"]

log = logging.getLogger("procledger.supervisor")

Feed = Callable[[bytes], None]


class FileCapture:
    """One run's output files: opened for its spawn, followed while it runs, summarised at
    its end. ``feeds``: what new bytes of each stream are handed to (an output readiness
    probe), by whoever follows the files."""

    def __init__(self, folder: Path | None, limit: int | None, host_id: str | None) -> None:
        """``limit`` None: not known (an adopted run whose files lack it): nothing is dropped,
        and the summary says the limit is unknown."""
        self.folder = folder
        self.limit = limit
        self.host_id = host_id
        self.feeds: tuple[Feed, Feed] | None = None
        self._stopped: str | None = None if folder is not None else "no output folder"
        self._files: OutputFiles | None = None
        self._summary: tuple[OutputSummary, dict[str, str]] | None = None

    def open(self) -> tuple[int, int] | None:
        """The child's stdout and stderr descriptors (the caller closes them once spawned);
        ``None`` -- the child's output then goes to ``/dev/null`` -- when nothing is kept or
        the files cannot be made (the reason kept for the ledger)."""
        if self.folder is None or self.limit == 0:
            return None
        try:
            self.folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            files = open_output_files(self.folder)
            (self.folder / LIMIT_NAME).write_text(f"{self.limit}\n")
            return files
        except OSError as error:
            self._stopped = f"output files could not be made: {error}"
            log.warning("output not captured in %s: %s", self.folder, error)
            return None

    def files(self) -> OutputFiles | None:
        """The files as the follower keeps them (bound, kept ranges); ``None`` if there are
        none to keep."""
        if self._files is None and self._stopped is None and self.limit != 0:
            try:
                assert self.folder is not None
                limit = sys.maxsize if self.limit is None else self.limit
                self._files = OutputFiles(self.folder, limit)
            except OSError as error:
                self._stopped = f"output files unreadable: {error}"
        return self._files

    def finish(self) -> tuple[OutputSummary, dict[str, str]]:
        """The summary and the base64 tails for the ledger, read from the files now (the
        first call's answer is kept: every way out of a run may call this)."""
        if self._summary is None:
            self._summary = self._summarise()
        return self._summary

    def _summarise(self) -> tuple[OutputSummary, dict[str, str]]:
        files = self.files()
        if files is None:
            folder = None if self.limit == 0 else self.folder
            summary = OutputSummary(
                capture=True,
                host_id=self.host_id,
                folder=None if folder is None else str(folder),
                limit=self.limit,
                stopped=self._stopped,
            )
            return summary, {}
        files.enforce_bound()
        facts = files.summarize()
        fields = facts.summary_fields(self.host_id) | {"limit": self.limit}
        return OutputSummary.model_validate(fields), facts.tails()


LIMIT_NAME = "limit"
"""The bound a run's files were given, beside them: the ledger does not keep it, and an agent
that adopts the run after a crash must keep the same bound."""


def recorded_limit(folder: Path) -> int | None:
    """The bound written beside a run's files; ``None`` when missing or unreadable."""
    try:
        return int((folder / LIMIT_NAME).read_text().strip())
    except (OSError, ValueError):
        return None


def open_file_capture(
    registry: ProcessRegistry, output_dir: Path | None, process_id: str, limit: int
) -> FileCapture:
    """A run's file capture in the folder every reader of this store looks in (by store and
    process id) under ``output_dir`` (``<state dir>/output`` when None), as ``open_capture``
    names it; a folder that cannot be made leaves the capture stopped and the run goes on."""
    return FileCapture(capture_folder(registry, output_dir, process_id), limit, this_host_id())


def close_descriptors(fds: tuple[int, int] | None) -> None:
    """Our copies of the child's output files, once the child holds its own."""
    for fd in fds or ():
        os.close(fd)
