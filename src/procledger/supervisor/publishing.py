"""Completion notifications of supervised runs (docs/design.md §4, §6.2): published only after
the terminal released the lease, and -- by ``restore`` -- again with the handle and command id
the run was started with, so that a receiver that already had it can tell.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Protocol

from procledger.domain.errors import ProcledgerError
from procledger.domain.notification import ProcessCompletionNotification
from procledger.domain.records import ProcessRecord
from procledger.supervisor.requests import NotifyTo

if TYPE_CHECKING:
    from procledger.application.registry import ProcessRegistry

__all__ = ["CompletionNotifier", "Publisher"]

log = logging.getLogger("procledger.supervisor")


class CompletionNotifier(Protocol):
    """What the Supervisor needs of a notifier (``procledger.notifications.Notifier``)."""

    def notify_process_completion(self, notification: ProcessCompletionNotification) -> Any: ...


class Publisher:
    """Publishes completion notifications through ``notifier`` (none without one)."""

    def __init__(self, registry: ProcessRegistry, notifier: CompletionNotifier | None) -> None:
        self._registry, self._notifier = registry, notifier

    def publish(
        self,
        command_id: uuid.UUID,
        handle: str,
        notify_to: NotifyTo | None,
        record: ProcessRecord,
    ) -> None:
        """Publish the completion notification of ``record``'s terminal. A refused delivery is
        the notifier's to report; the terminal stands either way."""
        notifier = self._notifier
        if notifier is None or notify_to is None or record.reason is None:
            return
        notification = ProcessCompletionNotification(
            command_id=command_id,
            session_id=notify_to[0],
            loop_id=notify_to[1],
            process_handle=handle,
            state=record.state,
            reason=record.reason,
        )
        try:
            delivery = notifier.notify_process_completion(notification)
        except ProcledgerError as error:
            log.warning("process %r: completion notification refused: %s", record.id, error)
            return
        if getattr(delivery, "error", None) is not None:
            log.info("process %r: completion notification %s", record.id, delivery)

    def publish_again(self, written: ProcessRecord) -> None:
        """Publish a restored process's notification with its original handle and command id
        (only where ``start`` saved them: a start that asked for no notification saved none)."""
        row = self._registry.handle_row(written.id)
        if row is None:
            return
        notify_to = (
            None if row.session_id is None or row.loop_id is None else (row.session_id, row.loop_id)
        )
        self.publish(row.command_id, row.handle, notify_to, written)
