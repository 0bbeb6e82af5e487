"""Each stored event's kind as a caller sees it, and the shape version the code writes: by the
event class's name, with no class behind it, so the CLI's fast path reads an event history as
the registry does without loading the aggregate (docs/design.md §8.1). ``domain.rendering``
maps the classes through this table, and a test holds the versions to the classes'.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EVENT_CLASSES", "PRODUCER_EVENT", "TOPIC_PREFIX"]

TOPIC_PREFIX: Final = "procledger:Process."
"""How every stored event's topic begins (the aggregate's nested classes)."""
PRODUCER_EVENT: Final = "ProducerEvent"
"""A producer's own event: logged under its declared type, its payload as given."""

EVENT_CLASSES: Final[dict[str, tuple[str, int]]] = {
    "Registered": ("registered", 1),
    "Started": ("started", 2),
    "Backgrounded": ("backgrounded", 2),
    "StopRequested": ("stop_requested", 1),
    "Completed": ("completed", 2),
    "Lost": ("lost", 1),
    "Abandoned": ("abandoned", 1),
    "FirstStarted": ("first_started", 1),
    "AbandonRequested": ("abandon_requested", 1),
    "WaitSet": ("wait_set", 1),
    "WaitCleared": ("wait_cleared", 1),
    "ExternalRefSet": ("external_ref_set", 1),
    "WakeTargetCleared": ("wake_target_cleared", 1),
    "OutputTruncated": ("output_truncated", 1),
    "OutputStopped": ("output_stopped", 1),
    "OutputCaptured": ("output_captured", 1),
    "Ready": ("ready", 1),
    "CrashLoop": ("crash_loop", 1),
    "ServiceStopRequested": ("service_stop_requested", 1),
    "OrphanStopped": ("orphan_stopped", 1),
    "InputSent": ("input_sent", 1),
    "WaitingForInput": ("waiting_for_input", 1),
    "InputWaitEnded": ("input_wait_ended", 1),
    "ResourcesUsed": ("resources_used", 1),
}
"""Class name -> (kind, the class's ``class_version``)."""
