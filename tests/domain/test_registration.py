"""ProcessRegistration and its parts (docs/design.md §3.1): the model's own rules.

Invalid input cannot even be constructed: pydantic's ``ValidationError`` names the field.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from procledger.domain.registration import (
    EventType,
    HandleDescriptor,
    Originator,
    ProcessInput,
    ProcessRegistration,
    SessionScope,
    env_ref_for,
)
from procledger.domain.vocabulary import RecoveryDisposition
from procledger.testing import registrations

ENV_REF = env_ref_for({"PATH": "/usr/bin"})


def registration(**overrides: Any) -> dict[str, Any]:
    """A valid registration as a JSON-shaped dict (a command), with ``overrides`` applied."""
    fields: dict[str, Any] = {
        "id": "build-42",
        "input": {"type": "command", "argv": ["/usr/bin/make", "all"], "cwd": "/src"},
        "disposition": "owner_bound",
        "originator": {"type": "host", "scope": None},
        "env_ref": ENV_REF,
    }
    fields.update(overrides)
    return fields


def external(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "input": {"type": "external", "metadata": {"label": "deploy"}},
        "env_ref": None,
    }
    return registration(**{**fields, **overrides})


def refused(data: dict[str, Any]) -> pydantic.ValidationError:
    with pytest.raises(pydantic.ValidationError) as caught:
        ProcessRegistration.model_validate(data)
    return caught.value


def names(error: pydantic.ValidationError, field: str) -> bool:
    """The error names ``field``: in an error's location or in its message."""
    return any(field in err["loc"] or field in err["msg"] for err in error.errors())


# -- the valid forms ------------------------------------------------------------------------------


def test_a_command_registration_with_every_part() -> None:
    reg = ProcessRegistration.model_validate(
        registration(
            originator={"type": "session", "scope": {"session_id": "s1", "agent_frame_id": "f"}},
            wake_target={"session_id": "s1"},
            event_types=[{"name": "signal.ready"}, {"name": "signal.done-1"}],
            descriptor={"kind": "build", "label": "make all"},
            definition={"workflow": "ci", "step": 3},
        )
    )
    assert reg.input.argv == ["/usr/bin/make", "all"]
    assert reg.disposition is RecoveryDisposition.owner_bound
    assert reg.originator.scope_id == "session:s1/frame:f"
    assert reg.wake_target == SessionScope(session_id="s1")
    assert [t.name for t in reg.event_types] == ["signal.ready", "signal.done-1"]
    assert reg.declares("signal.ready")
    assert not reg.declares("signal.other")
    assert reg.definition == {"workflow": "ci", "step": 3}


def test_optional_parts_default_to_nothing() -> None:
    reg = ProcessRegistration.model_validate(external())
    assert reg.wake_target is None
    assert reg.env_ref is None
    assert reg.event_types == []
    assert reg.descriptor is None
    assert reg.definition is None


def test_objects_and_dicts_build_the_same_registration() -> None:
    built = ProcessRegistration(
        id="build-42",
        input=ProcessInput.command(["/usr/bin/make", "all"], cwd="/src"),
        disposition=RecoveryDisposition.owner_bound,
        originator=Originator.host(),
        env_ref=ENV_REF,
    )
    assert built == ProcessRegistration.model_validate(registration())


@pytest.mark.parametrize("disposition", list(RecoveryDisposition))
def test_every_disposition_is_accepted(disposition: RecoveryDisposition) -> None:
    reg = ProcessRegistration.model_validate(registration(disposition=disposition.value))
    assert reg.disposition is disposition


# -- id --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", " ", "\t\n", "a#b", "#", "x" * 257, "é" * 257])
def test_bad_ids_are_refused_naming_id(bad: str) -> None:
    error = refused(registration(id=bad))
    assert error.errors()[0]["loc"] == ("id",)


