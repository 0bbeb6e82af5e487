"""Names are claims decided where a service registers (docs/design.md §19.1): a state machine
of starts, ends, restarts and stops of services under a few names, against a model of which
service holds each name. Nothing is released by a write: a name is free once its holder is
over, and a refused start writes nothing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.registry.conformance import KEY, registration

from procledger import NameTaken, NotFound, ProcessRegistry, RestartPolicy, open_registry
from procledger.domain.attempts import attempt_id

NAMES = st.sampled_from(["web", "db"])
POLICY = RestartPolicy(mode="on-failure")


@dataclass
class Held:
    """The model of a service under a name."""

    first: str
    service: bool  # has a restart policy
    attempts: list[str] = field(default_factory=list)
    ended: bool = False  # its newest attempt ended
    live: bool = True  # it holds its name


class NameClaims(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.registry: ProcessRegistry = open_registry("memory://")
        self.count = 0
        self.held: dict[str, Held] = {}
        self.refused: list[str] = []

    def teardown(self) -> None:
        self.registry.close()

    def _register(self, process_id: str, name: str, **service: Any) -> None:
        self.registry.register(registration(process_id, name=name, **service))
        self.registry.record_started(process_id, 1)

    @rule(name=NAMES, service=st.booleans())
    def start(self, name: str, service: bool) -> None:
        self.count += 1
        process_id = f"p{self.count}"
        policy = {"restart": POLICY, "attempt": 1} if service else {}
        held = self.held.get(name)
        if held is not None and held.live:
            with pytest.raises(NameTaken) as taken:
                self._register(process_id, name, **policy)
            assert (taken.value.name, taken.value.process_id) == (name, held.attempts[-1])
            self.refused.append(process_id)
            return
        self._register(process_id, name, **policy)
        self.held[name] = Held(process_id, service, [process_id])

    @rule(name=NAMES, failed=st.booleans())
    def end(self, name: str, failed: bool) -> None:
        held = self.held.get(name)
        if held is None or held.ended:
            return
        code = 1 if failed else 0
        self.registry.record_completed(
            held.attempts[-1], "exited", "exited", exit_code=code, authority=KEY
        )
        held.ended = True
        held.live = held.service and failed  # on-failure: another attempt may follow

    @rule(name=NAMES)
    def restart(self, name: str) -> None:
        held = self.held.get(name)
        if held is None or not (held.live and held.ended):
            return
        number = len(held.attempts) + 1
        process_id = attempt_id(held.first, number)
        self._register(
            process_id, name, restart=POLICY, attempt_of=held.first, attempt=number
        )  # its own service holds the name: the claim passes
        held.attempts.append(process_id)
        held.ended = False

    @rule(name=NAMES)
    def stop_service(self, name: str) -> None:
        held = self.held.get(name)
        if held is None or not (held.service and held.live and held.ended):
            return
        self.registry.request_service_stop(held.first, "terminated")  # between two attempts
        held.live = False

    @invariant()
    def each_name_names_its_newest_service(self) -> None:
        for name, held in self.held.items():
            assert self.registry.resolve_process_id(name) == held.first
            named = self.registry.services.named(name)
            assert named is not None
            assert named.first_id == held.first
            assert named.live is held.live
            assert named.newest is not None
            assert named.newest.id == held.attempts[-1]

    @invariant()
    def a_refused_start_wrote_nothing(self) -> None:
        for process_id in self.refused[-3:]:
            with pytest.raises(NotFound):
                self.registry.get(process_id)


TestNameClaims = NameClaims.TestCase
TestNameClaims.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def test_a_pruned_service_names_nothing_and_its_name_is_free(
    registry: ProcessRegistry,
) -> None:
    registry.register(registration("a", name="web"))
    registry.record_started("a", 1)
    registry.record_completed("a", "exited", "exited", exit_code=0, authority=KEY)
    assert registry.resolve_process_id("web") == "a"
    registry.prune_terminal(registry.now_ms() + 1)
    with pytest.raises(NotFound):
        registry.resolve_process_id("web")
    assert registry.services.named("web") is None
    registry.register(registration("b", name="web"))
    assert registry.resolve_process_id("web") == "b"
