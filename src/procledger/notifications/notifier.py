"""One session's notifier: validate, route, journal, then dispatch (docs/design.md §4).

Both kinds of process notification — a completion, and a wait for input (§4.4) — take the same
path, so a loop sees them in one order and a retry of either deduplicates on its command id.
The order is the contract:

1. validate the notification again (a ``model_construct``ed object is never trusted) and check
   it belongs to this session — failures raise and write nothing;
2. find the loop — unknown or foreign loops are ``STOPPED`` before anything is written;
3. journal the command under its id — an identical retry writes nothing more, a different
   payload is a ``COLLISION`` and is never dispatched, any other failure is raised;
4. dispatch into the loop's bounded inbox — ``DUPLICATE``, ``STOPPED`` (full) or ``ACCEPTED``.

Without a registry the notifier is headless: there is no journal, and de-duplication rests on
the inbox alone.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

from procledger.domain.errors import (
    IdempotencyCollision,
    LoopNotFound,
    NotFound,
    OwnerMismatch,
    ProcessLifecycleValidationError,
    UnsupportedLoop,
)
from procledger.domain.notification import (
    Notification,
    ProcessCompletionNotification,
    ProcessInputNotification,
)
from procledger.notifications.delivery import DUPLICATE, Delivery, collision, stopped
from procledger.notifications.inbox import LoopInbox
from procledger.notifications.journal import Journal


def _uuid(field: str, value: uuid.UUID | str) -> uuid.UUID:
    try:
        parsed = value if isinstance(value, uuid.UUID) else uuid.UUID(value)
    except (TypeError, ValueError, AttributeError):
        raise ProcessLifecycleValidationError(field, f"not a UUID: {value!r}") from None
    if parsed.int == 0:
        raise ProcessLifecycleValidationError(field, "must not be the zero UUID")
    return parsed


@dataclass(frozen=True, slots=True)
class _Loop:
    inbox: LoopInbox
    accepts_process_notifications: bool


class Notifier:
    """Delivers process notifications (completions, waits for input) to the loops of one session.

    ``registry`` is the ``ProcessRegistry`` whose journal makes delivery durable (or any object
    with its ``journal_*`` methods); ``None`` makes a headless notifier. Thread-safe.
    """

    def __init__(self, registry: Journal | None, session_id: uuid.UUID | str) -> None:
        self._journal = registry
        self._session_id = _uuid("session_id", session_id)
        self._loops: dict[uuid.UUID, _Loop] = {}
        self._lock = threading.Lock()

    @property
    def session_id(self) -> uuid.UUID:
        """The session whose loops this notifier serves; notifications for others are refused."""
        return self._session_id

    @property
    def headless(self) -> bool:
        """Whether nothing is journalled: delivery is then only as durable as the inbox."""
        return self._journal is None

    def __repr__(self) -> str:
        kind = "headless" if self._journal is None else "journalled"
        return f"Notifier(session_id={self._session_id}, {kind}, loops={len(self._loops)})"

    # -- loops ---------------------------------------------------------------------------------

    def add_loop(
        self,
        loop_id: uuid.UUID | str,
        inbox: LoopInbox | None = None,
        *,
        accepts_process_notifications: bool = True,
    ) -> LoopInbox:
        """Attach a loop and return its inbox (a new ``LoopInbox()`` when none is given).

        A loop that does not accept process notifications (a foreign engine) is known, but
        every notification for it is ``STOPPED`` with ``UnsupportedLoop``.
        """
        lid = _uuid("loop_id", loop_id)
        inbox = LoopInbox() if inbox is None else inbox
        with self._lock:
            existing = self._loops.get(lid)
            if existing is not None and existing != _Loop(inbox, accepts_process_notifications):
                raise ValueError(f"loop {lid} is already attached to session {self._session_id}")
            inbox.attach(self, lid)
            self._loops[lid] = _Loop(inbox, accepts_process_notifications)
        return inbox

    def remove_loop(self, loop_id: uuid.UUID | str) -> None:
        """Detach a loop: later notifications for it are ``STOPPED`` with ``LoopNotFound``."""
        lid = _uuid("loop_id", loop_id)
        with self._lock:
            self._loops.pop(lid, None)

    # -- delivery ------------------------------------------------------------------------------

    def notify_process_completion(self, notification: ProcessCompletionNotification) -> Delivery:
        """Validate, route, journal, dispatch — in that order (see the module docstring).

        The command is journalled under its ``command_id`` before the loop sees it, so nothing
        is lost when the loop is full, stopped or gone; an identical retry is ``DUPLICATE``
        once the loop has consumed it, and never written twice.

        Returns:
            A ``Delivery`` whose disposition says what happened (accepted, duplicate, stopped
            with the reason, or rejected by a full inbox).

        Raises:
            ProcessLifecycleValidationError: the notification is invalid (nothing is written).
            OwnerMismatch: it is addressed to another session (nothing is written).
            StoreError: the journal could not be written (nothing is dispatched).
        """
        return self._deliver(ProcessCompletionNotification.model_validate(notification))

    def notify_input_wait(self, notification: ProcessInputNotification) -> Delivery:
        """Tell the loop its process blocks waiting for input; the same steps, journal and
        answers as ``notify_process_completion`` (docs/design.md §4.4), so a watcher that sees
        the same wait twice may simply send it again under the same command id.

        Returns:
            A ``Delivery``: accepted, duplicate (already pending or consumed), collision (the
            command id was used for another payload, of either kind) or stopped, with the reason.

        Raises:
            ProcessLifecycleValidationError: the notification is invalid (nothing is written).
            OwnerMismatch: it is addressed to another session (nothing is written).
            StoreError: the journal could not be written (nothing is dispatched).
        """
        return self._deliver(ProcessInputNotification.model_validate(notification))

    def _deliver(self, checked: Notification) -> Delivery:
        """Steps 1 (the owner) to 4 for a notification validated again a moment ago."""
        if checked.session_id != self._session_id:
            raise OwnerMismatch(
                f"command {checked.command_id} is addressed to session {checked.session_id}, "
                f"not to this notifier's session {self._session_id}"
            )
        routed = self._route(checked)
        if isinstance(routed, Delivery):
            return routed
        if self._journal is not None:
            try:
                appended = self._journal.journal_append_checked(checked)
            except IdempotencyCollision as error:
                return collision(error)
            if appended.consumed:
                return DUPLICATE
        return routed.offer(checked)

    def _route(self, notification: Notification) -> LoopInbox | Delivery:
        lid = notification.loop_id
        with self._lock:
            loop = self._loops.get(lid)
        if loop is None:
            return stopped(
                LoopNotFound(
                    f"loop {lid} is not attached to session {self._session_id} "
                    f"(command {notification.command_id})"
                )
            )
        if not loop.accepts_process_notifications:
            return stopped(
                UnsupportedLoop(
                    f"loop {lid} does not accept process notifications "
                    f"(command {notification.command_id})"
                )
            )
        return loop.inbox

    # -- restore -------------------------------------------------------------------------------

    def undelivered(self, loop_id: uuid.UUID | str) -> list[Notification]:
        """This session's journalled notifications for ``loop_id`` not yet consumed, in journal
        order (accepted-but-unconsumed and stopped ones alike). Headless: the attached inbox's
        pending notifications (nothing else was kept)."""
        lid = _uuid("loop_id", loop_id)
        if self._journal is not None:
            return self._journal.journal_undelivered(self._session_id, lid)
        with self._lock:
            loop = self._loops.get(lid)
        return [] if loop is None else loop.inbox.pending()

    def restore_loop(self, loop_id: uuid.UUID | str) -> list[Delivery]:
        """Seed an attached loop's inbox with its undelivered notifications, without journalling
        them again; one ``Delivery`` per notification, in journal order."""
        deliveries = []
        for notification in self.undelivered(loop_id):
            routed = self._route(notification)
            deliveries.append(
                routed if isinstance(routed, Delivery) else routed.offer(notification)
            )
        return deliveries

    def record_consumed(self, loop_id: uuid.UUID, command_id: uuid.UUID, *, known: bool) -> None:
        """Called by an attached inbox's ``consume``: journal it before the inbox forgets it."""
        journal = self._journal
        if journal is not None and journal.journal_mark_consumed(
            self._session_id, loop_id, command_id
        ):
            return
        if not known:
            raise NotFound(
                f"command {command_id} is neither pending nor journalled for loop {loop_id} "
                f"of session {self._session_id}"
            )
