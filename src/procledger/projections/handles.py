"""``HandleSummary``: what a session sees of a process it holds a handle to.

Its JSON is fixed by the contract: ``{"__handle__": "process", "id", "process_id",
"descriptor": {"kind", "label"}, "status"}`` plus ``"definition"`` when the process has one.
The descriptor is the grant's (chosen when the handle was granted), the status and definition
are the process's.
"""

from __future__ import annotations

from typing import Any

from pydantic import JsonValue, model_serializer, model_validator

from procledger.domain.model import Frozen
from procledger.domain.registration import HandleDescriptor
from procledger.domain.vocabulary import ProcessStatus

HANDLE_TAG = "process"


class HandleSummary(Frozen):
    process_id: str
    descriptor: HandleDescriptor
    status: ProcessStatus
    definition: JsonValue = None

    @property
    def id(self) -> str:
        return self.process_id

    @model_validator(mode="before")
    @classmethod
    def _from_wire(cls, data: Any) -> Any:
        """Accept the serialised form back (``__handle__`` and ``id`` are derived)."""
        if isinstance(data, dict) and "__handle__" in data:
            data = dict(data)
            tag = data.pop("__handle__")
            if tag != HANDLE_TAG:
                raise ValueError(f"__handle__ must be {HANDLE_TAG!r}, not {tag!r}")
            handle_id = data.pop("id", data.get("process_id"))
            if handle_id != data.get("process_id"):
                raise ValueError("id and process_id must be equal")
        return data

    @model_serializer(mode="plain")
    def _wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "__handle__": HANDLE_TAG,
            "id": self.process_id,
            "process_id": self.process_id,
            "descriptor": {"kind": self.descriptor.kind, "label": self.descriptor.label},
            "status": self.status.value,
        }
        if self.definition is not None:
            body["definition"] = self.definition
        return body