@pytest.mark.parametrize("good", ["a", " padded ", "x" * 256, "é" * 256, "ns/job:1.2_3"])
def test_ids_up_to_256_characters_without_hash_are_accepted(good: str) -> None:
    assert ProcessRegistration.model_validate(registration(id=good)).id == good


# -- disposition -----------------------------------------------------------------------------------


def test_disposition_is_required_with_no_default() -> None:
    data = registration()
    del data["disposition"]
    error = refused(data)
    assert [(e["loc"], e["type"]) for e in error.errors()] == [(("disposition",), "missing")]
    assert ProcessRegistration.model_fields["disposition"].is_required()


def test_disposition_is_required_when_loading_json_too() -> None:
    data = registration()
    del data["disposition"]
    with pytest.raises(pydantic.ValidationError) as caught:
        ProcessRegistration.model_validate_json(json.dumps(data))
    assert caught.value.errors()[0]["loc"] == ("disposition",)


@pytest.mark.parametrize("bad", [None, "", "owner-bound", "OWNER_BOUND", 1])
def test_unknown_dispositions_are_refused(bad: Any) -> None:
    assert names(refused(registration(disposition=bad)), "disposition")


# -- env_ref ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "process_input",
    [
        {"type": "command", "argv": ["true"]},
        {"type": "engine", "kind": "workflow", "payload": {"step": 1}},
    ],
)
def test_command_and_engine_inputs_require_env_ref(process_input: dict[str, Any]) -> None:
    error = refused(registration(input=process_input, env_ref=None))
    assert names(error, "env_ref")
    assert ProcessRegistration.model_validate(registration(input=process_input)).env_ref == ENV_REF


def test_an_external_input_must_not_have_env_ref() -> None:
    error = refused(external(env_ref=ENV_REF))
    assert names(error, "env_ref")


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "sha256:" + "0" * 64,
        "process-env:sha256:" + "0" * 63,
        "process-env:sha256:" + "0" * 65,
        "process-env:sha256:" + "A" * 64,
        "process-env:sha1:" + "0" * 40,
        "process-env:sha256:" + "0" * 64 + "\n",
        " process-env:sha256:" + "0" * 64,
    ],
)
def test_env_ref_must_be_a_content_hash(bad: str) -> None:
    error = refused(registration(env_ref=bad))
    assert error.errors()[0]["loc"] == ("env_ref",)


def test_env_ref_for_is_the_hash_of_the_content_in_any_order() -> None:
    a = env_ref_for({"A": "1", "B": "2"})
    assert a == env_ref_for({"B": "2", "A": "1"})
    assert a != env_ref_for({"A": "1", "B": "3"})
    assert a.startswith("process-env:sha256:")
    assert ProcessRegistration.model_validate(registration(env_ref=a)).env_ref == a


def test_environment_values_have_no_place_in_a_registration() -> None:
    assert names(refused(registration(env={"SECRET": "x"})), "env")
    bad_input = {"type": "command", "argv": ["true"], "env": {"SECRET": "x"}}
    assert names(refused(registration(input=bad_input)), "env")


# -- ProcessInput: a tagged union on ``type`` ------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "dumped"),
    [
        (
            {"type": "command", "argv": ["ls", "-l"]},
            {"type": "command", "argv": ["ls", "-l"], "cwd": None},
        ),
        (
            {"type": "command", "argv": ["ls"], "cwd": "/tmp"},
            {"type": "command", "argv": ["ls"], "cwd": "/tmp"},
        ),
        (
            {"type": "engine", "kind": "workflow", "payload": [1, {"a": None}]},
            {"type": "engine", "kind": "workflow", "payload": [1, {"a": None}]},
        ),
        ({"type": "engine", "kind": "k"}, {"type": "engine", "kind": "k", "payload": None}),
        ({"type": "external"}, {"type": "external", "metadata": None}),
        (
            {"type": "external", "metadata": {"name": "n"}},
            {"type": "external", "metadata": {"name": "n"}},
        ),
    ],
)
def test_input_json_carries_only_its_variant_keys(
    data: dict[str, Any], dumped: dict[str, Any]
) -> None:
    value = ProcessInput.model_validate(data)
    assert value.model_dump(mode="json") == dumped
    assert json.loads(value.model_dump_json()) == dumped
    assert ProcessInput.model_validate_json(value.model_dump_json()) == value


