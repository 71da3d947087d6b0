"""O22: the public envelope models refuse bad fields with DispatchInvalid, never pydantic's ValidationError."""

from __future__ import annotations

import pytest

from statebook.lifecycle import StatebookError
from statebook.outbox import DispatchInvalid, DispatchSignal, Signal


@pytest.mark.parametrize("fields, argument", [
    ({"created_at": "soon"}, "created_at"),
    ({"created_at": float("nan")}, "created_at"),
    ({"created_at": float("inf")}, "created_at"),
    ({"created_at": 1.0, "body": 5}, "body"),
    ({"created_at": 1.0, "attempt": "x"}, "attempt"),
    ({}, "created_at"),
])
@pytest.mark.parametrize("build", ["init", "model_validate"])
def test_a_bad_envelope_field_is_a_dispatch_invalid_naming_it(fields, argument, build):
    with pytest.raises(DispatchInvalid) as caught:
        DispatchSignal(**fields) if build == "init" else DispatchSignal.model_validate(fields)
    assert isinstance(caught.value, StatebookError)
    assert caught.value.argument == argument and str(caught.value).startswith(argument)


def test_a_good_envelope_still_builds():
    assert DispatchSignal(created_at=1.0, kind="ping").to_json()["kind"] == "ping"
    assert Signal.model_validate({"created_at": 2.0}).created_at == 2.0
