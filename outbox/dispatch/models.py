"""The dispatch as :func:`~statebook.outbox.get_dispatch` and :func:`~statebook.outbox.list_dispatches` return it."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr, SerializationInfo, field_serializer

from ..record import MASK, Record, Time


def _revealed(info: SerializationInfo) -> bool:
    return bool(info.context and info.context.get("reveal"))


class Dispatch(Record):
    """One row of the dispatch outbox (specs/outbox.md), payload decoded.

    The ack token is a capability: ``ack_token.get_secret_value()`` gives it; a dump shows ``********``
    in its place (in the row and in the payload) unless dumped with ``reveal=True``.
    """

    id: str
    kind: str
    deliver_to: str
    payload: Any
    dedup_key: str | None = None
    attempt: int
    max_attempts: int
    next_attempt_at: Time
    ack_required: bool
    ack_token: SecretStr | None = None
    session_id: str | None = None
    schedule_run_id: str | None = None
    last_error: str | None = None
    created_at: Time
    expires_at: Time | None = None
    claim_id: str | None = None
    """the fencing token of the claim that holds (or last held) it"""
    status: str
    version: int
    updated_at: Time
    status_reason_code: str
    status_reason_summary: str

    @classmethod
    def json_columns(cls) -> tuple[str, ...]:
        """``payload`` is stored as JSON."""
        return ("payload",)

    @field_serializer("ack_token")
    def _ack_token(self, token: SecretStr | None, info: SerializationInfo) -> str | None:
        if token is None:
            return None
        return token.get_secret_value() if _revealed(info) else MASK

    @field_serializer("payload")
    def _payload(self, payload: Any, info: SerializationInfo) -> Any:
        if _revealed(info) or not isinstance(payload, dict) or not payload.get("ack_token"):
            return payload
        return dict(payload, ack_token=MASK)