@pytest.mark.parametrize(
    "bad",
    [
        {"argv": ["ls"]},  # no tag
        {"type": "shell", "argv": ["ls"]},
        {"type": None},
        # keys of another variant
        {"type": "command", "argv": ["ls"], "kind": "k"},
        {"type": "command", "argv": ["ls"], "payload": 1},
        {"type": "command", "argv": ["ls"], "metadata": {}},
        {"type": "engine", "kind": "k", "argv": ["ls"]},
        {"type": "engine", "kind": "k", "cwd": "/"},
        {"type": "engine", "kind": "k", "metadata": {}},
        {"type": "external", "argv": ["ls"]},
        {"type": "external", "cwd": "/"},
        {"type": "external", "kind": "k"},
        {"type": "external", "payload": 1},
        # unknown keys
        {"type": "command", "argv": ["ls"], "stdin": "x"},
        {"type": "external", "pid": 1},
        # required content
        {"type": "command"},
        {"type": "command", "argv": []},
        {"type": "command", "argv": [""]},
        {"type": "command", "argv": "ls"},
        {"type": "engine"},
        {"type": "engine", "kind": ""},
        {"type": "engine", "kind": "  "},
        {"type": "external", "metadata": ["label"]},
        {"type": "external", "metadata": "label"},
    ],
)
def test_bad_inputs_are_refused_naming_input(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        ProcessInput.model_validate(bad)
    error = refused(registration(input=bad))
    assert error.errors()[0]["loc"][0] == "input"


@pytest.mark.parametrize(
    ("process_input", "identity"),
    [
        (ProcessInput.command(["/usr/bin/python3", "-c", "pass"]), ("command", "python3")),
        (ProcessInput.command(["python3"]), ("command", "python3")),
        (ProcessInput.command(["./scripts/run.sh", "x"]), ("command", "run.sh")),
        (ProcessInput.engine("workflow", {"label": "ignored"}), ("workflow", None)),
        (ProcessInput.external({"label": "L", "name": "N", "title": "T"}), ("external", "L")),
        (ProcessInput.external({"name": "N", "title": "T"}), ("external", "N")),
        (ProcessInput.external({"title": "T"}), ("external", "T")),
        (ProcessInput.external({"other": "x"}), ("external", None)),
        (ProcessInput.external({}), ("external", None)),
        (ProcessInput.external(None), ("external", None)),
    ],
)
def test_identity_is_derived_from_the_input(
    process_input: ProcessInput, identity: tuple[str, str | None]
) -> None:
    assert process_input.identity() == identity


# -- Originator and SessionScope ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("originator", "scope_id", "dumped"),
    [
        (Originator.host(), "host", {"type": "host", "scope": None}),
        (Originator.host("ci-runner"), "host:ci-runner", {"type": "host", "scope": "ci-runner"}),
        (
            Originator.session(SessionScope(session_id="s1")),
            "session:s1",
            {"type": "session", "scope": {"session_id": "s1", "agent_frame_id": None}},
        ),
        (
            Originator.session(SessionScope(session_id="s1", agent_frame_id="f2")),
            "session:s1/frame:f2",
            {"type": "session", "scope": {"session_id": "s1", "agent_frame_id": "f2"}},
        ),
    ],
)
def test_originator_scope_ids_and_json(
    originator: Originator, scope_id: str, dumped: dict[str, Any]
) -> None:
    assert originator.scope_id == scope_id
    assert originator.model_dump(mode="json") == dumped
    again = Originator.model_validate_json(originator.model_dump_json())
    assert again == originator
    assert again.scope_id == scope_id


