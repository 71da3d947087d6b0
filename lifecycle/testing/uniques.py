"""The unique keys of a lifecycle's table, read from its SQLAlchemy ``Table``, so the reference model can
predict that a create or a transition hits one (the database refuses it; the engine raises).

Read from the table: every ``UniqueConstraint`` (``unique=True`` columns included) and every unique
``Index``. A partial unique index is read when its predicate — the same for ``sqlite_where`` and
``postgresql_where``, as SQLite and PostgreSQL must behave the same — is one or more terms joined by
``AND``, each ``column IS [NOT] NULL``, ``column = literal``, ``column <> literal`` or ``column [NOT] IN
(literals)`` (text, integer, decimal or TRUE/FALSE literals); a :func:`~statebook.lifecycle.schema.status_index`
made unique takes its predicate from the lifecycle. Anything else — an index on an expression, another
predicate, a predicate on one backend only, a key over a JSON column — raises ``ValueError`` naming the
index: leave that lifecycle out of the machine (``entity_types``) rather than let the model guess.

A row holds a key's value only when every key column is known and not NULL and the predicate is true
(NULLs are distinct on both backends). A column whose default is computed when the row is inserted is
unknown to the model: such a key is taken to be free, as a generated value would be.

    >>> [(k.name, k.columns) for k in unique_keys(SCHEDULE)]     # doctest: +SKIP
    [('uq_schedules_name', ('name',))]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:
    from ..policy import Lifecycle

__all__ = ["Term", "UniqueKey", "key_columns", "unique_keys"]

_DIALECTS = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Term:
    """One term of a partial index's predicate: ``op`` is null | not_null | in | not_in."""

    column: str
    op: str
    values: tuple[Any, ...] = ()

    def holds(self, row: Mapping[str, Any]) -> bool:
        """Whether the term is true for ``row`` (SQL's: a comparison with NULL is not true)."""
        if self.column not in row:
            return False
        value = row[self.column]
        if self.op == "null":
            return value is None
        if self.op == "not_null":
            return value is not None
        return value is not None and (value in self.values) == (self.op == "in")


