"""Query building every backend shares: plain functions on SQLAlchemy Core, no port method.

``ids_in(column, name)`` is the condition "``column`` is one of the ids bound as ``name``" (bind a
list of ids). It compiles to ONE statement shape for every list length, so the backends' compiled
statements stay cached; each backend registers its SQL for it (``@compiles`` in
``statebook.adapters.sqlite`` and ``.postgres``: ``json_each`` there, ``= ANY`` of an array here), so
no line of dialect-specific SQL lives in ``lifecycle/``.

``lock_rows(query, lock)`` locks the rows a query reads as :data:`~.store.Lock` says; SQLAlchemy
compiles the lock to nothing where the database has no row locks (SQLite's single writer needs none).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.visitors import InternalTraversal

from .store import Lock


class IdsIn(sa.ColumnElement[bool]):
    """``column IN (the ids bound as name)``: each backend compiles it (see the module docstring)."""

    inherit_cache = True
    type = sa.Boolean()
    _is_implicitly_boolean = True  # a condition as it is, never wrapped as "= 1"
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement), ("name", InternalTraversal.dp_string)]

    def __init__(self, column: sa.ColumnElement[Any], name: str) -> None:
        self.column = column
        self.name = name

    @property
    def _from_objects(self) -> list[Any]:
        return self.column._from_objects


@compiles(IdsIn)
def _expanded(element: IdsIn, compiler: Any, **kw: Any) -> str:
    """Where no backend registered a form (``str(query)``, another dialect): SQLAlchemy's expanding IN, right
    everywhere but one statement per list length, which the backends' compiled shapes cannot hold."""
    text: str = compiler.process(element.column.in_(sa.bindparam(element.name, expanding=True)), **kw)
    return text


def ids_in(column: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool]:
    """``column`` is one of the ids bound as ``name`` (a list of str), one compiled shape for every length."""
    return IdsIn(column, name)


def lock_rows(query: sa.Select[Any], lock: Lock) -> sa.Select[Any]:
    """``query`` with its rows locked as ``lock`` says (``skip_locked``: rows another transaction holds are
    skipped). A database without row locks compiles it to the plain query."""
    if lock is None:
        return query
    return query.with_for_update(skip_locked=lock == "skip_locked")
