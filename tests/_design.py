"""docs/design.md's lifecycle table (§2.1) and transitions (§2.2), written out once by hand for the
tests that compare the code with the design (``domain/test_lifecycle.py``, ``test_cli_table.py``).
"""

from __future__ import annotations

# §2.1, written out: one (kind, state, reason) per valid triple; None where the table says none.
DESIGN_ROWS: list[tuple[str, str, str | None]] = [
    ("started", "running", None),
    ("backgrounded", "running", None),
    ("stop_requested", "starting", "interrupted"),
    ("stop_requested", "starting", "terminated"),
    ("stop_requested", "starting", "killed"),
    ("stop_requested", "running", "interrupted"),
    ("stop_requested", "running", "terminated"),
    ("stop_requested", "running", "killed"),
    ("completed", "exited", "exited"),
    ("completed", "failed", "failed"),
    ("completed", "failed", "ready_timeout"),
    ("completed", "timed_out", "timed_out"),
    ("completed", "interrupted", "interrupted"),
    ("completed", "terminated", "terminated"),
    ("completed", "terminated", "runner_shutdown"),
    ("completed", "terminated", "output_limit"),
    ("completed", "killed", "killed"),
    ("completed", "killed", "runner_shutdown"),
    ("completed", "killed", "output_limit"),
    ("completed", "signaled", "signaled"),
    ("lost", "lost_on_restore", "lost_on_restore"),
    ("abandoned", "abandoned", "owner_drain"),
    ("abandoned", "abandoned", "owner_dead"),
    ("abandoned", "abandoned", "abandon_requested"),
]

# §2.2, written out: (from_state, kind, to_state).
DESIGN_TRANSITIONS: set[tuple[str, str, str]] = {
    ("starting", "started", "running"),
    ("starting", "backgrounded", "running"),
    ("running", "backgrounded", "running"),
    ("starting", "stop_requested", "starting"),
    ("running", "stop_requested", "running"),
    ("starting", "completed", "failed"),
    ("starting", "completed", "terminated"),
    ("starting", "completed", "killed"),
    ("starting", "lost", "lost_on_restore"),
    ("starting", "abandoned", "abandoned"),
    ("running", "completed", "exited"),
    ("running", "completed", "failed"),
    ("running", "completed", "timed_out"),
    ("running", "completed", "interrupted"),
    ("running", "completed", "terminated"),
    ("running", "completed", "killed"),
    ("running", "completed", "signaled"),
    ("running", "lost", "lost_on_restore"),
    ("running", "abandoned", "abandoned"),
}
