"""Process aggregate ids are the stock ``uuid.uuid5`` of the process id (stored ids use them)."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from procledger.domain.process import process_uuid

NAMESPACE = uuid.UUID("6f1c2d7e-5b0a-4c1e-9a53-0d4c6e1f7a21")


@given(st.text())
def test_process_ids_are_the_stock_uuid5(process_id: str) -> None:
    assert process_uuid(process_id) == uuid.uuid5(NAMESPACE, process_id)


def test_a_known_process_id_keeps_its_aggregate_id() -> None:
    assert process_uuid("job-1") == uuid.UUID("9897ed87-a79e-5f15-a2e6-be0666086fb3")
