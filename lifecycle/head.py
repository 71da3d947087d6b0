"""The head of a row: what a compare-and-set compares, produced by the engine and handed back to it.

A caller that read a row (a due scan) or wrote one (a claim's outcome) keeps its :class:`Head` and
passes it as ``apply_many(seen={id: head})``: the engine plans against it without reading the row
again, and a row moved since is a ``conflict``. Which columns make a head is the engine's business:
a read selects :func:`head_columns` and builds the head with :meth:`Head.of`; a write's head comes
from :meth:`~.plan.Outcome.head`.

>>> head = Head.of({"status": "pending", "version": 3, "last_fact_id": "f3", "chain_hash": "h3", "attempt": 2},
...                "attempt")
>>> head["version"], head["attempt"]
(3, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import sqlalchemy as sa

CHAIN_COLUMNS = ("last_fact_id", "chain_hash")
"""Where a row stands in its entity's hash chain: how the row was written, not what it says (a read model
leaves them out)."""
HEAD = ("status", "version", *CHAIN_COLUMNS)
"""The lifecycle columns a compare-and-set reads: the row's status and its chain head."""


@dataclass(frozen=True)
class Head:
    """A row as its last reader or writer saw it: status, version, chain head, and the values of the
    columns the next command guards on (``guarded``)."""

    status: str
    version: int
    fact_id: str
    chain_hash: str = field(repr=False)
    guarded: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, row: Mapping[str, Any], *guarded: str) -> Head:
        """The head of ``row`` (read with :func:`head_columns`), with the ``guarded`` columns' values."""
        return filled(cls, status=row["status"], version=row["version"], fact_id=row["last_fact_id"],
                      chain_hash=row["chain_hash"], guarded={g: row[g] for g in guarded})

    def guarding(self, **values: Any) -> Head:
        """This head with the guarded columns' values set (e.g. what a claim just wrote)."""
        return replace(self, guarded={**self.guarded, **values})

    def __getitem__(self, column: str) -> Any:
        # The engine plans against a head as against a row it read.
        if column == "status":
            return self.status
        if column == "version":
            return self.version
        if column == "last_fact_id":
            return self.fact_id
        if column == "chain_hash":
            return self.chain_hash
        return self.guarded[column]


R = TypeVar("R")
_new = object.__new__


def filled(cls: type[R], /, **fields: Any) -> R:
    """``cls(**fields)`` for a frozen dataclass given every field (no ``__post_init__`` runs), the values
    written straight into the new instance: the generated ``__init__`` sets each field through
    ``object.__setattr__``, and a delivery builds two heads, a candidate and a lease on every pass."""
    record = _new(cls)
    record.__dict__.update(fields)
    return record


def head_columns(table: sa.Table) -> list[sa.Column[Any]]:
    """The columns a read must select for :meth:`Head.of` to build a row's head."""
    return [table.c[c] for c in HEAD]