@dataclass(frozen=True)
class UniqueKey:
    """A unique constraint or index: its name, its columns and (partial index) its predicate's terms."""

    name: str
    columns: tuple[str, ...]
    where: tuple[Term, ...] = ()

    def of(self, row: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The key's value in ``row``; None when the row holds none (a NULL or unknown column, a false predicate)."""
        if any(row.get(c) is None for c in self.columns):
            return None
        if not all(t.holds(row) for t in self.where):
            return None
        return tuple(row[c] for c in self.columns)


def key_columns(table: sa.Table) -> list[tuple[str, ...]]:
    """The columns of every unique constraint and unique index of ``table`` made of plain columns (predicates
    not read): what a strategy copies from one row to another to make them collide."""
    found = [tuple(c.name for c in u.columns) for u in table.constraints if isinstance(u, sa.UniqueConstraint)]
    for index in table.indexes:
        if index.unique and all(isinstance(e, sa.Column) for e in index.expressions):
            found.append(tuple(c.name for c in index.columns))
    return found


def unique_keys(lc: Lifecycle) -> tuple[UniqueKey, ...]:
    """Every unique key of the lifecycle's table but its primary key (the model judges ids itself); a key
    covering the primary key is left out too: it cannot collide unless the id does."""
    table = lc.table
    primary = {c.name for c in table.primary_key.columns}
    keys: list[UniqueKey] = []
    for constraint in table.constraints:
        if isinstance(constraint, sa.UniqueConstraint):
            columns = tuple(c.name for c in constraint.columns)
            keys.append(UniqueKey(str(constraint.name or f"unique({', '.join(columns)})"), columns))
    for index in table.indexes:
        if not index.unique:
            continue
        if not all(isinstance(e, sa.Column) for e in index.expressions):
            raise ValueError(f"{lc.entity_type}: unique index {index.name} of table {table.name} is on an "
                             "expression; the kit's model reads unique keys of plain columns only")
        keys.append(UniqueKey(str(index.name), tuple(c.name for c in index.columns), _predicate(lc, index)))
    for key in keys:
        json = [c for c in key.columns if isinstance(table.c[c].type, sa.JSON)]
        if json:
            raise ValueError(f"{lc.entity_type}: unique key {key.name} of table {table.name} covers JSON column "
                             f"{json[0]}; the kit's model cannot compare JSON as the database does")
    return tuple(k for k in keys if not primary <= set(k.columns))


def _predicate(lc: Lifecycle, index: sa.Index) -> tuple[Term, ...]:
    table = lc.table
    role = table.info.get("status_indexes", {}).get(index.name)
    if role is not None:  # status_index: schema_for writes the predicate from the lifecycle
        statuses = lc.active if role == "active" else tuple(s for s in lc.statuses if s in lc.terminal)
        return (Term("status", "in", tuple(statuses)),)
    read: dict[str, tuple[Term, ...] | None] = {}
    for dialect in _DIALECTS:
        where = index.dialect_options[dialect]["where"]
        read[dialect] = None if where is None else _terms(lc, index, where)
    if read["sqlite"] != read["postgresql"]:
        raise ValueError(
            f"{lc.entity_type}: partial unique index {index.name} of table {table.name} has different predicates "
            "for SQLite and PostgreSQL; give sqlite_where and postgresql_where the same one"
        )
    return read["sqlite"] or ()


_LITERAL = r"'(?:[^']|'')*'|-?\d+(?:\.\d+)?|TRUE|FALSE"
_TERM = re.compile(
    r'(?:"?\w+"?\.)?"?(?P<col>\w+)"?\s+(?:IS\s+(?P<negated>NOT\s+)?NULL'
    rf"|(?P<cmp>=|<>|!=)\s*(?P<lit>{_LITERAL})"
    rf"|(?P<notin>NOT\s+)?IN\s*\((?P<list>\s*(?:{_LITERAL})\s*(?:,\s*(?:{_LITERAL})\s*)*)\))",
    re.IGNORECASE,
)
_SUPPORTED = ("column IS [NOT] NULL, column = literal, column <> literal, column [NOT] IN (literals), "
              "joined by AND")


def _terms(lc: Lifecycle, index: sa.Index, where: Any) -> tuple[Term, ...]:
    if isinstance(where, sa.TextClause):
        text = where.text
    else:
        text = str(where.compile(compile_kwargs={"literal_binds": True}))
    terms = []
    for part in _conjuncts(text):
        match = _TERM.fullmatch(_unwrap(part))
        if match is None or match["col"] not in lc.table.c:
            raise ValueError(
                f"{lc.entity_type}: the kit's model cannot read the predicate {text!r} of partial unique index "
                f"{index.name} (table {lc.table.name}); it reads {_SUPPORTED}"
            )
        column = match["col"]
        if match["cmp"]:
            terms.append(Term(column, "in" if match["cmp"] == "=" else "not_in", (_literal(match["lit"]),)))
        elif match["list"] is not None:
            values = tuple(_literal(v) for v in re.findall(_LITERAL, match["list"], re.IGNORECASE))
            terms.append(Term(column, "not_in" if match["notin"] else "in", values))
        else:
            terms.append(Term(column, "not_null" if match["negated"] else "null"))
    return tuple(sorted(terms, key=repr))


def _literal(text: str) -> Any:
    if text.startswith("'"):
        return text[1:-1].replace("''", "'")
    if text.upper() in ("TRUE", "FALSE"):
        return text.upper() == "TRUE"
    return float(text) if "." in text else int(text)


def _unwrap(text: str) -> str:
    """``text`` without whitespace and the parentheses that enclose all of it."""
    text = text.strip()
    while text.startswith("(") and text.endswith(")") and _closing(text, 0) == len(text) - 1:
        text = text[1:-1].strip()
    return text


def _closing(text: str, at: int) -> int:
    """The index of the parenthesis closing the one at ``at`` (quotes respected)."""
    depth, quoted = 0, False
    for i in range(at, len(text)):
        ch = text[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _conjuncts(text: str) -> list[str]:
    """``text`` split at its top-level ``AND``s (not inside quotes or parentheses)."""
    text = _unwrap(text)
    parts, depth, quoted, start, i = [], 0, False, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        elif not quoted and depth == 0:
            match = re.match(r"\s+AND\s+", text[i:], re.IGNORECASE)
            if match:
                parts.append(text[start:i])
                i += match.end()
                start = i
                continue
        i += 1
    parts.append(text[start:])
    return parts
