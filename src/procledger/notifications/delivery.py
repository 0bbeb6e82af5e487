"""What a notification attempt came to: a disposition and, when refused, its typed cause."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import final

from procledger.domain.errors import DeliveryError, IdempotencyCollision


class NotificationDisposition(StrEnum):
    """How the owning loop's side answered a completion notification.

    Retry only ``STOPPED``, and only with the same command id and the identical notification.
    """

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    COLLISION = "collision"
    STOPPED = "stopped"


@final
@dataclass(frozen=True, slots=True)
class Delivery:
    """``error`` is the typed cause for ``STOPPED`` (a ``DeliveryError``: ``LoopNotFound``,
    ``UnsupportedLoop`` or ``DeliveryStopped``) and ``COLLISION`` (``IdempotencyCollision``);
    ``None`` for ``ACCEPTED`` and ``DUPLICATE``."""

    disposition: NotificationDisposition
    error: DeliveryError | IdempotencyCollision | None = None


ACCEPTED = Delivery(NotificationDisposition.ACCEPTED)
DUPLICATE = Delivery(NotificationDisposition.DUPLICATE)


def stopped(error: DeliveryError) -> Delivery:
    return Delivery(NotificationDisposition.STOPPED, error)


def collision(error: IdempotencyCollision) -> Delivery:
    return Delivery(NotificationDisposition.COLLISION, error)
