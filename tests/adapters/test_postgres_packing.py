"""PostgreSQL batches sent as one JSON text of row arrays (adapters/postgres_batches.py, issue 29): which
columns may travel that way, and that every value comes back from the server exactly as it was given."""

from __future__ import annotations

import enum
import sys

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from statebook.adapters.postgres_batches import _PACKED, _params, _source

META = sa.MetaData()
PLAIN = sa.Table(
    "packing_plain", META,
    sa.Column("id", sa.String(32)), sa.Column("body", sa.Text), sa.Column("n", sa.Integer), sa.Column("big", sa.BigInteger),
    sa.Column("x", sa.Float), sa.Column("flag", sa.Boolean), sa.Column("doc", sa.JSON),
)


class Colour(enum.Enum):
    RED = "red"


class Upper(sa.TypeDecorator[str]):
    impl = sa.Text
    cache_ok = True


@pytest.mark.parametrize("column, json_as_text, packed", [
    (sa.Column("doc", sa.JSON), True, True),  # fact JSON columns: already canonical text
    (sa.Column("doc", sa.JSON), False, False),  # a row's JSON column holds Python values
    (sa.Column("c", sa.Enum(Colour)), False, False),
    (sa.Column("c", sa.Numeric(10, 2)), False, False),
    (sa.Column("c", Upper()), False, False),
    (sa.Column("c", sa.DateTime(timezone=True)), False, False),
    (sa.Column("c", postgresql.UUID()), False, False),
    (sa.Column("c", sa.Float), False, True),
    (sa.Column(_PACKED, sa.Text), False, False),  # its parameter would be the packed one's
], ids=["json-text", "json-values", "enum", "numeric", "decorated", "datetime", "uuid", "float", "name-clash"])
def test_only_plain_columns_travel_packed(column, json_as_text, packed):
    columns = [sa.Column("id", sa.String(32)), column]
    *_, order = _source("r_", "r", columns, json_as_text=json_as_text)
    assert (order is not None) == packed
    if packed:
        assert order == ("id", column.name)


def test_a_constant_column_is_one_parameter_beside_the_packed_rows():
    sql, binds, refs, order = _source("r_", "r", list(PLAIN.c), json_as_text=True, constant=frozenset({"flag"}))
    assert order == ("id", "body", "n", "big", "x", "doc")
    assert refs["flag"] == "CAST(:r_flag AS BOOLEAN)" and refs["n"] == 'r.n'
    assert sorted(b.key for b in binds) == ["r_flag", "r_" + _PACKED]
    params = _params("r_", {"id": ["a", "b"], "flag": [True, True], "n": [1, 2], "body": ["x", "y"], "big": [3, 4],
                            "x": [0.5, 1.5], "doc": ["{}", "[]"]}, frozenset({"flag"}), order)
    assert params == {"r_flag": True, "r_" + _PACKED: '[["a","x",1,3,0.5,"{}"],["b","y",2,4,1.5,"[]"]]'}


VALUES = [
    ("a", 'quote " backslash \\ slash /', 2**31 - 1, 2**63 - 1, 0.1 + 0.2, True, '{"k":"v \\" \\u00e9"}'),
    ("b", "tab\tnl\nlone cr\r \u2028\u2029 \x7f \x1b", -(2**31), -(2**63), 5e-324, False, "[]"),
    ("c", "é e\u0301 \U0001f600 日本", 0, 0, sys.float_info.max, None, "null"),
    ("d", "", -1, 1, -2.5e-300, True, '"a string"'),
    ("e", None, None, None, 1_764_900_000.1234567, None, None),
    ("f", "1e16", 7, 10**16, 1e16, False, "1.5"),
]


@pytest.mark.postgres
async def test_every_plain_value_comes_back_from_the_server_exactly(pg_url):
    """Text with every kind of escape, integers at their bounds, floats only their shortest repr carries,
    NULLs and JSON text: a SELECT over the packed source returns the values given."""
    sql, binds, refs, order = _source("r_", "r", list(PLAIN.c), json_as_text=True)
    assert order is not None
    columns = {name: [row[i] for row in VALUES] for i, name in enumerate(order)}
    params = _params("r_", columns, frozenset(), order)
    query = sa.text(f"SELECT {', '.join(refs[c] for c in order)} FROM {sql} ORDER BY r.id").bindparams(*binds)
    compiled = query.compile(dialect=postgresql.asyncpg.dialect())
    statement = str(compiled)
    conn = await asyncpg.connect(pg_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        rows = await conn.fetch(statement, *[params[name] for name in compiled.positiontup or []])
    finally:
        await conn.close()
    got = [tuple(r) for r in rows]
    want = [(i, body, n, big, x, flag, doc) for i, body, n, big, x, flag, doc in VALUES]
    assert [g[:6] for g in got] == [w[:6] for w in want]
    assert [repr(g[4]) for g in got] == [repr(w[4]) for w in want]
    # a JSON column cast from text keeps the text as written (the fact hashes cover those bytes)
    assert [g[6] for g in got] == [w[6] for w in want]
