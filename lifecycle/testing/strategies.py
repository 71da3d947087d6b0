"""Hypothesis strategies for any registered lifecycle: column values, creation values, commands.

Commands are drawn as a caller would write them from what it saw of an entity: mostly plausible,
sometimes not — an undeclared edge or status, the wrong actor type, a missing or undeclared patch or
guard field, a stale expected status or guard value, an undeclared reason code, a shared
idempotency key, a value of a unique column another entity (one of ``peers``) already holds. The
reference model (:mod:`.model`) says what the engine must answer to each::

    from hypothesis import given
    from statebook.lifecycle.testing import strategies as sbst

    @given(sbst.commands(ORDER, {"id": "o-1", "status": "placed"}, actors=sbst.actors_of([ORDER])))
    def test_refusals_name_a_rule(cmd): ...
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from hypothesis import strategies as st

from ..policy import Lifecycle
from ..reasons import Actor
from ..schema import LIFECYCLE_COLUMNS, data_columns
from .model import TransitionCmd
from .uniques import key_columns

__all__ = [
    "actors_of", "bogus_reasons", "column_values", "commands", "creation_values", "creations", "guardable",
    "idempotency_keys", "listed_values", "purge_reasons", "reasons_for",
]

UNKNOWN_STATUS = "limbo"
"""A status no lifecycle declares (the registry refuses nothing by that name in the tests we ship)."""


def guardable(lc: Lifecycle) -> list[str]:
    """Patch fields a guard may compare: JSON columns have no portable equality."""
    return sorted(f for f in lc.patch_fields if not isinstance(lc.table.c[f].type, sa.JSON))


_LITERAL = re.compile(r"\s*(?:'((?:[^']|'')*)'|(-?\d+))\s*(?:,|$)")


def listed_values(column: sa.Column[Any]) -> tuple[Any, ...] | None:
    """The values a ``CHECK (column IN (...))`` of the column's table admits (text or integer literals), or
    None when no such CHECK names the column. Other CHECKs are not read: a table with them needs its own
    ``LifecycleMachine.creation_values``."""
    table = column.table
    for constraint in getattr(table, "constraints", ()):
        if not isinstance(constraint, sa.CheckConstraint):
            continue
        text = str(getattr(constraint.sqltext, "text", constraint.sqltext)).strip()
        match = re.fullmatch(rf"{re.escape(column.name)}\s+IN\s*\((.*)\)", text, flags=re.IGNORECASE | re.DOTALL)
        if match is None:
            continue
        body, values, at = match.group(1), [], 0
        while at < len(body):
            item = _LITERAL.match(body, at)
            if item is None:
                break
            values.append(item.group(1).replace("''", "'") if item.group(1) is not None else int(item.group(2)))
            at = item.end()
        else:
            if values:
                return tuple(values)
    return None


def column_values(column: sa.Column[Any]) -> st.SearchStrategy[Any]:
    """Values ``column`` accepts on both backends (exact floats, int4 integers, short plain text); one of
    the listed values when a ``CHECK (column IN (...))`` restricts it (:func:`listed_values`)."""
    kind = column.type
    listed = listed_values(column) if column.name != "status" else None
    if listed is not None:
        base: st.SearchStrategy[Any] = st.sampled_from(listed)
    elif isinstance(kind, sa.JSON):
        base = st.sampled_from([{}, {"n": 1}, ["a", "b"], []])
    elif isinstance(kind, sa.Boolean):
        base = st.booleans()
    elif isinstance(kind, sa.Integer):
        base = st.integers(-3, 12)
    elif isinstance(kind, sa.Float | sa.Numeric):
        base = st.integers(0, 4_000).map(lambda i: 1_700_000_000.0 + i / 4)
    else:
        size = getattr(kind, "length", None) or 5
        base = st.text(alphabet="abxyz-", max_size=min(size, 5))
    return st.one_of(st.none(), base) if column.nullable else base


def creation_values(lc: Lifecycle, peers: Sequence[Mapping[str, Any]] = ()) -> st.SearchStrategy[dict[str, Any]]:
    """Data columns for a new entity of ``lc``: every required column, some optional ones. Now and then
    the columns of one unique key are copied from one of ``peers`` (rows of existing entities of ``lc``),
    so the table's unique constraints are met.

    A column with a foreign key is left out when it may be (NULL or a default), else this raises
    ``ValueError`` naming it: override ``LifecycleMachine.creation_values`` for such a table.
    """
    required: list[str] = []
    optional: list[str] = []
    for name in data_columns(lc.table):
        column = lc.table.c[name]
        if name in LIFECYCLE_COLUMNS or column.primary_key:
            continue
        may_omit = column.nullable or column.default is not None or column.server_default is not None
        if column.foreign_keys:
            if not may_omit:
                raise ValueError(
                    f"{lc.entity_type}: column {name} references another table and has no default; "
                    "give the machine realistic values by overriding LifecycleMachine.creation_values"
                )
            continue
        (optional if may_omit else required).append(name)
    fixed = {n: column_values(lc.table.c[n]) for n in required}
    extra = {n: column_values(lc.table.c[n]) for n in optional}
    drawn = st.fixed_dictionaries(fixed, optional=extra)
    settable = set(required) | set(optional)
    keys = [k for k in key_columns(lc.table) if set(k) <= settable]
    if not peers or not keys:
        return drawn

    @st.composite
    def colliding(draw: st.DrawFn) -> dict[str, Any]:
        values = draw(drawn)
        if draw(st.integers(0, 99)) < 20:
            peer = draw(st.sampled_from(list(peers)))
            held = [k for k in keys if all(peer.get(c) is not None for c in k)]
            if held:
                values.update({c: peer[c] for c in draw(st.sampled_from(held))})
        return values

    return colliding()


def actors_of(lifecycles: Iterable[Lifecycle], also: Sequence[str] = ("system", "user")) -> tuple[Actor, ...]:
    """One actor of every type an edge is gated on, plus the types in ``also``."""
    types = sorted({t for lc in lifecycles for e in lc.edges for t in e.actors} | set(also))
    return tuple(Actor(t, f"{t}-1") for t in types)


def reasons_for(lc: Lifecycle, status: str) -> list[str]:
    """Declared codes about ``status`` (``<prefix>.<status>.<why>``; any declared code when there is none)."""
    return sorted(r for r in lc.reasons if r.split(".")[1:2] == [status]) or sorted(lc.reasons)


def purge_reasons(lc: Lifecycle) -> list[str]:
    """Declared codes a purge may cite (``<prefix>.purged.<why>``)."""
    return sorted(r for r in lc.reasons if r.split(".")[1:2] == ["purged"])


def bogus_reasons(lc: Lifecycle, status: str, others: Iterable[Lifecycle] = ()) -> list[str]:
    """Reason codes the lifecycle does not declare: a made-up one in its namespace, one another
    lifecycle of ``others`` declares (or one in another namespace), one that is not a code at all."""
    prefix = sorted(lc.reason_prefixes)[0] if lc.reason_prefixes else lc.entity_type
    foreign = sorted(r for o in others for r in o.reasons if r not in lc.reasons)
    found = [f"{prefix}.{status}.made_up", foreign[0] if foreign else f"not_{prefix}.{status}.created", "Not A Code"]
    return [r for r in found if r not in lc.reasons]


def idempotency_keys(fresh: Callable[[], str], shared: Sequence[str] = ("k1", "k2")) -> st.SearchStrategy[str | None]:
    """No key (half the time), a fresh key from ``fresh()``, or one of ``shared`` — reused on purpose
    by several actors and entities, so replays and mismatches happen."""

    def pick(roll: int) -> st.SearchStrategy[str | None]:
        if roll < 50:
            return st.none()
        if roll < 85:
            return st.builds(fresh)
        return st.sampled_from(list(shared))

    return st.integers(0, 99).flatmap(pick)


def creations(lc: Lifecycle, others: Iterable[Lifecycle] = ()) -> st.SearchStrategy[tuple[str, str]]:
    """``(status, reason code)`` for a create: mostly an initial status and a declared code; sometimes
    a non-initial or unknown status, or an undeclared code."""

    @st.composite
    def draw(draw: st.DrawFn) -> tuple[str, str]:
        roll = draw(st.integers(0, 99))
        later = [s for s in lc.statuses if s not in lc.initial]
        if roll < 75 or (roll < 95 and not later):
            status = draw(st.sampled_from(sorted(lc.initial)))
        elif roll < 95:
            status = draw(st.sampled_from(later))
        else:
            status = UNKNOWN_STATUS
        bogus = draw(st.integers(0, 99)) < 8
        code = draw(st.sampled_from(bogus_reasons(lc, status, others) if bogus else reasons_for(lc, status)))
        return status, code

    return draw()


def commands(
    lc: Lifecycle,
    seen: Mapping[str, Any],
    *,
    actors: Sequence[Actor],
    key: str | None = None,
    careful: bool = False,
    others: Iterable[Lifecycle] = (),
    peers: Sequence[Mapping[str, Any]] = (),
) -> st.SearchStrategy[TransitionCmd]:
    """A transition command on the entity whose row ``seen`` shows (its ``id`` and ``status`` at least),
    as one of ``actors`` would write it from that view.

    A ``careful`` caller breaks the policy less often, so its entities travel further. An edge
    gated on other actor types is mostly handed to an actor allowed to take it. ``others``: lifecycles
    whose reason codes make good undeclared ones. ``peers``: rows of other entities of ``lc``, whose
    values a patch of a unique column sometimes copies.
    """
    others = tuple(others)
    unique = {c for key in key_columns(lc.table) for c in key}
    copies = {c: [v for _, v in sorted({repr(p[c]): p[c] for p in peers if p.get(c) is not None}.items())]
              for c in unique}

    @st.composite
    def draw(draw: st.DrawFn) -> TransitionCmd:
        def chance(percent: int, careless_percent: int) -> bool:
            return draw(st.integers(0, 99)) < (percent if careful else careless_percent)

        actor = draw(st.sampled_from(list(actors)))
        status = seen["status"]
        targets = lc.targets(status)
        if lc.same_status == "allow" and status not in lc.terminal and status not in targets:
            targets.append(status)
        if targets and chance(95, 70):
            target = draw(st.sampled_from(targets))
        elif chance(97, 90):
            target = draw(st.sampled_from(lc.statuses))
        else:
            target = UNKNOWN_STATUS
        edge = lc.edge(status, target)
        allowed = [a for a in actors if edge is not None and a.type in edge.actors]
        if edge is not None and edge.actors and actor.type not in edge.actors and allowed and chance(80, 50):
            actor = draw(st.sampled_from(allowed))

        if chance(97, 85):
            expected: tuple[str, ...] = (status,)
        elif chance(50, 50):
            expected = (status, draw(st.sampled_from(lc.statuses)))
        elif chance(95, 90):
            expected = (draw(st.sampled_from(lc.statuses)),)
        else:
            expected = ()

        fields = sorted(lc.patch_fields)
        patch_fields: set[str] = set(draw(st.sets(st.sampled_from(fields), max_size=2))) if fields else set()
        if edge is not None and chance(97, 85):
            patch_fields |= edge.requires_patch
        outside = [c for c in lc.table.c.keys() if c not in lc.patch_fields]
        if outside and not chance(99, 97):
            patch_fields.add(draw(st.sampled_from(outside)))
        patch = {}
        for f in sorted(patch_fields):
            if copies.get(f) and draw(st.integers(0, 99)) < 40:
                patch[f] = draw(st.sampled_from(copies[f]), label=f"patch {f} (a peer's)")
            else:
                patch[f] = draw(column_values(lc.table.c[f]), label=f"patch {f}")

        scalar = guardable(lc)
        guard_fields: set[str] = set(draw(st.sets(st.sampled_from(scalar), max_size=1))) if scalar else set()
        if edge is not None and chance(97, 85):
            guard_fields |= edge.requires_guard
        guards = {}
        for g in sorted(guard_fields):
            if chance(95, 65):
                guards[g] = seen.get(g)  # what the caller saw, possibly stale
            else:
                guards[g] = draw(column_values(lc.table.c[g]), label=f"guard {g}")

        if chance(97, 90):
            code = draw(st.sampled_from(reasons_for(lc, target)))
        else:
            code = draw(st.sampled_from(bogus_reasons(lc, target, others)))
        summary = draw(st.sampled_from(["", "as seen", "retry"]))
        return TransitionCmd(lc.entity_type, seen["id"], target, code, summary, actor, expected, guards, patch, key)

    return draw()
