"""What every typed read result shares: a frozen pydantic model built from one row, times as aware datetimes.

The dispatch, notification and scheduler models (``outbox/dispatch/models.py``, ``outbox/notifications/models.py``,
``scheduler/models.py``) derive from :class:`Record`; each builds itself from a row in one classmethod,
so callers never pick columns out of a mapping. ``model_dump(mode="json")`` is what ``--json`` prints.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict

from statebook.lifecycle.clock import utc
from statebook.lifecycle.head import CHAIN_COLUMNS

MASK = "********"
"""What a dump shows in place of a secret (an ack token)."""


def _utc(value: Any) -> Any:
    """POSIX seconds (as stored) as an aware UTC datetime; anything else is left to pydantic."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return utc(value)
    return value


Time = Annotated[datetime, BeforeValidator(_utc)]
"""A stored time (POSIX seconds) read as an aware UTC ``datetime``."""


def decoded(value: Any) -> Any:
    """A JSON column's value: SQLite may hand back the text, PostgreSQL the decoded value."""
    return json.loads(value) if isinstance(value, str | bytes) else value


class Record(BaseModel):
    """A frozen read model: assigning to a field raises, equal rows give equal models."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    @classmethod
    def from_row(cls, row: Any) -> Self:
        """The model of one row (a SQLAlchemy ``Row`` or a mapping): JSON columns decoded, the engine's
        head dropped; the one place each entity is built from its columns."""
        values = dict(row._mapping) if hasattr(row, "_mapping") else dict(row)
        for column in CHAIN_COLUMNS:
            values.pop(column, None)
        for column in cls.json_columns():
            if column in values:
                values[column] = decoded(values[column])
        return cls.model_validate(values)

    @classmethod
    def json_columns(cls) -> tuple[str, ...]:
        """The columns stored as JSON text (none unless an entity says so)."""
        return ()

    def dump(self, **context: Any) -> dict[str, Any]:
        """``model_dump(mode="json")``: what the CLI's ``--json`` prints (``context`` reaches serializers)."""
        return self.model_dump(mode="json", context=context or None)