def test_session_scope_ids() -> None:
    assert SessionScope(session_id="s").scope_id == "session:s"
    assert SessionScope(session_id="s", agent_frame_id="f").scope_id == "session:s/frame:f"


@pytest.mark.parametrize(
    "bad",
    [
        {"scope": "x"},  # no tag
        {"type": "user"},
        {"type": "session"},
        {"type": "session", "scope": None},
        {"type": "session", "scope": "s1"},
        {"type": "session", "scope": {"agent_frame_id": "f"}},
        {"type": "session", "scope": {"session_id": ""}},
        {"type": "session", "scope": {"session_id": "s", "pid": 1}},
        {"type": "host", "scope": {"session_id": "s"}},
        {"type": "host", "scope": 3},
        {"type": "host", "session_id": "s"},
    ],
)
def test_bad_originators_are_refused_naming_originator(bad: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        Originator.model_validate(bad)
    assert refused(registration(originator=bad)).errors()[0]["loc"][0] == "originator"


def test_wake_target_is_a_session_scope() -> None:
    error = refused(registration(wake_target={"session_id": ""}))
    assert error.errors()[0]["loc"][0] == "wake_target"
    assert refused(registration(wake_target="s1")).errors()[0]["loc"][0] == "wake_target"


# -- EventType -------------------------------------------------------------------------------------


@pytest.mark.parametrize("good", ["signal.ready", "signal.a", "signal.Step_2-done", "signal.9"])
def test_signal_event_types(good: str) -> None:
    event_type = EventType(name=good)
    assert event_type.model_dump(mode="json") == {"name": good, "payload_schema": None}
    assert EventType.model_validate({"name": good}) == event_type


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "signal",
        "signal.",
        "ready",
        "Signal.ready",
        "signals.ready",
        "signal.a b",
        "signal.a.b",
        "signal.é",
        "signal.ready\n",
        " signal.ready",
        "signal.#",
    ],
)
def test_bad_event_types_are_refused(bad: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        EventType(name=bad)
    assert caught.value.errors()[0]["loc"] == ("name",)
    error = refused(registration(event_types=[{"name": bad}]))
    assert error.errors()[0]["loc"][0] == "event_types"


def test_event_types_carry_an_optional_payload_schema() -> None:
    schema = {"type": "object", "properties": {"port": {"type": "integer"}}}
    event_type = EventType.model_validate({"name": "signal.ready", "payload_schema": schema})
    assert event_type.model_dump(mode="json") == {"name": "signal.ready", "payload_schema": schema}


def test_an_event_type_is_declared_once() -> None:
    error = refused(registration(event_types=[{"name": "signal.a"}, {"name": "signal.a"}]))
    assert names(error, "event_types")


# -- HandleDescriptor ------------------------------------------------------------------------------


def test_handle_descriptor() -> None:
    assert HandleDescriptor(kind="build").model_dump() == {"kind": "build", "label": None}
    with pytest.raises(pydantic.ValidationError):
        HandleDescriptor(kind="")
    assert refused(registration(descriptor={"label": "x"})).errors()[0]["loc"][0] == "descriptor"


# -- strict and frozen -----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["command", "stdout", "pid", "status", "state"])
def test_unknown_keys_are_refused(key: str) -> None:
    assert refused(registration(**{key: "x"})).errors()[0]["loc"] == (key,)


FROZEN = [
    (ProcessRegistration.model_validate(registration()), "id", "other"),
    (ProcessRegistration.model_validate(registration()), "disposition", "rerunnable"),
    (ProcessInput.command(["ls"]), "argv", ["rm"]),
    (ProcessInput.external({}), "type", "command"),
    (Originator.host(), "scope", "x"),
    (SessionScope(session_id="s"), "session_id", "t"),
    (EventType(name="signal.a"), "name", "signal.b"),
    (HandleDescriptor(kind="k"), "label", "l"),
]


@pytest.mark.parametrize(("model", "field", "value"), FROZEN)
def test_assigning_to_a_frozen_model_raises_validation_error(
    model: pydantic.BaseModel, field: str, value: Any
) -> None:
    before = model.model_dump()
    with pytest.raises(pydantic.ValidationError) as caught:
        setattr(model, field, value)
    assert caught.value.errors()[0]["type"] == "frozen_instance"
    assert model.model_dump() == before


# -- the registration hash -------------------------------------------------------------------------


def canonical_sha256(reg: ProcessRegistration) -> str:
    """sha256 of sorted-key compact JSON, computed with the standard library."""
    text = json.dumps(
        reg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_the_hash_is_sha256_of_the_canonical_json() -> None:
    reg = ProcessRegistration.model_validate(registration(definition={"é": [1, {"b": 2, "a": 1}]}))
    assert reg.registration_hash() == canonical_sha256(reg)


def test_the_hash_of_a_known_registration_never_changes() -> None:
    """Stored registrations are compared by hash: the bytes hashed must stay the same."""
    reg = ProcessRegistration.model_validate(registration())
    assert reg.registration_hash() == (
        "sha256:" + hashlib.sha256(_KNOWN_CANONICAL_JSON.encode()).hexdigest()
    )


_KNOWN_CANONICAL_JSON = (
    '{"definition":null,"descriptor":null,"disposition":"owner_bound",'
    f'"env_ref":"{ENV_REF}","event_types":[],"id":"build-42",'
    '"input":{"argv":["/usr/bin/make","all"],"cwd":"/src","type":"command"},'
    '"originator":{"scope":null,"type":"host"},"wake_target":null}'
)


def test_the_hash_ignores_key_order_and_construction_route() -> None:
    a = ProcessRegistration.model_validate(
        external(definition={"a": 1, "b": {"c": 2, "d": 3}}, id="x")
    )
    reordered = dict(reversed(list(external(id="x").items())))
    reordered["definition"] = {"b": {"d": 3, "c": 2}, "a": 1}
    b = ProcessRegistration.model_validate(reordered)
    c = ProcessRegistration.model_validate_json(a.model_dump_json())
    assert a.registration_hash() == b.registration_hash() == c.registration_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"id": "build-43"},
        {"disposition": "rerunnable"},
        {"input": {"type": "command", "argv": ["/usr/bin/make", "all"]}},
        {"originator": {"type": "host", "scope": "ci"}},
        {"wake_target": {"session_id": "s"}},
        {"env_ref": env_ref_for({"PATH": "/bin"})},
        {"event_types": [{"name": "signal.ready"}]},
        {"descriptor": {"kind": "build"}},
        {"definition": {"step": 1}},
        {"definition": 0},
    ],
)
def test_every_field_changes_the_hash(change: dict[str, Any]) -> None:
    base = ProcessRegistration.model_validate(registration())
    changed = ProcessRegistration.model_validate(registration(**change))
    assert base.registration_hash() != changed.registration_hash()


@given(registrations())
def test_generated_registrations_round_trip_with_a_stable_hash(reg: ProcessRegistration) -> None:
    again = ProcessRegistration.model_validate_json(reg.model_dump_json())
    assert again == reg
    assert again.registration_hash() == reg.registration_hash() == canonical_sha256(reg)
    assert reg.registration_hash().startswith("sha256:")
    assert len(reg.registration_hash()) == len("sha256:") + 64
    assert (reg.env_ref is None) is (reg.input.type == "external")


@given(st.text(max_size=300))
def test_id_rule_matches_its_definition(candidate: str) -> None:
    valid = bool(candidate.strip()) and len(candidate) <= 256 and "#" not in candidate
    if valid:
        assert ProcessRegistration.model_validate(registration(id=candidate)).id == candidate
    else:
        assert refused(registration(id=candidate)).errors()[0]["loc"] == ("id",)
