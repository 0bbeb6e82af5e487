"""Process notifications: journalled before dispatch, deduplicated by command id.

``Notifier`` (one per session) validates a ``ProcessCompletionNotification`` or a
``ProcessInputNotification``, journals it in the registry under its command id, and dispatches
it into the owning loop's bounded ``LoopInbox``; each attempt answers a ``Delivery`` with a
``NotificationDisposition``.
"""

from __future__ import annotations

from procledger.domain.notification import ProcessCompletionNotification, ProcessInputNotification
from procledger.notifications.delivery import Delivery, NotificationDisposition
from procledger.notifications.inbox import LoopInbox
from procledger.notifications.journal import Journal, JournalAppend, JournalEntry
from procledger.notifications.notifier import Notifier

__all__ = [
    "Delivery",
    "Journal",
    "JournalAppend",
    "JournalEntry",
    "LoopInbox",
    "NotificationDisposition",
    "Notifier",
    "ProcessCompletionNotification",
    "ProcessInputNotification",
]
