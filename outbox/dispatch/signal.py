"""The payload envelope: a versioned signal, serialised once at enqueue (specs/outbox.md O1).

A stored payload is ``DispatchSignal(...).to_json()``: JSON-mode values, an id and the book clock's
``created_at``; each attempt sends it with ``attempt`` set to the attempt being made (:func:`with_attempt`).

>>> s = DispatchSignal(created_at=0.0, dispatch_id="ab" * 16, kind="ping", deliver_to="seat-1")
>>> (s.to_json()["schema_version"], s.to_json()["attempt"], s.to_json()["metadata"])
(2, 0, {})
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from statebook.lifecycle.codec import dumps, loads, new_id
from statebook.lifecycle.tracing import TRACEPARENT_PATTERN, is_traceparent

from .errors import DispatchInvalid

SIGNAL_SCHEMA_VERSION: int = 2
"""Changes when a field is removed or renamed or changes meaning; adding a nullable field is not breaking.
2: ``attempt`` is the attempt being made (it stayed 0), and ``metadata`` no longer names a Python class."""


class Signal(BaseModel):
    """A message with identity and provenance. ``created_at`` comes from the caller's clock."""

    # Unknown fields are ignored so an older reader accepts a newer envelope (additions are not breaking).
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    id: str = Field(default_factory=new_id)
    created_at: float
    metadata: dict[str, Any] = Field(default_factory=dict)
    data: Any = None
    emitter_role: str | None = None
    schema_version: int = SIGNAL_SCHEMA_VERSION

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _refusal(exc) from None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:
        """pydantic's ``model_validate``, refusing with :class:`DispatchInvalid` (not a ``ValidationError``)."""
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise _refusal(exc) from None

    def to_json(self) -> dict[str, Any]:
        """The envelope as JSON-mode values (what is stored and sent)."""
        return self.model_dump(mode="json")


class DispatchSignal(Signal):
    """The envelope of one dispatch. Stored with ``attempt`` 0 (none made yet); each send carries the
    attempt it makes (:func:`with_attempt`), the row's column being the live count between sends."""

    dispatch_id: str = ""
    kind: str = ""
    deliver_to: str = ""
    attempt: int = 0
    ack_token: str | None = None
    body: dict[str, Any] = Field(default_factory=dict)
    traceparent: str | None = Field(None, pattern=f"^{TRACEPARENT_PATTERN}$")
    """The W3C trace context of the enqueue's span; absent from the JSON when tracing was off."""

    def to_json(self) -> dict[str, Any]:
        """The envelope as JSON-mode values, without ``traceparent`` when it is None (as enqueue stores it)."""
        data = self.model_dump(mode="json")
        if data["traceparent"] is None:
            del data["traceparent"]
        return data


def _refusal(exc: ValidationError) -> DispatchInvalid:
    """The first error of a signal's validation as one DispatchInvalid naming its field."""
    first = exc.errors(include_url=False)[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, DispatchInvalid):  # raised by a nested __init__, already one refusal
        return cause
    field = ".".join(str(part) for part in first["loc"]) or "signal"
    return DispatchInvalid(f"{field!r}: {first['msg']}" if not field.isidentifier() else f"{field}: {first['msg']}",
                           argument=field[:255], rule=first["type"])


def dispatch_envelope(
    *, created_at: float, dispatch_id: str, kind: str, deliver_to: str, ack_token: str | None, body: dict[str, Any],
    traceparent: str | None = None,
) -> dict[str, Any]:
    """``DispatchSignal(...).to_json()`` for already-validated values, without building the model.

    The enqueue hot path uses it; ``body`` must already be JSON-normalised (``enqueue`` checks it).
    A test keeps it equal to the model's output field for field.
    """
    envelope = {
        "id": new_id(), "created_at": float(created_at), "metadata": {}, "data": None,
        "emitter_role": None, "schema_version": SIGNAL_SCHEMA_VERSION, "dispatch_id": dispatch_id, "kind": kind,
        "deliver_to": deliver_to, "attempt": 0, "ack_token": ack_token, "body": body,
    }
    if traceparent is not None:
        envelope["traceparent"] = traceparent
    return envelope


TRACEPARENT_BYTES = len(',"traceparent":""') + 55
"""What a ``traceparent`` adds to the stored envelope's canonical JSON (a W3C version-00 value is 55 characters)."""
_TRACEPARENT_KEY = '"traceparent":"'


def traceparent_of(stored: str) -> str | None:
    """The ``traceparent`` a stored envelope carries, or None.

    Canonical JSON sorts ``traceparent`` last, so it is looked for at the text's end; text in another
    form is decoded. A value of another shape is ignored (a receiver's trace is never broken by it).

    >>> traceparent_of('{"body":{},"traceparent":"00-' + "1" * 32 + '-' + "2" * 16 + '-01"}')[:6]
    '00-111'
    """
    tail = stored[-(len(_TRACEPARENT_KEY) + 57):]
    if tail.startswith(_TRACEPARENT_KEY) and tail.endswith('"}'):
        value: object = tail[len(_TRACEPARENT_KEY):-2]
    elif _TRACEPARENT_KEY not in stored:
        return None
    else:
        try:
            value = loads(stored).get("traceparent")
        except (ValueError, AttributeError):
            return None
    return value if isinstance(value, str) and is_traceparent(value) else None


_STORED_ATTEMPT = ',"attempt":0,'
"""How the stored envelope's canonical text (sorted keys, no spaces) holds its attempt: right after
``ack_token`` (null or 32 hex), within the first 64 characters, before ``body`` could begin."""


def with_attempt(stored: str, attempt: int) -> str:
    """The text attempt ``attempt`` sends: the stored envelope's, its top-level ``attempt`` set to ``attempt``.

    The stored text is canonical JSON, so the field sits at a known place and one splice gives the same
    bytes but the number; text in another form (written by other means) is decoded and encoded again.

    >>> with_attempt('{"ack_token":null,"attempt":0,"body":{"attempt":0}}', 3)
    '{"ack_token":null,"attempt":3,"body":{"attempt":0}}'
    """
    at = stored.find(_STORED_ATTEMPT, 0, 64) if stored.startswith('{"ack_token":') else -1
    if at >= 0:
        return f'{stored[:at]},"attempt":{attempt},{stored[at + len(_STORED_ATTEMPT):]}'
    envelope = loads(stored)
    envelope["attempt"] = attempt
    return dumps(envelope)
