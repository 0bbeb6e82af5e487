"""Who may execute a process now, and what lets a writer finish one (docs/design.md §3.5).

Reading ``/proc`` is I/O, so the domain does not do it: the composition root installs a
``local identity source`` (see ``procledger.adapters.liveness``) and
``LeaseOwner.local_process`` asks it. Without one, owners are opaque.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from procledger.domain.model import Frozen, Tagged
from procledger.domain.vocabulary import RecoveryDisposition


class Liveness(Tagged):
    """How others can tell whether an owner is alive: ``opaque`` (they can't) or a local PID."""

    TAG: ClassVar[str] = "kind"
    DEFAULT_TAG: ClassVar[str | None] = "opaque"
    VARIANTS: ClassVar[dict[str, tuple[frozenset[str], frozenset[str]]]] = {
        "opaque": (frozenset(), frozenset()),
        "local_process": (
            frozenset({"host_id", "boot_id", "pid", "process_start"}),
            frozenset(),
        ),
    }

    kind: Literal["opaque", "local_process"] = "opaque"
    host_id: str | None = None
    boot_id: str | None = None
    pid: int | None = None
    process_start: str | None = None

    @property
    def is_local_process(self) -> bool:
        return self.kind == "local_process"


LocalIdentitySource = Callable[[], Liveness | None]
_local_identity: list[LocalIdentitySource] = []


def install_local_identity_source(source: LocalIdentitySource) -> None:
    """Called once by the adapters: the one seam through which the domain learns its PID."""
    _local_identity[:] = [source]


def local_liveness() -> Liveness:
    """This process's liveness as the installed source tells it (opaque without one): what
    ``local_process`` owners carry, and where a caller that needs only the host id asks."""
    liveness = _local_identity[0]() if _local_identity else None
    return liveness or _OPAQUE


_OPAQUE = Liveness()


class LeaseOwner(Frozen):
    owner_id: str = Field(min_length=1)
    incarnation_id: str = Field(min_length=1)
    liveness: Liveness = Field(default_factory=Liveness)

    @classmethod
    def local_process(cls, owner_id: str, incarnation_id: str | None = None) -> LeaseOwner:
        """An owner that others on this host can prove dead; opaque where /proc is unreadable."""
        return cls(
            owner_id=owner_id,
            incarnation_id=incarnation_id or uuid.uuid4().hex,
            liveness=local_liveness(),
        )

    def same_incarnation(self, other: LeaseOwner) -> bool:
        return self.owner_id == other.owner_id and self.incarnation_id == other.incarnation_id


class Lease(Frozen):
    process_id: str
    owner: LeaseOwner
    lease_token: str
    fencing_token: int
    claimed_at_ms: int
    expires_at_ms: int

    def is_live(self, now_ms: int) -> bool:
        return self.expires_at_ms > now_ms


class Acquired(Frozen):
    lease: Lease


class Busy(Frozen):
    holder: Lease


class LeaseTimings(Frozen):
    """How long a claim lasts and how often a runner renews it; ttl ≥ 3 × renew."""

    ttl_ms: int = 30_000
    renew_ms: int = 10_000

    @model_validator(mode="after")
    def _ttl_covers_three_renewals(self) -> LeaseTimings:
        if self.ttl_ms < 1 or self.renew_ms < 1:
            raise ValueError("ttl_ms and renew_ms must both be at least 1")
        if self.ttl_ms < 3 * self.renew_ms:
            raise ValueError(
                f"ttl_ms ({self.ttl_ms}) must be at least 3 × renew_ms ({self.renew_ms})"
            )
        return self


class CompletionAuthority(Tagged):
    """What entitles a writer without a lease to record a terminal."""

    TAG: ClassVar[str] = "authority"
    VARIANTS: ClassVar[dict[str, tuple[frozenset[str], frozenset[str]]]] = {
        "external_owner": (frozenset({"granted_to"}), frozenset()),
        "workflow_key": (frozenset({"key"}), frozenset()),
        "reconciled_abandon": (frozenset(), frozenset()),
    }

    authority: Literal["external_owner", "workflow_key", "reconciled_abandon"]
    granted_to: str | None = None
    key: str | None = None

    @classmethod
    def external_owner(cls, granted_to: str) -> CompletionAuthority:
        return cls(authority="external_owner", granted_to=granted_to)

    @classmethod
    def workflow_key(cls, key: str) -> CompletionAuthority:
        return cls(authority="workflow_key", key=key)

    @classmethod
    def reconciled_abandon(cls) -> CompletionAuthority:
        return cls(authority="reconciled_abandon")

    def allows(
        self,
        disposition: RecoveryDisposition,
        *,
        abandon_requested_reason: bool,
        abandon_pending: bool,
    ) -> bool:
        """The authority matrix: which disposition each authority may finish, and how."""
        if self.authority == "external_owner":
            return disposition is RecoveryDisposition.externally_owned
        if self.authority == "workflow_key":
            return disposition in (
                RecoveryDisposition.rerunnable,
                RecoveryDisposition.owner_bound,
            )
        return (
            disposition is RecoveryDisposition.externally_owned
            and abandon_requested_reason
            and abandon_pending
        )


def authority_payload(authority: CompletionAuthority | None) -> dict[str, Any] | None:
    """The authority as stored in a terminal event: its tag and that variant's own keys.

    Built by hand (all values are strings) because this runs on every terminal decision and
    pydantic's serializer costs more than the rest of the decision.
    """
    if authority is None:
        return None
    payload: dict[str, Any] = {"authority": authority.authority}
    for key in _AUTHORITY_KEYS[authority.authority]:
        payload[key] = getattr(authority, key)
    return payload


_AUTHORITY_KEYS = {
    tag: tuple(sorted(required | optional))
    for tag, (required, optional) in CompletionAuthority.VARIANTS.items()
}
